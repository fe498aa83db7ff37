#!/usr/bin/env bash
# Device call 5 (2026-12-01): dev/cuda classifier with the exp2 variant of the loss kernel (XENT_EXP2, dev).
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
timeout 120 python3 dev/cuda/classifier.py > "$OUT/dev-classifier.log" 2>&1; echo "dev classifier rc=$? ($(grep -c '| ok' "$OUT/dev-classifier.log") ok rows)"
grep -E "FAIL|Error|error" "$OUT/dev-classifier.log" | head -5; grep -E "softmax_xent_h16" "$OUT/dev-classifier.log" | grep -v edge
echo "all done at $(( $(date +%s) - T0 )) s"
