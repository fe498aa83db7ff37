"""Shared helpers of the dev/cuda scripts: what a script declares (Version), the shapes it runs at
(read from config/config.yaml), building kernels from the .cu sources exactly as the production
loader does, 16-bit rounding on the host, checking against a NumPy reference with a stated
tolerance, timing with CUDA events, and the result table.

Nothing here imports CuPy at module level: every script imports on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

DEV = Path(__file__).resolve().parent
REPO = DEV.parents[1]
KERNELS = REPO / "andrea" / "kernels"
if str(REPO) not in sys.path:  # the scripts import andrea.engine.numpy_backend from this checkout
    sys.path.insert(0, str(REPO))

# Unit roundoff u = 2^-p (p significand bits, the implicit one counted) of each storage type: one
# rounding to nearest moves a value by at most u relative. Every tolerance is a multiple of this.
UNIT_ROUNDOFF = {"fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}


# Below the normal range a rounding moves a value by up to half the smallest subnormal instead:
# fp16's (2^-24) matters for small gradients and activations; bf16 shares fp32's range.
SUBNORMAL_HALF_STEP = {"fp32": 2.0**-150, "bf16": 2.0**-134, "fp16": 2.0**-25}


def u(precision: str) -> float:
    return UNIT_ROUNDOFF[precision]


def tiny(precision: str) -> float:
    """The absolute part of one rounding's error bound (|Δ| ≤ u·|x| + tiny)."""
    return SUBNORMAL_HALF_STEP[precision]


# ----------------------------------------------------------------------------- declarations


@dataclass(frozen=True)
class Version:
    """One version of a kernel: the op it computes (a key of the script's REFERENCES), the
    __global__ functions it launches, the file they come from ("layernorm.cu" is andrea/kernels;
    "dev/cuda/x.cu" a dev-only source), extra -D options, and the storage precisions it runs in.
    `production` says whether the production backend (andrea/engine/cupy) runs it."""

    op: str
    name: str
    kernels: tuple
    source: str
    precisions: tuple = ("fp32",)
    defines: tuple = ()
    production: bool = True

    def path(self) -> Path:
        return REPO / self.source if self.source.startswith("dev/") else KERNELS / self.source


@dataclass(frozen=True)
class Shape:
    """A problem size: B sequences of T tokens, model width C, H heads, vocabulary V, L layers."""

    name: str
    B: int
    T: int
    C: int
    H: int
    V: int
    L: int = 1

    @property
    def D(self) -> int:
        return self.C // self.H

    @property
    def N(self) -> int:
        return self.B * self.T

    @property
    def M(self) -> int:  # MLP width
        return 4 * self.C


def _train_setting(cfg: dict, model: str, key: str):
    """A model's training setting as andrea.config resolves it (train.<model> > train.defaults >
    the schema's default), read without the config machinery (the GPU machine lacks jsonschema)."""
    import yaml

    train = cfg.get("train") or {}
    for level in (train.get(model) or {}, train.get("defaults") or {}):
        if key in level:
            return level[key]
    schema = yaml.safe_load((REPO / "andrea" / "schemas" / "config.schema.yaml").read_text(encoding="utf-8"))
    return schema["$defs"]["train_settings"]["properties"][key]["default"]


def _config() -> dict:
    import yaml  # a dependency of snakemake, so on every machine that runs the pipeline

    return yaml.safe_load((REPO / "config" / "config.yaml").read_text(encoding="utf-8"))


def model_shape(name: str, batch: int | None = None, cfg: dict | None = None) -> Shape:
    """The shape of model `name` (config/config.yaml `models:`) at `batch` sequences, or at its training
    batch size (`train:`) when None. vocab = 256 bytes + n_segments + BOS."""
    cfg = _config() if cfg is None else cfg
    m = cfg["models"][name]
    batch = _train_setting(cfg, name, "batch_size") if batch is None else batch
    return Shape(f"{name.removeprefix('ANDREA-')} B={batch}", batch, m["context"], m["d_model"], m["n_head"],
                 256 + m["n_segments"] + 1, m["n_layer"])


def model_at_batch(text: str) -> tuple:
    """--models' NAME[:B]: (a model of config/config.yaml, a batch size or None)."""
    name, _, batch = text.partition(":")
    if name not in _config()["models"]:
        raise argparse.ArgumentTypeError(f"{name!r} is not a model of config/config.yaml")
    if batch and not (batch.isdigit() and int(batch) > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: the batch after ':' must be a positive whole number")
    return name, int(batch) if batch else None


def model_shapes(quick: bool) -> list:
    """The timing shapes: ANDREA-12M and ANDREA-120M at their training batch size (config/config.yaml
    `models:` and `train:`), or ANDREA-tiny at B=2 with --quick."""
    cfg = _config()
    if quick:
        return [model_shape("ANDREA-tiny", 2, cfg)]
    return [model_shape(name, None, cfg) for name in ("ANDREA-12M", "ANDREA-120M")]


# ----------------------------------------------------------------------------- building kernels


def kernel_names(path: Path) -> list:
    """The extern "C" __global__ functions a RawModule of this .cu file exposes: its own and those
    of the .cu files it #includes (found beside it or in andrea/kernels, as -I does)."""
    import re

    text = path.read_text(encoding="utf-8")
    names = []
    for inc in re.findall(r'^#include\s+"(\w+\.cu)"', text, flags=re.M):
        found = next((d / inc for d in (path.parent, KERNELS) if (d / inc).exists()), None)
        if found is None:
            raise FileNotFoundError(f"{path}: includes {inc}, found neither beside it nor in {KERNELS}")
        names += kernel_names(found)
    kernel = r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?'
    # kernels a macro defines (`#define M(name, ...)` with `... void name(` and `void name##_h16(`), per use of it
    for macro, arg, body in re.findall(r'^#define\s+(\w+)\((\w+)[^)]*\)((?:.*\\\n)*.*)', text, flags=re.M):
        suffixes = re.findall(kernel + re.escape(arg) + r"(?:##(\w+))?\s*\(", body)
        for used in re.findall(r'^' + macro + r'\((\w+)', text, flags=re.M):
            names += [used + s for s in suffixes]
    return names + [n for n in re.findall(kernel + r'(\w+)\s*\(', text) if not re.search(r'#define[^\n]*\b' + n + r'\b', text)]


@functools.lru_cache(maxsize=None)
def _module(cp, path: str, head_dim, defines: tuple):
    # the options of andrea/engine/cupy/kernels.py: C++17, the kernels folder on the include path
    opts = ("-std=c++17", f"-I{KERNELS}", "-lineinfo")
    if head_dim is not None:
        opts += (f"-DHEAD_DIM={head_dim}",)
    opts += tuple(f"-D{d}" for d in defines)
    return cp.RawModule(code=Path(path).read_text(encoding="utf-8"), options=opts)


def build(cp, version: Version, precision: str = "fp32", head_dim=None, extra_defines: tuple = ()):
    """The kernels of `version` as {name: function}, compiled for `precision` (fp16 adds
    -DANDREA_FP16, as the production loader does in fp16 mode)."""
    defines = tuple(version.defines) + tuple(extra_defines) + (("ANDREA_FP16",) if precision == "fp16" else ())
    mod = _module(cp, str(version.path()), head_dim, defines)
    return {k: mod.get_function(k) for k in version.kernels}


def blocks(n: int, threads: int = 256) -> int:
    return (n + threads - 1) // threads


# ----------------------------------------------------------------------------- 16-bit values on the host


def to_h16(x, precision: str) -> np.ndarray:
    """x rounded to nearest-even in bf16 or fp16, as the raw 16 bits (uint16): device buffers of
    16-bit values are uint16 arrays, so no script needs a bfloat16 dtype."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if precision == "fp16":
        return x.astype(np.float16).view(np.uint16)
    if precision != "bf16":
        raise ValueError(f"16-bit precision {precision!r}: bf16 or fp16")
    b = x.view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def from_h16(bits, precision: str) -> np.ndarray:
    """The float64 values of raw bf16 or fp16 bits."""
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    if precision == "fp16":
        return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def rounded(x, precision: str) -> np.ndarray:
    """x as the kernel will see it (float64 values of its fp32 or 16-bit storage)."""
    if precision == "fp32":
        return np.asarray(x, dtype=np.float32).astype(np.float64)
    return from_h16(to_h16(x, precision), precision)


def stored(x, precision: str) -> np.ndarray:
    """The host array to upload for `precision`: float32, or the raw 16-bit bits."""
    return np.ascontiguousarray(x, dtype=np.float32) if precision == "fp32" else to_h16(x, precision)


def loaded(a, precision: str) -> np.ndarray:
    """A device array brought back as float64 values."""
    host = a.get()
    return host.astype(np.float64) if precision == "fp32" else from_h16(host, precision)


# ----------------------------------------------------------------------------- checking


@dataclass
class Err:
    """The worst deviation of a result from its reference: max_err is max |got − want|, ratio is
    max |got − want| / (atol + rtol·|want|) over the elements (≤ 1 passes)."""

    max_err: float = 0.0
    ratio: float = 0.0
    finite: bool = True
    what: str = ""

    @property
    def ok(self) -> bool:
        return self.finite and self.ratio <= 1.0

    def worst(self, other: "Err") -> "Err":
        if not other.finite or (self.finite and other.ratio > self.ratio):
            return Err(other.max_err, other.ratio, other.finite, other.what)
        return self


def compare(got, want, rtol: float, atol: float = 0.0, what: str = "") -> Err:
    """Elementwise |got − want| ≤ atol + rtol·|want|; got and want as float64 arrays."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise ValueError(f"{what}: result shape {got.shape} != reference shape {want.shape}")
    if got.size == 0:
        return Err(what=what)
    finite = bool(np.isfinite(got).all())
    with np.errstate(invalid="ignore"):
        err = np.abs(got - want)
    err = np.where(np.isnan(err), np.inf, err)  # a NaN result is infinitely wrong
    allowed = atol + rtol * np.abs(want)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(allowed > 0, err / allowed, np.where(err > 0, np.inf, 0.0))
    return Err(float(err.max()), float(ratio.max()), finite, what)


def exact(got, want, what: str = "") -> Err:
    """Bit-for-bit equality (e.g. roundings both sides do the same way, or a run against itself)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        raise ValueError(f"{what}: result shape {got.shape} != reference shape {want.shape}")
    diff = int(np.count_nonzero(got != want))
    return Err(float(diff), 0.0 if diff == 0 else math.inf, True, what + (f" ({diff} elements differ)" if diff else ""))


def rms(x) -> float:
    return float(np.sqrt(np.mean(np.square(np.asarray(x, dtype=np.float64)))))


# ----------------------------------------------------------------------------- timing


def bench(cp, fn, reps: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of `fn` (kernel launches on the current stream) over `reps` runs, each
    between two CUDA events, after `warmup` runs (compilation, caches, clocks)."""
    for _ in range(warmup):
        fn()
    events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    events[-1][1].synchronize()
    return statistics.median(cp.cuda.get_elapsed_time(s, e) for s, e in events)


def gbps(nbytes: float, ms: float) -> str:
    return f"{nbytes / ms / 1e6:.0f} GB/s"


def tflops(flops: float, ms: float) -> str:
    return f"{flops / ms / 1e9:.1f} TFLOP/s"


# ----------------------------------------------------------------------------- the result table


@dataclass
class Row:
    op: str
    version: str
    precision: str
    shape: str
    max_err: float | None = None
    ratio: float | None = None  # max err / tolerance; None: not checked (a timing-only row)
    ok: bool = True
    ms: float | None = None
    rate: str = ""
    production: bool = True
    note: str = ""


@dataclass
class Report:
    """The rows of one script; finish() prints them and says whether every check passed."""

    script: str
    rows: list = field(default_factory=list)

    def add(self, op, version, precision, shape, err: Err | None = None, ms=None, rate="", production=True, note=""):
        if err is not None and err.what and not note:
            note = err.what
        row = Row(op, version, precision, shape.name if isinstance(shape, Shape) else str(shape),
                  None if err is None else err.max_err, None if err is None else err.ratio,
                  True if err is None else err.ok, ms, rate, production, note)
        self.rows.append(row)
        return row

    def attempt(self, op, version, precision, shape, fn, production=True):
        """Run fn() -> (err, ms, rate); an exception (a compile error, a launch failure) becomes a
        failed row with its message instead of stopping the script."""
        try:
            err, ms, rate = fn()
        except Exception as exc:  # noqa: BLE001 - reported, and counted as a failure
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            print(f"  {op} / {version} / {precision} / {getattr(shape, 'name', shape)}: {last}", file=sys.stderr)
            row = self.add(op, version, precision, shape, production=production, note=f"error: {last[:160]}")
            row.ok = False
            return row
        return self.add(op, version, precision, shape, err, ms, rate, production)

    @property
    def failed(self) -> list:
        return [r for r in self.rows if not r.ok]

    def print_table(self) -> None:
        head = ("op", "version", "prec", "shape", "max err", "err/tol", "ms", "rate", "")
        lines = []
        for r in self.rows:
            version = r.version + ("" if r.production else " (dev)")
            lines.append((r.op, version, r.precision, r.shape,
                          "—" if r.max_err is None else f"{r.max_err:.2e}",
                          "—" if r.ratio is None else f"{r.ratio:.3f}",
                          "—" if r.ms is None else f"{r.ms:.4f}", r.rate,
                          ("ok" if r.ok else "FAIL") + (f"  {r.note}" if r.note else "")))
        widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
        fmt = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
        print(f"\n{self.script}: error = max |kernel − reference|, err/tol ≤ 1 passes; ms = median of CUDA-event timings")
        print(fmt(head))
        print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        for line in lines:
            print(fmt(line))

    def finish(self, args) -> int:
        self.print_table()
        failed = self.failed
        print(f"{self.script}: {len(self.rows) - len(failed)} of {len(self.rows)} rows ok" + (f", {len(failed)} FAILED" if failed else ""))
        if args.json:
            path = Path(args.json)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps({"script": self.script, "rows": [asdict(r) for r in self.rows]}, indent=1))
            tmp.replace(path)
        return 1 if failed or not self.rows else 0


# ----------------------------------------------------------------------------- command line


def run_script(doc: str, script: str, edge: list, runs: list, argv=None, extra_args=None, before=None) -> int:
    """A script's main: its arguments, then every `run(cp, report, shape, rng, reps)` of `runs`
    over its edge shapes and the model shapes, then the report (exit 1 on any failed check).
    `before(cp, args)` may answer first (an exit status) instead, e.g. for a profiler run."""
    import numpy as np

    args = parse_args(doc, argv, extra_args)
    cp = import_cupy()
    if before is not None:
        status = before(cp, args)
        if status is not None:
            return status
    shapes = [model_shape(name, batch) for name, batch in args.models] if args.models else model_shapes(args.quick)
    banner(cp, script, shapes)
    report = Report(script)
    rng = np.random.default_rng(args.seed)
    for run in runs:
        for shape in edge + shapes:
            run(cp, report, shape, rng, args.reps)
    return report.finish(args)


def parse_args(doc: str, argv=None, extra=None) -> argparse.Namespace:
    """The options every script takes; `extra(parser)` adds a script's own."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small shapes only (ANDREA-tiny, B=2) and the edge cases")
    ap.add_argument("--reps", type=int, default=20, help="timed runs per version (the median is reported; default 20)")
    ap.add_argument("--seed", type=int, default=0, help="random inputs' seed")
    ap.add_argument("--json", help="also write the rows to this JSON file (run_all.py reads it)")
    ap.add_argument("--models", nargs="+", type=model_at_batch, metavar="NAME[:B]",
                    help="time these models' shapes instead (e.g. ANDREA-480M:8; B: its training batch when omitted)")
    if extra is not None:
        extra(ap)
    return ap.parse_args(argv)


def import_cupy():
    """CuPy and a usable GPU, or a clear exit: the dev scripts only run on a CUDA machine."""
    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # ImportError, or a CUDA runtime without a device
        raise SystemExit(f"dev/cuda needs CuPy and an NVIDIA GPU ({type(exc).__name__}: {exc})") from None
    return cp


def device_name(cp) -> str:
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def banner(cp, script: str, shapes) -> None:
    print(f"{script} on {device_name(cp)}, CuPy {cp.__version__}; shapes: "
          + "; ".join(f"{s.name} (T={s.T} C={s.C} H={s.H} V={s.V})" for s in shapes))


# ----------------------------------------------------------------------------- PyTorch's attention, for scale


def torch_median_ms(torch, fn, reps: int) -> float:
    """Median milliseconds of `fn` over `reps` runs timed by CUDA events on PyTorch's stream, after 3
    warm-up runs (the yardsticks' timing, as CupyBackend's kernels are timed by CuPy's events)."""
    for _ in range(3):
        fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev)


def torch_sdpa(q, k, v, dy, precision: str, reps: int = 20):
    """PyTorch's causal scaled_dot_product_attention on the same inputs ([B, H, T, D] float64 host
    arrays, rounded to `precision` on the way): (y, dq, dk, dv) as float64 [B, H, T, D], and the
    forward and backward milliseconds (medians of CUDA events); None when torch with CUDA is not
    importable. A yardstick, not a version of ours."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    qt, kt, vt = (torch.tensor(a, device="cuda").to(dt).requires_grad_(True) for a in (q, k, v))
    dyt = torch.tensor(dy, device="cuda").to(dt)

    def fwd():
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

    y = fwd()
    y.backward(dyt)
    out = tuple(t.detach().double().cpu().numpy() for t in (y, qt.grad, kt.grad, vt.grad))

    def timed(fn):
        return torch_median_ms(torch, fn, reps)

    ys = [fwd()]  # the backward times re-use one forward graph
    fwd_ms = timed(fwd)
    bwd_ms = timed(lambda: torch.autograd.grad(ys[0], (qt, kt, vt), dyt, retain_graph=True))
    return out, fwd_ms, bwd_ms


# ----------------------------------------------------------------------------- attention tolerances


def heads(x, H: int) -> np.ndarray:
    """[B, T, H·D] -> [B, H, T, D]."""
    B, T, C = x.shape
    return x.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)


def score_error(q, k, scale: float) -> float:
    """A bound on the absolute error of a score s_ij = scale·q_i·k_j summed in fp32 (D products in
    some order, fp32 accumulation, as both the CUDA-core and the tensor-core kernels do):
    (D + 2)·u·scale·|q_i|·|k_j| ≤ (D + 2)·u·scale·max|q|·max|k| (Cauchy-Schwarz). Through exp it
    becomes a relative error of each probability."""
    D = q.shape[-1]
    qn = float(np.sqrt((q * q).sum(-1)).max())
    kn = float(np.sqrt((k * k).sum(-1)).max())
    return (D + 2) * u("fp32") * scale * qn * kn


def attention_abs(q, k, v, lse, scale: float, dy=None, delta=None) -> dict:
    """Σ_j of the absolute values of the terms each attention output adds up ([B, H, T, D]
    float64, causal, P = exp(scale·q·kᵀ − lse)): y: P·|v|; with dy and delta also dq: scale·A·|k|,
    dk: scale·Aᵀ·|q|, dv: Pᵀ·|dy|, where A = P·(|dy|·|v|ᵀ + |delta|) bounds |dS|/scale. An error
    bound of the form c·u·Σ|terms| follows for each output."""
    T = q.shape[2]
    causal = np.tril(np.ones((T, T), dtype=bool))
    s = np.where(causal, q @ k.swapaxes(-1, -2) * scale - lse[..., None], -np.inf)
    p = np.exp(s)
    out = {"y": p @ np.abs(v)}
    if dy is not None:
        a = p * (np.abs(dy) @ np.abs(v).swapaxes(-1, -2) + np.abs(delta)[..., None])
        out.update(dq=scale * (a @ np.abs(k)), dk=scale * (a.swapaxes(-1, -2) @ np.abs(q)), dv=p.swapaxes(-1, -2) @ np.abs(dy))
    return out
