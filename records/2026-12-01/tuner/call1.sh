#!/usr/bin/env bash
# Device call 1 (2026-12-01): the graph-timed cuBLASLt tuner. GPU tests; the tuner's time in the
# first step (fresh tuning file); before/after on ANDREA-120M; then gemm_energy's three pickers.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
export ANDREA_GEMM_TUNING=/tmp/tuning.json
T0=$(date +%s)
python3 -m pytest tests/test_gpu_backend.py tests/test_gpu_fp8.py -q -p no:cacheprovider -rs > "$OUT/gpu-tests.log" 2>&1
tail -3 "$OUT/gpu-tests.log"; echo "tests done at $(( $(date +%s) - T0 )) s"
python3 - > "$OUT/tuning-time.log" 2>&1 <<'PY'
import sys, time
sys.path.insert(0, "bench")
from andrea.engine.cupy import cublaslt
orig, spent = cublaslt.graph_times, []
def timed(*a, **k):
    t = time.perf_counter(); r = orig(*a, **k); spent.append(time.perf_counter() - t); return r
cublaslt.graph_times = timed
import gpu_bench
sys.argv = ["gpu_bench.py", "--models", "ANDREA-120M", "--batches", "8", "32", "--precisions", "bf16", "fp8",
            "--rounds", "1", "--steps", "5", "--no-torch"]
gpu_bench.main()
print(f"graph-timed tuning: {len(spent)} plans, {sum(spent):.2f} s in all, longest {max(spent):.3f} s")
PY
tail -1 "$OUT/tuning-time.log"; echo "tuning time done at $(( $(date +%s) - T0 )) s"
OUT="$OUT/before-after" bash bench/before_after.sh results/before.tar --models ANDREA-120M --batches 8 32 --precisions bf16 fp8 --rounds 3
echo "before/after done at $(( $(date +%s) - T0 )) s"
timeout $(( 570 - ($(date +%s) - T0) )) python3 bench/gemm_energy.py --m 8192 32768 --seconds 0.25 --out "$OUT/gemm_energy.json" > "$OUT/gemm_energy.log" 2>&1
grep -E "^m=|tuned choice" "$OUT/gemm_energy.log" | tail -4
echo "all done at $(( $(date +%s) - T0 )) s"
