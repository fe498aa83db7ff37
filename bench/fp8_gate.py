"""fp8's quality gate (issues 15 and 44): one model trained in bf16 and in fp8 from the same weights on
the same batches of a real corpus, its validation bits per byte on the held-out documents compared:
fp8 must end within --gate (1 %) of bf16, after --steps (6,000) steps: the gate `precision: auto`
asks of a model before it trains it in fp8 (andrea/engine/fp8_records.py). The same for any run
against the first (e.g. the bf16 residual stream against the fp32 one). Also the validation loss
(nats/token) beside it, the fp8 casts' overflow and underflow counts, and the steps' speed of each run.

    python3 bench/fp8_gate.py --shards results/ANDREA-120M/shards.json --model ANDREA-120M --out DIR \
        --record andrea/engine/fp8_records.json     # the gate, its verdict into the fp8 record
    python3 bench/fp8_gate.py ... --steps 2000 --precisions bf16:fp32 bf16 fp8   # the residual stream's gate too

Runs are PRECISION, PRECISION:RESIDUAL (the residual stream in fp32 or bf16, ANDREA_RESIDUAL) or
PRECISION:RESIDUAL:GELU (the GELU output kept or recomputed, ANDREA_GELU; an empty RESIDUAL is the
default); each run after the first is gated against the first.

The data: the encode stage's shards (shards.json names the directory and the tokenizer), rows drawn
as training draws them (a source with probability ∝ its tokens, a training document uniformly, a
window of T + 1 tokens from its start; the held-out documents, every `--heldout-every`-th, are
never read). The schedule: warm-up then cosine (andrea/optim.py) over --steps. Validation: the
held-out windows (andrea/evaluation.py, as the trainer validates: bits/byte counts the UTF-8 bytes
the target tokens stand for, by the shards' tokenizer), every --eval-every steps on the training
engine (fp8 forward passes for the fp8 run), and at each run's end by one bf16 engine with the fp32
residual stream, the same scorer for every run: those final figures are gated. Writes
DIR/fp8_gate.json (curves, final bits/byte and losses, the verdict, counts) and exits 1 when the
gate fails.

--record PATH (the first run bf16, an fp8 run among the others, at least 6,000 steps) writes the fp8
run's verdict as the model's gate entry of the fp8 record, pass or fail, replacing the one before.
--reuse-runs: each finished run's figures (its curve and its final scores, not its weights: tens of
KB) are kept in DIR/runs/RUN.json; a later call with the same settings takes them instead of
training again (the same GPU kind, cuDNN frontend present or not, engine settings, commit and
uncommitted changes), so the two runs of a large model can run in separate calls, on machines that
share nothing but what a call carries back (480M at B=8, an estimate from gpu_bench's 148,090 and
193,691 tokens/s of 2026-12-03: 6,000 steps are ~5.5 min in bf16 and ~4.2 in fp8, plus the
evaluations). --backend numpy runs the same on the CPU (precisions fp32 and fp8, the NumPy
reference; for testing the script on small shapes).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from unittest import mock

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from andrea.curriculum import is_heldout  # noqa: E402
from andrea.engine import Engine  # noqa: E402
from andrea.engine.fp8_records import GATE_LIMIT, GATE_STEPS, update_record, with_gate  # noqa: E402
from andrea.evaluation import build_eval_set, evaluate, prepare_batches  # noqa: E402
from andrea.io import code_version, write_json_atomic  # noqa: E402
from andrea.optim import OptimConfig, train_step  # noqa: E402
from andrea.shards import Shard  # noqa: E402
from andrea.tokenizer import HarrisTokenizer  # noqa: E402
from gpu_bench import ENGINE_ENV, MODELS  # noqa: E402



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


def compare(reference: str, name: str, runs: dict, limit: float) -> dict:
    """Run `name` against `reference` on the final (bf16-scored) validation: the gate is on bits per
    byte, the loss (nats/token) beside it."""
    a, b = runs[reference], runs[name]
    gap = (b["val_bpb_bf16_eval"] - a["val_bpb_bf16_eval"]) / a["val_bpb_bf16_eval"]
    return {"reference": reference, "run": name,
            "reference_bpb": a["val_bpb_bf16_eval"], "bpb": b["val_bpb_bf16_eval"], "relative_difference": gap,
            "reference_loss": a["val_loss_bf16_eval"], "loss": b["val_loss_bf16_eval"],
            "loss_relative_difference": (b["val_loss_bf16_eval"] - a["val_loss_bf16_eval"]) / a["val_loss_bf16_eval"],
            "limit": limit, "passed": bool(abs(gap) <= limit)}


def uncommitted_changes() -> str | None:
    """A hash of the tree's uncommitted changes to tracked files (None: none, or no git): code_version()
    names the commit only, and a device call runs the working tree as it is."""
    try:
        diff = subprocess.run(["git", "-C", str(REPO), "diff", "HEAD"], capture_output=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return hashlib.sha256(diff).hexdigest()[:16] if diff else None


def gate_entry(result: dict, gate: dict, model_config: dict, corpus: dict, gpu: str, compute_capability: str,
               command: str, date: str, commit: str) -> dict:
    """The fp8 record's gate entry of a model (andrea/engine/fp8_records.py) from this run's bf16-fp8 verdict."""
    return {"model_config": model_config, "steps": result["steps"], "batch_size": result["batch"], "seq_len": result["seq"],
            "lr": result["lr"], "warmup": result["warmup"], "seed": result["seed"], "eval_windows": result["eval_windows"],
            "bf16_bpb": gate["reference_bpb"], "fp8_bpb": gate["bpb"], "relative_difference": gate["relative_difference"],
            "bf16_loss": gate["reference_loss"], "fp8_loss": gate["loss"],
            "loss_relative_difference": gate["loss_relative_difference"], "limit": gate["limit"], "passed": gate["passed"],
            "corpus": corpus, "gpu": gpu, "compute_capability": compute_capability, "date": date, "command": command,
            "commit": commit}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=Path, required=True, help="a model's shards.json (the encode stage's output)")
    ap.add_argument("--model", default="ANDREA-120M", choices=list(MODELS))
    ap.add_argument("--steps", type=int, default=GATE_STEPS)
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
    ap.add_argument("--gate", type=float, default=GATE_LIMIT, help="the largest relative difference in validation bits/byte")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--record", type=Path, help="the fp8 record to write the model's gate verdict to "
                    "(andrea/engine/fp8_records.json: what precision: auto reads)")
    ap.add_argument("--reuse-runs", action="store_true", help="keep each finished run's figures in OUT/runs/, and take "
                    "those of the same settings and code instead of training them again")
    ap.add_argument("--backend", choices=["cupy", "numpy"], default="cupy",
                    help="numpy: the CPU reference (precisions fp32 and fp8), for small test runs")
    args = ap.parse_args()
    if args.record and args.backend != "cupy":
        ap.error("--record gates the GPU engine: run it with --backend cupy")
    if args.record:
        if args.precisions[0] != "bf16" or "fp8" not in args.precisions[1:]:
            ap.error("--record gates plain fp8 against plain bf16: --precisions bf16 ... fp8 ...")
        if args.steps < GATE_STEPS:
            ap.error(f"--record: the gate is {GATE_STEPS:,} steps or more (a shorter run would replace the model's "
                     f"entry with one precision: auto does not accept); run without --record")
        if args.gate != GATE_LIMIT:
            ap.error(f"--record: the gate's limit is {GATE_LIMIT:g} (precision: auto's); run another --gate without --record")
        changed = {k: os.environ[k] for k in ENGINE_ENV if os.environ.get(k)}
        if changed:
            ap.error(f"--record gates the engine as it ships; unset {', '.join(f'{k}={v}' for k, v in changed.items())}")

    from andrea.engine.engine import gpu_kind

    meta = json.loads(args.shards.read_text())
    shard_dir = Path(meta["shard_dir"])  # relative to the directory the workflow ran in (run this from there)
    shards = {n: Shard(shard_dir, n, verify_hash=False) for n in meta["sources"] if meta["sources"][n]["n_tokens"]}
    cfg = MODELS[args.model]
    tok = HarrisTokenizer.load(meta["segments"])  # bits/byte: the bytes each token stands for
    if tok.vocab_size != cfg.vocab_size:
        raise SystemExit(f"{args.shards}: vocabulary {tok.vocab_size}, but {args.model} has {cfg.vocab_size}: "
                         f"give {args.model}'s shards")
    T, B = args.seq, args.batch
    t0 = time.perf_counter()
    rows = draw_rows(shards, args.steps, B, T, args.heldout_every, args.seed)
    es = build_eval_set(shards, args.heldout_every, T, args.eval_windows * T, tok.token_bytes)
    print(f"{args.model}: {len(shards)} sources, {sum(s.n_tokens for s in shards.values()):,} tokens; {args.steps} steps of "
          f"{B}x{T}; {len(es)} held-out windows ({', '.join(es.sources)}); rows drawn in {time.perf_counter() - t0:.1f} s",
          flush=True)
    oc = OptimConfig(lr=args.lr, warmup_steps=args.warmup, max_steps=args.steps)
    result = {"model": args.model, "steps": args.steps, "batch": B, "seq": T, "lr": args.lr, "warmup": args.warmup,
              "seed": args.seed, "eval_windows": len(es), "tokens": int(sum(s.n_tokens for s in shards.values())),
              "runs": {}}
    # what a kept run must share with this call to be taken instead of trained (--reuse-runs)
    settings = {k: result[k] for k in ("model", "steps", "batch", "seq", "lr", "warmup", "seed", "eval_windows", "tokens")}
    settings |= {"eval_every": args.eval_every, "heldout_every": args.heldout_every, "tokenizer_hash": meta["tokenizer_hash"],
                 "env": {k: os.environ.get(k) for k in ENGINE_ENV}, "code": code_version(),
                 "uncommitted": uncommitted_changes(), "backend": args.backend}
    if args.backend == "cupy":  # another GPU kind, or cuDNN's attention in place of ours: trained again
        settings |= {"gpu": list(gpu_kind()), "cudnn_frontend": importlib.util.find_spec("cudnn") is not None}
    kept_dir = args.out / "runs"
    scorer = None  # the final scores' engine: bf16 with the fp32 residual stream (the more exact scorer; the
    # audit scores with the stream the model trained on), made once, after the first run has trained
    for run_name in args.precisions:
        kept = kept_dir / f"{run_name.replace(':', '_')}.json"
        if args.reuse_runs and kept.exists():
            doc = json.loads(kept.read_text())
            if doc.get("settings") == settings and "val_bpb_bf16_eval" in doc.get("run", {}):
                result["runs"][run_name] = doc["run"]
                print(f"{run_name}: taken from {kept} (trained by an earlier call)", flush=True)
                continue
            print(f"{run_name}: {kept} was trained with other settings, code or machine; training again", flush=True)
        prec, _, rest = run_name.partition(":")
        residual, _, gelu = rest.partition(":")
        env = {"ANDREA_RESIDUAL": residual or os.environ.get("ANDREA_RESIDUAL", "bf16")}
        env |= {"ANDREA_GELU": gelu} if gelu else {}
        with mock.patch.dict(os.environ, env):
            e = Engine(cfg, batch_size=B, seq_len=T, backend=args.backend, precision=prec, seed=args.seed)  # reads it
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
                curve.append({"step": s + 1, "val_loss": r["loss"], "val_bpb": r["bpb"],
                              "train_loss": float(np.mean(losses[-50:]))})
                print(f"{run_name} step {s + 1}: train {curve[-1]['train_loss']:.4f} val {r['loss']:.4f} nats/token, "
                      f"{r['bpb']:.4f} bits/byte ({B * T * (s + 1) / t_train:,.0f} tok/s so far)", flush=True)
        run = {"curve": curve, "train_losses": [round(x, 5) for x in losses], "tok_s": B * T * args.steps / t_train,
               "val_loss_own": curve[-1]["val_loss"], "val_bpb_own": curve[-1]["val_bpb"]}
        if prec == "fp8":
            run["fp8_counts"] = e.be.fp8_counts()
            scales = getattr(getattr(e.be, "fp8", None), "scales", None)  # the CuPy backend's per-site scales
            if scales is not None:
                run["fp8_scales"] = scales()
        run["residual"] = getattr(e.be, "residual", "fp32")  # the NumPy backend's stream is fp32
        run["gelu_kept"] = not e.be.recomputes_gelu
        if scorer is None:
            with mock.patch.dict(os.environ, {"ANDREA_RESIDUAL": "fp32"}):
                scorer = Engine(cfg, batch_size=B, seq_len=T, backend=args.backend,
                                precision="bf16" if args.backend == "cupy" else "fp32", seed=args.seed)
        scorer.load_state(e.w)
        r = evaluate(scorer, es)
        run["val_loss_bf16_eval"], run["val_bpb_bf16_eval"] = r["loss"], r["bpb"]
        result["runs"][run_name] = run
        if args.reuse_runs:
            kept_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(kept, {"settings": settings, "run": run})
        e.be.release()
        del e
    reference, *others = args.precisions
    result["gates"] = []
    for name in others:
        gate = compare(reference, name, result["runs"], args.gate)
        result["gates"].append(gate)
        c = result["runs"][name].get("fp8_counts")
        casts = (f"; fp8 casts {c['values']:,}, overflow {c['overflow']:,}, underflow {c['underflow']:,}" if c else "")
        print(f"validation after {args.steps} steps: {reference} {gate['reference_bpb']:.4f} bits/byte "
              f"({gate['reference_loss']:.4f} nats/token), {name} {gate['bpb']:.4f} ({gate['loss']:.4f}): "
              f"{gate['relative_difference']:+.2%} bits/byte; gate ±{args.gate:.1%}: "
              f"{'PASS' if gate['passed'] else 'FAIL'}{casts}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "fp8_gate.json", result)
    if args.record:
        gpu, cc = gpu_kind()
        corpus = {"shards": str(args.shards), "tokenizer_hash": meta["tokenizer_hash"], "tokens": result["tokens"],
                  "sources": sorted(shards)}
        entry = gate_entry(result, next(g for g in result["gates"] if g["run"] == "fp8"), asdict(cfg), corpus, gpu, cc,
                           " ".join(["python3", *sys.argv]), time.strftime("%Y-%m-%d", time.gmtime()), code_version())
        update_record(args.record, lambda record: with_gate(record, args.model, entry))
        print(f"{args.record}: {args.model}'s fp8 gate entry written ({'passed' if entry['passed'] else 'failed'})", flush=True)
    return 0 if all(g["passed"] for g in result["gates"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
