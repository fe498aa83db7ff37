#!/usr/bin/env bash
# ANDREA-120M's whole geometry on a GPU (issue 42: ≤ 2 min on one H200, the 21×21 loss surface on
# ≥ 16K held-out tokens included), through the Snakemake command a user types, in one device call:
#
#   source bench/device_env.sh && bash bench/geometry_device.sh      (carry .whl, results/device-site, .device)
#
# 1. data: the real corpus (bench/real_corpus.sh; .device/real-corpus.tar.xz carried, as for
#    bench/study_device.sh), whose held-out documents hold well over 16K tokens at T = 1024; with
#    CORPUS=embedded, the embedded corpus with every docstring of the standard library
#    (sources.repo-docstrings max_docs: null), whose held-out windows at T = 1024 are only 7 (7,168
#    tokens: measured on the device, 2026-12-03), too few for the issue's 16K; tokenizer N = 8192, shards.
# 2. train: ANDREA-120M on the CuPy backend in bf16 for STEPS (600) steps, a checkpoint and a validation
#    every 200, three kept (so the training path has init → 200 → 400 → final).
# 3. geometry: snakemake results/ANDREA-120M/geometry with the shipped geometry settings (21×21 slice
#    on 16,384 held-out tokens, the audit's 8 prompts), timed by the rule's benchmark and by `time`.
#
# Prints the geometry's time by view, the surface's held-out tokens, and whether the path's ends equal
# the run's recorded validation; copies the page, geometry.json, the log and the benchmarks to $OUT
# (the device tool's output folder; results/device-out elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/device-out}
STEPS=${STEPS:-600}
CORES=${CORES:-$(nproc)}
mkdir -p "$OUT" .device
export PYTHONUNBUFFERED=1
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
python3 -c "import cupy; assert cupy.cuda.runtime.getDeviceCount() > 0" || { echo "no CUDA GPU with CuPy here"; exit 1; }

CONF="config/config.yaml"
CORPUS=${CORPUS:-real}
if [ "$CORPUS" = real ]; then
  mkdir -p data
  [ -d data/real ] || tar xJf .device/real-corpus.tar.xz -C data \
    || { echo "no .device/real-corpus.tar.xz (carry it; bench/study_device.sh's header says how to make it)"; exit 1; }
  CONF="$CONF data/real/real-corpus.yaml"
fi
cat > .device/geometry.yaml <<EOF
data_profile: $CORPUS
sources:
  repo-docstrings: {max_docs: null}
train:
  ANDREA-120M: {backend: cupy, precision: bf16, max_steps: $STEPS, checkpoint_every: 200, keep_checkpoints: 3,
                eval_every: 200, sample_every: 100000, lr: 6.0e-4, warmup_steps: 100, curriculum: {warmup_steps: 200}}
EOF
[ "$CORPUS" = real ] && sed -i '/^data_profile:/d' .device/geometry.yaml  # the overlay names its profile
CONF="$CONF .device/geometry.yaml"

start=$(date +%s)
python3 -m snakemake results/ANDREA-120M/ckpt --cores "$CORES" --configfile $CONF > "$OUT/train.log" 2>&1 \
  || { tail -60 "$OUT/train.log"; tail -30 results/logs/train/ANDREA-120M.log 2>/dev/null; exit 1; }
echo "data and training: $(( $(date +%s) - start )) s"
grep -h "plan:\|finished at step" results/logs/train/ANDREA-120M.log | cut -c1-260 || true

start=$(date +%s.%N)
python3 -m snakemake results/ANDREA-120M/geometry --cores "$CORES" --configfile $CONF > "$OUT/geometry-snakemake.log" 2>&1 \
  || { tail -60 "$OUT/geometry-snakemake.log"; tail -40 results/logs/geometry/ANDREA-120M.log; exit 1; }
echo "snakemake results/ANDREA-120M/geometry: $(python3 -c "import time; print(round(time.time() - $start, 1))") s wall"
echo "rule benchmark (s, max_rss MB): $(tail -1 results/benchmarks/geometry/ANDREA-120M.tsv | cut -f1,3)"
cp results/logs/geometry/ANDREA-120M.log results/benchmarks/geometry/ANDREA-120M.tsv "$OUT/"
cp results/ANDREA-120M/geometry/geometry.json results/ANDREA-120M/geometry/geometry.html "$OUT/"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" || true
python3 - <<'PY'
import json
g = json.load(open("results/ANDREA-120M/geometry/geometry.json"))
print("backend:", g["backend"], g["precision"], "| seconds by part:", g["seconds"])
s = g["surface"]
print(f"surface: {len(s['alpha'])}x{len(s['beta'])} on {s['tokens']:,} held-out tokens ({s['windows']} windows), {s['seconds']} s")
for n in g["interpolation"]["nodes"]:
    print(f"  {n['label']:>10}: loss {n['loss']}, recorded {n['recorded_loss']}, difference {n['difference']}")
assert s["tokens"] >= 16384, "fewer than 16K held-out tokens on the surface"
PY
