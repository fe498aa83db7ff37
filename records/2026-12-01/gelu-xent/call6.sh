#!/usr/bin/env bash
# Device call 6 (2026-12-01): the final tree. dev/cuda classifier (the exp2 loss kernel in production),
# the GPU tests (backend, fp8, sampling), the GELU kept against recomputed at ANDREA-120M B=32 in 6
# interleaved rounds, then ours beside PyTorch's faster mode (CUDA graphs) at issue 15's four shapes.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
cp -r results/device-site/* /tmp/site/
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
timeout 90 python3 dev/cuda/classifier.py > "$OUT/dev-classifier.log" 2>&1; echo "dev classifier rc=$? ($(grep -c '| ok' "$OUT/dev-classifier.log") ok rows)"
grep -E "FAIL|Error|error" "$OUT/dev-classifier.log" | head -5; grep -E "softmax_xent_h16" "$OUT/dev-classifier.log" | grep -v edge | grep bf16
timeout 200 python3 -m pytest tests/test_gpu_backend.py tests/test_gpu_fp8.py tests/test_sampling_gpu.py -q -p no:cacheprovider -rs \
  > "$OUT/gpu-tests.log" 2>&1
grep -E "^FAILED|passed|failed|Error" "$OUT/gpu-tests.log" | tail -6; echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 150 python3 bench/gpu_bench.py --models ANDREA-120M --batches 32 --precisions bf16-gr bf16-gk --rounds 6 --no-torch \
  --out "$OUT/bench-gelu-ab.json" > "$OUT/bench-gelu-ab.log" 2>&1; echo "A/B rc=$?"
grep -E "ours_bf16-g" "$OUT/bench-gelu-ab.log"; echo "A/B done at $(( $(date +%s) - T0 )) s"
timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/gpu_bench.py --models ANDREA-12M ANDREA-120M --batches 8 32 \
  --precisions bf16 fp8 --torch-modes graphs --rounds 3 --out "$OUT/bench.json" > "$OUT/bench.log" 2>&1; echo "bench rc=$?"
grep "^|" "$OUT/bench.log" | head -8; echo "all done at $(( $(date +%s) - T0 )) s"
