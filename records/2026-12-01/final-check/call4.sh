#!/usr/bin/env bash
# Device call 4 (2026-12-01): the bench scripts that installed the wheels themselves now source
# bench/device_env.sh (gpu_engine.sh, gpu_real_corpus.sh setup, gpu_fp8_resume.sh). Each run once on a
# fresh machine: the setup, a bf16 run through Snakemake on the embedded corpus stopped and resumed,
# and the engine check (dev/cuda fp8 against NumPy, then the GPU backend's tests).
set -uo pipefail
T0=$(date +%s)
bash bench/gpu_real_corpus.sh setup > "$OUT/setup.log" 2>&1; echo "setup rc=$? ($(( $(date +%s) - T0 )) s)"; tail -2 "$OUT/setup.log"
CORPUS=embedded PRECISION=bf16 STEPS=120 STOP=60 TIMEOUT=150 bash bench/gpu_fp8_resume.sh; echo "resume check rc=$? ($(( $(date +%s) - T0 )) s)"
grep -h "plan:" resB/ANDREA-120M/runs/*/train.log | head -1 | cut -c1-400
timeout $(( 560 - ($(date +%s) - T0) )) bash bench/gpu_engine.sh check fp8 > "$OUT/engine-check.log" 2>&1; echo "engine check rc=$?"
grep -E "rows ok|passed|failed|FAIL" "$OUT/engine-check.log" | tail -6; echo "all done at $(( $(date +%s) - T0 )) s"
