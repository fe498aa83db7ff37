#!/usr/bin/env bash
# Device call 6 (2026-12-01): sample_rows v2 (the passes that need no order read the row coalesced)
# against v1 (dev/cuda/sampling_v1.cu), checked and timed; the sampling GPU tests.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
python3 dev/cuda/sampling.py --reps 50 > "$OUT/dev-sampling.log" 2>&1; echo "dev sampling rc=$? ($(grep -c '| ok' "$OUT/dev-sampling.log") ok rows)"
grep -E "FAIL|boundary|error" "$OUT/dev-sampling.log" | head -5
grep -E "(120M|12M) V=[0-9]+ rows=(1|16) (T=0.8 k=40 p=0.95|greedy) normal" "$OUT/dev-sampling.log" | cut -c17-175
timeout 120 python3 -m pytest tests/test_sampling_gpu.py -q -p no:cacheprovider -k "sampler or bos or replaying or one_short" > "$OUT/gpu-tests.log" 2>&1
grep -E "^FAILED|passed|failed" "$OUT/gpu-tests.log" | tail -3; echo "all done at $(( $(date +%s) - T0 )) s"
