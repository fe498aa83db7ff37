#!/usr/bin/env bash
# Device call 4 (2026-12-01, run inline): dev/cuda layernorm.py and fp8.py after call 3's kernels,
# with the backward's next-row prefetch as a dev version (LN_R16_PREFETCH=false beside it).
export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
timeout 150 python3 dev/cuda/layernorm.py > $OUT/dev-layernorm.log 2>&1
timeout 100 python3 dev/cuda/fp8.py > $OUT/dev-fp8.log 2>&1
