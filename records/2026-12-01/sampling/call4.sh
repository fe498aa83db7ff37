#!/usr/bin/env bash
# Device call 4 (2026-12-01): sampled generation against a stronger PyTorch loop: its sampler (the
# Gumbel-max trick) compiled into a CUDA graph as well as its step.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
timeout 420 python3 bench/generate_bench.py --rows 1 16 --temperature 0.8 --out "$OUT/generate-t08.json" > "$OUT/generate-t08.log" 2>&1
grep -E "graph|compile|failed" "$OUT/generate-t08.log" | grep -E "^\||failed"; echo "all done at $(( $(date +%s) - T0 )) s"
