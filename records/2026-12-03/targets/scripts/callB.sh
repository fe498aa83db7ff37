#!/usr/bin/env bash
# stop 52 call B: fp8 gates for ANDREA-12M and ANDREA-120M on the real corpus (6,000 steps, B=8)
source bench/device_env.sh >/dev/null 2>&1
T0=$SECONDS
mkdir -p data && tar xJf .device/real-corpus.tar.xz -C data
timeout 200 python3 -m snakemake results/ANDREA-12M/shards.json results/ANDREA-120M/shards.json --cores 16 --configfile config/config.yaml data/real/real-corpus.yaml > $OUT/callB-shards.log 2>&1; echo "shards rc $? at $((SECONDS-T0)) s" | tee -a $OUT/summary.txt
cp andrea/engine/fp8_records.json $OUT/fp8_records.before.json
for m in ANDREA-12M ANDREA-120M; do
  timeout $((570-(SECONDS-T0))) python3 bench/fp8_gate.py --shards results/$m/shards.json --model $m --out $OUT/gate-$m --record andrea/engine/fp8_records.json > $OUT/callB-gate-$m.log 2>&1; echo "gate $m rc $? at $((SECONDS-T0)) s" | tee -a $OUT/summary.txt
  tail -4 $OUT/callB-gate-$m.log
done
cp andrea/engine/fp8_records.json $OUT/fp8_records.after.json
rm -rf $OUT/gate-*/runs
