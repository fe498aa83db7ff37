#!/usr/bin/env bash
# Device call 7 (2026-12-01): dev/cuda classifier on the final tree (call 6's run hit its limit: an
# edge shape of V = 60,001 whose NumPy reference builds a V x V identity head; the shape is gone).
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
timeout 90 python3 dev/cuda/classifier.py > "$OUT/dev-classifier.log" 2>&1; echo "dev classifier rc=$? ($(grep -c '| ok' "$OUT/dev-classifier.log") ok rows)"
grep -E "FAIL|Error|error" "$OUT/dev-classifier.log" | head -5; grep -E "softmax_xent_h16" "$OUT/dev-classifier.log" | grep -v edge
echo "all done at $(( $(date +%s) - T0 )) s"
