#!/usr/bin/env bash
# Device call 1 (2026-12-01): the bf16 residual stream. The new kernels against NumPy (dev/cuda
# layernorm, embedding, decode, fp8 and the backend test of the stream's pairs), then ours with the
# bf16 stream beside the fp32 one (bf16 and fp8, -r32: ANDREA_RESIDUAL=fp32) at the four shapes of
# issue 15, then the GPU tests with the time left.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
cp -r results/device-site/* /tmp/site/
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
for s in layernorm embedding decode fp8; do
  timeout 120 python3 dev/cuda/$s.py > "$OUT/dev-$s.log" 2>&1; echo "dev $s rc=$? ($(grep -c '| ok' "$OUT/dev-$s.log") ok rows)"
  grep -E "FAIL|Error|error" "$OUT/dev-$s.log" | head -5
done
grep -E "16-bit stream|16-bit dout\b|fused, 16-bit dout \||vec, 16-bit branch" "$OUT/dev-layernorm.log" | grep -E "120M|12M" | head -20
timeout 120 python3 -m pytest tests/test_gpu_backend.py -q -p no:cacheprovider -k "residual or plans_bf16 or bf16_step" > "$OUT/quick-tests.log" 2>&1
grep -E "^FAILED|passed|failed|Error" "$OUT/quick-tests.log" | tail -6; echo "checks done at $(( $(date +%s) - T0 )) s"
timeout 300 python3 bench/gpu_bench.py --models ANDREA-12M ANDREA-120M --batches 8 32 --precisions bf16 bf16-r32 fp8 fp8-r32 \
  --rounds 3 --no-torch --out "$OUT/bench-residual.json" > "$OUT/bench-residual.log" 2>&1; echo "bench rc=$?"
grep "^|" "$OUT/bench-residual.log" | head -30; echo "bench done at $(( $(date +%s) - T0 )) s"
timeout $(( 590 - ($(date +%s) - T0) )) python3 -m pytest tests/test_gpu_backend.py tests/test_gpu_fp8.py tests/test_sampling_gpu.py \
  -q -p no:cacheprovider -x -rs > "$OUT/gpu-tests.log" 2>&1
grep -E "^FAILED|passed|failed|Error" "$OUT/gpu-tests.log" | tail -8; echo "all done at $(( $(date +%s) - T0 )) s"
