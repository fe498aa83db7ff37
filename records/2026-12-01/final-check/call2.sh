#!/usr/bin/env bash
# Device call 2 (2026-12-01): fp8 ANDREA-120M through the Snakemake workflow on the real corpus, stopped by
# SIGTERM and resumed against an uninterrupted run (CORPUS=real PRECISION=fp8 BATCH=32 STEPS=300
# STOP=150 bash bench/gpu_fp8_resume.sh), to read the plan line's new words on where a = gelu(h) is made.
set -uo pipefail
source bench/device_env.sh  # before the script below empties results/ (results/device-site with it)
T0=$(date +%s)
bash bench/gpu_real_corpus.sh setup > "$OUT/setup.log" 2>&1; echo "setup rc=$? ($(( $(date +%s) - T0 )) s)"
CORPUS=real PRECISION=fp8 BATCH=32 STEPS=300 STOP=150 TIMEOUT=70 bash bench/gpu_fp8_resume.sh; echo "resume check rc=$?"
grep -h "plan:" resB/ANDREA-120M/runs/*/train.log | head -2 | cut -c1-700
grep -h "validation at step" resB/ANDREA-120M/runs/*/train.log | cut -c1-160 | tail -3
echo "all done at $(( $(date +%s) - T0 )) s"
