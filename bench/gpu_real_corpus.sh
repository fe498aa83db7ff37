#!/usr/bin/env bash
# The recorded real-corpus run of ANDREA-12M and ANDREA-120M on a GPU machine, through the exact
# Snakemake command a user types, in phases that fit separate calls of ten minutes:
#
#   bash bench/gpu_real_corpus.sh setup            wheels (.whl, from ../shared/tools/device_wheels.sh) and
#                                                  the corpus (.device/real-corpus.tar.xz, from bench/real_corpus.sh)
#   bash bench/gpu_real_corpus.sh data             data stages, tokenizers and shards of both models
#   bash bench/gpu_real_corpus.sh train MODEL N    snakemake results/MODEL/audit with max_steps N
#                                                  (PRECISION=fp8 in the environment: trained in fp8)
#   bash bench/gpu_real_corpus.sh parity MODEL     bench/loss_parity.py on that run's first recorded batches
#
# Results are packed into $OUT (the device tool's output folder; results/device-out elsewhere).
# The config: config/config.yaml, the corpus overlay (.device/real/real-corpus.yaml: its data profile,
# real-corpus, for every model) and
# .device/gpu.yaml (written here: max_steps, a shorter curriculum warm-up for a minutes-long run,
# the first 300 batches recorded for the parity check).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
CONF="config/config.yaml .device/real/real-corpus.yaml .device/gpu.yaml"
CORES=${CORES:-$(nproc)}

gpu_yaml() {  # max_steps per model: $1 for 12M, $2 for 120M; PRECISION (e.g. fp8) for both where set
  local p=${PRECISION:+, precision: $PRECISION}
  cat > .device/gpu.yaml <<EOF
train:
  ANDREA-12M: {max_steps: $1, record_batches: 300, curriculum: {warmup_steps: 3000}$p}
  ANDREA-120M: {max_steps: $2, record_batches: 300, curriculum: {warmup_steps: 3000}$p}
EOF
}

case "${1:-}" in
setup)
  source bench/device_env.sh  # the wheels into /tmp/site, with results/device-site (wordfreq)
  tar xJf .device/real-corpus.tar.xz  # always: an older overlay left on a warm machine would be kept
  [ -f .device/gpu.yaml ] || gpu_yaml 1000 1000
  echo "setup done: $(ls .device/real)"
  ;;
data)
  python3 -m snakemake results/ANDREA-12M/shards.json results/ANDREA-120M/shards.json --cores "$CORES" --configfile $CONF \
    > "$OUT/data.log" 2>&1 || { tail -40 "$OUT/data.log"; exit 1; }
  for f in results/benchmarks/*/*.tsv; do echo "$f: $(tail -1 "$f" | cut -f1)"; done
  python3 - <<'PY'
import json
for m in ("ANDREA-12M", "ANDREA-120M"):
    s = json.load(open(f"results/{m}/shards.json"))
    print(m, {k: (v["n_docs"], v["n_tokens"]) for k, v in s["sources"].items()})
PY
  ;;
train)
  MODEL=$2
  if [ "$MODEL" = ANDREA-12M ]; then gpu_yaml "$3" "$(grep -o 'ANDREA-120M: {max_steps: [0-9]*' .device/gpu.yaml | grep -o '[0-9]*$')"
  else gpu_yaml "$(grep -o 'ANDREA-12M: {max_steps: [0-9]*' .device/gpu.yaml | grep -o '[0-9]*$')" "$3"; fi
  start=$(date +%s)
  python3 -m snakemake "results/$MODEL/audit" --cores 4 --configfile $CONF > "$OUT/snakemake-$MODEL.log" 2>&1 \
    || { tail -60 "$OUT/snakemake-$MODEL.log"; tail -30 "results/logs/train/$MODEL.log"; exit 1; }
  echo "snakemake results/$MODEL/audit: $(( $(date +%s) - start )) s"
  run=$(python3 -c "import json; print(json.load(open('results/$MODEL/ckpt/run.json'))['run_dir'])")
  grep -h "plan:\|finished at\|validation at step" "$run/train.log" | cut -c1-400 | sed -n '1,3p;$p'
  python3 - "$run" "$MODEL" <<'PY'
import json, statistics, sys
run, model = sys.argv[1], sys.argv[2]
recs = [json.loads(l) for l in open(f"{run}/loss.jsonl")]
tr = [r for r in recs if r.get("kind", "train") == "train"]
ev = [r for r in recs if r.get("kind") == "eval"]
plan = json.load(open(f"{run}/plan.json"))
print(f"{model}: {len(tr)} steps, median {statistics.median(r['tokens_per_s'] for r in (tr[20:] or tr)):,.0f} tokens/s, "
      f"loss {tr[0]['loss']:.3f} -> {tr[-1]['ema']:.3f}; plan estimate {plan['estimated_remaining_s']:.0f} s, "
      f"actual {plan.get('actual_remaining_s', float('nan')):.0f} s")
for e in ev[:: max(1, len(ev) // 6)] + ev[-1:]:
    print(f"  eval step {e['step']}: {e['loss']:.4f} nats/token, {e['bpb']:.4f} bits/byte "
          + " ".join(f"{k}={v['bpb']:.3f}" for k, v in e["sources"].items()))
print(json.dumps(json.load(open(f"results/{model}/audit/summary.json")), indent=1))
for s in [json.loads(l) for l in open(f"results/{model}/audit/samples.jsonl")][:4]:
    print("---", s["domain"], "|", s["prompt"], "| coherence", s["coherence"]); print(s["text"][:400])
PY
  tar czf "$OUT/run-$MODEL.tgz" "$run"/{plan.json,state.json,loss.jsonl,samples.jsonl,train.log} "results/$MODEL/audit" \
    "results/$MODEL/ckpt/run.json" "results/logs/train/$MODEL.log" "$OUT/snakemake-$MODEL.log" 2>/dev/null || true
  ls -la "$OUT"
  ;;
parity)
  MODEL=$2
  run=$(python3 -c "import json; print(json.load(open('results/$MODEL/ckpt/run.json'))['run_dir'])")
  python3 bench/loss_parity.py "$run" --out "$OUT/parity-$MODEL" 2>&1 | tail -50
  ;;
*)
  sed -n '2,16p' "$0"
  exit 2
  ;;
esac
