#!/usr/bin/env bash
# Device call 5 (2026-12-01): a block per row for the few-rows LayerNorm; the one-token step uploads
# its tokens and downloads its logits itself (pinned buffers, in the graph); greedy picks for all rows at once.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
cp -r results/device-site/* /tmp/site/
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
python3 dev/cuda/layernorm.py > "$OUT/dev-layernorm.log" 2>&1; echo "dev layernorm rc=$?"
python3 dev/cuda/decode.py > "$OUT/dev-decode.log" 2>&1; echo "dev decode rc=$?"
grep -E "16-bit branch" "$OUT/dev-layernorm.log" | cut -c1-180
python3 -m pytest tests/test_gpu_backend.py tests/test_sampling_gpu.py -q -p no:cacheprovider -rs > "$OUT/gpu-tests.log" 2>&1
grep -E "^FAILED|passed|failed" "$OUT/gpu-tests.log" | tail -6; echo "checks done at $(( $(date +%s) - T0 )) s"
python3 bench/decode_profile.py --models ANDREA-120M --rows 1 16 --runners ours > "$OUT/decode-profile-120M.md" 2>&1
grep "^## " "$OUT"/decode-profile-*.md; echo "profiles done at $(( $(date +%s) - T0 )) s"
python3 bench/generate_bench.py --rows 1 16 --out "$OUT/generate.json" > "$OUT/generate.log" 2>&1
tail -20 "$OUT/generate.log"; echo "all done at $(( $(date +%s) - T0 )) s"
