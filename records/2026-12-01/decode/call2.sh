#!/usr/bin/env bash
# Device call 2 (2026-12-01): where a decoded token's time goes, ours and PyTorch compiled; generation speed now.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site
T0=$(date +%s)
python3 bench/decode_profile.py --models ANDREA-120M --rows 1 16 > "$OUT/decode-profile-120M.md" 2>&1
python3 bench/decode_profile.py --models ANDREA-12M --rows 1 > "$OUT/decode-profile-12M.md" 2>&1
grep "^## " "$OUT"/decode-profile-*.md; echo "profiles done at $(( $(date +%s) - T0 )) s"
python3 bench/generate_bench.py --rows 1 16 --out "$OUT/generate.json" > "$OUT/generate.log" 2>&1
tail -20 "$OUT/generate.log"; echo "all done at $(( $(date +%s) - T0 )) s"
