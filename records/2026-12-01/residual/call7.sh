#!/usr/bin/env bash
# Device call 7 (2026-12-01): the kernels' shared helpers (load4/store4/as_stored on raw4/f4/packed4,
# embed_rows and as_float in common.cuh). dev/cuda --quick (ANDREA-tiny and the edge shapes: the
# checks, not the timings) for every script whose kernels moved, and the stream's GPU tests.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
for s in layernorm fp8 embedding decode; do
  timeout 60 python3 dev/cuda/$s.py --quick > "$OUT/dev-$s.log" 2>&1; echo "dev $s rc=$? ($(grep -c '| ok' "$OUT/dev-$s.log") ok rows, $(grep -c 'FAIL' "$OUT/dev-$s.log") failed)"
done
timeout 60 python3 -m pytest tests/test_gpu_backend.py -q -p no:cacheprovider -k "residual or embedding or layernorm" > "$OUT/gpu-tests.log" 2>&1
grep -E "^FAILED|passed|failed|Error" "$OUT/gpu-tests.log" | tail -4; echo "all done at $(( $(date +%s) - T0 )) s"
