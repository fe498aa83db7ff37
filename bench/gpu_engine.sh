#!/usr/bin/env bash
# The training engine's kernels and speed on the GPU, in phases that fit device calls:
#
#   bash bench/gpu_engine.sh check [SCRIPT ...]   dev/cuda scripts (default: attention_mma layernorm elementwise fp8) at the
#                                                 model shapes, every version against NumPy and timed; then the GPU
#                                                 backend's tests
#   bash bench/gpu_engine.sh compare BEFORE.tar [gpu_bench.py arguments]
#                                                 bench/before_after.sh: the tree in BEFORE.tar (git archive of the
#                                                 commit before a change) against this one, taking turns
#   bash bench/gpu_engine.sh torch [gpu_bench.py arguments]     ours beside PyTorch bf16 + torch.compile
#   bash bench/gpu_engine.sh profile MODEL BATCH   bench/gpu_profile.py: where a step's time goes, function by function
#
# Results go to $OUT (the device tool's output folder; results/device-out elsewhere): the logs and
# JSON of a phase in one archive, $OUT/<phase>-<time>.tgz (the device tool brings back 8 files).
# Wheels in .whl/ are installed into /tmp/site first (bench/device_env.sh): Snakemake's (../shared/tools/device_wheels.sh)
# and, for cuDNN's attention (the device image has cuDNN but not its Python frontend),
#   pip download nvidia-cudnn-frontend==1.16.0 --no-deps --only-binary=:all: --python-version 3.12 -d .whl
set -euo pipefail
cd "$(dirname "$0")/.."
FINAL=$(realpath -m "${OUT:-results/device-out}")
OUT=$(mktemp -d)
mkdir -p "$FINAL"
trap 'tar czf "$FINAL/${1:-none}-$(date +%H%M%S).tgz" -C "$OUT" .' EXIT
source bench/device_env.sh  # Snakemake's wheels (jsonschema for andrea.config) and results/device-site
case "${1:-}" in
check)
  scripts=("${@:2}")
  [ ${#scripts[@]} -gt 0 ] || scripts=(attention_mma layernorm elementwise fp8)
  status=0
  for s in "${scripts[@]}"; do
    python3 "dev/cuda/$s.py" > "$OUT/dev-$s.log" 2>&1 || status=1
    grep -E "FAIL|failed|Error" "$OUT/dev-$s.log" | head -5 || true
  done
  python3 -m pytest tests/test_gpu_backend.py tests/test_gpu_fp8.py tests/test_sampling_gpu.py tests/test_dev_cuda.py -q -p no:cacheprovider -rs 2>&1 | tee "$OUT/gpu-tests.log" | tail -5
  exit $status
  ;;
compare)
  OUT=$OUT bash bench/before_after.sh "${@:2}" | tail -20
  ;;
torch)
  python3 bench/gpu_bench.py --out "$OUT/gpu_bench.json" "${@:2}" 2>&1 | tee "$OUT/gpu_bench.log" | tail -25
  ;;
profile)
  python3 bench/gpu_profile.py --model "${2:-ANDREA-120M}" --batch "${3:-32}" 2>&1 | tee "$OUT/profile-${2:-ANDREA-120M}-B${3:-32}.log" | tail -45
  ;;
*)
  sed -n 2,13p "$0"
  exit 2
  ;;
esac
