#!/usr/bin/env bash
# The full-size rehearsal of the real profile on the GPU device (issue 40, item 7), in one call of the
# device tool (10 minutes), with calls after it where the work outlasts one:
#
#   bash bench/real_scale_device.sh [FRACTION [MAX_STEPS]]   start it (default 1.0 and 200), wait, collect
#   bash bench/real_scale_device.sh wait                      a later call: wait for the same run, collect
#
# Starting it: the wheels onto the path (bench/device_env.sh), the real corpus unpacked from
# .device/real-corpus.tar.xz, then in the background (setsid: it outlives the call) bench/real_scale.py:
# replicas of the real profile's datasets at FRACTION of their rows (1.0: ~2.7M documents, ~5 GB),
# `andrea data fetch --profile real` from them, `snakemake results/ANDREA-120M/shards.json` on every
# core with each stage's time and peak memory, then `snakemake results/ANDREA-120M/ckpt` with
# max_steps MAX_STEPS (a train overlay: the 2.7M-document data path meets the trainer once).
# The call waits until the run ends or its time is nearly up (WAIT_S, default 560 s), then copies
# into $OUT: real_scale.json and .md (the measurements), the run's log, Snakemake's logs of both
# phases, the stage logs (a tarball) and the train log; a run still going says so and leaves them
# for `wait`.
#
# EXTRA_CONFIG=FILE adds a config overlay (e.g. a small batch for a test on a CPU). WORK (default
# /tmp/andrea-real-scale) holds the replicas, the fetched copy and the results (~25 GB at 1.0).
#
# Carry (the device tool's `carry`): .whl (../shared/tools/device_wheels.sh), results/device-site
# (bash bench/device_site.sh: wordfreq, which the trainer's coherence score reads) and
# .device/real-corpus.tar.xz, built where there is network:
#   bash bench/real_corpus.sh data/real && mkdir -p .device && tar cJf .device/real-corpus.tar.xz -C data real
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/device-out}
WORK=${WORK:-/tmp/andrea-real-scale}
WAIT_S=${WAIT_S:-560}
mkdir -p "$OUT" "$WORK"
start=$(date +%s)
# The wheels go on the path when starting only: reinstalling them under a running Snakemake could pull a
# module from under it (DEVICE_ENV=0: a machine that has the packages, e.g. a CPU test with the venv on PATH)
[ "${DEVICE_ENV:-1}" = 0 ] || [ "${1:-}" = wait ] || source bench/device_env.sh

collect() {  # what the run has written so far, into $OUT (at most 8 files come back)
  cp "$WORK"/real_scale.json "$WORK"/real_scale.md "$WORK"/run.log "$OUT"/ 2>/dev/null
  for f in "$WORK"/f*/; do
    [ -d "$f" ] || continue
    cp "$f"snakemake.log "$OUT"/snakemake-data.log 2>/dev/null
    cp "$f"snakemake-then.log "$OUT"/snakemake-train.log 2>/dev/null
    [ -d "$f"results/logs ] && tar czf "$OUT"/stage-logs.tgz -C "$f"results logs benchmarks 2>/dev/null
    run=$(ls -d "$f"results/ANDREA-120M/runs/*/ 2>/dev/null | tail -1)
    [ -n "$run" ] && cp "$run"train.log "$OUT"/train.log 2>/dev/null
  done
  ls -la "$OUT"
}

if [ "${1:-}" != wait ]; then
  FRACTION=${1:-1.0} STEPS=${2:-200}
  python3 -c "import snakemake, datasets, pyarrow, wordfreq" || { echo "the carried wheels do not import (see above)"; exit 1; }
  rm -rf "$WORK"/* && mkdir -p "$WORK/corpus"
  tar xJf .device/real-corpus.tar.xz -C "$WORK/corpus" || { echo "no .device/real-corpus.tar.xz (carry it; see the header)"; exit 1; }
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  echo "$(nproc) cores, $(free -g | awk '/Mem/{print $2}') GiB, $(df -h /tmp | awk 'NR==2{print $4}') free on /tmp"
  setsid nohup bash -c "python3 bench/real_scale.py --fraction $FRACTION --cores $(nproc) --workdir $WORK \
      --corpus $WORK/corpus/real --then results/ANDREA-120M/ckpt --train-steps $STEPS ${EXTRA_CONFIG:+--configfile $EXTRA_CONFIG}; echo \"exit \$?\" > $WORK/EXIT" \
      > "$WORK/run.log" 2>&1 < /dev/null &
  echo "started: fraction $FRACTION, max_steps $STEPS; log $WORK/run.log"
fi

while [ ! -f "$WORK/EXIT" ] && [ $(( $(date +%s) - start )) -lt "$WAIT_S" ]; do sleep 5; done
cat "$WORK/run.log" | grep -v "^\s*$" | tail -40
collect
if [ -f "$WORK/EXIT" ]; then
  echo "finished: $(cat "$WORK/EXIT")"; grep -q "exit 0" "$WORK/EXIT"
else
  echo "still running after $(( $(date +%s) - start )) s: call 'bash bench/real_scale_device.sh wait' (the same machine, while it is warm)"
fi
