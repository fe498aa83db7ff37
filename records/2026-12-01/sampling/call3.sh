#!/usr/bin/env bash
# Device call 3 (2026-12-01): the final tree. dev/cuda/sampling.py (with signed zeros), the GPU tests
# (backend, sampling, dev/cuda), the audit of ANDREA-120M through Snakemake (embedded corpus, 200
# steps, audit.backend auto), and the sampled generation bench for both models.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
cp -r results/device-site/* /tmp/site/
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
python3 dev/cuda/sampling.py > "$OUT/dev-sampling.log" 2>&1; echo "dev sampling rc=$? ($(grep -c '| ok' "$OUT/dev-sampling.log") ok rows)"
grep -E "FAIL|boundary|error" "$OUT/dev-sampling.log" | head -5
timeout 300 python3 -m pytest tests/test_sampling_gpu.py tests/test_gpu_backend.py tests/test_dev_cuda.py -q -p no:cacheprovider -rs > "$OUT/gpu-tests.log" 2>&1
grep -E "^FAILED|passed|failed" "$OUT/gpu-tests.log" | tail -6; echo "tests done at $(( $(date +%s) - T0 )) s"
cat > /tmp/train.yaml <<YAML
train:
  ANDREA-120M: {max_steps: 200, eval_every: 0, sample_every: 100000, checkpoint_every: 200}
YAML
echo "audit: {backend: auto}" > /tmp/audit.yaml
timeout 150 python3 -m snakemake results/ANDREA-120M/audit --cores 8 --configfile config/config.yaml /tmp/train.yaml /tmp/audit.yaml \
  --config data_profile=embedded > "$OUT/audit-snakemake.log" 2>&1; echo "snakemake rc=$?"
tail -2 "$OUT/audit-snakemake.log"
echo "audit seconds (snakemake benchmark): $(tail -1 results/benchmarks/audit/ANDREA-120M.tsv | cut -f1)"
cp results/logs/audit/ANDREA-120M.log "$OUT/audit.log" 2>/dev/null; grep -iE "sampl|held|report" "$OUT/audit.log" | head -8
cp results/ANDREA-120M/audit/samples.jsonl "$OUT/audit-samples.jsonl" 2>/dev/null
timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/generate_bench.py --rows 1 16 --temperature 0.8 --out "$OUT/generate-t08.json" > "$OUT/generate-t08.log" 2>&1
grep -E "graph|compile" "$OUT/generate-t08.log" | grep "^|"; echo "all done at $(( $(date +%s) - T0 )) s"
