#!/usr/bin/env bash
# Build results/device-site: the pure-Python packages the device image lacks beyond Snakemake's wheels
# (../shared/tools/device_wheels.sh, in .whl/): wordfreq and its needs, for the coherence score that the
# trainer's samples, the audit and the sampling tests compute. wordfreq ships word lists for 40
# languages (58 MB installed); only English's stay (andrea.coherence.DEFAULT_LANGUAGES), so the folder
# fits the device tool's 64 MiB carry beside .whl/. Run from the repository root, with network; then
# carry "results/device-site" and source bench/device_env.sh at the top of the call.
set -euo pipefail
site=results/device-site
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
need="wordfreq ftfy langcodes locate msgpack regex wcwidth"  # wordfreq 3.1 and what it needs (ftfy: wcwidth)
# the versions the tests pin (constraints.txt), as wheels for the device's Python 3.12 on x86-64 Linux
mapfile -t reqs < <(grep -iE "^(${need// /|})==" constraints.txt)
if [ "${#reqs[@]}" -ne "$(wc -w <<< "$need")" ]; then
  echo "device_site: constraints.txt pins ${reqs[*]:-none} of $need" >&2
  exit 1
fi
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$tmp/whl" "${reqs[@]}"
# a wheel is a zip of its site-packages tree: unpacked, as pip --target would (pip here refuses cp312)
for w in "$tmp"/whl/*.whl; do python3 -m zipfile -e "$w" "$tmp/site"; done
find "$tmp/site/wordfreq/data" -type f ! -name '*_en.*' -delete
mkdir -p results
rm -rf "$site.tmp" && mv "$tmp/site" "$site.tmp" && rm -rf "$site" && mv "$site.tmp" "$site"
du -sh "$site"
