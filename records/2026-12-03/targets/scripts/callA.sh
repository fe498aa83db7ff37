#!/usr/bin/env bash
# stop 52 call A: GPU tests on main (post-CI changes of stop 51), kernel profiles beside PyTorch
source bench/device_env.sh >/dev/null 2>&1
export ANDREA_WGMMA_CUBIN_CACHE=/tmp/wgc
T0=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
git log --oneline -1 > $OUT/tree.txt 2>/dev/null
timeout 300 python3 -m pytest -q -x tests/test_gpu_backend.py tests/test_gpu_attention_wgmma.py tests/test_gpu_fp8.py tests/test_sampling_gpu.py > $OUT/callA-gpu-tests.log 2>&1; echo "pytest rc $? at $((SECONDS-T0)) s" | tee -a $OUT/summary.txt
tail -3 $OUT/callA-gpu-tests.log
timeout 150 python3 bench/kernel_profile.py --model ANDREA-480M --batch 8 --steps 3 --top 40 --runners torch_graphs bf16 > $OUT/callA-kp-480M-B8.md 2>&1; echo "kp480 rc $? at $((SECONDS-T0)) s" | tee -a $OUT/summary.txt
timeout 90 python3 bench/kernel_profile.py --model ANDREA-12M --batch 8 --steps 5 --top 40 --runners bf16 fp8 > $OUT/callA-kp-12M-B8.md 2>&1; echo "kp12 rc $? at $((SECONDS-T0)) s" | tee -a $OUT/summary.txt
timeout 100 python3 bench/kernel_profile.py --model ANDREA-120M --batch 8 --steps 5 --top 40 --runners torch_graphs bf16 > $OUT/callA-kp-120M-B8.md 2>&1; echo "kp120 rc $? at $((SECONDS-T0)) s" | tee -a $OUT/summary.txt
grep -h "^## " $OUT/callA-kp-*.md
