#!/usr/bin/env bash
# Device call 1 (2026-12-01, issue 15's closing check): the GPU tests on the final tree (the fp8 plan
# line now names where a = gelu(h) is made), then ours (bf16, bf16 with cuDNN's non-deterministic
# attention backward, fp8) beside both of PyTorch's compiled modes (default, CUDA graphs) at the
# issue's four shapes, in one run. The first call to source bench/device_env.sh.
set -uo pipefail
source bench/device_env.sh
T0=$(date +%s)
timeout 240 python3 -m pytest tests/test_gpu_backend.py tests/test_gpu_fp8.py tests/test_sampling_gpu.py -q -p no:cacheprovider -rs \
  > "$OUT/gpu-tests.log" 2>&1
grep -E "^FAILED|passed|failed|Error" "$OUT/gpu-tests.log" | tail -8; echo "tests done at $(( $(date +%s) - T0 )) s"
timeout $(( 590 - ($(date +%s) - T0) )) python3 bench/gpu_bench.py --models ANDREA-12M ANDREA-120M --batches 8 32 \
  --precisions bf16 bf16-nondet fp8 --torch-modes default graphs --rounds 3 --out "$OUT/bench.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; grep "^|" "$OUT/bench.log" | head -14; echo "all done at $(( $(date +%s) - T0 )) s"
