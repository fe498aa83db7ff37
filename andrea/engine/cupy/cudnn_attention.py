"""Causal self-attention through cuDNN's fused attention (SDPA), on the 16-bit training buffers.

cuDNN's Hopper kernels (warp-group MMA, TMA) ran the model's attention 1.5-2x faster than our
mma.sync flash kernels on the H200 (forward 0.171 against 0.305 ms, backward 0.592 against 0.874 ms
at ANDREA-120M's B=32 shapes; records/2026-12-01/cudnn/), so where the cuDNN frontend
and the cuDNN library (the gpu extra: INSTALL below) are installed the 16-bit modes' training
passes use it, and our kernels (attention.py) stay the fallback and the generation path. At head
size 32 (ANDREA-12M) it gains little (backward 0.569 against 0.578 ms). Our Hopper kernels have closed
most of the gap since (2026-12-03, BENCHMARKS.md "round three": our wgmma backward 1.04-1.06x cuDNN's
time at head size 64 and faster at 32, the forward 1.22-1.29x); which to default to once both are
measured in one run with the frontend installed is issue 44's open item.

It reads and writes the very buffers of our kernels: q, k, v as strided views of the [B, T, 3, H, D]
projection output, y and dy [B, T, H·D], dq, dk, dv into a buffer shaped like qkv, and the
log-sum-exp of each score row [B, H, T] fp32 (cuDNN's "stats": the same quantity, so the two
implementations can stand in for each other). The backward runs cuDNN's deterministic algorithm
(the same bits every run, as ours) unless ANDREA_ATTENTION_DETERMINISTIC=0 asks for the faster one
that sums dq with atomics. Its workspace grows with the batch (fp32 partial dq per key
tile: 770 MiB at ANDREA-12M B=32, more than PyTorch's whole margin). It lives in the backend's
backward arena (the loss's probabilities, dead while the layers' backward runs, less the tail
that holds the attention output's gradient: Activations.arena), and the backward runs on slices of
the batch where the whole would need more than that arena, or than ANDREA_ATTENTION_WORKSPACE_MIB
where that is larger (256 by default); at head sizes up to 32 that our kernels take, our flash
backward runs instead of slices or a workspace beyond the arena (as fast as cuDNN's whole-batch call there, with no workspace). A graph per shape is built on first use; a shape cuDNN refuses falls back to our kernels. Execution is host work plus kernel launches on the current stream, so
it can be captured in a CUDA graph.
"""

from __future__ import annotations

import functools
import math
import os
import warnings

import cupy as cp
import numpy as np

from andrea.engine.cupy import attention_mma
from andrea.engine.cupy.weights import BF16

IMPLEMENTATIONS = ("cudnn", "flash", "mma")


INSTALL = "pip install -c constraints.txt nvidia-cudnn-frontend nvidia-cudnn-cu13 (the gpu extra has both)"
# the backward's workspace beyond the arena at most (decision): above it, slices of the batch. 256 MiB
# lets ANDREA-120M B=8 (192 MiB, 1.6x its arena) run the whole batch in one call: 0.3 ms a step faster
# than two slices, at a peak still below PyTorch's. The price: wherever the whole batch's workspace is
# under 256 MiB but over the arena (also 120M and 480M at B=4), it takes memory of its own rather
# than slices inside the arena; the larger shapes' slices fit in their arenas (120M B=32, 480M B=8)
WORKSPACE_MIB = 256
# at head sizes up to this our flash backward (no workspace, deterministic too) is as fast as cuDNN's
# whole-batch one (0.578 against 0.569 ms at ANDREA-12M B=32), and faster than its slices (decision)
OURS_OVER_SLICES_HEAD_DIM = 32


def workspace_cap() -> int:
    """Bytes the backward's workspace may take beyond the backend's backward arena:
    ANDREA_ATTENTION_WORKSPACE_MIB, or WORKSPACE_MIB."""
    raw = os.environ.get("ANDREA_ATTENTION_WORKSPACE_MIB", str(WORKSPACE_MIB))
    try:
        mib = float(raw)
    except ValueError:
        raise ValueError(f"ANDREA_ATTENTION_WORKSPACE_MIB={raw!r}: give a number of MiB") from None
    return int(mib * (1 << 20))


@functools.lru_cache(maxsize=None)
def _cudnn():
    """The cuDNN frontend module, or None where it is not installed or the cuDNN library it loads is
    missing (the frontend imports without one and fails at its first call)."""
    try:
        import cudnn

        cudnn.backend_version()
    except Exception:
        return None
    return cudnn


def deterministic_from_env() -> bool:
    """ANDREA_ATTENTION_DETERMINISTIC: "1" (the default: cuDNN's deterministic backward, the same bits
    every run) or "0" (its backward that sums dq with atomics: faster, but the low bits of the
    gradients change from run to run, so a resumed run no longer repeats an uninterrupted one
    exactly)."""
    raw = os.environ.get("ANDREA_ATTENTION_DETERMINISTIC", "1")
    if raw not in ("0", "1"):
        raise ValueError(f"ANDREA_ATTENTION_DETERMINISTIC={raw!r}: give 1 (deterministic, the default) or 0")
    return raw == "1"


def implementation_from_env() -> str:
    """ANDREA_ATTENTION: "cudnn" (the default where the frontend and cuDNN are installed), "flash" (our
    kernels: the Hopper wgmma forward and backward where they run) or "mma" (our mma.sync kernels only,
    as before the wgmma kernels: to compare)."""
    name = os.environ.get("ANDREA_ATTENTION", "cudnn" if _cudnn() is not None else "flash")
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"ANDREA_ATTENTION={name!r}: choose one of {', '.join(IMPLEMENTATIONS)}")
    if name == "cudnn" and _cudnn() is None:
        raise RuntimeError(f"ANDREA_ATTENTION=cudnn but the cuDNN frontend or library cannot be loaded: {INSTALL}")
    return name


class CudnnAttention:
    """One backend's cuDNN handle and its attention graphs, per shape."""

    def __init__(self, deterministic: bool | None = None, cap: int | None = None):
        self.cudnn = _cudnn()
        self.cap = workspace_cap() if cap is None else cap  # bytes of workspace beyond the arena
        # False: the backward that sums dq with atomics; None: as ANDREA_ATTENTION_DETERMINISTIC says
        self.deterministic = deterministic_from_env() if deterministic is None else deterministic
        self.handle = self.cudnn.create_handle()
        self.stream = None
        self.graphs: dict = {}  # (direction, B, H, T, D, dtype) -> (graph, tensors, workspace bytes), or None: refused
        self.slices: dict = {}  # (B, H, T, D, dtype) -> batch rows per backward call
        self.ours_instead: set = set()  # (B, H, T, D) whose backward our kernel runs instead of slices or a workspace of its own

    def _bind(self) -> None:
        ptr = cp.cuda.get_current_stream().ptr
        if ptr != self.stream:
            self.cudnn.set_stream(handle=self.handle, stream=ptr)
            self.stream = ptr

    def _graph(self, key):
        if key not in self.graphs:
            try:
                self.graphs[key] = self._build(*key)
            except Exception as err:  # a shape or type this cuDNN does not take: our kernels run it
                if cp.cuda.get_current_stream().is_capturing():
                    raise RuntimeError(f"cuDNN attention graph {key} first built while a CUDA graph is captured") from err
                warnings.warn(f"cuDNN attention refused {key[0]} B={key[1]} H={key[2]} T={key[3]} D={key[4]} "
                              f"({type(err).__name__}: {str(err)[:300]}); our flash kernels run it")
                self.graphs[key] = None
        return self.graphs[key]

    def refused(self) -> list:
        """The shapes cuDNN refused (our kernels ran them): (direction, B, H, T, D)."""
        return [key[:5] for key, built in self.graphs.items() if built is None]

    def _build(self, direction, B, H, T, D, dtype):
        c = self.cudnn
        io = c.data_type.BFLOAT16 if dtype == BF16 else c.data_type.HALF
        f32 = c.data_type.FLOAT
        g = c.pygraph(io_data_type=io, intermediate_data_type=f32, compute_data_type=f32, handle=self.handle)
        dims = [B, H, T, D]
        s_qkv = [T * 3 * H * D, D, 3 * H * D, 1]  # [B, T, 3, H, D] seen as [B, H, T, D]
        s_y = [T * H * D, D, H * D, 1]  # [B, T, H·D] seen as [B, H, T, D]
        s_lse = [H * T, T, 1, 1]
        scale = 1.0 / math.sqrt(D)
        q, k, v = (g.tensor(name=n, dim=dims, stride=s_qkv, data_type=io) for n in "qkv")
        if direction == "fwd":
            o, stats = g.sdpa(name="sdpa", q=q, k=k, v=v, generate_stats=True, attn_scale=scale, use_causal_mask=True)
            o.set_output(True).set_dim(dims).set_stride(s_y).set_data_type(io)
            stats.set_output(True).set_dim([B, H, T, 1]).set_stride(s_lse).set_data_type(f32)
            tensors = (q, k, v, o, stats)
        else:
            o = g.tensor(name="o", dim=dims, stride=s_y, data_type=io)
            do = g.tensor(name="do", dim=dims, stride=s_y, data_type=io)
            stats = g.tensor(name="stats", dim=[B, H, T, 1], stride=s_lse, data_type=f32)
            grads = g.sdpa_backward(name="sdpa_bwd", q=q, k=k, v=v, o=o, dO=do, stats=stats, attn_scale=scale,
                                    use_causal_mask=True, use_deterministic_algorithm=self.deterministic)
            for t in grads:
                t.set_output(True).set_dim(dims).set_stride(s_qkv).set_data_type(io)
            tensors = (q, k, v, o, do, stats, *grads)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([c.heur_mode.A, c.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        return g, tensors, max(g.get_workspace_size(), 1)

    def _run(self, be, key, pointers) -> bool:
        """Execute the graph of `key` on the pointers (in its tensors' order); False: no graph for it.
        The backward's workspace is the backend's backward arena where it fits there."""
        built = self._graph(key)
        if built is None:
            return False
        g, tensors, ws_bytes = built
        arena = be.backward_arena
        if key[0] == "bwd" and arena is not None and ws_bytes <= arena.size:
            ws = arena
        else:
            ws = be.scratch("cudnn_attention_ws", (ws_bytes,), cp.uint8)
        self._bind()
        g.execute(dict(zip(tensors, pointers)), ws.data.ptr, handle=self.handle)
        return True

    def fwd(self, be, qkv, y, lse) -> bool:
        """y and lse from the [B, T, 3, H, D] buffer qkv; False where cuDNN does not take the shape."""
        B, T, _, H, D = qkv.shape
        base, hd = qkv.data.ptr, H * D * qkv.itemsize
        return self._run(be, ("fwd", B, H, T, D, qkv.dtype), (base, base + hd, base + 2 * hd, y.data.ptr, lse.data.ptr))

    def rows_per_backward(self, B, H, T, D, dtype, arena_bytes: int = 0) -> int:
        """Batch rows each backward call takes: B, or the largest divisor of B whose workspace (linear in
        the rows) fits in the larger of the backward arena (`arena_bytes`: memory that costs nothing)
        and self.cap; one row where none does. Decided once per shape."""
        key = (B, H, T, D, dtype)
        if key not in self.slices:
            rows, built = B, self._graph(("bwd", B, H, T, D, dtype))
            cap = max(arena_bytes, self.cap)
            if built is not None and built[2] > cap:
                per_row = built[2] / B
                # slices start 16-byte aligned, as takes() requires of the whole buffers (lse: fp32 [H, T]
                # a row; y: 16-bit [T, H·D] a row)
                fits = [r for r in range(1, B) if B % r == 0 and r * H * T * 4 % 16 == 0 and r * T * H * D * 2 % 16 == 0]
                under = [r for r in fits if r * per_row <= cap]
                rows = max(under) if under else min(fits, default=B)
                if rows < B:
                    del self.graphs[("bwd", B, H, T, D, dtype)]  # built to learn its workspace; never run
            self.slices[key] = rows
        return self.slices[key]

    def bwd(self, be, dy, qkv, y, lse, dqkv) -> bool:
        """dq, dk, dv into dqkv (overwritten) from dy and the forward's y and lse, rows_per_backward
        batch rows a call; False (our kernels run it) where cuDNN refuses the shape, or where it
        would take slices or memory beyond the arena at a head size where our kernel is as fast as
        its whole-batch call."""
        B, T, _, H, D = qkv.shape
        arena = be.backward_arena
        arena_bytes = 0 if arena is None else arena.size
        rows = self.rows_per_backward(B, H, T, D, qkv.dtype, arena_bytes)
        if D <= OURS_OVER_SLICES_HEAD_DIM and attention_mma.flash_takes(D):
            whole = None if rows < B else self._graph(("bwd", B, H, T, D, qkv.dtype))
            if rows < B or (whole is not None and whole[2] > arena_bytes):
                self.ours_instead.add((B, H, T, D))  # slices, or a workspace of its own: ours needs neither
                return False
        hd = H * D * qkv.itemsize
        step_qkv, step_y, step_lse = rows * T * 3 * hd, rows * T * hd, rows * H * T * lse.itemsize  # bytes per slice
        for i in range(B // rows):
            base, dbase = qkv.data.ptr + i * step_qkv, dqkv.data.ptr + i * step_qkv
            pointers = (base, base + hd, base + 2 * hd, y.data.ptr + i * step_y, dy.data.ptr + i * step_y,
                        lse.data.ptr + i * step_lse, dbase, dbase + hd, dbase + 2 * hd)
            if not self._run(be, ("bwd", rows, H, T, D, qkv.dtype), pointers):
                return False  # refused: the first slice already (every slice has the same shape)
        return True


def takes(qkv, y, lse, dy=None, dqkv=None) -> bool:
    """The buffers cuDNN's graphs are built for: contiguous 16-bit qkv [B, T, 3, H, D] (and dqkv), y and
    dy [B, T, H·D] of its type, lse [B, H, T] fp32, every one 16-byte aligned; anything else runs on
    our kernels."""
    if qkv.ndim != 5 or qkv.shape[2] != 3 or qkv.dtype not in (BF16, np.dtype(np.float16)):
        return False
    B, T, _, H, D = qkv.shape
    want = [(y, (B, T, H * D), qkv.dtype), (lse, (B, H, T), np.dtype(np.float32))]
    want += [(x, shape, qkv.dtype) for x, shape in ((dy, (B, T, H * D)), (dqkv, qkv.shape)) if x is not None]
    return qkv.flags.c_contiguous and qkv.data.ptr % 16 == 0 and all(
        x.shape == shape and x.dtype == dtype and x.flags.c_contiguous and x.data.ptr % 16 == 0 for x, shape, dtype in want)
