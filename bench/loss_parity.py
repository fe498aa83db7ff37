"""Loss parity: a recorded training run replayed, batch for batch, in PyTorch and in our engine.

A run trained with `record_batches: N` leaves in RUN_DIR/parity/ the weights before step 0
(init.bin, the checkpoint format of design §3.5), the N steps' token rows (batches.bin, uint16
[N, batch_size·grad_accum, T+1]) and what the steps were (meta.json); RUN_DIR/loss.jsonl holds the
losses the run logged. This script replays those steps from the same weights with the same
schedule (andrea/optim.py: warm-up then cosine, global-norm clipping, AdamW with decay on matrices
and embeddings only, gradients averaged over the micro-batches):

  - PyTorch (bench/torch_reference.py) in fp32 (TF32 off) and in bf16 autocast, torch.optim.AdamW;
  - our engine (andrea.engine.Engine + andrea.optim.train_step) in fp32 on the run's backend
    (NumPy where CuPy is missing), and in bf16 where CuPy is there;

and compares the losses every --every steps: ours fp32 against PyTorch fp32 (target ≤ 1 %), ours
bf16 (replayed, and as the run trained) against PyTorch bf16 (target ≤ 2 %). An fp32 run's own
losses are held to PyTorch fp32 instead. Prints a Markdown table and PASS/FAIL per comparison
(exit status 1 on a FAIL), writes parity.json and parity.png (if matplotlib is there) into --out.

    python bench/loss_parity.py RUN_DIR --out DIR [--device cuda|cpu]
    python bench/loss_parity.py --make-demo DIR     # a tiny recorded run (NumPy), for trying it out
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
for p in (REPO, REPO / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from andrea.checkpoint import CheckpointError, read_checkpoint, write_checkpoint  # noqa: E402
from andrea.io import atomic_path, read_document, write_json_atomic, write_text_atomic  # noqa: E402
from andrea.model import ModelConfig, init_weights, n_params  # noqa: E402
from andrea.optim import OptimConfig, lr_at, train_step  # noqa: E402

TARGET_FP32 = 0.01
TARGET_BF16 = 0.02
TOKEN_DTYPE = np.dtype("<u2")
META_KEYS = ("model", "model_config", "batch_size", "grad_accum", "seq_len", "steps", "backend", "precision", "optim")


class RecordingError(ValueError):
    """A parity recording that cannot be replayed; the message names the file and the problem."""


@dataclass
class Recording:
    run_dir: Path
    meta: dict
    cfg: ModelConfig
    oc: OptimConfig
    init: np.ndarray  # float32 [n_params]
    batches: np.ndarray  # uint16 [N, rows, T+1]
    as_trained: list  # the run's logged loss of each step, None where loss.jsonl has none

    @property
    def B(self) -> int:
        return self.meta["batch_size"]

    @property
    def grad_accum(self) -> int:
        return self.meta["grad_accum"]

    @property
    def T(self) -> int:
        return self.meta["seq_len"]

    @property
    def steps(self) -> int:
        return self.batches.shape[0]

    def micro_batches(self, step: int) -> list:
        """Step `step`'s grad_accum micro-batches of (inputs, targets), each [batch_size, T]."""
        rows = self.batches[step].astype(np.int64)
        return [(np.ascontiguousarray(rows[i : i + self.B, :-1]), np.ascontiguousarray(rows[i : i + self.B, 1:]))
                for i in range(0, rows.shape[0], self.B)]


def _dataclass_from(cls, d: dict, where: str):
    names = {f.name for f in dataclasses.fields(cls)}
    required = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    missing = sorted(required - set(d))
    if missing:
        raise RecordingError(f"{where}: missing {', '.join(missing)}")
    try:
        return cls(**{k: v for k, v in d.items() if k in names})
    except (TypeError, ValueError) as e:
        raise RecordingError(f"{where}: {e}") from None


def load_recording(run_dir: str | Path, steps: int | None = None, losses: bool = True) -> Recording:
    """Read and check RUN_DIR/parity/{meta.json, init.bin, batches.bin} and (with `losses`)
    RUN_DIR/loss.jsonl; `steps` keeps only the first that many steps."""
    run_dir = Path(run_dir)
    pdir = run_dir / "parity"
    meta_path = pdir / "meta.json"
    meta = read_document(meta_path, "parity recording (was the run trained with `record_batches: N`?)", error=RecordingError)
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise RecordingError(f"{meta_path}: missing key(s) {', '.join(missing)}")
    for k in ("batch_size", "grad_accum", "seq_len", "steps"):
        if not isinstance(meta[k], int) or meta[k] < 1:
            raise RecordingError(f"{meta_path}: {k} must be a positive integer, not {meta[k]!r}")
    cfg = _dataclass_from(ModelConfig, meta["model_config"], f"{meta_path}: model_config")
    oc = _dataclass_from(OptimConfig, meta["optim"], f"{meta_path}: optim")
    if meta["seq_len"] > cfg.context:
        raise RecordingError(f"{meta_path}: seq_len {meta['seq_len']} exceeds the model's context {cfg.context}")
    if cfg.vocab_size > np.iinfo(TOKEN_DTYPE).max + 1:
        raise RecordingError(f"{meta_path}: vocab_size {cfg.vocab_size} does not fit uint16 token IDs")

    try:
        ckpt = read_checkpoint(pdir / "init.bin", expected_n_params=n_params(cfg))
    except CheckpointError as e:
        raise RecordingError(str(e)) from None
    if ckpt.step != 0:
        raise RecordingError(f"{pdir / 'init.bin'}: step {ckpt.step}, expected the weights before step 0")

    N, rows, T1 = meta["steps"], meta["batch_size"] * meta["grad_accum"], meta["seq_len"] + 1
    bpath = pdir / "batches.bin"
    if not bpath.exists():
        raise RecordingError(f"{bpath}: not found")
    want = N * rows * T1 * TOKEN_DTYPE.itemsize
    size = bpath.stat().st_size
    if size != want:
        raise RecordingError(f"{bpath}: {size:,} bytes, but meta.json's steps {N} × rows {rows} × (seq_len+1) {T1} "
                             f"uint16 tokens need {want:,}")
    batches = np.fromfile(bpath, dtype=TOKEN_DTYPE).reshape(N, rows, T1)
    if steps is not None:
        if not 1 <= steps <= N:
            raise RecordingError(f"--steps {steps}: the recording holds 1..{N} steps")
        batches = batches[:steps]
    top = int(batches.max())
    if top >= cfg.vocab_size:
        step = int(np.argmax((batches >= cfg.vocab_size).any(axis=(1, 2))))
        raise RecordingError(f"{bpath}: token {top} at step {step} is outside the vocabulary (size {cfg.vocab_size})")
    n = batches.shape[0]
    return Recording(run_dir, meta, cfg, oc, ckpt.weights, batches,
                     read_losses(run_dir / "loss.jsonl", n) if losses else [None] * n)


def read_losses(path: Path, steps: int) -> list:
    """The logged training loss of steps 0..steps-1 (the first record of a step counts; None if
    absent; validation records, `"kind": "eval"`, are not training losses).
    An absent loss.jsonl gives all None; a line that is not JSON or lacks step/loss is skipped and counted."""
    losses = [None] * steps
    if not path.exists():
        print(f"note: {path} not found; no as-trained column", file=sys.stderr)
        return losses
    bad = 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
                if rec.get("kind", "train") != "train":
                    continue  # validation records share the file
                step, loss = int(rec["step"]), float(rec["loss"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
                bad += 1
                continue
            if 0 <= step < steps and losses[step] is None:
                losses[step] = loss
    if bad:
        print(f"note: {path}: skipped {bad} malformed line(s)", file=sys.stderr)
    if None in losses:
        print(f"note: {path}: no loss for {losses.count(None)} of the {steps} recorded steps", file=sys.stderr)
    return losses


# ----------------------------------------------------------------------------- replays


def replay_ours(rec: Recording, backend: str, precision: str) -> dict:
    """Our engine from init.bin through the recorded steps: the loss and gradient norm of each."""
    from andrea.engine import Engine

    engine = Engine(rec.cfg, batch_size=rec.B, seq_len=rec.T, backend=backend, precision=precision)
    engine.load_state(rec.init)
    losses, norms = [], []
    for s in range(rec.steps):
        res = train_step(engine, rec.micro_batches(s), s, rec.oc)
        losses.append(res.loss)
        norms.append(res.grad_norm)
    engine.be.release()  # its buffers go back to the pool before the next engine is built
    return {"loss": losses, "grad_norm": norms}


def replay_torch(rec: Recording, device: str, precision: str, compile: bool = False) -> dict:
    """PyTorch from init.bin through the recorded steps, in fp32 or bf16 autocast."""
    import torch

    from torch_reference import load_flat, torch_model

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 (bf16 autocast is unaffected)
    torch.backends.cudnn.allow_tf32 = False
    model = torch_model(rec.cfg)
    decay = load_flat(model, rec.cfg, rec.init)
    model.to(device)
    named = dict(model.named_parameters())
    oc = rec.oc
    groups = [{"params": [p for n, p in named.items() if decay[n]], "weight_decay": oc.weight_decay},
              {"params": [p for n, p in named.items() if not decay[n]], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=oc.lr, betas=(oc.beta1, oc.beta2), eps=oc.eps)
    fwd = torch.compile(model) if compile else model
    n = rec.grad_accum
    losses, norms = [], []
    for s in range(rec.steps):
        opt.zero_grad(set_to_none=True)
        micro = []
        for inputs, targets in rec.micro_batches(s):
            x = torch.from_numpy(inputs).to(device)
            y = torch.from_numpy(targets).to(device)
            with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = fwd(x, y)
            (loss / n).backward()
            micro.append(loss.detach())
        loss = torch.stack(micro).mean().item()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), oc.grad_clip).item()
        if math.isfinite(loss) and math.isfinite(norm):  # as train_step: a non-finite step is skipped
            for g in opt.param_groups:
                g["lr"] = lr_at(s, oc)
            opt.step()
        losses.append(loss)
        norms.append(norm)
    return {"loss": losses, "grad_norm": norms}


# ----------------------------------------------------------------------------- comparison


def rel_diff(a, b) -> list:
    """|a − b| / |b| per step (b the reference); NaN where either is missing or not finite."""
    out = []
    for x, y in zip(a, b):
        ok = x is not None and y is not None and math.isfinite(x) and math.isfinite(y) and y != 0
        out.append(abs(x - y) / abs(y) if ok else float("nan"))
    return out


def comparisons(precision: str) -> list[tuple[str, str, float | None]]:
    """(column, reference column, target) pairs; target None: informative only."""
    pairs = [("ours_fp32", "torch_fp32", TARGET_FP32), ("ours_bf16", "torch_bf16", TARGET_BF16)]
    if precision == "fp32":
        pairs += [("as_trained", "torch_fp32", TARGET_FP32), ("as_trained", "ours_fp32", None)]
    else:  # bf16 (or fp16, held to bf16's target: PyTorch has no fp16 replay here)
        pairs += [("as_trained", "torch_bf16", TARGET_BF16)]
        if precision == "bf16":
            pairs.append(("as_trained", "ours_bf16", None))
    return pairs


def compare(columns: dict, precision: str, every: int) -> tuple[list, list]:
    """The tabulated steps (every `every`-th and the last) and, for each comparison whose columns
    were both run, its max relative difference over those steps and over all steps, and PASS/FAIL."""
    n = len(next(iter(columns.values())))
    steps = sorted(set(range(0, n, every)) | {n - 1})
    results = []
    for a, b, target in comparisons(precision):
        if a not in columns or b not in columns:
            continue
        d = rel_diff(columns[a], columns[b])
        tab = [d[s] for s in steps]
        finite = [x for x in tab if not math.isnan(x)]
        # a missing or non-finite loss at a tabulated step fails a target: nothing to compare is no pass
        worst = max(finite) if len(finite) == len(tab) else float("inf")
        all_finite = [x for x in d if not math.isnan(x)]
        results.append({
            "column": a, "reference": b, "target": target, "rel_diff": d,
            "max_rel_tabulated": worst, "max_rel_all_steps": max(all_finite) if all_finite else None,
            "worst_step": steps[int(np.nanargmax(tab))] if finite else None,
            "pass": None if target is None else bool(worst <= target),
        })
    return steps, results


def markdown(columns: dict, steps: list, results: list) -> str:
    names = list(columns)
    head = ["step", *names, *(f"{r['column']} vs {r['reference']}" for r in results)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    fmt = lambda x: "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"  # noqa: E731
    for s in steps:
        cells = [str(s), *(fmt(columns[c][s]) for c in names)]
        cells += ["—" if math.isnan(r["rel_diff"][s]) else f"{r['rel_diff'][s]:.2e}" for r in results]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for r in results:
        verdict = "info" if r["target"] is None else ("PASS" if r["pass"] else "FAIL")
        target = "" if r["target"] is None else f" (target ≤ {r['target']:.0%})"
        every = r["max_rel_all_steps"]
        lines.append(f"- {r['column']} vs {r['reference']}: max rel. diff {r['max_rel_tabulated']:.2e} at the tabulated "
                     f"steps{target}, {every:.2e} over all steps: **{verdict}**" if every is not None else
                     f"- {r['column']} vs {r['reference']}: no comparable steps: **{verdict}**")
    return "\n".join(lines)


def plot(columns: dict, results: list, path: Path) -> bool:
    """Loss curves of every column, and below them the relative differences with the 1 % and 2 %
    lines. Returns False (and says so) where matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; no parity.png", file=sys.stderr)
        return False
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    styles = ["-", "--", ":", "-."]  # columns that agree lie on top of each other: tell them apart
    for i, (name, losses) in enumerate(columns.items()):
        top.plot(range(len(losses)), [np.nan if x is None else x for x in losses], label=name, lw=1.2, ls=styles[i % 4])
    top.set_ylabel("loss")
    top.legend()
    top.grid(alpha=0.3)
    for i, r in enumerate(results):
        d = np.maximum(np.asarray(r["rel_diff"], dtype=float), 1e-9)  # exact agreement drawn at the floor
        bottom.plot(range(len(d)), d, label=f"{r['column']} vs {r['reference']}", lw=1.2, ls=styles[i % 4])
    for target, style in ((TARGET_FP32, "--"), (TARGET_BF16, ":")):
        bottom.axhline(target, color="k", ls=style, lw=0.8, label=f"{target:.0%}")
    bottom.set_yscale("log")
    bottom.set_xlabel("step")
    bottom.set_ylabel("relative difference")
    bottom.legend(fontsize=7)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return True


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def _backend_available(name: str) -> bool:
    from andrea.engine import load_backend

    try:
        load_backend(name)
        return True
    except RuntimeError:
        return False


def run_parity(run_dir, out=None, device: str | None = None, backend: str = "auto", steps: int | None = None,
               every: int = 10, torch_precisions=("fp32", "bf16"), compile: bool = False) -> dict:
    """Replay a recording every way this machine allows, compare, print, write parity.json/.png."""
    rec = load_recording(run_dir, steps)
    run_backend, precision = rec.meta["backend"], rec.meta["precision"]
    if backend == "auto":
        backend = run_backend if _backend_available(run_backend) else "numpy"
        if backend != run_backend:
            print(f"note: the run's backend {run_backend!r} is not available here; our replay uses NumPy", file=sys.stderr)
    columns, extra, timings = {}, {}, {}
    if any(x is not None for x in rec.as_trained):
        columns["as_trained"] = rec.as_trained
    ours = [("fp32", backend)] + ([("bf16", "cupy")] if _backend_available("cupy") else [])
    if len(ours) == 1:
        print("note: CuPy is not available here; no bf16 replay of our engine", file=sys.stderr)
    for prec, be in ours:
        t0 = time.perf_counter()
        r = replay_ours(rec, be, prec)
        timings[f"ours_{prec}"] = time.perf_counter() - t0
        columns[f"ours_{prec}"], extra[f"ours_{prec}"] = r["loss"], {"backend": be, "grad_norm": r["grad_norm"]}
    torch_version = None
    if torch_precisions:
        import torch

        torch_version = torch.__version__
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        for prec in torch_precisions:
            t0 = time.perf_counter()
            r = replay_torch(rec, device, prec, compile)
            timings[f"torch_{prec}"] = time.perf_counter() - t0
            columns[f"torch_{prec}"], extra[f"torch_{prec}"] = r["loss"], {"device": device, "grad_norm": r["grad_norm"]}
    tab_steps, results = compare(columns, precision, every)
    table = markdown(columns, tab_steps, results)
    print(f"{rec.meta['model']}: {rec.steps} steps of {rec.B}×{rec.grad_accum} rows × {rec.T} tokens, trained on "
          f"{run_backend}/{precision}; replays: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    print(table)
    report = {
        "run_dir": str(rec.run_dir), "meta": rec.meta, "steps": rec.steps, "tabulated_steps": tab_steps,
        "our_backend": backend, "torch": torch_version, "torch_device": device, "compile": compile,
        "columns": columns, "replays": extra, "seconds": timings, "comparisons": results,
        "pass": all(r["pass"] for r in results if r["pass"] is not None),
    }
    if out is not None:
        out = Path(out)
        write_json_atomic(out / "parity.json", _json_safe(report))
        write_text_atomic(out / "parity.md", table + "\n")
        plot(columns, results, out / "parity.png")
    return report


# ----------------------------------------------------------------------------- a demo recording


DEMO_CONFIG = ModelConfig(vocab_size=300, d_model=64, n_head=4, n_layer=2, context=32)
DEMO_OPTIM = OptimConfig(lr=1e-2, min_lr_ratio=0.1, warmup_steps=5, max_steps=40, weight_decay=0.1, grad_clip=1.0)


def demo_batches(cfg: ModelConfig, steps: int, rows: int, T: int, seed: int) -> np.ndarray:
    """Seeded token rows with something to learn: a fixed random Markov chain in which each token
    has four possible successors (loss floor ln 4 ≈ 1.39, against ln V at the start)."""
    rng = np.random.default_rng(seed)
    successors = rng.integers(0, cfg.vocab_size, (cfg.vocab_size, 4))
    x = np.empty((steps * rows, T + 1), dtype=np.int64)
    x[:, 0] = rng.integers(0, cfg.vocab_size, steps * rows)
    for t in range(T):
        x[:, t + 1] = successors[x[:, t], rng.integers(0, 4, steps * rows)]
    return x.reshape(steps, rows, T + 1).astype(TOKEN_DTYPE)


def make_demo(run_dir, steps: int = 30, batch_size: int = 4, grad_accum: int = 2, seed: int = 0,
              backend: str = "numpy", precision: str = "fp32", cfg: ModelConfig = DEMO_CONFIG,
              oc: OptimConfig = DEMO_OPTIM) -> Path:
    """A recorded run without the trainer: RUN_DIR/parity/{init.bin, batches.bin, meta.json} and
    RUN_DIR/loss.jsonl, laid out as the trainer's `record_batches`, trained by our engine."""
    from andrea.engine import Engine

    run_dir = Path(run_dir)
    pdir = run_dir / "parity"
    T = cfg.context
    batches = demo_batches(cfg, steps, batch_size * grad_accum, T, seed)
    w0 = init_weights(cfg, seed)
    write_checkpoint(pdir / "init.bin", 0, w0, np.zeros_like(w0), np.zeros_like(w0))
    with atomic_path(pdir / "batches.bin") as tmp:
        batches.tofile(tmp)
    meta = {"model": "demo-tiny", "model_config": dataclasses.asdict(cfg), "batch_size": batch_size,
            "grad_accum": grad_accum, "seq_len": T, "steps": steps, "backend": backend, "precision": precision,
            "optim": dataclasses.asdict(oc)}
    write_json_atomic(pdir / "meta.json", meta)
    rec = load_recording(run_dir, losses=False)  # as a replay will read it
    engine = Engine(cfg, batch_size=batch_size, seq_len=T, backend=backend, precision=precision)
    engine.load_state(rec.init)
    lines = []
    for s in range(steps):
        res = train_step(engine, rec.micro_batches(s), s, oc)
        lines.append(json.dumps({"step": s, "loss": res.loss, "lr": res.lr, "grad_norm": res.grad_norm,
                                 "clipped": res.clipped, "skipped": res.skipped}))
    write_text_atomic(run_dir / "loss.jsonl", "\n".join(lines) + "\n")
    return run_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", nargs="?", type=Path, help="a run directory holding parity/ and loss.jsonl")
    ap.add_argument("--out", type=Path, help="where parity.json, parity.md and parity.png go (default: RUN_DIR)")
    ap.add_argument("--device", choices=["cuda", "cpu"], help="PyTorch's device (default: cuda if available)")
    ap.add_argument("--backend", choices=["auto", "numpy", "cupy"], default="auto",
                    help="our fp32 replay's backend (default: the run's, NumPy if that is missing)")
    ap.add_argument("--steps", type=int, help="replay only the first STEPS recorded steps")
    ap.add_argument("--every", type=int, default=10, help="tabulate and judge every EVERY-th step (and the last)")
    ap.add_argument("--torch", nargs="*", default=["fp32", "bf16"], choices=["fp32", "bf16"],
                    help="PyTorch replays to run (none: --torch with no value)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the PyTorch model (off: exactness first)")
    ap.add_argument("--make-demo", type=Path, metavar="DIR", help="write a tiny recorded run into DIR and stop")
    ap.add_argument("--demo-steps", type=int, default=30)
    ap.add_argument("--demo-backend", choices=["numpy", "cupy"], default="numpy")
    ap.add_argument("--demo-precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    args = ap.parse_args()
    if args.make_demo:
        d = make_demo(args.make_demo, steps=args.demo_steps, backend=args.demo_backend, precision=args.demo_precision)
        print(f"demo recording written to {d} (compare: python bench/loss_parity.py {d})")
        return
    if args.run_dir is None:
        ap.error("give RUN_DIR, or --make-demo DIR")
    if args.every < 1:
        ap.error("--every must be at least 1")
    try:
        report = run_parity(args.run_dir, args.out or args.run_dir, args.device, args.backend, args.steps, args.every,
                            tuple(args.torch), args.compile)
    except RecordingError as e:
        sys.exit(f"error: {e}")
    sys.exit(0 if report["pass"] else 1)


if __name__ == "__main__":
    main()
