#!/usr/bin/env bash
# Device call 3 (2026-12-01): the 16-bit stream's LayerNorm kernels made to keep more bytes in flight
# (the forward: 2 rows a warp, all loads first; the backward: the next row's loads issued before this
# row's arithmetic). dev/cuda checks and times them beside the versions they replace, the stream's
# backend test runs, then bench/before_after.sh against 5d00093 (the stream with the first kernels).
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
for s in layernorm fp8; do
  timeout 120 python3 dev/cuda/$s.py > "$OUT/dev-$s.log" 2>&1; echo "dev $s rc=$? ($(grep -c '| ok' "$OUT/dev-$s.log") ok rows)"
  grep -E "FAIL|Error|error" "$OUT/dev-$s.log" | head -5
done
grep -E "16-bit stream|16-bit dout and" "$OUT/dev-layernorm.log" | grep -E "120M|12M"
grep -E "16-bit residual" "$OUT/dev-fp8.log" | grep -E "120M|12M"
timeout 90 python3 -m pytest tests/test_gpu_backend.py tests/test_gpu_fp8.py -q -p no:cacheprovider -k "residual or bf16_step or fp8" > "$OUT/quick-tests.log" 2>&1
grep -E "^FAILED|passed|failed|Error" "$OUT/quick-tests.log" | tail -6; echo "checks done at $(( $(date +%s) - T0 )) s"
OUT="$OUT" timeout $(( 580 - ($(date +%s) - T0) )) bash bench/before_after.sh results/before.tar --models ANDREA-12M ANDREA-120M \
  --batches 8 32 --precisions bf16 fp8 --rounds 2 > "$OUT/before-after.log" 2>&1; echo "before/after rc=$?"
cat "$OUT/before_after.md" 2>/dev/null; echo "all done at $(( $(date +%s) - T0 )) s"
