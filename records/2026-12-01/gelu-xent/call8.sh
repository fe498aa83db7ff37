#!/usr/bin/env bash
# Device call 8 (2026-12-01): after the duplicates' mends (the loss kernel's two folds one helper; the
# tests' replayed steps one helper): dev/cuda classifier and the loss, GELU and bf16-step backend tests.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
timeout 60 python3 dev/cuda/classifier.py > "$OUT/dev-classifier.log" 2>&1; echo "dev classifier rc=$? ($(grep -c '| ok' "$OUT/dev-classifier.log") ok rows)"
grep -E "FAIL|Error|error" "$OUT/dev-classifier.log" | head -5; grep -E "softmax_xent_h16" "$OUT/dev-classifier.log" | grep -v edge | grep bf16
timeout 150 python3 -m pytest tests/test_gpu_backend.py -q -p no:cacheprovider -k "loss or classifier or gelu or bf16_step or fp16_step" \
  > "$OUT/quick-tests.log" 2>&1
grep -E "^FAILED|passed|failed|Error" "$OUT/quick-tests.log" | tail -6; echo "all done at $(( $(date +%s) - T0 )) s"
