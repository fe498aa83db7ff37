#!/usr/bin/env bash
# Device call 2 (2026-12-01): the residual stream's quality gate. ANDREA-120M trained 2,000 steps of
# 8 x 1024 tokens from the same weights on the same batches of the real corpus (bench/real_corpus.sh,
# 10.6M tokens) with the fp32 residual stream (bf16:fp32, the reference), the bf16 stream (bf16, the
# new default) and fp8 (its bf16 stream); validation loss on the held-out windows, scored at the end
# by one bf16 engine. Then ours beside PyTorch at 120M B=32 with the time left.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
timeout 420 python3 bench/fp8_gate.py --shards results/ANDREA-120M/shards.json --steps 2000 --eval-every 500 \
  --precisions bf16:fp32 bf16 fp8 --out "$OUT" > "$OUT/gate.log" 2>&1; echo "gate rc=$?"
grep -E "step (500|1000|1500|2000)|validation loss|sources" "$OUT/gate.log"; echo "gate done at $(( $(date +%s) - T0 )) s"
timeout $(( 590 - ($(date +%s) - T0) )) python3 bench/gpu_bench.py --models ANDREA-120M --batches 32 --precisions bf16 fp8 \
  --rounds 3 --out "$OUT/bench-120M-B32.json" > "$OUT/bench-120M-B32.log" 2>&1; echo "bench rc=$?"
grep "^|" "$OUT/bench-120M-B32.log" | head; echo "all done at $(( $(date +%s) - T0 )) s"
