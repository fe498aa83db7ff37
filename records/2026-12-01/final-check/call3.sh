#!/usr/bin/env bash
# Device call 3 (2026-12-01): after the review's mends (the fp8 plan line where ANDREA_FP8_PRODUCTS leaves
# the MLP in 16 bits; device_env.sh safe under set -e), under set -e as a new call script might be: the
# fp8 tests, whose product-choice test now reads the plan words.
set -euo pipefail
source bench/device_env.sh
T0=$(date +%s)
timeout 200 python3 -m pytest tests/test_gpu_fp8.py -q -p no:cacheprovider -rs > "$OUT/fp8-tests.log" 2>&1 || echo "pytest rc=$?"
grep -E "^FAILED|passed|failed|Error" "$OUT/fp8-tests.log" | tail -8; echo "all done at $(( $(date +%s) - T0 )) s"
