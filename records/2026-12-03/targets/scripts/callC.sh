#!/usr/bin/env bash
# stop 52 call C: issue 44's targets table, our kernels only (no cuDNN frontend), then with cuDNN installed
source bench/device_env.sh >/dev/null 2>&1
T0=$SECONDS
B="python3 bench/gpu_bench.py --torch-modes graphs --rounds 3"
timeout 240 $B --models ANDREA-12M ANDREA-120M --batches 8 32 --precisions bf16 fp8 --out $OUT/callC-nocudnn-12-120.json > $OUT/callC-nocudnn-12-120.log 2>&1; echo "nocudnn 12/120 rc $? at $((SECONDS-T0)) s" | tee -a $OUT/summary.txt
timeout 130 $B --models ANDREA-480M --batches 8 --precisions bf16 fp8 --out $OUT/callC-nocudnn-480-B8.json > $OUT/callC-nocudnn-480-B8.log 2>&1; echo "nocudnn 480 B8 rc $? at $((SECONDS-T0)) s" | tee -a $OUT/summary.txt
timeout 110 $B --models ANDREA-480M --batches 32 --precisions bf16 --out $OUT/callC-nocudnn-480-B32.json > $OUT/callC-nocudnn-480-B32.log 2>&1; echo "nocudnn 480 B32 rc $? at $((SECONDS-T0)) s" | tee -a $OUT/summary.txt
grep -h "^| ANDREA" $OUT/callC-nocudnn-*.log
python3 -m pip install -q --no-deps --no-index --target /tmp/cudnn .device/cudnn/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/cudnn:$PYTHONPATH
python3 -c "import cudnn; print('cudnn frontend', cudnn.__version__, cudnn.backend_version())" 2>&1 | tail -1 | tee -a $OUT/summary.txt
left=$((585-(SECONDS-T0)))
[ $left -gt 60 ] && timeout $left $B --models ANDREA-120M ANDREA-12M --batches 8 32 --precisions bf16 fp8 --out $OUT/callC-cudnn-12-120.json > $OUT/callC-cudnn-12-120.log 2>&1; echo "cudnn 12/120 rc $? at $((SECONDS-T0)) s" | tee -a $OUT/summary.txt
grep -h "^| ANDREA\|^ANDREA" $OUT/callC-cudnn-*.log
