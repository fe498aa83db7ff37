"""NCCL all-reduce of one model's gradient, as data-parallel training will do it every step.

Run on a machine with >= 2 GPUs, one rank per GPU (as root add --allow-run-as-root; the flags
are those andrea.comm.mpirun_command gives):
    mpirun -n 2 --bind-to none python -m mpi4py bench/allreduce_bench.py [--model ANDREA-120M] [--out r.json]

The gradient is the model's flat buffer: n_params(ANDREA-120M) from config/config.yaml (92.2M
values; GPT-2's 124M has a 50k vocabulary, ours 8.4k). Reduced in fp32 and bf16, whole and in
buckets of 25/50/100 MB (the backward pass will reduce bucket by bucket while it computes). After
the warm-up calls, the median of the timed passes; bus bandwidth as nccl-tests defines it for
all-reduce: bytes * 2 (n - 1) / n / time, the rate each link carries whatever the rank count.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from andrea.comm import from_environment  # noqa: E402
from andrea.model import ModelConfig, n_params  # noqa: E402

MB = 1 << 20


def model_size(name: str) -> int:
    import yaml

    models = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "config.yaml").read_text())["models"]
    return n_params(ModelConfig.from_config(models[name]))


def time_pass(cp, comm, buf, bucket_elems: int | None, warmup: int, iters: int) -> list[float]:
    """Seconds per all-reduce of all of `buf`, in buckets of `bucket_elems` (None: one call)."""
    step = buf.size if bucket_elems is None else bucket_elems
    buckets = [buf[i : i + step] for i in range(0, buf.size, step)]
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for i in range(warmup + iters):
        comm.barrier()  # every rank starts together: the time is the reduction's, not a straggler's
        start.record()
        for b in buckets:
            comm.allreduce(b, "sum")
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ANDREA-120M")
    ap.add_argument("--n", type=int, help="values to reduce (default: the model's n_params)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--buckets-mb", default="25,50,100")
    ap.add_argument("--out", help="write the results as JSON (rank 0)")
    args = ap.parse_args()

    comm = from_environment("cupy")
    if comm.size < 2:
        print("one rank: nothing to reduce; start this under mpirun with one rank per GPU", file=sys.stderr)
        return 2
    import cupy as cp
    n = args.n or model_size(args.model)
    dtypes = [("fp32", np.float32)]
    try:
        import ml_dtypes

        comm._nccl_dtype(ml_dtypes.bfloat16)
        dtypes.append(("bf16", ml_dtypes.bfloat16))
    except (ImportError, TypeError) as e:
        print(f"bf16 skipped: {e}", file=sys.stderr)
    rows = []
    for name, dtype in dtypes:
        buf = cp.zeros(n, dtype=dtype)  # sums of zeros stay finite however many passes
        item = buf.dtype.itemsize
        for bucket_mb in [None] + [int(b) for b in args.buckets_mb.split(",")]:
            elems = None if bucket_mb is None else bucket_mb * MB // item
            times = time_pass(cp, comm, buf, elems, args.warmup, args.iters)
            t = float(np.median(times))
            nbytes = n * item
            rows.append({"dtype": name, "bucket_mb": bucket_mb, "n_buckets": 1 if elems is None else -(-n // elems),
                         "values": n, "mb": round(nbytes / MB, 1), "median_ms": round(t * 1e3, 3),
                         "min_ms": round(min(times) * 1e3, 3), "max_ms": round(max(times) * 1e3, 3),
                         "busbw_gbs": round(nbytes * 2 * (comm.size - 1) / comm.size / t / 1e9, 1)})
            if comm.is_root:
                print(json.dumps(rows[-1]), flush=True)
        del buf
    if comm.is_root:
        result = {"ranks": comm.size, "model": None if args.n else args.model, "nccl_version": comm.version,
                  "gpu": cp.cuda.runtime.getDeviceProperties(comm.device)["name"].decode(), "rows": rows}
        if args.out:
            from andrea.io import write_json_atomic

            write_json_atomic(args.out, result)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
