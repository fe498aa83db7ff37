#!/usr/bin/env bash
# Device call 5 (2026-12-01): the final tree. The GPU tests (backend, fp8, sampling), then ours beside
# PyTorch's faster mode (torch.compile with CUDA graphs) at issue 15's four shapes, bf16 and fp8.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
cp -r results/device-site/* /tmp/site/
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
timeout 40 python3 dev/cuda/layernorm.py > "$OUT/dev-layernorm.log" 2>&1; echo "dev layernorm rc=$? ($(grep -c '| ok' "$OUT/dev-layernorm.log") ok rows)"
timeout 200 python3 -m pytest tests/test_gpu_backend.py tests/test_gpu_fp8.py tests/test_sampling_gpu.py -q -p no:cacheprovider -rs \
  > "$OUT/gpu-tests.log" 2>&1
grep -E "^FAILED|passed|failed|Error" "$OUT/gpu-tests.log" | tail -6; echo "tests done at $(( $(date +%s) - T0 )) s"
timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/gpu_bench.py --models ANDREA-12M ANDREA-120M --batches 8 32 \
  --precisions bf16 fp8 --torch-modes graphs --rounds 3 --out "$OUT/bench.json" > "$OUT/bench.log" 2>&1; echo "bench rc=$?"
grep "^|" "$OUT/bench.log"; echo "all done at $(( $(date +%s) - T0 )) s"
