#!/usr/bin/env bash
# Device call 2 (2026-12-01): ANDREA_GELU=auto. The GPU tests (backend, fp8, sampling), then the
# workflow a user runs: snakemake results/ANDREA-120M/audit on the embedded corpus, bf16 on the GPU at
# B=32 (auto keeps the GELU output there), 400 steps stopped by SIGTERM at ~150 and resumed, then the audit.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
cp -r results/device-site/* /tmp/site/
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
timeout 240 python3 -m pytest tests/test_gpu_backend.py tests/test_gpu_fp8.py tests/test_sampling_gpu.py -q -p no:cacheprovider -rs \
  > "$OUT/gpu-tests.log" 2>&1
grep -E "^FAILED|passed|failed|Error" "$OUT/gpu-tests.log" | tail -6; echo "tests done at $(( $(date +%s) - T0 )) s"
cat > /tmp/train.yaml <<YAML
train:
  ANDREA-120M: {batch_size: 32, max_steps: 400, eval_every: 100, sample_every: 200, checkpoint_every: 100}
YAML
echo "audit: {backend: auto}" > /tmp/audit.yaml
SM="python3 -m snakemake results/ANDREA-120M/audit --cores 8 --configfile config/config.yaml /tmp/train.yaml /tmp/audit.yaml --config data_profile=embedded"
$SM > "$OUT/snakemake-1.log" 2>&1 &
pid=$!
until compgen -G "results/ANDREA-120M/runs/*/loss.jsonl" >/dev/null && [ "$(grep -c '"train"\|"loss"' results/ANDREA-120M/runs/*/loss.jsonl)" -ge 150 ]; do
  kill -0 $pid 2>/dev/null || { echo "snakemake ended before step 150"; break; }
  [ $(( $(date +%s) - T0 )) -gt 480 ] && break
  sleep 0.5
done
kill -TERM $pid 2>/dev/null; wait $pid; echo "first run stopped at $(( $(date +%s) - T0 )) s"
timeout $(( 585 - ($(date +%s) - T0) )) $SM > "$OUT/snakemake-2.log" 2>&1; echo "snakemake (resumed) rc=$?"
tail -2 "$OUT/snakemake-2.log"
cp results/logs/train/ANDREA-120M.log "$OUT/train.log" 2>/dev/null
grep -hE "plan:|resum|GELU" "$OUT/train.log" | cut -c1-400 | head -6
python3 - <<'PY'
import glob, json
(run,) = glob.glob("results/ANDREA-120M/runs/*/loss.jsonl")
rows = [json.loads(l) for l in open(run)]
train = [r for r in rows if r.get("kind", "train") == "train"]
val = [r for r in rows if r.get("kind") == "eval" or "val_loss" in r]
steps = [r["step"] for r in train]
print("train steps", steps[0], "..", steps[-1], "continuous" if steps == list(range(len(steps))) else "NOT continuous")
print("loss first/last 10:", sum(r["loss"] for r in train[:10]) / 10, sum(r["loss"] for r in train[-10:]) / 10)
print("median tok/s", sorted(r["tokens_per_s"] for r in train)[len(train) // 2])
print("validation:", [(r["step"], round(r.get("val_loss", r.get("loss", 0)), 4)) for r in val][:6])
PY
cp results/ANDREA-120M/audit/samples.jsonl "$OUT/audit-samples.jsonl" 2>/dev/null
cp results/logs/audit/ANDREA-120M.log "$OUT/audit.log" 2>/dev/null; grep -iE "held|bits|report" "$OUT/audit.log" | head -4
echo "all done at $(( $(date +%s) - T0 )) s"
