#!/usr/bin/env bash
# Device call 3 (2026-12-01): the fp8 tests (the epilogue's printed departures, by value), fp8 with the
# GELU epilogue against the cast pass (-noepi) at ANDREA-120M B=32 and B=8, both casting with the packed
# underflow count, then ours (bf16, fp8) beside PyTorch's faster mode (CUDA graphs) at issue 15's shapes.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
cp -r results/device-site/* /tmp/site/
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
timeout 60 python3 -m pytest tests/test_gpu_fp8.py -q -p no:cacheprovider -rs -s -k epilogue > "$OUT/fp8-tests.log" 2>&1
grep -E "^FAILED|passed|failed|differ|beyond|Error" "$OUT/fp8-tests.log" | tail -8; echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 150 python3 bench/gpu_bench.py --models ANDREA-120M --batches 32 8 --precisions fp8-noepi fp8 --rounds 6 --no-torch \
  --out "$OUT/bench-epi-ab.json" > "$OUT/bench-epi-ab.log" 2>&1; echo "A/B rc=$?"
grep -E "ours_fp8" "$OUT/bench-epi-ab.log" | cut -c1-200; echo "A/B done at $(( $(date +%s) - T0 )) s"
timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/gpu_bench.py --models ANDREA-12M ANDREA-120M --batches 8 32 \
  --precisions bf16 fp8 --torch-modes graphs --rounds 3 --out "$OUT/bench.json" > "$OUT/bench.log" 2>&1; echo "bench rc=$?"
grep "^|" "$OUT/bench.log" | head -12; echo "all done at $(( $(date +%s) - T0 )) s"
