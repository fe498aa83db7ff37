#!/usr/bin/env bash
# Data parallelism on a GPU machine with 2 (or more) GPUs, in phases that fit device calls:
#
#   bash bench/gpu_data_parallel.sh tests      NCCL communicator and data-parallel training tests
#   bash bench/gpu_data_parallel.sh scaling    bench/allreduce_bench.py and bench/dp_scaling.py (1 vs 2 GPUs)
#   bash bench/gpu_data_parallel.sh workflow [RANKS [TARGET]]
#                                               snakemake results/ANDREA-12M/TARGET (ckpt) with ranks: RANKS (2),
#                                               embedded corpus
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
*)
  echo "usage: $0 tests|scaling|workflow" >&2; exit 2
  ;;
esac
