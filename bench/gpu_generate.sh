#!/usr/bin/env bash
# Generation on the GPU, in phases that fit device calls:
#
#   bash bench/gpu_generate.sh tests     the decode kernels and the captured step against NumPy, and the GPU backend's tests
#   bash bench/gpu_generate.sh bench     bench/generate_bench.py: ours (graph, eager, the fp32 path) beside PyTorch
#   bash bench/gpu_generate.sh audit [MODEL [STEPS]]
#                                        snakemake results/MODEL/audit (ANDREA-120M after STEPS=200 steps on the
#                                        embedded corpus), audit.backend auto (the GPU), then numpy (the host), timed
#
# Needs the wheels of bench/gpu_real_corpus.sh setup (Snakemake). Results go to $OUT (the device
# tool's output folder; results/device-out elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
case "${1:-}" in
tests)
  python3 -m pytest tests/test_sampling_gpu.py tests/test_gpu_backend.py -q -p no:cacheprovider -x 2>&1 | tee "$OUT/tests.log" | tail -15
  ;;
bench)
  python3 bench/generate_bench.py --rows 1 16 --out "$OUT/generate.json" "${@:2}" 2>&1 | tee "$OUT/generate.log" | tail -20
  ;;
audit)
  [ -d /tmp/site ] || bash bench/gpu_real_corpus.sh setup > /dev/null
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
  MODEL=${2:-ANDREA-120M} STEPS=${3:-200}
  cat > /tmp/train.yaml <<YAML
train:
  $MODEL: {max_steps: $STEPS, eval_every: 0, sample_every: 100000, checkpoint_every: $STEPS}
YAML
  for backend in auto numpy; do
    echo "audit: {backend: $backend}" > /tmp/audit.yaml
    python3 -m snakemake "results/$MODEL/audit" --cores 8 --configfile config/config.yaml /tmp/train.yaml /tmp/audit.yaml \
      --config data_profile=embedded >> "$OUT/audit-snakemake.log" 2>&1 || { tail -40 "$OUT/audit-snakemake.log"; tail -30 "results/logs/audit/$MODEL.log"; exit 1; }
    echo "audit of $MODEL with audit.backend $backend: $(tail -1 "results/benchmarks/audit/$MODEL.tsv" | cut -f1) s (snakemake benchmark)" | tee -a "$OUT/audit.txt"
    cp "results/logs/audit/$MODEL.log" "$OUT/audit-$backend.log"
    cp -r "results/$MODEL/audit" "$OUT/audit-$backend"
  done
  ;;
*)
  echo "usage: $0 tests|bench|audit" >&2; exit 2
  ;;
esac
