#!/usr/bin/env bash
# fp8 through the Snakemake train rule on a GPU machine: ANDREA-120M on the embedded corpus, one run
# uninterrupted (results/), one stopped by SIGTERM at >= 300 logged steps and run again (resB/): the
# training losses must agree step for step (the delayed scales travel in the checkpoint's state).
#   bash bench/gpu_fp8_resume.sh        (from the repository root, with .whl: ../shared/tools/device_wheels.sh)
# Removes results/, resB/ and .snakemake/ first. Logs go to $OUT (results/device-out elsewhere).
set -u
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${OUT:-results/device-out}")
rm -rf results resB .snakemake
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
printf 'train:\n  ANDREA-120M: {precision: fp8, max_steps: 600, eval_every: 200, sample_every: 100000, checkpoint_every: 1000, warmup_steps: 50, lr: 6.0e-4}\n' > /tmp/f.yaml
C="--cores 8 --configfile config/config.yaml /tmp/f.yaml"  # the target goes before --configfile
timeout 200 python3 -m snakemake results/ANDREA-120M/ckpt $C --config data_profile=embedded > $OUT/a.log 2>&1; echo "A (uninterrupted): rc $?"
python3 -m snakemake resB/ANDREA-120M/ckpt $C --config data_profile=embedded results_dir=resB > $OUT/b1.log 2>&1 &
sm=$!
until compgen -G "resB/ANDREA-120M/runs/*/loss.jsonl" >/dev/null && [ "$(cat resB/ANDREA-120M/runs/*/loss.jsonl | wc -l)" -ge 300 ]; do sleep 0.2; kill -0 $sm 2>/dev/null || break; done
pkill -TERM -f "scripts/tmp.*train.py" && echo "SIGTERM at $(cat resB/ANDREA-120M/runs/*/loss.jsonl | wc -l) logged lines"
wait $sm; echo "B first part: rc $?"
timeout 200 python3 -m snakemake resB/ANDREA-120M/ckpt $C --config data_profile=embedded results_dir=resB > $OUT/b2.log 2>&1; echo "B resumed: rc $?"
grep -hE "stopped by a signal|resumed|fp8 casts by step 600|finished" resB/ANDREA-120M/runs/*/train.log | cut -c1-200
grep -hE "fp8 casts by step 600" results/ANDREA-120M/runs/*/train.log | cut -c1-200
python3 - <<'PY'
import glob, json
def losses(root):
    (f,) = glob.glob(f"{root}/ANDREA-120M/runs/*/loss.jsonl")
    return {r["step"]: r["loss"] for r in map(json.loads, open(f)) if r.get("kind", "train") == "train"}
a, b = losses("results"), losses("resB")
same = [s for s in sorted(a) if s in b and a[s] == b[s]]
diff = [s for s in sorted(a) if s in b and a[s] != b[s]]
print(f"steps: A {len(a)}, B {len(b)}; identical {len(same)}, different {len(diff)}" + (f", first different {diff[0]}: {a[diff[0]]} vs {b[diff[0]]}" if diff else ""))
PY
