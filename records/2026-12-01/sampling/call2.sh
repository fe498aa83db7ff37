#!/usr/bin/env bash
# Device call 2 (2026-12-01): sample_rows v2 (the row staged in shared memory, warp-aggregated
# histogram) against v1, then generation speed, greedy and sampled, beside PyTorch's compiled loop.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
cp -r results/device-site/* /tmp/site/
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
python3 dev/cuda/sampling.py > "$OUT/dev-sampling.log" 2>&1; echo "dev sampling rc=$?"
grep -E "FAIL|boundary|error" "$OUT/dev-sampling.log" | head -8
grep -E "(120M|12M) V=[0-9]+ rows=(1|16) (T=0.8 k=40 p=0.95|greedy) normal" "$OUT/dev-sampling.log" | cut -c17-200
python3 -m pytest tests/test_sampling_gpu.py -q -p no:cacheprovider -rs -x > "$OUT/gpu-tests.log" 2>&1
grep -E "^FAILED|^E  |passed|failed" "$OUT/gpu-tests.log" | head -12; echo "checks done at $(( $(date +%s) - T0 )) s"
python3 bench/generate_bench.py --rows 1 16 --temperature 0.8 --out "$OUT/generate-t08.json" > "$OUT/generate-t08.log" 2>&1
grep -E "graph|compile" "$OUT/generate-t08.log" | grep "^|"; echo "sampled bench done at $(( $(date +%s) - T0 )) s"
python3 bench/generate_bench.py --rows 1 16 --out "$OUT/generate-greedy.json" > "$OUT/generate-greedy.log" 2>&1
grep -E "graph|compile" "$OUT/generate-greedy.log" | grep "^|"; echo "greedy bench done at $(( $(date +%s) - T0 )) s"
python3 bench/decode_profile.py --models ANDREA-12M ANDREA-120M --rows 1 --runners ours > "$OUT/decode-profile.md" 2>&1
grep -E "^## |sample_rows" "$OUT"/decode-profile.md | head; echo "all done at $(( $(date +%s) - T0 )) s"
