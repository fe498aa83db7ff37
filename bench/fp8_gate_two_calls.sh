#!/usr/bin/env bash
# A model's fp8 quality gate (bench/fp8_gate.py --record) in two device calls, for a model whose bf16
# and fp8 runs of 6,000 steps do not fit one 10-minute call with the data stages (ANDREA-480M: ~5.5 and
# ~4.2 min of training, an estimate). Each call builds the model's shards of the real corpus through the
# workflow (carry .device with real-corpus.tar.xz: bench/real_corpus.sh, then
# `tar cJf .device/real-corpus.tar.xz -C data real`), then:
#   call 1: the bf16 run; its figures (not its weights) in $OUT/gate-MODEL/runs/bf16.json
#   call 2: put that file at .device/gate-MODEL/runs/bf16.json (carried), the same commit and tree;
#           the fp8 run, the verdict and the record's gate entry; fp8_gate.json and the record in $OUT
#
#   source bench/device_env.sh; bash bench/fp8_gate_two_calls.sh ANDREA-480M 1      (on the GPU machine)
set -uo pipefail
cd "$(dirname "$0")/.."
MODEL=$1 CALL=$2
OUT=$(realpath -m "${OUT:-results/device-out}")
mkdir -p "$OUT" data
T0=$SECONDS
note() { echo "$1 at $((SECONDS - T0)) s" | tee -a "$OUT/fp8_gate_two_calls.txt"; }
tar xJf .device/real-corpus.tar.xz -C data || { note "no .device/real-corpus.tar.xz (carry .device)"; exit 1; }
python3 -m snakemake "results/$MODEL/shards.json" --cores 16 --configfile config/config.yaml data/real/real-corpus.yaml \
  > "$OUT/shards-$MODEL.log" 2>&1 || { note "shards failed (shards-$MODEL.log)"; exit 1; }
note "shards of $MODEL"
GATE=(python3 bench/fp8_gate.py --shards "results/$MODEL/shards.json" --model "$MODEL" --reuse-runs)
case $CALL in
  1) "${GATE[@]}" --precisions bf16 --out "$OUT/gate-$MODEL" > "$OUT/gate-$MODEL-call1.log" 2>&1
     note "bf16 run rc $?"; ls -la "$OUT/gate-$MODEL/runs" ;;
  2) [ -f ".device/gate-$MODEL/runs/bf16.json" ] || { note "no .device/gate-$MODEL/runs/bf16.json (call 1's)"; exit 1; }
     "${GATE[@]}" --precisions bf16 fp8 --out ".device/gate-$MODEL" --record andrea/engine/fp8_records.json \
       > "$OUT/gate-$MODEL-call2.log" 2>&1
     note "fp8 run and gate rc $?"
     cp ".device/gate-$MODEL/fp8_gate.json" "$OUT/gate-$MODEL-fp8_gate.json" 2>/dev/null
     cp andrea/engine/fp8_records.json "$OUT/fp8_records.after.json"
     grep -E "taken from|validation after|record" "$OUT/gate-$MODEL-call2.log" ;;
  *) echo "give the call: 1 or 2" >&2; exit 2 ;;
esac
