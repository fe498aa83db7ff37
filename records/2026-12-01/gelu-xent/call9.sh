#!/usr/bin/env bash
# Device call 9 (2026-12-01): the loss with the GELU output kept against recomputed, ANDREA-120M at
# B=32 (where auto keeps it) on the real corpus's shards, 400 steps from the same weights on the same batches.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
timeout 190 python3 bench/fp8_gate.py --shards results/ANDREA-120M/shards.json --batch 32 --steps 400 --warmup 40 \
  --eval-every 100 --precisions bf16::recompute bf16::keep --out "$OUT" > "$OUT/gate.log" 2>&1; echo "gate rc=$?"
grep -E "step (100|200|300|400):|gap|gate|PASS|FAIL" "$OUT/gate.log" | tail -14
