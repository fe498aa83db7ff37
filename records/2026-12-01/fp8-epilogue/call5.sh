#!/usr/bin/env bash
# Device call 5 (2026-12-01): fp8 (the GELU epilogue in place) through the workflow on the real corpus,
# stopped and resumed: CORPUS=real PRECISION=fp8 BATCH=32 STEPS=300 STOP=150 bash bench/gpu_fp8_resume.sh.
# (The first try, 600 steps, failed at once: results/device-site was not carried, so no wordfreq.)
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
bash bench/gpu_real_corpus.sh setup > "$OUT/setup.log" 2>&1; echo "setup rc=$? ($(( $(date +%s) - T0 )) s)"
cp -r results/device-site/* /tmp/site/  # wordfreq (the trainer's coherence score): before the script empties results/
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
CORPUS=real PRECISION=fp8 BATCH=32 STEPS=300 STOP=150 TIMEOUT=70 bash bench/gpu_fp8_resume.sh; echo "resume check rc=$?"
grep -h "validation at step" resB/ANDREA-120M/runs/*/train.log | cut -c1-160 | tail -4
echo "all done at $(( $(date +%s) - T0 )) s"
