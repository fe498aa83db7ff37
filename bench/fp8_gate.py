"""fp8's quality gate (issue 15): one model trained in bf16 and in fp8 from the same weights on the
same batches of a real corpus, its validation loss on the held-out documents compared: fp8 must end
within --gate (1.5 %) of bf16 (and so must the bf16 residual stream against the fp32 one). Also the
fp8 casts' overflow and underflow counts, and the steps' speed of each run.

    python3 bench/fp8_gate.py --shards results/ANDREA-120M/shards.json --steps 2000 --out DIR
    python3 bench/fp8_gate.py ... --precisions bf16:fp32 bf16 fp8   # the residual stream's gate too

Runs are PRECISION, PRECISION:RESIDUAL (the residual stream in fp32 or bf16, ANDREA_RESIDUAL) or
PRECISION:RESIDUAL:GELU (the GELU output kept or recomputed, ANDREA_GELU; an empty RESIDUAL is the
default); each run after the first is gated against the first.

The data: the encode stage's shards (shards.json names the directory), rows drawn as training
draws them (a source with probability ∝ its tokens, a training document uniformly, a window of
T + 1 tokens from its start; the held-out documents, every `--heldout-every`-th, are never read).
The schedule: warm-up then cosine (andrea/optim.py) over --steps. Validation: the held-out windows
(andrea/evaluation.py, as the trainer validates), every --eval-every steps on the training engine
(fp8 forward passes for the fp8 run), and at the end with one bf16 engine with the fp32 residual
stream for every run. Writes DIR/fp8_gate.json (curves, final losses, the verdict, counts) and
exits 1 when the gate fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from andrea.curriculum import is_heldout  # noqa: E402
from andrea.engine import Engine  # noqa: E402
from andrea.evaluation import build_eval_set, evaluate, prepare_batches  # noqa: E402
from andrea.io import write_json_atomic  # noqa: E402
from andrea.optim import OptimConfig, train_step  # noqa: E402
from andrea.shards import Shard  # noqa: E402
from gpu_bench import MODELS  # noqa: E402


def draw_rows(shards: dict, steps: int, B: int, T: int, heldout_every: int, seed: int) -> np.ndarray:
    """[steps, B, T + 1] token rows, the same for every precision."""
    names = sorted(shards)
    weights = np.array([shards[n].n_tokens for n in names], np.float64)
    rng = np.random.default_rng(seed)
    out = np.empty((steps, B, T + 1), np.uint16)
    for s in range(steps):
        for b in range(B):
            sh = shards[names[rng.choice(len(names), p=weights / weights.sum())]]
            d = int(rng.integers(sh.n_docs))
            while is_heldout(d, heldout_every):
                d = int(rng.integers(sh.n_docs))
            out[s, b] = sh.window(d, T, heldout_every)[0]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=Path, required=True, help="a model's shards.json (the encode stage's output)")
    ap.add_argument("--model", default="ANDREA-120M", choices=list(MODELS))
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-windows", type=int, default=32, help="held-out windows per source")
    ap.add_argument("--heldout-every", type=int, default=50, help="as the curriculum's heldout_every (config default 50)")
    ap.add_argument("--precisions", nargs="+", default=["bf16", "fp8"],
                    help="runs, each PRECISION, PRECISION:RESIDUAL (the residual stream's type, fp32 or bf16: "
                         "ANDREA_RESIDUAL; default bf16 in bf16 and fp8) or PRECISION:RESIDUAL:GELU (keep or recompute: "
                         "ANDREA_GELU); each run after the first is gated against it")
    ap.add_argument("--gate", type=float, default=0.015)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    import cupy as cp

    meta = json.loads(args.shards.read_text())
    shard_dir = Path(meta["shard_dir"])  # relative to the directory the workflow ran in (run this from there)
    shards = {n: Shard(shard_dir, n, verify_hash=False) for n in meta["sources"] if meta["sources"][n]["n_tokens"]}
    cfg = MODELS[args.model]
    T, B = args.seq, args.batch
    t0 = time.perf_counter()
    rows = draw_rows(shards, args.steps, B, T, args.heldout_every, args.seed)
    es = build_eval_set(shards, args.heldout_every, T, args.eval_windows * T, np.ones(cfg.vocab_size, np.int64))
    print(f"{args.model}: {len(shards)} sources, {sum(s.n_tokens for s in shards.values()):,} tokens; {args.steps} steps of "
          f"{B}x{T}; {len(es)} held-out windows ({', '.join(es.sources)}); rows drawn in {time.perf_counter() - t0:.1f} s",
          flush=True)
    oc = OptimConfig(lr=args.lr, warmup_steps=args.warmup, max_steps=args.steps)
    result = {"model": args.model, "steps": args.steps, "batch": B, "seq": T, "lr": args.lr, "warmup": args.warmup,
              "tokens": int(sum(s.n_tokens for s in shards.values())), "runs": {}}
    finals = {}
    for run_name in args.precisions:
        prec, _, rest = run_name.partition(":")
        residual, _, gelu = rest.partition(":")
        env = {"ANDREA_RESIDUAL": residual or os.environ.get("ANDREA_RESIDUAL", "bf16")}
        env |= {"ANDREA_GELU": gelu} if gelu else {}
        with mock.patch.dict(os.environ, env):
            e = Engine(cfg, batch_size=B, seq_len=T, backend="cupy", precision=prec, seed=args.seed)  # reads it
        eval_batches = prepare_batches(e, es)
        curve, losses = [], []
        t_train = 0.0
        for s in range(args.steps):
            t = time.perf_counter()
            b = e.prepare(rows[s, :, :-1], rows[s, :, 1:])
            losses.append(train_step(e, [b], s, oc).loss)
            t_train += time.perf_counter() - t
            if (s + 1) % args.eval_every == 0 or s + 1 == args.steps:
                r = evaluate(e, es, eval_batches)
                curve.append({"step": s + 1, "val_loss": r["loss"], "train_loss": float(np.mean(losses[-50:]))})
                print(f"{run_name} step {s + 1}: train {curve[-1]['train_loss']:.4f} val {r['loss']:.4f} "
                      f"({B * T * (s + 1) / t_train:,.0f} tok/s so far)", flush=True)
        run = {"curve": curve, "train_losses": [round(x, 5) for x in losses], "tok_s": B * T * args.steps / t_train,
               "val_loss_own": curve[-1]["val_loss"]}
        if prec == "fp8":
            run["fp8_counts"] = e.be.fp8_counts()
            run["fp8_scales"] = e.be.fp8.scales()
        run["residual"] = e.be.residual
        run["gelu_kept"] = not e.be.recomputes_gelu
        finals[run_name] = cp.asnumpy(e.w)
        result["runs"][run_name] = run
        e.be.release()
        del e
    # the end: one bf16 engine over each run's weights, with the fp32 residual stream (the more exact
    # scorer; the audit scores with the stream the model trained on)
    with mock.patch.dict(os.environ, {"ANDREA_RESIDUAL": "fp32"}):
        ev = Engine(cfg, batch_size=B, seq_len=T, backend="cupy", precision="bf16", seed=args.seed)
    for name, w in finals.items():
        ev.load_state(w)
        result["runs"][name]["val_loss_bf16_eval"] = evaluate(ev, es)["loss"]
    reference, *others = args.precisions
    a = result["runs"][reference]["val_loss_bf16_eval"]
    result["gates"] = []
    for name in others:
        b = result["runs"][name]["val_loss_bf16_eval"]
        gap = (b - a) / a
        gate = {"reference": reference, "run": name, "reference_loss": a, "loss": b, "relative_gap": gap,
                "limit": args.gate, "passed": bool(abs(gap) <= args.gate)}
        result["gates"].append(gate)
        c = result["runs"][name].get("fp8_counts")
        casts = (f"; fp8 casts {c['values']:,}, overflow {c['overflow']:,}, underflow {c['underflow']:,}" if c else "")
        print(f"validation loss after {args.steps} steps: {reference} {a:.4f}, {name} {b:.4f} ({gap:+.2%}; gate "
              f"±{args.gate:.1%}: {'PASS' if gate['passed'] else 'FAIL'}){casts}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "fp8_gate.json", result)
    return 0 if all(g["passed"] for g in result["gates"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
