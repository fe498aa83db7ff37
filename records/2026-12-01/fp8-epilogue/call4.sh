#!/usr/bin/env bash
# Device call 4 (2026-12-01): the final tree after the review's mends (NoAlgorithm, the underflow count
# from a mask of nonzero values, the epilogue's amaxes checked in a's history): dev/cuda fp8, the GPU
# tests (backend, fp8, sampling), and bench/overlap_probe.py briefly on the bf16 residual stream.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
cp -r results/device-site/* /tmp/site/
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
timeout 90 python3 dev/cuda/fp8.py > "$OUT/dev-fp8.log" 2>&1; echo "dev fp8 rc=$? $(grep -E 'rows ok' "$OUT/dev-fp8.log")"
grep -E "FAIL|rror" "$OUT/dev-fp8.log" | head -5
timeout 300 python3 -m pytest tests/test_gpu_backend.py tests/test_gpu_fp8.py tests/test_sampling_gpu.py -q -p no:cacheprovider -rs -s \
  > "$OUT/gpu-tests.log" 2>&1
grep -E "^FAILED|passed|failed|differ|beyond|Error" "$OUT/gpu-tests.log" | tail -8; echo "tests done at $(( $(date +%s) - T0 )) s"
timeout $(( 560 - ($(date +%s) - T0) )) python3 bench/overlap_probe.py --batches 8 --blocks 64 --sm-counts 0 \
  > "$OUT/overlap-probe.log" 2>&1; echo "overlap probe rc=$?"; grep "^|" "$OUT/overlap-probe.log" | head -6
echo "all done at $(( $(date +%s) - T0 )) s"
