#!/usr/bin/env bash
# Device call 4 (2026-12-01): the final tree (the code of call 2's tree). Ours (bf16 with ANDREA_GELU=auto,
# fp8) beside PyTorch's faster mode (torch.compile with CUDA graphs) at issue 15's four shapes.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
timeout 580 python3 bench/gpu_bench.py --models ANDREA-12M ANDREA-120M --batches 8 32 \
  --precisions bf16 fp8 --torch-modes graphs --rounds 3 --out "$OUT/bench.json" > "$OUT/bench.log" 2>&1; echo "bench rc=$?"
grep "^|" "$OUT/bench.log"; echo "all done at $(( $(date +%s) - T0 )) s"
