#!/usr/bin/env bash
# End-to-end training on a GPU, through the `andrea` stages (for machines without Snakemake):
# data → tokenizer (N = 8192) → shards → ANDREA-120M on the CuPy backend in bf16 for 300 steps,
# stopped with SIGTERM part-way and resumed. Prints whether the loss fell and loss.jsonl stayed
# continuous. Usage (from the repository root): bash bench/gpu_train_e2e.sh [workdir]
set -euo pipefail
W=${1:-$(mktemp -d)}
mkdir -p "$W"
A="python3 -m andrea.cli"
python3 - "$W" <<'PY'
import sys, yaml
w = sys.argv[1]
c = yaml.safe_load(open("config/config.yaml"))
c["results_dir"] = f"{w}/results"
c["train"]["ANDREA-120M"] = {"backend": "cupy", "precision": "bf16", "batch_size": 8, "max_steps": 300, "lr": 6e-4,
                             "warmup_steps": 30, "checkpoint_every": 50, "sample_every": 100, "sample_tokens": 64,
                             "curriculum": {"warmup_steps": 100}}
yaml.safe_dump(c, open(f"{w}/config.yaml", "w"), sort_keys=False)
PY
C="--config $W/config.yaml"
$A data $C
$A tokenizer train $C --model ANDREA-120M
$A encode $C --model ANDREA-120M --workers 8
python3 - "$W" <<'PY'
import sys
from andrea.config import load_config
from andrea.shards import write_model_shards
from andrea.versions import stage_dir
w = sys.argv[1]
c = load_config(f"{w}/config.yaml")
write_model_shards("ANDREA-120M", stage_dir(c, "encode", 8192) / "manifest.json", f"{w}/results/ANDREA-120M/shards.json")
PY
$A train $C --model ANDREA-120M > "$W/train1.log" 2>&1 &
pid=$!
until compgen -G "$W/results/ANDREA-120M/runs/*/loss.jsonl" >/dev/null && [ "$(cat $W/results/ANDREA-120M/runs/*/loss.jsonl | wc -l)" -ge 120 ]; do
  kill -0 $pid 2>/dev/null || { echo "trainer ended early"; tail -20 "$W/train1.log"; exit 1; }
  sleep 0.5
done
kill -TERM $pid
wait $pid
echo "first run: $(tail -1 "$W/train1.log")"
$A train $C --model ANDREA-120M --out "$W/results/ANDREA-120M/ckpt" > "$W/train2.log" 2>&1
grep -h "plan:\|resumed\|checkpoint" "$W/train1.log" "$W/train2.log" | cut -c1-300
python3 - "$W" <<'PY'
import glob, json, sys
w = sys.argv[1]
(run,) = glob.glob(f"{w}/results/ANDREA-120M/runs/*/")
lines = [r for r in map(json.loads, open(run + "loss.jsonl")) if r.get("kind", "train") == "train"]  # not validation records
steps = [l["step"] for l in lines]
assert steps == list(range(300)), "loss.jsonl is not continuous"
first, last = sum(l["loss"] for l in lines[:10]) / 10, sum(l["loss"] for l in lines[-10:]) / 10
tps = sorted(l["tokens_per_s"] for l in lines)[len(lines) // 2]
print(f"steps 0-299 continuous; loss {first:.3f} -> {last:.3f}; median {tps:,.0f} tokens/s")
assert last < first - 1.0, "loss did not fall"
print(json.load(open(f"{w}/results/ANDREA-120M/ckpt/run.json"))["step"], "steps in results/ANDREA-120M/ckpt")
PY
