#!/usr/bin/env bash
# Device call 1 (2026-12-01, issue 15 fourteenth part): the loss kernel holding its row in registers
# (softmax_xent_h16_rows) and the GELU output kept with gelu' as the backward product's epilogue
# (ANDREA_GELU=keep). dev/cuda classifier against NumPy, the backend tests of both, then ours with
# the GELU recomputed (-gr) and kept (-gk) at issue 15's four shapes, and a kernel profile of each.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
timeout 90 python3 dev/cuda/classifier.py > "$OUT/dev-classifier.log" 2>&1; echo "dev classifier rc=$? ($(grep -c '| ok' "$OUT/dev-classifier.log") ok rows)"
grep -E "FAIL|Error|error" "$OUT/dev-classifier.log" | head -5; grep -E "softmax_xent_h16" "$OUT/dev-classifier.log" | head -12
timeout 150 python3 -m pytest tests/test_gpu_backend.py -q -p no:cacheprovider -k "gelu or classifier or loss or bf16_step or fp16_step or plans_bf16" \
  > "$OUT/quick-tests.log" 2>&1
grep -E "^FAILED|passed|failed|Error" "$OUT/quick-tests.log" | tail -6; echo "checks done at $(( $(date +%s) - T0 )) s"
timeout 300 python3 bench/gpu_bench.py --models ANDREA-12M ANDREA-120M --batches 8 32 --precisions bf16-gr bf16-gk fp8 \
  --rounds 3 --no-torch --out "$OUT/bench-gelu.json" > "$OUT/bench-gelu.log" 2>&1; echo "bench rc=$?"
grep "^|" "$OUT/bench-gelu.log" | head -30; echo "bench done at $(( $(date +%s) - T0 )) s"
timeout $(( 580 - ($(date +%s) - T0) )) python3 bench/kernel_profile.py --model ANDREA-120M --batch 32 --runners bf16-gr bf16-gk \
  > "$OUT/kp-120M-B32.md" 2>&1; echo "profile rc=$?"
grep -E "^## |softmax_xent|gelu|geluaux|dgelu|^\| (matrix|attention|layernorm|other|optimizer|loss) " "$OUT/kp-120M-B32.md" | head -30
echo "all done at $(( $(date +%s) - T0 )) s"
