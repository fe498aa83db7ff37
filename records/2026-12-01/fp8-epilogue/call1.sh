#!/usr/bin/env bash
# Device call 1 (2026-12-01, fp8 GELU epilogue): the kernels' checks (dev/cuda fp8: fp8_update taking
# in a product's amax, the GELU backward cast counting a; layernorm: ln_apply4 shared by three
# kernels), the fp8 GPU tests (the epilogue's own test prints how often its a differs from the
# backward's recast), the backend tests, then fp8 with the epilogue against the cast pass (-noepi)
# at ANDREA-120M B=32 and B=8, and a kernel profile of both at B=32.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
cp -r results/device-site/* /tmp/site/
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
timeout 120 python3 -m pytest tests/test_gpu_fp8.py -q -p no:cacheprovider -rs -s > "$OUT/fp8-tests.log" 2>&1
grep -E "^FAILED|passed|failed|differ|Error" "$OUT/fp8-tests.log" | tail -8; echo "fp8 tests done at $(( $(date +%s) - T0 )) s"
timeout 90 python3 dev/cuda/fp8.py > "$OUT/dev-fp8.log" 2>&1; echo "dev fp8 rc=$? $(tail -n 1 "$OUT/dev-fp8.log")"
grep -E "FAIL|rror" "$OUT/dev-fp8.log" | head -5
timeout 90 python3 dev/cuda/layernorm.py > "$OUT/dev-layernorm.log" 2>&1; echo "dev layernorm rc=$? $(tail -n 1 "$OUT/dev-layernorm.log")"
grep -E "FAIL|rror" "$OUT/dev-layernorm.log" | head -5; echo "dev done at $(( $(date +%s) - T0 )) s"
timeout 150 python3 bench/gpu_bench.py --models ANDREA-120M --batches 32 8 --precisions fp8-noepi fp8 --rounds 6 --no-torch \
  --out "$OUT/bench-epi-ab.json" > "$OUT/bench-epi-ab.log" 2>&1; echo "A/B rc=$?"
grep -E "ours_fp8" "$OUT/bench-epi-ab.log"; echo "A/B done at $(( $(date +%s) - T0 )) s"
timeout 140 python3 -m pytest tests/test_gpu_backend.py -q -p no:cacheprovider -rs -x > "$OUT/backend-tests.log" 2>&1
grep -E "^FAILED|passed|failed|Error" "$OUT/backend-tests.log" | tail -4; echo "backend tests done at $(( $(date +%s) - T0 )) s"
timeout $(( 580 - ($(date +%s) - T0) )) python3 bench/kernel_profile.py --model ANDREA-120M --batch 32 --runners fp8-noepi fp8 \
  > "$OUT/kp-fp8-B32.md" 2>&1; echo "profile rc=$?"
grep -E "^## |fp8_cast|gelu|^\| (matrix|attention|layernorm|other|optimizer|loss) " "$OUT/kp-fp8-B32.md" | head -30
echo "all done at $(( $(date +%s) - T0 )) s"
