#!/usr/bin/env bash
# Device call 3 (2026-12-01): the fp8 casts with every load of a block's tiles issued first. dev/cuda
# fp8.py on this tree and on the tree before (results/before.tar, the commit before), the fp8 GPU
# tests, then bench/before_after.sh at ANDREA-120M B=8 and 32 in fp8 (and bf16: unchanged kernels, a control).
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
mkdir -p /tmp/before && tar xf results/before.tar -C /tmp/before
timeout 100 python3 dev/cuda/fp8.py > "$OUT/dev-fp8.log" 2>&1; echo "dev fp8 rc=$? ($(grep -c '| ok' "$OUT/dev-fp8.log") ok rows)"
grep -E "FAIL|Error|error" "$OUT/dev-fp8.log" | head -5
(cd /tmp/before && timeout 100 python3 dev/cuda/fp8.py > "$OUT/dev-fp8-before.log" 2>&1); echo "dev fp8 (before) rc=$?"
for f in dev-fp8-before dev-fp8; do echo "== $f"; grep -E "120M" "$OUT/$f.log" | grep -E "cast_h16_e4m3_gelu|gelu_bwd_cast_tiles|cast_h16_e5m2 |cast_h16_e4m3 |jobs" | cut -c1-160; done
timeout 150 python3 -m pytest tests/test_gpu_fp8.py -q -p no:cacheprovider -rs > "$OUT/fp8-tests.log" 2>&1
grep -E "^FAILED|passed|failed|Error" "$OUT/fp8-tests.log" | tail -4; echo "checks done at $(( $(date +%s) - T0 )) s"
OUT=/tmp/ba timeout $(( 585 - ($(date +%s) - T0) )) bash bench/before_after.sh results/before.tar --models ANDREA-120M \
  --batches 8 32 --precisions fp8 bf16 --rounds 2 > "$OUT/before-after.log" 2>&1; echo "before_after rc=$?"
cp /tmp/ba/before_after.md "$OUT/" 2>/dev/null; tar czf "$OUT/before-after.tgz" -C /tmp ba
cat "$OUT/before_after.md" 2>/dev/null; echo "all done at $(( $(date +%s) - T0 )) s"
