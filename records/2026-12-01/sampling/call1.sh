#!/usr/bin/env bash
# Device call 1 (2026-12-01): the token chosen on the device (kernels/sampling.cu) and fed back
# inside the captured step; the host reads the picks a chunk behind.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
cp -r results/device-site/* /tmp/site/
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
python3 dev/cuda/sampling.py > "$OUT/dev-sampling.log" 2>&1; echo "dev sampling rc=$?"
grep -E "FAIL|boundary|error" "$OUT/dev-sampling.log" | head -8; grep -E "120M.*rows=(1|16) T=0.8 k=40 p=0.95 normal" "$OUT/dev-sampling.log" | cut -c1-200
python3 -m pytest tests/test_sampling_gpu.py -q -p no:cacheprovider -rs -x > "$OUT/gpu-tests.log" 2>&1
grep -E "^FAILED|^E  |passed|failed" "$OUT/gpu-tests.log" | head -12; echo "checks done at $(( $(date +%s) - T0 )) s"
python3 bench/generate_bench.py --models ANDREA-120M --rows 1 16 --temperature 0.8 --host-picks --out "$OUT/generate-t08.json" > "$OUT/generate-t08.log" 2>&1
tail -9 "$OUT/generate-t08.log"; echo "sampled bench done at $(( $(date +%s) - T0 )) s"
python3 bench/decode_profile.py --models ANDREA-120M --rows 1 16 > "$OUT/decode-profile-120M.md" 2>&1
grep -E "^## |sample_rows|idle" "$OUT"/decode-profile-120M.md | head -20; echo "profiles done at $(( $(date +%s) - T0 )) s"
python3 bench/generate_bench.py --rows 1 16 --out "$OUT/generate-greedy.json" > "$OUT/generate-greedy.log" 2>&1
tail -16 "$OUT/generate-greedy.log"; echo "all done at $(( $(date +%s) - T0 )) s"
