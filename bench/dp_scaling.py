"""Data-parallel scaling on the GPUs of one host: ANDREA's training step (bf16, CUDA graphs) on 1
and on N GPUs, one rank per GPU, gradients averaged by NCCL inside the backward pass.

    python3 bench/dp_scaling.py --gpus 1 2 --batches 8 32 [--bucket-mb 25 100 0] [--reduce-dtypes float32 bfloat16]
                                [--models ANDREA-120M] [--out r.json]

For each model, per-GPU batch B and rank count n (started with andrea.comm.mpirun_command, each
count in its own job): the global tokens/s (n·B·T per step), the scaling efficiency against n
times one GPU, and where the all-reduce goes: the step with the reduction inside the backward
pass (what training runs), the same step without any reduction, and the all-reduce of the whole
gradient alone; hidden = 1 − (with − without) / alone, the share of the reduction's time the
backward pass covers (negative: reducing inside the backward pass slowed it by more than the
all-reduce takes alone). --bucket-mb compares bucket sizes (train.reduce_bucket_mb; 0: one
all-reduce after the backward pass); --reduce-dtypes compares averaging the gradients in float32
and in bfloat16 (train.reduce_dtype; "alone" then includes the casts). Timed as gpu_bench.py times: warm-up, then rounds of steps,
the median round.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpu_bench import MODELS, PEAK_TRACKER  # noqa: E402  (the model table, read without the config machinery)

from andrea.model import flops_per_token  # noqa: E402

PEAK = 989e12


def worker(args) -> None:
    """One rank: time the configurations and let rank 0 write them."""
    import cupy as cp

    from andrea.comm import from_environment
    from andrea.engine import Engine
    from andrea.optim import OptimConfig, train_step

    comm = from_environment("cupy")
    rows = []
    multi = comm.size > 1
    for name, B, bucket, rdt in [(m, b, k, r) for m in args.models for b in args.batches for k in (args.bucket_mb if multi else [0])
                                 for r in (args.reduce_dtypes if multi else ["float32"])]:
        cfg = MODELS[name]
        pool = cp.get_default_memory_pool()
        PEAK_TRACKER.start(pool)  # this rank's highest in-use figure from here on
        before = pool.used_bytes()
        e = Engine(cfg, batch_size=B, seq_len=args.seq, backend="cupy", precision="bf16", comm=comm, reduce_bucket_mb=bucket,
                   reduce_dtype=rdt)
        x = np.random.default_rng(comm.rank).integers(0, cfg.vocab_size, (B, args.seq + 1))
        batch = e.prepare(x[:, :-1], x[:, 1:])
        oc = OptimConfig(lr=3e-4, warmup_steps=1)

        def step_with(reduce: bool):  # as optim.launch_step queues a step, read at once as with several ranks
            e.forward_backward(batch, reduce=reduce, zero_grads=True)
            e.update(1e-4, 0.9, 0.95, 1e-8, 0.0, 1.0)
            e.readback([e.ctrl]).get()  # a host sync, as every training step with several ranks has

        def allreduce_alone():  # the whole gradient as the backward pass sends it (casts included)
            e.be.reduce_async(comm, e.g, rdt)
            e.be.reduce_join()
            cp.cuda.get_current_stream().synchronize()

        def timed(fn):
            for _ in range(args.warmup):
                fn()
            comm.barrier()
            out = []
            for _ in range(args.rounds):
                cp.cuda.Device().synchronize()
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    fn()
                cp.cuda.Device().synchronize()
                out.append((time.perf_counter() - t0) / args.steps)
                comm.barrier()
            return sorted(out)[len(out) // 2], out

        train_step(e, [batch], 0, oc)  # the training path itself, once (captures its graph)
        with_s, with_rounds = timed(lambda: step_with(True))
        without_s, _ = timed(lambda: step_with(False))
        alone_s, _ = timed(allreduce_alone) if comm.size > 1 else (0.0, [])
        tokens = comm.size * B * args.seq
        row = {"model": name, "B": B, "T": args.seq, "gpus": comm.size, "bucket_mb": bucket, "reduce_dtype": rdt, "step_s": with_s, "rounds_s": with_rounds,
               "tok_s": tokens / with_s, "mfu": flops_per_token(cfg) * tokens / with_s / PEAK / comm.size,
               "step_without_reduce_s": without_s, "allreduce_alone_s": alone_s,
               "hidden": (1 - (with_s - without_s) / alone_s) if alone_s else None,
               "grad_mib": e.g.nbytes / 2**20, "peak_gib_rank0": (PEAK_TRACKER.peak - before) / 2**30}
        if comm.is_root:
            print(json.dumps(row), flush=True)
        rows.append(row)
        e.release_graphs()  # before comm.close(): NCCL waits for graphs holding its operations
        e.be.release()
    if comm.is_root:
        Path(args.result).write_text(json.dumps(rows))
    import gc

    gc.collect()  # every engine's graphs were released above; none may outlive the communicator
    comm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["ANDREA-120M"])
    ap.add_argument("--batches", nargs="+", type=int, default=[8, 32])
    ap.add_argument("--gpus", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--bucket-mb", nargs="+", type=float, default=[25.0], help="gradient bucket sizes to compare (0: no overlap)")
    ap.add_argument("--reduce-dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16"],
                    help="what the gradients are averaged in (with several GPUs)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    from andrea.comm import launch_environment, mpirun_command

    results = []
    for n in args.gpus:
        with tempfile.TemporaryDirectory() as tmp:
            result = Path(tmp) / "rows.json"
            argv = [sys.executable, __file__, "--worker", "--result", str(result), "--models", *args.models,
                    "--batches", *map(str, args.batches), "--seq", str(args.seq), "--steps", str(args.steps),
                    "--rounds", str(args.rounds), "--warmup", str(args.warmup), "--bucket-mb", *map(str, args.bucket_mb),
                    "--reduce-dtypes", *args.reduce_dtypes]
            cmd = mpirun_command(n, argv) if n > 1 else argv
            subprocess.run(cmd, check=True, env=launch_environment({"PYTHONPATH": os.pathsep.join([str(REPO / "bench"), str(REPO)])}))
            results += json.loads(result.read_text())
    one = {(r["model"], r["B"]): r["tok_s"] for r in results if r["gpus"] == 1}
    print("\n| model | per-GPU B | GPUs | bucket MB | reduced in | tokens/s | MFU per GPU | scaling efficiency | step ms (no reduce) | all-reduce alone ms | hidden | peak GiB (rank 0) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        base = one.get((r["model"], r["B"]))
        eff = f"{r['tok_s'] / (r['gpus'] * base):.1%}" if base else "—"
        hidden = f"{r['hidden']:.0%}" if r["hidden"] is not None else "—"
        bucket = "—" if r["gpus"] == 1 else f"{r['bucket_mb']:g}"
        rdt = "—" if r["gpus"] == 1 else r["reduce_dtype"]
        print(f"| {r['model']} | {r['B']} | {r['gpus']} | {bucket} | {rdt} | {r['tok_s']:,.0f} | {r['mfu']:.1%} | {eff} | "
              f"{r['step_s'] * 1e3:.2f} ({r['step_without_reduce_s'] * 1e3:.2f}) | {r['allreduce_alone_s'] * 1e3:.2f} | {hidden} | "
              f"{r.get('peak_gib_rank0', float('nan')):.2f} |")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
