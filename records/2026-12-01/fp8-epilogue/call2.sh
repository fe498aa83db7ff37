#!/usr/bin/env bash
# Device call 2 (2026-12-01): the workflow a user runs, on the real corpus (bench/real_corpus.sh, carried
# as .device/real-corpus.tar.xz): the data stages through ANDREA-120M's shards, then training in bf16
# at B=32 (the GELU output kept: auto) through `snakemake results/ANDREA-120M/ckpt`, 1,200 steps
# uninterrupted, and again stopped by SIGTERM to the trainer at ~600 logged lines and resumed through
# `snakemake resB/ANDREA-120M/audit` (bench/gpu_fp8_resume.sh): the losses must agree step for step.
# Then the resumed run's curve, speed, audit and samples. Then dev/cuda/fp8.py (the casts' counts from
# packed bytes) and the fp8 GPU tests (the mended ones).
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
bash bench/gpu_real_corpus.sh setup > "$OUT/setup.log" 2>&1; echo "setup rc=$? ($(( $(date +%s) - T0 )) s)"
cp -r results/device-site/* /tmp/site/
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
CORPUS=real PRECISION=bf16 BATCH=32 STEPS=1200 STOP=600 TARGET=audit timeout 450 bash bench/gpu_fp8_resume.sh
echo "workflow done at $(( $(date +%s) - T0 )) s"
grep -E "rule |Finished|Error|error" "$OUT/data.log" | grep -v "^$" | sort | uniq -c | head -20
python3 - <<'PY'
import glob, json, statistics
(run,) = glob.glob("resB/ANDREA-120M/runs/*/")
recs = [json.loads(l) for l in open(f"{run}/loss.jsonl")]
tr = [r for r in recs if r.get("kind", "train") == "train"]
ev = [r for r in recs if r.get("kind") == "eval"]
print(f"resumed run: {len(tr)} steps, median {statistics.median(r['tokens_per_s'] for r in tr[20:]):,.0f} tokens/s, "
      f"loss {tr[0]['loss']:.3f} -> EMA {tr[-1]['ema']:.3f}")
for e in ev:
    print(f"  eval step {e['step']}: {e['loss']:.4f} nats/token, {e['bpb']:.4f} bits/byte "
          + " ".join(f"{k}={v['bpb']:.3f}" for k, v in e["sources"].items()))
print(json.dumps(json.load(open("resB/ANDREA-120M/audit/summary.json")), indent=1)[:1500])
for s in [json.loads(l) for l in open("resB/ANDREA-120M/audit/samples.jsonl")][:4]:
    print("---", s["domain"], "|", s["prompt"], "| coherence", s["coherence"]); print(s["text"][:300])
PY
run=$(ls -d resB/ANDREA-120M/runs/*/ | head -1)
tar czf "$OUT/run-resB.tgz" "$run"/{plan.json,state.json,loss.jsonl,samples.jsonl,train.log} resB/ANDREA-120M/audit 2>/dev/null
echo "summary done at $(( $(date +%s) - T0 )) s"
timeout $(( 500 - ($(date +%s) - T0) )) python3 dev/cuda/fp8.py > "$OUT/dev-fp8.log" 2>&1; echo "dev fp8 rc=$? $(tail -n 2 "$OUT/dev-fp8.log" | head -1)"
grep -E "FAIL|rror" "$OUT/dev-fp8.log" | head -5
timeout $(( 585 - ($(date +%s) - T0) )) python3 -m pytest tests/test_gpu_fp8.py -q -p no:cacheprovider -rs -s > "$OUT/fp8-tests.log" 2>&1
grep -E "^FAILED|passed|failed|differ|beyond|Error" "$OUT/fp8-tests.log" | tail -8; echo "all done at $(( $(date +%s) - T0 )) s"
