#!/usr/bin/env bash
# One device call for the cuBLASLt tuning question of issue 44 (BENCHMARKS.md, "The fp8 gates and the
# targets": at ANDREA-480M B=8 our matrix products take 3.1 ms a step more than PyTorch's, on other
# algorithms): the tuning tests, each product's candidates and PyTorch's own call under sustained load
# (bench/gemm_energy.py), then whole steps with the default tuning and with ANDREA_GEMM_TUNE=sustained,
# each in a process of its own with a fresh tuning file, PyTorch (CUDA graphs) beside each. About 9
# minutes (an estimate: not yet run); 120M next, with --models ANDREA-120M --batches 8 32.
#
#   source bench/device_env.sh; bash bench/gemm_tuning_device.sh      (on the GPU machine; results in $OUT;
#   BUDGET_S: seconds it may take in all, 585 unless given)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${OUT:-results/device-out}")
mkdir -p "$OUT"
T0=$SECONDS
note() { echo "$1 at $((SECONDS - T0)) s" | tee -a "$OUT/gemm_tuning.txt"; }
timeout 90 python3 -m pytest -q tests/test_gpu_backend.py -k gemm_tuning > "$OUT/gemm-tuning-tests.log" 2>&1; note "tuning tests rc $?"
rm -f "$OUT"/tuning-*.json*  # each mode times afresh
for mode in 1 sustained; do
  # a 480M B=8 run with PyTorch beside it: under 130 s on 2026-12-03 (with fp8 too)
  ANDREA_GEMM_TUNE=$mode ANDREA_GEMM_TUNING="$OUT/tuning-$mode.json" timeout 150 python3 bench/gpu_bench.py \
    --models ANDREA-480M --batches 8 --precisions bf16 --torch-modes graphs --rounds 3 \
    --out "$OUT/bench-tune-$mode.json" > "$OUT/bench-tune-$mode.log" 2>&1; note "gpu_bench ANDREA_GEMM_TUNE=$mode rc $?"
done
# then each product's candidates under load, with what time is left
timeout $(( ${BUDGET_S:-585} - (SECONDS - T0) )) python3 bench/gemm_energy.py --m 8192 --d 1536 --algos 32 --written --torch --seconds 0.15 \
  --out "$OUT/gemm-energy-480M-B8.json" > "$OUT/gemm-energy-480M-B8.log" 2>&1; note "gemm_energy 480M rc $?"
grep -H "^| ANDREA" "$OUT"/bench-tune-*.log
grep -h "^m=" "$OUT/gemm-energy-480M-B8.log"
