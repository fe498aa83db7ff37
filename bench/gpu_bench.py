"""ANDREA's CuPy engine vs PyTorch on one GPU, side by side in one run (issue: GPU backend).

PyTorch runs the same architecture (bf16 autocast + torch.compile + scaled_dot_product_attention,
fused AdamW, global clipping; its batch already on the GPU), in torch.compile's default mode and in
its CUDA-graph mode (reduce-overhead), and the ratios are to the faster of the two. Ours runs the
CuPy backend in bf16 and fp16 (CUDA graphs), bf16 without graphs, and fp32, each step an
optim.launch_step with the next batch prepared in a background thread meanwhile and the step's
results read after the next step is launched (as the trainer does: andrea/trainer.py). All of a
configuration's runners are built first, then timed in rounds, taking turns, and the median round
counts (PyTorch alone varied by ±20 % between runs here). For
each model and batch size: tokens/s, MFU (llm.c's formula: flops/token = 6·N + 6·L·d·T, against
989 TFLOP/s bf16), peak GPU memory (PyTorch: max_memory_allocated; ours: the highest in-use figure
of CuPy's pool, tracked by an allocator wrapper), and the ratio ours/PyTorch. Where NVML is there
(the driver's library), also each runner's energy over its rounds: joules per step, tokens per joule,
mean power and SM clock, and how often the power cap held the clock down (bench/gpu_power.py: at
ANDREA-120M B=32 every runner runs at the H200's 700 W cap). Prints Markdown tables, writes JSON.

    python3 bench/gpu_bench.py --out results.json
    python3 bench/gpu_bench.py --models ANDREA-12M --batches 8 --precisions bf16 --rounds 5
    python3 bench/gpu_bench.py --models ANDREA-120M --batches 8 32 --precisions bf16 fp8 \
        --record andrea/engine/fp8_records.json   # the speeds precision: auto decides fp8 by

With --record PATH, each model and batch size's bf16 and fp8 tokens/s (the plain "bf16" and "fp8"
runners) replace that GPU kind's, model's and shape's row in the fp8 record
(andrea/engine/fp8_records.py), with the date, the command and the commit.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from andrea.model import ModelConfig, flops_per_token, n_params  # noqa: E402
from gpu_power import PowerMeter  # noqa: E402 (bench/, the script's folder)

PEAK = 989e12
MODELS = {  # the config/config.yaml table (read without the config machinery: the device lacks jsonschema)
    "ANDREA-12M": ModelConfig(vocab_size=4353, d_model=384, n_head=12, n_layer=6, context=1024),
    "ANDREA-120M": ModelConfig(vocab_size=8449, d_model=768, n_head=12, n_layer=12, context=1024),
    "ANDREA-480M": ModelConfig(vocab_size=16641, d_model=1536, n_head=24, n_layer=16, context=1024),
}


class PeakTracker:
    """CuPy's pool reports what is in use now, not its peak: this allocator wraps the pool and
    records the highest in-use figure after every allocation (with `record_sites`, also where in
    andrea/ the allocation that reached it was made: bench/memory_breakdown.py)."""

    def __init__(self):
        self.pool, self.peak, self.record_sites, self.site = None, 0, False, ""

    def start(self, pool):
        import cupy as cp

        if self.pool is None:
            cp.cuda.set_allocator(self.malloc)
        self.pool, self.peak, self.site = pool, pool.used_bytes(), ""

    def malloc(self, nbytes):
        mem = self.pool.malloc(nbytes)
        used = self.pool.used_bytes()
        if used > self.peak:
            self.peak = used
            if self.record_sites:
                import traceback

                frames = [f for f in traceback.extract_stack()[:-1] if "/andrea/" in f.filename][-3:]
                self.site = f"{nbytes / (1 << 20):.1f} MiB at " + " <- ".join(
                    f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
        return mem


PEAK_TRACKER = PeakTracker()


class Ours:
    """Our engine at one precision: fp32, bf16, fp16 or fp8 (CUDA graphs); "-eager": without graphs;
    "-nondet": cuDNN attention's non-deterministic backward (ANDREA_ATTENTION_DETERMINISTIC=0);
    "-wsN": ANDREA_ATTENTION_WORKSPACE_MIB=N; "-r32": the fp32 residual stream (ANDREA_RESIDUAL=fp32);
    "-gk" / "-gr": each layer's GELU output kept / recomputed in the backward (ANDREA_GELU=keep / recompute);
    "-noepi": the MLP's GELU as a pass of its own, not its first product's epilogue (ANDREA_GELU_EPILOGUE=0;
    in fp8: a cast from h); "-flash": our attention kernels even where cuDNN's are installed
    (ANDREA_ATTENTION=flash); "-mma": ours with the mma.sync kernels, not the Hopper wgmma ones
    (ANDREA_ATTENTION=mma; beside "-flash" where cuDNN is installed, as plain runners run cuDNN's)."""

    def __init__(self, cfg, B, T, precision, warmup):
        import cupy as cp

        from andrea.engine import Engine
        from andrea.optim import OptimConfig, StepsInFlight, launch_step

        self.cp, self.launch_step = cp, launch_step
        pool = cp.get_default_memory_pool()
        gc.collect()  # engines of the previous configuration hold reference cycles (captured graphs)
        before = pool.used_bytes()
        PEAK_TRACKER.start(pool)
        flags = precision.split("-")[1:]
        env = {"ANDREA_ATTENTION_DETERMINISTIC": "0" if "nondet" in flags else os.environ.get("ANDREA_ATTENTION_DETERMINISTIC", "1")}
        env.update({"ANDREA_ATTENTION_WORKSPACE_MIB": f[2:] for f in flags if f.startswith("ws")})
        env["ANDREA_RESIDUAL"] = "fp32" if "r32" in flags else os.environ.get("ANDREA_RESIDUAL", "bf16")
        gelu = {"gk": "keep", "gr": "recompute"}
        env.update({"ANDREA_GELU": gelu[f] for f in flags if f in gelu})
        env["ANDREA_GELU_EPILOGUE"] = "0" if "noepi" in flags else os.environ.get("ANDREA_GELU_EPILOGUE", "1")
        for impl in ("flash", "mma"):
            if impl in flags:
                env["ANDREA_ATTENTION"] = impl
        with mock.patch.dict(os.environ, env):  # the backend reads them when it is made
            self.e = Engine(cfg, batch_size=B, seq_len=T, backend="cupy", precision=precision.split("-")[0])
        self.e.graphs = self.e.graphs and "eager" not in flags
        x = np.random.default_rng(0).integers(0, cfg.vocab_size, (B, T + 1))
        self.raw = (x[:, :-1], x[:, 1:])
        # as the trainer does: the next batch is checked and prepared (the embedding backward's
        # plan) in a background thread while the step runs on the device
        self.prefetch = ThreadPoolExecutor(1)
        self.next = self.prefetch.submit(self.e.prepare, *self.raw)
        self.oc = OptimConfig(lr=3e-4, warmup_steps=1)
        self.step = 0
        self.in_flight = StepsInFlight(self.e)  # as the trainer reads its steps
        self.run(warmup)
        # the most GPU memory in use while this engine was built and warmed up (steps allocate the
        # same every time), beyond what was in use before (its backend's scratch included: each
        # engine's backend has its own)
        self.peak = PEAK_TRACKER.peak - before
        self.plan = self.e.memory_plan().total

    def run(self, steps):
        for _ in range(steps):
            self.in_flight.push(self.launch_step(self.e, [self.next.result()], self.step, self.oc))
            self.step += 1
            self.next = self.prefetch.submit(self.e.prepare, *self.raw)
        self.in_flight.drain()
        self.cp.cuda.Device().synchronize()


class Torch:
    """The PyTorch reference: bf16 autocast + torch.compile + SDPA, fused AdamW, global clipping.
    mode "graphs": torch.compile's "reduce-overhead" mode, which replays the forward and backward as
    CUDA graphs (no launch work on the host: at 120M B=8 the default mode's GPU waits on the host)."""

    MODES = {"default": None, "graphs": "reduce-overhead"}

    def __init__(self, cfg, B, T, warmup, mode="default"):
        import torch

        from torch_reference import torch_model

        torch.manual_seed(0)
        self.torch = torch
        before = torch.cuda.memory_allocated()  # what PyTorch runners built before this one hold
        model = torch_model(cfg).to("cuda")
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, fused=True)
        cmodel = torch.compile(model, mode=self.MODES[mode])
        x = torch.randint(0, cfg.vocab_size, (B, T + 1), device="cuda")
        inp, tgt = x[:, :-1].contiguous(), x[:, 1:].contiguous()
        graphs = mode == "graphs"

        def step():
            if graphs:  # the last step's graph outputs (the gradients, already used) may be overwritten
                torch.compiler.cudagraph_mark_step_begin()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = cmodel(inp, tgt)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

        self.step_fn = step
        torch.cuda.reset_peak_memory_stats()
        self.run(warmup)
        self.peak = torch.cuda.max_memory_allocated() - before
        self.plan = None

    def run(self, steps):
        for _ in range(steps):
            self.step_fn()
        self.torch.cuda.synchronize()


def timed_rounds(runners, steps, rounds, meter=None):
    """Seconds per step of each runner: `rounds` rounds, the runners taking turns (so that clock
    and thermal drift hit all of them alike); the median round counts. With a PowerMeter, each
    round's energy, clock and power cap are read too (readings[name]: one per round)."""
    times = {name: [] for name in runners}
    readings = {name: [] for name in runners}
    for _ in range(rounds):
        for name, r in runners.items():
            with (meter.measure() if meter else nullcontext()) as reading:
                t0 = time.perf_counter()
                r.run(steps)
                times[name].append((time.perf_counter() - t0) / steps)
            if reading is not None:
                readings[name].append(reading)
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}, times, readings


# NVML's energy counter moves in steps too coarse for short stretches: summed over less than this many
# seconds its figures came out above the 700 W cap (ANDREA-12M, 120M at B=8 with 20-step rounds)
ENERGY_MIN_SECONDS = 3.0


def energy_of(readings, steps, tokens) -> dict:
    """Joules per step, tokens per joule, mean power, SM clock and share of samples capped or slowed over
    all of a runner's rounds; {} where those rounds lasted under ENERGY_MIN_SECONDS (more --steps)."""
    joules, seconds = sum(r.joules for r in readings), sum(r.seconds for r in readings)
    if seconds < ENERGY_MIN_SECONDS:
        return {}
    n = steps * len(readings)
    return {"j_per_step": joules / n, "tok_per_j": tokens * n / joules if joules else 0.0,
            "watts": joules / seconds if seconds else 0.0, "sm_mhz": sum(r.sm_mhz for r in readings) / len(readings),
            "capped": sum(r.capped for r in readings) / len(readings)}


def best_torch(row) -> dict | None:
    """The fastest PyTorch runner's figures of a result row (with its name under "runner"), or None."""
    runs = [dict(x, runner=k) for k, x in row.items() if k.startswith("torch") and isinstance(x, dict)]
    return max(runs, key=lambda x: x["tok_s"], default=None)


# the engine's settings by environment variable (the runners' flags set them per runner): a measurement
# recorded for the engine as it ships is taken with none set (--record here, fp8_gate.py's too)
ENGINE_ENV = ("ANDREA_RESIDUAL", "ANDREA_GELU", "ANDREA_GELU_EPILOGUE", "ANDREA_FP8_PRODUCTS", "ANDREA_ATTENTION",
              "ANDREA_ATTENTION_DETERMINISTIC", "ANDREA_ATTENTION_WORKSPACE_MIB", "ANDREA_GEMM_TUNE")


def speed_rows(rows: list[dict], gpu: str, compute_capability: str, command: str, date: str, commit: str) -> list[dict]:
    """The fp8 record's speed rows (andrea/engine/fp8_records.py) of the result rows where both
    the plain bf16 and fp8 runners ran."""
    from dataclasses import asdict

    return [{"gpu": gpu, "compute_capability": compute_capability, "model": r["model"],
             "model_config": asdict(MODELS[r["model"]]), "batch_size": r["B"], "seq_len": r["T"],
             "bf16_tok_s": round(r["ours_bf16"]["tok_s"]), "fp8_tok_s": round(r["ours_fp8"]["tok_s"]),
             "date": date, "command": command, "commit": commit}
            for r in rows if "ours_bf16" in r and "ours_fp8" in r]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["ANDREA-12M", "ANDREA-120M"], choices=list(MODELS))
    ap.add_argument("--batches", nargs="+", type=int, default=[8, 32])
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20, help="steps per timed round (rounds of a second or so: the power cap's steady state)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the runners taking turns; the median counts")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--precisions", nargs="+", default=["bf16", "fp16", "bf16-eager", "fp32"],
                    help="bf16 / fp16 / fp8 (CUDA graphs), bf16-eager (no graphs), bf16-nondet (cuDNN's "
                         "non-deterministic attention backward), bf16-ws512 (its workspace up to 512 MiB), bf16-r32 (the fp32 "
                         "residual stream), bf16-gk / bf16-gr (the GELU output kept / recomputed), fp8-noepi (a = gelu(h) cast "
                         "by a pass of its own, not the product's epilogue), bf16-flash / bf16-mma (our attention where cuDNN is installed; "
                         "with the mma.sync forward), fp32")
    ap.add_argument("--torch-modes", nargs="+", default=["default", "graphs"], choices=list(Torch.MODES),
                    help="PyTorch runners: torch.compile's default mode, and its CUDA-graph mode (reduce-overhead); "
                         "ratios are to the faster of them. Each holds its own model and memory: at the largest "
                         "batches pass one")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-ours", action="store_true", help="PyTorch alone (e.g. its largest batch, without our pool beside it)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--record", type=Path, help="the fp8 record to write each shape's bf16 and fp8 tokens/s to "
                    "(andrea/engine/fp8_records.json: what precision: auto reads); needs the bf16 and fp8 runners")
    args = ap.parse_args()
    if args.record and (args.no_ours or not {"bf16", "fp8"} <= set(args.precisions)):
        ap.error("--record needs our bf16 and fp8 runners: --precisions with bf16 and fp8, without --no-ours")
    changed = {k: os.environ[k] for k in ENGINE_ENV if os.environ.get(k)} if args.record else {}
    if changed:  # the record is of the engine as it ships (a runner's flags are set per runner, not here)
        ap.error(f"--record measures the engine as it ships; unset {', '.join(f'{k}={v}' for k, v in changed.items())}")
    import cupy as cp

    meter = PowerMeter.open()
    rows = []
    for name in args.models:
        cfg = MODELS[name]
        for B in args.batches:
            tokens = B * args.seq
            fpt = flops_per_token(cfg)
            runners = {}
            for mode in [] if args.no_torch else args.torch_modes:
                runners["torch" if mode == "default" else f"torch_{mode}"] = Torch(cfg, B, args.seq, args.warmup, mode)
            for prec in [] if args.no_ours else args.precisions:
                runners[f"ours_{prec}"] = Ours(cfg, B, args.seq, prec, args.warmup)
            med, all_times, readings = timed_rounds(runners, args.steps, args.rounds, meter)
            row = {"model": name, "params": n_params(cfg), "B": B, "T": args.seq}
            for key, dt in med.items():
                r = runners[key]
                row[key] = {"tok_s": tokens / dt, "mfu": fpt * tokens / dt / PEAK, "peak_gib": r.peak / 2**30, "step_ms": dt * 1e3,
                            "rounds_ms": [round(t * 1e3, 3) for t in all_times[key]]}
                if r.plan is not None:
                    row[key]["plan_gib"] = r.plan / 2**30
                if isinstance(r, Ours):
                    row[key]["implementation"] = r.e.be.implementation()  # the plan line: which attention ran
                power = ""
                if readings[key] and energy_of(readings[key], args.steps, tokens):
                    row[key] |= energy_of(readings[key], args.steps, tokens)
                    x = row[key]
                    power = (f", {x['j_per_step']:.2f} J/step ({x['tok_per_j']:,.0f} tok/J) at {x['watts']:.0f} W, "
                             f"SM {x['sm_mhz']:.0f} MHz, clock held down by the power cap or a slowdown {x['capped']:.0%} of the time")
                print(f"{name} B={B} {key}: {tokens / dt:,.0f} tok/s, MFU {fpt * tokens / dt / PEAK:.1%}, peak {r.peak / 2**30:.2f} GiB, "
                      f"rounds {row[key]['rounds_ms']} ms{power}", flush=True)
            rows.append(row)
            for r in runners.values():
                if isinstance(r, Ours):
                    r.e.be.release()  # its scratch, weight copy and cuBLAS workspace
            del runners
            gc.collect()
            cp.get_default_memory_pool().free_all_blocks()
            if not args.no_torch:
                import torch

                # the compiled graphs and CUDA-graph pools of this configuration go too (and dynamo's
                # recompile limit, 8 per function, is not reached by later configurations)
                torch._dynamo.reset()
                torch.cuda.empty_cache()

    print("\nPyTorch: the faster of its runners in each row (its mode named); the ratios are to it.")
    print("| model | B×T | PyTorch tok/s (MFU, GiB) | ours bf16 tok/s (MFU, GiB) | ours fp8 tok/s (MFU, GiB) | ours fp16 | "
          "bf16 no graphs | fp32 | bf16 / PyTorch | fp8 / PyTorch |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        t, b, f8 = best_torch(r), r.get("ours_bf16"), r.get("ours_fp8")
        cell = lambda x: f"{x['tok_s']:,.0f} ({x['mfu']:.1%}, {x['peak_gib']:.2f})" if x else "—"  # noqa: E731
        plain = lambda x: f"{x['tok_s']:,.0f}" if x else "—"  # noqa: E731
        ratio = lambda x: f"{x['tok_s'] / t['tok_s']:.2f}" if (t and x) else "—"  # noqa: E731
        mode = f" {t['runner']}" if t else ""
        print(f"| {r['model']} | {r['B']}×{r['T']} | {cell(t)}{mode} | {cell(b)} | {cell(f8)} | {plain(r.get('ours_fp16'))} | "
              f"{plain(r.get('ours_bf16-eager'))} | {plain(r.get('ours_fp32'))} | {ratio(b)} | {ratio(f8)} |")
    others = sorted({k for r in rows for k in r if k.startswith("ours_")} - {"ours_bf16", "ours_fp8"})
    if rows and best_torch(rows[0]) and others:
        print("\n| model | B | " + " | ".join(f"{k[5:]} tok/s (/ PyTorch, GiB)" for k in others) + " |")
        print("|---|---|" + "---|" * len(others))
        for r in rows:
            t = best_torch(r)
            cells = [f"{r[k]['tok_s']:,.0f} ({r[k]['tok_s'] / t['tok_s']:.2f}, {r[k]['peak_gib']:.2f})" if k in r and t else "—"
                     for k in others]
            print(f"| {r['model']} | {r['B']} | " + " | ".join(cells) + " |")
    withheld = [f"{r['model']} B={r['B']} {k}" for r in rows for k, x in r.items() if isinstance(x, dict) and "j_per_step" not in x]
    if meter is not None and withheld:
        print(f"\nenergy withheld where a runner's rounds lasted under {ENERGY_MIN_SECONDS:.0f} s in all "
              f"(NVML's counter is too coarse there; pass more --steps or --rounds): {', '.join(withheld)}")
    if meter is not None and any("j_per_step" in x for r in rows for x in r.values() if isinstance(x, dict)):
        print("\n| model | B | runner | J/step | tok/J | W | SM MHz | capped or slowed |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            for k, x in r.items():
                if isinstance(x, dict) and "j_per_step" in x:
                    print(f"| {r['model']} | {r['B']} | {k} | {x['j_per_step']:.2f} | {x['tok_per_j']:,.0f} | {x['watts']:.0f} | "
                          f"{x['sm_mhz']:.0f} | {x['capped']:.0%} |")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))
    if args.record:
        from andrea.engine.engine import gpu_kind
        from andrea.engine.fp8_records import update_record, with_speed_rows
        from andrea.io import code_version

        gpu, cc = gpu_kind()
        new = speed_rows(rows, gpu, cc, " ".join(["python3", *sys.argv]), time.strftime("%Y-%m-%d", time.gmtime()),
                         code_version())
        update_record(args.record, lambda record: with_speed_rows(record, new))
        print(f"\n{args.record}: {len(new)} fp8 speed rows of {gpu} recorded: "
              + ", ".join(f"{r['model']} B={r['batch_size']} {r['fp8_tok_s'] / r['bf16_tok_s']:.2f}×" for r in new))


if __name__ == "__main__":
    main()
