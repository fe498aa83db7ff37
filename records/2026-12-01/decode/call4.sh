#!/usr/bin/env bash
# Device call 4 (2026-12-01): the GPU tests on the final tree (wordfreq's English list carried in
# results/device-site: the trainer's sampling tests score coherence), then the audit of ANDREA-120M
# through Snakemake (embedded corpus, 200 steps, audit.backend auto) as bench/gpu_generate.sh audit runs it.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
cp -r results/device-site/* /tmp/site/
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
python3 -m pytest tests/test_gpu_backend.py tests/test_gpu_fp8.py tests/test_sampling_gpu.py tests/test_dev_cuda.py -q -p no:cacheprovider -rs > "$OUT/gpu-tests.log" 2>&1
grep -E "^FAILED|passed|failed" "$OUT/gpu-tests.log" | tail -6; echo "tests done at $(( $(date +%s) - T0 )) s"
cat > /tmp/train.yaml <<YAML
train:
  ANDREA-120M: {max_steps: 200, eval_every: 0, sample_every: 100000, checkpoint_every: 200}
YAML
echo "audit: {backend: auto}" > /tmp/audit.yaml
timeout $(( 500 - ($(date +%s) - T0) )) python3 -m snakemake results/ANDREA-120M/audit --cores 8 --configfile config/config.yaml /tmp/train.yaml /tmp/audit.yaml \
  --config data_profile=embedded > "$OUT/audit-snakemake.log" 2>&1; echo "snakemake rc=$?"
tail -3 "$OUT/audit-snakemake.log"
echo "audit seconds (snakemake benchmark): $(tail -1 results/benchmarks/audit/ANDREA-120M.tsv | cut -f1)"
cp results/logs/audit/ANDREA-120M.log "$OUT/audit.log" 2>/dev/null
ls results/ANDREA-120M/audit/ 2>/dev/null && cp -r results/ANDREA-120M/audit "$OUT/audit" 2>/dev/null
echo "all done at $(( $(date +%s) - T0 )) s"
