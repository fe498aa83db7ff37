#!/usr/bin/env bash
# Data parallelism on a GPU machine with 2 (or more) GPUs, in phases that fit device calls:
#
#   bash bench/gpu_data_parallel.sh tests      NCCL communicator and data-parallel training tests
#   bash bench/gpu_data_parallel.sh scaling    bench/allreduce_bench.py and bench/dp_scaling.py (1 vs 2 GPUs)
#   bash bench/gpu_data_parallel.sh workflow [RANKS [TARGET]]
#                                               snakemake results/ANDREA-12M/TARGET (ckpt) with ranks: RANKS (2),
#                                               embedded corpus
#   bash bench/gpu_data_parallel.sh signal-resume [MODEL [FIRST [THEN [STOP [STEPS]]]]]
#                                               the Snakemake train rule with ranks FIRST (4), SIGTERM to its training
#                                               script after STOP (300) logged steps, then ranks THEN (2): the run
#                                               resumes from the signal's checkpoint and reaches STEPS (1200)
#   bash bench/gpu_data_parallel.sh rule-scaling [MODEL [STEPS]]
#                                               the Snakemake train rule, 1 rank then 2: MODEL (ANDREA-120M)
#                                               trains STEPS (200) steps on one GPU, then max_steps is raised
#                                               and the same run continues on two; at per-GPU B=8 and B=32.
#                                               Median tokens/s of each stretch from the run's loss.jsonl
#
# Needs the wheels of bench/gpu_real_corpus.sh setup (Snakemake, jsonschema: the tests' fixtures
# load the config). Results go to $OUT (the device tool's output folder; results/device-out elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
[ -d /tmp/site ] || bash bench/gpu_real_corpus.sh setup > /dev/null
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
case "${1:-}" in
tests)
  python3 -m pytest tests/test_comm_gpu.py tests/test_data_parallel_gpu.py -q -p no:cacheprovider -x 2>&1 | tee "$OUT/tests.log" | tail -30
  ;;
scaling)
  python3 -c "from andrea.comm import mpirun_command; import sys; print(' '.join(mpirun_command(2, [sys.executable, 'bench/allreduce_bench.py', '--out', '$OUT/allreduce.json'])))" > /tmp/ar.sh
  bash /tmp/ar.sh 2>&1 | tail -20
  python3 bench/dp_scaling.py --gpus 1 2 --batches 8 32 --bucket-mb ${BUCKETS:-25} --out "$OUT/dp_scaling.json" 2>&1 | tee "$OUT/dp_scaling.log" | tail -12
  ;;
workflow)
  RANKS=${2:-2} TARGET=${3:-ckpt}
  cat > /tmp/dp.yaml <<YAML
train:
  ANDREA-12M: {ranks: $RANKS, max_steps: 300, eval_every: 100, sample_every: 100, checkpoint_every: 100, batch_size: 8}
YAML
  start=$(date +%s)
  python3 -m snakemake "results/ANDREA-12M/$TARGET" --cores 8 --configfile config/config.yaml /tmp/dp.yaml --config data_profile=embedded \
    > "$OUT/snakemake.log" 2>&1 || { tail -40 "$OUT/snakemake.log"; tail -30 results/logs/train/ANDREA-12M.log; exit 1; }
  echo "snakemake results/ANDREA-12M/$TARGET with ranks $RANKS: $(( $(date +%s) - start )) s"
  for f in results/benchmarks/*/ANDREA-12M.tsv; do echo "$f: $(tail -1 "$f" | cut -f1) s"; done
  run=$(python3 -c "import json; print(json.load(open('results/ANDREA-12M/ckpt/run.json'))['run_dir'])")
  grep -h "plan:\|finished at\|validation at step" "$run/train.log" | cut -c1-300 | sed -n '1,2p;$p'
  cp "$run/plan.json" "$run/train.log" "$OUT/"
  ;;
rule-scaling)
  MODEL=${2:-ANDREA-120M} STEPS=${3:-200}
  for B in 8 32; do
    for RANKS in 1 2; do
      cat > /tmp/dp.yaml <<YAML
train:
  $MODEL: {ranks: $RANKS, batch_size: $B, max_steps: $(( STEPS * RANKS )), eval_every: 0, sample_every: 100000, checkpoint_every: $STEPS}
YAML
      start=$(date +%s)
      python3 -m snakemake "results/$MODEL/ckpt" --cores 8 --configfile config/config.yaml /tmp/dp.yaml --config data_profile=embedded \
        >> "$OUT/rule-scaling.log" 2>&1 || { tail -40 "$OUT/rule-scaling.log"; tail -30 "results/logs/train/$MODEL.log"; exit 1; }
      run=$(python3 -c "import json; print(json.load(open('results/$MODEL/ckpt/run.json'))['run_dir'])")
      python3 - "$run/loss.jsonl" "$B" "$RANKS" "$STEPS" "$(( $(date +%s) - start ))" <<'PY' | tee -a "$OUT/rule-scaling.txt"
import sys
from statistics import median
from andrea.runlog import read_records
path, B, ranks, steps, wall = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
lo = (ranks - 1) * steps + 20  # this stretch, after its first 20 steps (warm-up, capture)
tps = [r["tokens_per_s"] for r in read_records(path) if r.get("kind", "train") == "train" and lo <= r["step"] < ranks * steps]
print(f"per-GPU B={B} ranks={ranks}: steps {lo}-{ranks * steps - 1}: median {median(tps):,.0f} tokens/s "
      f"(n={len(tps)}; snakemake call {wall} s)")
PY
    done
    grep -h "plan:" "$run/train.log" | cut -c1-260 | tail -2 >> "$OUT/rule-scaling.txt"
    cp "$run/train.log" "$OUT/train-B$B.log"
  done
  ;;
signal-resume)
  # snakemake results/MODEL/ckpt with ranks FIRST; SIGTERM to the rule's training script once STOP
  # steps are logged (as a scheduler's preemption would); then the same target with ranks THEN:
  # the run resumes from the checkpoint the signal left and finishes
  MODEL=${2:-ANDREA-120M} FIRST=${3:-4} THEN=${4:-2} STOP=${5:-300} STEPS=${6:-1200}
  for RANKS in $FIRST $THEN; do
    cat > /tmp/dp.yaml <<YAML
train:
  $MODEL: {ranks: $RANKS, batch_size: 8, max_steps: $STEPS, eval_every: 0, sample_every: 100000, checkpoint_every: 500}
YAML
    python3 -m snakemake "results/$MODEL/ckpt" --cores 8 --configfile config/config.yaml /tmp/dp.yaml --config data_profile=embedded \
      >> "$OUT/signal-resume.log" 2>&1 &
    sm=$!
    if [ "$RANKS" = "$FIRST" ]; then
      until compgen -G "results/$MODEL/runs/*/loss.jsonl" >/dev/null && \
            [ "$(cat results/$MODEL/runs/*/loss.jsonl | wc -l)" -ge "$STOP" ]; do sleep 0.5; kill -0 $sm || break; done
      pkill -TERM -f "scripts/tmp.*train.py" && echo "SIGTERM sent at $(cat results/$MODEL/runs/*/loss.jsonl | wc -l) logged steps"
    fi
    wait $sm && echo "snakemake with ranks $RANKS: exit 0" || echo "snakemake with ranks $RANKS: exit $?"
  done
  run=$(python3 -c "import json; print(json.load(open('results/$MODEL/ckpt/run.json'))['run_dir'])")
  grep -hE "plan:|resumed|stopped|signal|finished" "$run/train.log" | cut -c1-240 | tee "$OUT/signal-resume.txt"
  cp "$run/train.log" "$OUT/signal-resume-train.log"
  ;;
*)
  echo "usage: $0 tests|scaling|workflow|rule-scaling|signal-resume" >&2; exit 2
  ;;
esac
