#!/usr/bin/env bash
# Device call 3 (2026-12-01): attn_decode_store (keys split across warps, cache store fused) and the
# few-rows LayerNorm: checked against NumPy, the GPU decoding tests, then profiled and timed beside PyTorch.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site
T0=$(date +%s)
python3 dev/cuda/decode.py > "$OUT/dev-decode.log" 2>&1; echo "dev decode rc=$?"
python3 dev/cuda/layernorm.py > "$OUT/dev-layernorm.log" 2>&1; echo "dev layernorm rc=$?"
grep -E "attn_decode|rows, 16-bit|vec, 16-bit" "$OUT/dev-decode.log" "$OUT/dev-layernorm.log" | grep -v "^.*edge B=3" | cut -c1-190 | head -40
python3 -m pytest tests/test_sampling_gpu.py tests/test_dev_cuda.py -q -p no:cacheprovider -rs > "$OUT/gpu-tests.log" 2>&1
tail -3 "$OUT/gpu-tests.log"; echo "checks done at $(( $(date +%s) - T0 )) s"
python3 bench/decode_profile.py --models ANDREA-120M --rows 1 16 --runners ours > "$OUT/decode-profile-120M.md" 2>&1
python3 bench/decode_profile.py --models ANDREA-12M --rows 1 --runners ours > "$OUT/decode-profile-12M.md" 2>&1
grep "^## " "$OUT"/decode-profile-*.md; echo "profiles done at $(( $(date +%s) - T0 )) s"
python3 bench/generate_bench.py --rows 1 16 --out "$OUT/generate.json" > "$OUT/generate.log" 2>&1
tail -20 "$OUT/generate.log"; echo "all done at $(( $(date +%s) - T0 )) s"
