#!/usr/bin/env bash
# Issue 41's curriculum study on the GPU device: `snakemake study_<name>` on the real corpus, every arm ×
# seed a training run, several sharing the one GPU (--resources gpu_share), in calls of ten minutes:
#
#   bash bench/study_device.sh start     setup, data stages, then the study in the background (setsid: it
#                                        outlives the call); waits until it ends or WAIT_S, collects
#   bash bench/study_device.sh wait      a later call on the same machine while it is warm: waits, collects
#   bash bench/study_device.sh status    what is done so far, without waiting
#
# A call that finds no study running and the study not finished (a fresh machine, or one stopped) starts it
# again: runs already finished on this machine are kept (Snakemake skips them), stopped ones resume from
# their last checkpoint (a fresh machine has neither: it starts over).
#
# Environment:
#   STUDY      the study in config/config.yaml (default curriculum-12M: ANDREA-12M, 8 arms x 3 seeds,
#              50M tokens; curriculum-120M: ANDREA-120M, 2 seeds)
#   SEEDS      e.g. "0 1 2" (default: the study's)    TOKENS  e.g. 50000000 (default: the study's)
#   ARMS       a subset of the study's arms, e.g. "bandit flat proportional uniform fixed exp3-loss
#              heldout-progress" (default: all); with ARMS the study runs as <STUDY>-subset
#   GPU_SHARE  runs at once on the GPU (default 4)    CORES  (default: all)    WAIT_S  (default 540)
#   WORK       the study's state between calls (default /tmp/andrea-study-<name>; its overlay: .device/study-<name>.yaml)
#   EXTRA_CONFIG  a config overlay read after the corpus's (e.g. a study of ANDREA-tiny to try the script on
#              a CPU: DEVICE_ENV=0 STUDY=<its name> EXTRA_CONFIG=FILE bash bench/study_device.sh start)
#
# Measured (BENCHMARKS.md, 2026-12-03, one H200, 16 cores): curriculum-12M with 6 arms x 3 seeds, 51.2M
# tokens a run: data stages 41 s, then the 18 runs in 7 min 12 s with GPU_SHARE=4 (a run 92-99 s while
# four share the GPU; 46-52 s for the last two, sharing it with each other): the whole 8-arm study is ~10 min, two calls. Not yet
# measured: ANDREA-120M (~470-600K tokens/s alone, so ~90-110 s a 51M-token run; 16 runs ~25 min).
#
# Carry (the device tool's `carry`): .whl (../shared/tools/device_wheels.sh), results/device-site (bash
# bench/device_site.sh: wordfreq) and .device/real-corpus.tar.xz (bash bench/real_corpus.sh data/real &&
# mkdir -p .device && tar cJf .device/real-corpus.tar.xz -C data real).
#
# Back in $OUT (at most 8 files): progress.txt, snakemake.log, and once the study is done table.md,
# curves.png, study.tgz (results/studies/<name>/: table, summary.json with every run's validation curve,
# plots, report.html; each run's train.log, plan.json, run.json; the benchmark files) and loss-logs.tgz
# (every run's loss.jsonl).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/device-out}
WAIT_S=${WAIT_S:-540}
CORES=${CORES:-$(nproc)}
GPU_SHARE=${GPU_SHARE:-4}
STUDY=${STUDY:-curriculum-12M}
NAME=$STUDY
[ -n "${ARMS:-}" ] && NAME="$STUDY-subset"
# each study its own state and overlay, so that `wait` or `status` of one never reads another's
WORK=${WORK:-/tmp/andrea-study-$NAME}
OVERLAY=.device/study-$NAME.yaml
BASE="config/config.yaml data/real/real-corpus.yaml ${EXTRA_CONFIG:-}"
CONF="$BASE $OVERLAY"
mkdir -p "$OUT" "$WORK"
start=$(date +%s)
TARGET="study_$(echo "$NAME" | sed 's/[^A-Za-z0-9_]/_/g')"
running() { [ -f "$WORK/pid" ] && kill -0 "$(cat "$WORK/pid")" 2>/dev/null; }
# the wheels go on the path before a study starts only: reinstalling them under a running Snakemake could
# pull a module from under it (DEVICE_ENV=0: a machine that has the packages already)
if [ "${1:-}" != status ] && [ "${DEVICE_ENV:-1}" != 0 ] && ! running; then source bench/device_env.sh; fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0

# the corpus's overlay is read by every command (status and wait too): a later call's fresh copy of the
# working tree may lack the data/ the first call unpacked (seen on the device, 2026-12-03)
mkdir -p data .device
[ -d data/real ] || tar xJf .device/real-corpus.tar.xz -C data || { echo "no .device/real-corpus.tar.xz (carry it; see the header)"; exit 1; }
# the same for the study's overlay: a later call's .device is the carried one, without the overlay the
# first call wrote (seen on the device, 2026-12-03: `wait` stopped in progress() on a KeyError); it is
# kept beside the run's state in $WORK and put back
[ -f "$OVERLAY" ] || [ ! -f "$WORK/study.yaml" ] || cp "$WORK/study.yaml" "$OVERLAY"

# the merged config of the call (the files in order, as Snakemake merges --configfile), as JSON
merged() {
  python3 - "$OVERLAY" $CONF <<'PY'
import json, os, sys
from andrea.config import deep_merge, read_config_file
raw = {}
for f in sys.argv[2:]:
    if os.path.exists(f) or f != sys.argv[1]:  # the study's overlay: once overlay() wrote it
        raw = deep_merge(raw, read_config_file(f))
print(json.dumps(raw))
PY
}

overlay() {  # $OVERLAY: the study as the environment asks (seeds, tokens, a subset of its arms)
  rm -f "$OVERLAY"
  merged > "$WORK/config.json" || return 1
  python3 - "$STUDY" "$NAME" "${SEEDS:-}" "${TOKENS:-}" "${ARMS:-}" "$WORK/config.json" "$OVERLAY" <<'PY'
import json, os, sys, yaml
from andrea.config import validate_config
study, name, seeds, tokens, arms, merged, overlay = sys.argv[1:]
cfg = validate_config(json.load(open(merged)))
if study not in cfg["studies"]:
    sys.exit(f"no study {study!r} in the config ({', '.join(cfg['studies'])})")
st = {k: v for k, v in cfg["studies"][study].items() if v is not None}
if seeds:
    st["seeds"] = [int(s) for s in seeds.split()]
if tokens:
    st["tokens"] = int(tokens)
if arms:
    missing = [a for a in arms.split() if a not in st["arms"]]
    if missing:
        sys.exit(f"study {study} has no arm {', '.join(missing)} (its arms: {', '.join(st['arms'])})")
    st["arms"] = {a: st["arms"][a] for a in arms.split()}
with open(overlay + ".tmp", "w") as f:  # renamed into place: a killed run leaves no half overlay
    yaml.safe_dump({"studies": {name: st}}, f, sort_keys=False)
os.replace(overlay + ".tmp", overlay)
print(f"study {name}: {cfg['studies'][study]['model']}, {len(st['arms'])} arms x {len(st['seeds'])} seeds, {st['tokens']:,} tokens")
PY
}

progress() {  # every run's state: steps done, its last validation, its wall time
  merged > "$WORK/config.json" || return 1
  python3 - "$NAME" "$WORK/config.json" > "$OUT/progress.txt" <<'PY'
import glob, json, os, sys
from andrea.config import study_max_steps, validate_config
name = sys.argv[1]
cfg = validate_config(json.load(open(sys.argv[2])))
st = cfg["studies"][name]
total = study_max_steps(cfg, name)
done = 0
for arm in st["arms"]:
    for seed in st["seeds"]:
        base = f"results/studies/{name}/runs/{arm}/seed{seed}"
        runs = sorted(glob.glob(f"{base}/*/loss.jsonl"), key=os.path.getmtime)
        line = f"{arm:18s} seed {seed}: "
        if not runs:
            print(line + "not started"); continue
        steps, last = 0, None
        for l in open(runs[-1]):
            if '"kind": "eval"' in l:
                last = json.loads(l)
            elif '"kind"' not in l:
                steps += 1
        bench = f"results/benchmarks/study_train/{name}/{arm}/seed{seed}.tsv"
        wall = open(bench).read().splitlines()[-1].split("\t")[0] if os.path.exists(bench) else "-"
        finished = os.path.exists(f"{base}/ckpt/run.json")
        done += finished
        srcs = {k: v["bpb"] for k, v in (last or {}).get("sources", {}).items() if v.get("bpb")}
        mean = sum(srcs.values()) / len(srcs) if srcs else float("nan")
        print(line + f"{'done' if finished else 'running'} {steps}/{total} steps, wall {wall} s, "
              f"last validation step {last['step'] if last else '-'} mean over sources {mean:.4f} "
              f"overall {last['bpb'] if last else '-'}")
print(f"{done} of {len(st['arms']) * len(st['seeds'])} runs done")
PY
  cat "$OUT/progress.txt"
}

collect() {
  cp "$WORK/snakemake.log" "$OUT/snakemake.log" 2>/dev/null
  progress
  local d="results/studies/$NAME"
  if [ -f "$d/report.html" ]; then
    cp "$d/table.md" "$d/curves.png" "$OUT/"
    tar czf "$OUT/study.tgz" "$d"/*.md "$d"/*.json "$d"/*.png "$d"/*.html \
      $(ls "$d"/runs/*/seed*/*/train.log "$d"/runs/*/seed*/*/plan.json "$d"/runs/*/seed*/ckpt/run.json 2>/dev/null) \
      results/benchmarks/study_train results/logs/study_train "$OVERLAY" 2>/dev/null
    tar czf "$OUT/loss-logs.tgz" $(ls "$d"/runs/*/seed*/*/loss.jsonl) 2>/dev/null
  fi
  ls -la "$OUT"
}

case "${1:-}" in
start | wait)
  if ! running && [ ! -f "results/studies/$NAME/report.html" ]; then
    python3 -c "import snakemake, wordfreq" || { echo "snakemake or wordfreq does not import (carry .whl and results/device-site)"; exit 1; }
    overlay || exit 1
    cp "$OVERLAY" "$WORK/study.yaml"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "no GPU (nvidia-smi)"
    echo "$CORES cores; study $NAME: snakemake $TARGET --resources gpu_share=$GPU_SHARE"
    rm -f "$WORK/EXIT"
    # the data stages in the foreground (every core), timed; then the study's runs in the background
    t0=$(date +%s)
    model=$(python3 -c "import yaml; print(list(yaml.safe_load(open('$OVERLAY'))['studies'].values())[0]['model'])")
    python3 -m snakemake "results/$model/shards.json" --cores "$CORES" --configfile $CONF > "$WORK/data.log" 2>&1 \
      || { tail -40 "$WORK/data.log"; exit 1; }
    echo "data stages: $(( $(date +%s) - t0 )) s"
    # each run's threads: the cores shared out (a GPU run needs few), so that GPU_SHARE runs fit in CORES
    per_run=$(( CORES / GPU_SHARE > 0 ? CORES / GPU_SHARE : 1 ))
    setsid nohup bash -c "python3 -m snakemake $TARGET --cores $CORES --resources gpu_share=$GPU_SHARE --keep-going \
        --set-threads study_train=$per_run --configfile $CONF; echo \"exit \$?\" > $WORK/EXIT" \
        > "$WORK/snakemake.log" 2>&1 < /dev/null &
    echo $! > "$WORK/pid"
    echo "started the study at $(( $(date +%s) - start )) s into the call"
  fi
  while running && [ ! -f "$WORK/EXIT" ] && [ $(( $(date +%s) - start )) -lt "$WAIT_S" ]; do sleep 10; done
  grep -v "^\s*$" "$WORK/snakemake.log" | grep -E "Finished|Error|error|steps \(" | tail -12
  collect
  if [ -f "results/studies/$NAME/report.html" ]; then
    echo "finished: $(cat "$WORK/EXIT" 2>/dev/null)"; sed -n '/^## Validation/,/^## Per source/p' "results/studies/$NAME/table.md"
    grep "^Verdict" "results/studies/$NAME/table.md"
  elif running; then
    echo "still running after $(( $(date +%s) - start )) s: call 'bash bench/study_device.sh wait' (same environment) while the machine is warm"
  else
    echo "the study stopped without its report: $(cat "$WORK/EXIT" 2>/dev/null); see snakemake.log"; exit 1
  fi
  ;;
status)
  collect
  ;;
*)
  sed -n '2,42p' "$0"
  exit 2
  ;;
esac
