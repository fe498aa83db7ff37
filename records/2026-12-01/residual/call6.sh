#!/usr/bin/env bash
# Device call 6 (2026-12-01): the review's mends. dev/cuda layernorm (stream checks on NaN-filled
# buffers, an odd-N edge shape) and fp8 (the backward checks' shared launch), and the GPU tests of the
# stream and the bf16/fp8 engines.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
for s in layernorm fp8; do
  timeout 150 python3 dev/cuda/$s.py > "$OUT/dev-$s.log" 2>&1; echo "dev $s rc=$? ($(grep -c '| ok' "$OUT/dev-$s.log") ok rows)"
  grep -E "FAIL|Error|error" "$OUT/dev-$s.log" | head -5
done
grep -E "16-bit stream|16-bit dout and" "$OUT/dev-layernorm.log" | grep -E "edge B=3 T=37 C=384"
timeout 150 python3 -m pytest tests/test_gpu_backend.py tests/test_gpu_fp8.py -q -p no:cacheprovider -k "residual or bf16 or fp8" \
  > "$OUT/gpu-tests.log" 2>&1
grep -E "^FAILED|passed|failed|Error" "$OUT/gpu-tests.log" | tail -6; echo "all done at $(( $(date +%s) - T0 )) s"
