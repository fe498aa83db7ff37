#!/usr/bin/env bash
# A training run through the Snakemake train rule on a GPU machine, stopped and resumed: ANDREA-120M
# run once uninterrupted (results/) and once stopped by SIGTERM to the trainer (not to Snakemake, which
# would let its job finish) at >= STOP logged steps, then run again (resB/): the training losses must
# agree step for step (the checkpoint carries the weights, the Adam state, the data position and, in
# fp8, the delayed scales).
#   bash bench/gpu_fp8_resume.sh        (from the repository root, carrying .whl and results/device-site: bench/device_env.sh)
# Settings from the environment (defaults: the fp8 check as first recorded):
#   PRECISION  fp8            BATCH  the config's (8)      STEPS 600     STOP 300
#   CORPUS     embedded       or real: the overlay .device/real/real-corpus.yaml (bench/real_corpus.sh; the
#                             gpu_real_corpus.sh setup extracts it); its data stages run once, into results/,
#                             and resB/ starts from a copy of them
#   TARGET     ckpt           the resumed run's target (audit: the audit runs after it too)
#   TIMEOUT    300            seconds for each Snakemake run (the uninterrupted one, the resumed one)
# STOP counts the run's loss records, validations among them. Exits 1 where no stop was made (the run
# ended first) or the losses differ.
# Removes results/, resB/ and .snakemake/ first. Logs go to $OUT (results/device-out elsewhere).
set -u
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${OUT:-results/device-out}")
PRECISION=${PRECISION:-fp8} STEPS=${STEPS:-600} STOP=${STOP:-300} CORPUS=${CORPUS:-embedded} TARGET=${TARGET:-ckpt}
TIMEOUT=${TIMEOUT:-300}
source bench/device_env.sh  # the wheels and results/device-site into /tmp/site, before results/ goes
rm -rf results resB .snakemake
mkdir -p "$OUT"
batch=${BATCH:+, batch_size: $BATCH}
printf 'train:\n  ANDREA-120M: {precision: %s, max_steps: %s, eval_every: 200, sample_every: 100000, checkpoint_every: 1000, warmup_steps: 50, lr: 6.0e-4%s}\n' \
  "$PRECISION" "$STEPS" "$batch" > /tmp/f.yaml
if [ "$CORPUS" = real ]; then
  C="--cores 8 --configfile config/config.yaml .device/real/real-corpus.yaml /tmp/f.yaml"  # the target goes before --configfile
  start=$(date +%s)
  python3 -m snakemake results/ANDREA-120M/shards.json $C > "$OUT/data.log" 2>&1; echo "data stages: rc $?, $(( $(date +%s) - start )) s"
  cp -a results resB
  RESB="--config results_dir=resB"
else
  C="--cores 8 --configfile config/config.yaml /tmp/f.yaml --config data_profile=embedded"
  RESB="results_dir=resB"  # joins the --config above
fi
start=$(date +%s)
timeout "$TIMEOUT" python3 -m snakemake results/ANDREA-120M/ckpt $C > "$OUT/a.log" 2>&1; echo "A (uninterrupted): rc $?, $(( $(date +%s) - start )) s"
python3 -m snakemake resB/ANDREA-120M/ckpt $C $RESB > "$OUT/b1.log" 2>&1 &
sm=$!
until compgen -G "resB/ANDREA-120M/runs/*/loss.jsonl" >/dev/null && [ "$(cat resB/ANDREA-120M/runs/*/loss.jsonl | wc -l)" -ge "$STOP" ]; do sleep 0.2; kill -0 $sm 2>/dev/null || break; done
pkill -TERM -f "scripts/tmp.*train.py" && echo "SIGTERM at $(cat resB/ANDREA-120M/runs/*/loss.jsonl | wc -l) logged lines"
wait $sm; echo "B first part: rc $?"
timeout "$TIMEOUT" python3 -m snakemake "resB/ANDREA-120M/$TARGET" $C $RESB > "$OUT/b2.log" 2>&1; echo "B resumed: rc $?"
grep -hE "plan:|stopped by a signal|resumed|fp8 casts by step $STEPS|finished" resB/ANDREA-120M/runs/*/train.log | cut -c1-300
grep -hE "fp8 casts by step $STEPS" results/ANDREA-120M/runs/*/train.log | cut -c1-200
python3 - <<'PY'
import glob, json
def losses(root):
    (f,) = glob.glob(f"{root}/ANDREA-120M/runs/*/loss.jsonl")
    return {r["step"]: r["loss"] for r in map(json.loads, open(f)) if r.get("kind", "train") == "train"}
a, b = losses("results"), losses("resB")
same = [s for s in sorted(a) if s in b and a[s] == b[s]]
diff = [s for s in sorted(a) if s in b and a[s] != b[s]]
print(f"steps: A {len(a)}, B {len(b)}; identical {len(same)}, different {len(diff)}" + (f", first different {diff[0]}: {a[diff[0]]} vs {b[diff[0]]}" if diff else ""))
raise SystemExit(1 if diff or not a or len(a) != len(b) else 0)
PY
ok=$?
if ! grep -q "stopped by a signal" resB/ANDREA-120M/runs/*/train.log; then
  echo "no resume tested: the run ended before $STOP loss records (raise STEPS or lower STOP)"; exit 1
fi
exit $ok
