"""The training engine: one model's buffers, planned and allocated once (design §3.2), and its
forward/backward passes (andrea/model.py) and optimizer steps on one backend object
(andrea/engine/backend.py): NumPy (andrea/engine/numpy_backend.py, the reference, any CPU) or CuPy
(andrea/engine/cupy, NVIDIA GPUs).

Weights, gradients and Adam's m and v are one flat buffer each, in the parameter order of
andrea/model.py (so a checkpoint is three contiguous copies). Activations saved for the backward
pass and the scratch it needs are allocated here, from the config, before step 1; the engine
reports this plan. A backend that can capture (Backend.can_capture) replays forward + backward as
one CUDA graph in the 16-bit modes.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

import numpy as np

from andrea import model
from andrea.comm import SingleProcess
from andrea.engine.activations import Activations
from andrea.engine.backend import CTRL, CTRL_T, Backend
from andrea.engine.fp8_records import TrainShape, auto_precision, fp8_capable, load_record
from andrea.model import (
    ModelConfig,
    Weights,
    decay_mask,
    init_weights,
    n_params,
    param_layout,
    views,
)

LOSS_SCALE_MAX = 2.0**15
LOSS_SCALE_WINDOW = 200

BACKENDS = {"numpy": ("andrea.engine.numpy_backend", "NumpyBackend"), "cupy": ("andrea.engine.cupy", "CupyBackend")}


def load_backend(name: str) -> type[Backend]:
    """The backend class called `name` (its module is imported only when asked for)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
    module, cls = BACKENDS[name]
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as e:
        raise RuntimeError(f"backend {name!r} is not available here ({e}); the CuPy backend needs an NVIDIA GPU "
                           "and `pip install -c constraints.txt -e '.[gpu]'`") from None


def make_backend(name: str, precision: str = "fp32") -> Backend:
    """A backend object of its own (no state shared with other engines)."""
    return load_backend(name)(precision)


def materialise(x) -> np.ndarray:
    """A host array from an Engine.snapshot (or an array, as it is)."""
    return x.host() if hasattr(x, "host") else x


def gpu_kind() -> tuple[str, str]:
    """The current CUDA device's name as CuPy reports it ("NVIDIA H200") and its compute
    capability in CuPy's form ("90"): the GPU kind the fp8 record is kept by."""
    import cupy

    dev = cupy.cuda.Device()
    name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"]
    return (name.decode() if isinstance(name, bytes) else str(name)), dev.compute_capability


def gpu_status() -> tuple[bool, str]:
    """Whether the CuPy backend can run here, and why (or why not), in words for the plan line."""
    try:
        import cupy
    except ImportError:
        return False, "CuPy is not installed (pip install -c constraints.txt -e '.[gpu]' on a machine with an NVIDIA GPU)"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
        if n == 0:
            return False, "CuPy sees no CUDA GPU"
        name, cc = gpu_kind()
        return True, f"CUDA GPU {cupy.cuda.Device().id} of {n}: {name} (compute capability {cc})"
    except Exception as e:  # no driver, no device, a broken install: the CPU is the honest answer
        return False, f"CuPy cannot use a CUDA GPU here ({type(e).__name__}: {e})"


def resolve_backend(backend: str, precision: str, shape: TrainShape | None = None,
                    trained: tuple[str, str] | None = None) -> tuple[str, str, str]:
    """The backend and precision a run uses, and why. `backend: auto` (the shipped default) takes
    CuPy when a CUDA GPU is usable, NumPy otherwise. `precision: auto` takes fp32 on NumPy (the only
    precision it has) and bf16 on CuPy (the fast path), except for a training run (`shape`, given by
    the trainer alone): there fp8 where the fp8 record says it is faster for this GPU, model and
    batch and passed the quality gate (andrea/engine/fp8_records.py auto_precision), and a run
    resumed on the backend its checkpoints were trained on (`trained`: their backend and precision)
    keeps their precision (an fp8 run on a GPU without fp8 goes on in bf16, the precision fp8 is
    built on)."""
    if backend == "auto":
        ok, why = gpu_status()
        backend, why = ("cupy" if ok else "numpy"), f"auto: {why}"
    elif backend in BACKENDS:
        why = "set in the config"
    else:
        raise ValueError(f"unknown backend {backend!r}; available: auto, {', '.join(BACKENDS)}")
    if precision == "auto":
        precision = "bf16" if backend == "cupy" else "fp32"
        if backend == "cupy" and shape is not None:
            load_backend(backend)  # its clear error where CuPy is missing, before the GPU is asked its kind
            precision, reason = train_precision(shape, trained)
            why = f"{why}; precision {reason}"
    elif backend == "numpy" and precision != "fp32":
        raise ValueError(f"precision {precision!r} needs the CuPy GPU backend, but this run uses NumPy ({why}); "
                         "set precision: auto (or fp32) to train on the CPU")
    return backend, precision, why


def train_precision(shape: TrainShape, trained: tuple[str, str] | None) -> tuple[str, str]:
    """`precision: auto` of a training run on the CuPy backend, and why (resolve_backend)."""
    try:
        gpu, cc = gpu_kind()
    except Exception as e:  # backend: cupy set on a machine whose GPU CuPy cannot use: the backend says so next
        return "bf16", f"auto: bf16 (the GPU could not be asked its kind for the fp8 record: {type(e).__name__}: {e})"
    if trained is not None and trained[0] == "cupy":
        kept = trained[1]
        if kept == "fp8" and not fp8_capable(cc):
            return "bf16", f"auto: bf16 (the run's checkpoints trained in fp8, which {gpu} cannot run; bf16 goes on from them)"
        return kept, f"auto: {kept} (the precision the run's checkpoints were trained in)"
    return auto_precision(load_record(), gpu, cc, shape)


@dataclass
class PreparedBatch:
    """A micro-batch checked and ready to upload: token and target IDs in the backend's index
    type, and whatever the backend planned from them on the host (Engine.prepare)."""

    tokens: np.ndarray
    targets: np.ndarray
    plan: object = None  # None: forward only (no backward plan made or uploaded)


@dataclass
class MemoryPlan:
    parameters: int  # bytes: weights, grads, m, v
    activations: int  # saved for the backward pass
    scratch: int
    n_params: int

    @property
    def total(self) -> int:
        return self.parameters + self.activations + self.scratch

    def describe(self) -> str:
        mib = 1 / (1 << 20)
        return (
            f"memory plan: {self.n_params:,} parameters; weights+grads+m+v {self.parameters * mib:,.1f} MiB, "
            f"saved activations {self.activations * mib:,.1f} MiB, scratch {self.scratch * mib:,.1f} MiB, "
            f"total {self.total * mib:,.1f} MiB"
        )


class Engine:
    """One model's buffers and its forward/backward/optimizer steps on one backend."""

    def __init__(self, cfg: ModelConfig, batch_size: int, seq_len: int | None = None, backend: str = "numpy",
                 dtype: str = "float32", seed: int = 0, precision: str = "fp32", comm=None,
                 reduce_bucket_mb: float = 25.0, reduce_dtype: str = "float32"):
        self.cfg = cfg
        # data parallelism: the ranks that average their gradients each step (andrea/comm.py); a
        # SingleProcess communicator (the default) makes both calls below return at once
        self.comm = comm if comm is not None else SingleProcess()
        self.reduce_bucket_mb = reduce_bucket_mb
        self.B = batch_size
        self.T = seq_len or cfg.context
        if self.T > cfg.context:
            raise ValueError(f"sequence length {self.T} exceeds the model's context {cfg.context}")
        self.be = make_backend(backend, precision)
        if reduce_dtype not in self.be.reduce_dtypes:
            raise ValueError(f"reduce_dtype {reduce_dtype!r}: the {backend} backend averages gradients in "
                             f"{' or '.join(self.be.reduce_dtypes)}")
        self.reduce_dtype = reduce_dtype
        self.backend = backend
        self.xp = self.be.xp
        self.precision = precision
        self.dtype = np.dtype(dtype)
        self.layout = param_layout(cfg)
        self.n_params = n_params(cfg)
        # one flat buffer each for weights, gradients, Adam m and v
        xp = self.xp
        self.w = xp.asarray(init_weights(cfg, seed, self.dtype))
        self.g = xp.zeros_like(self.w)
        self.m = xp.zeros_like(self.w)
        self.v = xp.zeros_like(self.w)
        self.decay = self.be.decay_buffer(decay_mask(self.layout, self.be.decay_dtype))
        self.P = views(self.w, self.layout)  # by checkpoint name ("h0.wq"), for tools and tests
        self.W = Weights(cfg, self.w, self.layout)  # by role (W.blocks[0].wq), for the passes
        self.G = Weights(cfg, self.g, self.layout)
        self.adam_t = 0  # updates applied so far (bias correction), as the host last learnt it
        # the optimizer step's decisions on the device (Backend.step_control; CTRL_T: the device's adam_t)
        self.ctrl = xp.zeros(len(CTRL), dtype=np.float64)
        self.A = Activations(cfg, self.B, self.T, self.be, self.dtype)
        self.acts, self.scratch = self.A.saved, self.A.scratch
        if self.A.arena is not None:
            self.be.set_backward_arena(self.A.arena)  # e.g. the attention backward's workspace
        self.scratch["norm_partial"] = xp.zeros(max(1, -(-self.n_params // (1 << 16))), dtype=np.float64)
        self.tokens = xp.zeros((self.B, self.T), dtype=self.be.index_dtype)
        self.targets = xp.zeros((self.B, self.T), dtype=self.be.index_dtype)
        self.be.register_weights(self.w, head=self.W.head)  # e.g. a bf16 copy that AdamW keeps fresh
        self.buckets = self._gradient_buckets()
        # CUDA graphs: the 16-bit GPU paths replay forward + backward as one captured graph
        self.graphs = self.be.can_capture and precision in ("bf16", "fp16", "fp8") and \
            os.environ.get("ANDREA_CUDA_GRAPHS", "1") != "0"
        self._captured = {}  # reduce (bool) -> the captured pass
        # fp16 loss scaling (decision): start at 2^15, the largest at which the classifier's scaled
        # gradient (|softmax - onehot| <= 1) still fits fp16; halve on overflow (andrea/optim.py),
        # double after LOSS_SCALE_WINDOW clean steps, never above the start
        self.loss_scale = 1.0
        self.set_loss_scale(LOSS_SCALE_MAX if precision == "fp16" else 1.0)

    def memory_plan(self) -> MemoryPlan:
        saved, scratch = self.A.nbytes()
        return MemoryPlan(
            parameters=sum(a.nbytes for a in (self.w, self.g, self.m, self.v, self.decay)),
            activations=saved + self.tokens.nbytes + self.targets.nbytes,
            scratch=scratch,  # the gradient norm's partial sums included (they live in A.scratch)
            n_params=self.n_params,
        )

    # -------------------------------------------------------------- forward / backward
    def prepare(self, tokens, targets, backward: bool = True) -> "PreparedBatch":
        """Check a micro-batch and do its host-side work (e.g. the CuPy backend plans the embedding
        backward from the token IDs; not for a batch that only goes forward). Pure host work that
        touches no engine buffer, so the trainer runs it in a background thread while the
        previous step runs on the device."""
        tokens = np.asarray(tokens)
        targets = np.asarray(targets)
        if tokens.shape != (self.B, self.T) or targets.shape != (self.B, self.T):
            raise ValueError(f"batch must be {(self.B, self.T)}, got {tokens.shape} and {targets.shape}")
        if tokens.max(initial=0) >= self.cfg.vocab_size or targets.max(initial=0) >= self.cfg.vocab_size or tokens.min(initial=0) < 0:
            raise ValueError(f"token IDs must lie in 0..{self.cfg.vocab_size - 1}")
        index = self.be.index_dtype
        plan = self.be.plan_tokens(tokens) if backward and self.be.plans_tokens else None
        return PreparedBatch(np.ascontiguousarray(tokens, dtype=index), np.ascontiguousarray(targets, dtype=index), plan)

    def _upload(self, tokens, targets=None) -> None:
        batch = tokens if isinstance(tokens, PreparedBatch) else self.prepare(tokens, targets)
        self.be.upload_tokens(batch.tokens, self.tokens, plan=batch.plan)  # with the embedding backward's plan, when made
        self.be.upload(batch.targets, self.targets)

    def forward(self, tokens, targets=None) -> float:
        """Mean cross-entropy over B×T; per-position losses stay in acts['losses']. `tokens` may be
        a PreparedBatch (then no targets)."""
        self._upload(tokens, targets)
        return self._forward()

    def forward_backward(self, tokens, targets=None, reduce: bool = True, on_host: bool = True, zero_grads: bool = False):
        """One micro-batch: forward, then backward (gradients added into self.g, or written there
        with `zero_grads`: cleared first, inside the same graph, so that the host does not queue a
        clear of its own). Returns the mean loss of each batch row, on the host (or, with on_host
        False, still on the device: no host sync; engine.host() brings it). With CUDA graphs the
        pass is one graph launch. `tokens` may be a PreparedBatch (then no targets). With several
        ranks and `reduce` (the last micro-batch of a step), the gradients are averaged over the
        ranks block by block as the backward pass completes them."""
        if isinstance(tokens, PreparedBatch) and tokens.plan is None and self.be.plans_tokens:
            raise ValueError("this batch was prepared for a forward pass only (prepare(..., backward=False))")
        self._upload(tokens, targets)
        reduce = reduce and self.comm.size > 1
        if self.graphs:
            key = (reduce, zero_grads)
            if key not in self._captured:
                self._captured[key] = self.be.capture(lambda: self._forward_backward(reduce, zero_grads))
            self._captured[key]()
        else:
            self._forward_backward(reduce, zero_grads)
        return self.row_losses(on_host)

    def release_graphs(self) -> None:
        """Destroy the captured passes. With several ranks, before the communicator is closed:
        NCCL waits in ncclCommDestroy until every CUDA graph holding its operations is gone, so a
        communicator closed (or collected at exit) while a graph lives hangs the process."""
        self._captured.clear()

    def _forward_backward(self, reduce: bool = False, zero_grads: bool = False) -> None:
        if zero_grads:
            self.zero_grads()
        self._forward()
        self.backward(reduce=reduce)

    def _forward(self):
        self.be.begin_pass()
        return model.forward(self.cfg, self.be, self.W, self.A, self.tokens, self.targets)

    def backward(self, dloss: float = 1.0, reduce: bool = False) -> None:
        """Gradients of the last forward's mean loss (times dloss, and times loss_scale in fp16),
        added into self.g; with `reduce`, averaged over the ranks, bucket by bucket."""
        hook = self._reduce_bucket if reduce else None
        model.backward(self.cfg, self.be, self.W, self.G, self.A, self.tokens, self.targets, dloss, grads_final=hook)
        if reduce:
            self.be.reduce_join()

    def _gradient_buckets(self) -> dict[int, tuple[int, int]]:
        """What to reduce after block l's backward (l = -1: after the embeddings'): {l: (lo, hi)}
        stretches of the flat gradients. The parameter layout keeps each block contiguous, and
        the backward pass finishes them from the end of the buffer down (the last block's
        stretch reaches the end: LN_f and an untied head are done first), so the finished part
        grows downwards; a stretch is sent once it holds reduce_bucket_mb (fewer, larger
        all-reduces cost less; smaller ones start sooner), the rest after the embeddings.
        reduce_bucket_mb 0: one all-reduce of everything at the end of the backward pass."""
        first = {}  # "h3" -> the offset of block 3's first parameter
        for p in self.layout:
            first.setdefault(p.name.split(".")[0], p.offset)
        bucket = self.reduce_bucket_mb * (1 << 20) / self.g.itemsize
        buckets, hi = {}, self.n_params
        for l in reversed(range(self.cfg.n_layer)):
            lo = first[f"h{l}"]
            if bucket and hi - lo >= bucket:
                buckets[l], hi = (lo, hi), lo
        buckets[-1] = (0, hi)
        return buckets

    def _reduce_bucket(self, l: int) -> None:
        if l in self.buckets:
            lo, hi = self.buckets[l]
            self.be.reduce_async(self.comm, self.g[lo:hi], self.reduce_dtype)

    def row_losses(self, on_host: bool = True):
        """Mean loss of each batch row (what the curriculum attributes to a row's source), on the host
        (or in a new device array, which the next pass does not overwrite)."""
        rows = self.acts["losses"].mean(axis=1)
        return self.host(rows) if on_host else rows

    def snapshot(self, a):
        """The value of a buffer now, for a writer thread to take later: `materialise(result)` is a
        host array. On the GPU a device-side copy (the transfer happens in the writer's thread);
        on the CPU a copy."""
        return self.be.snapshot(a)

    def host(self, a) -> np.ndarray:
        """A buffer as a NumPy array (a copy from the GPU, the array itself on the CPU)."""
        return self.be.to_host(a)

    # -------------------------------------------------------------- optimizer
    def zero_grads(self) -> None:
        self.g[:] = 0

    def grad_norm(self) -> float:
        """Global L2 norm of all gradients: per-block partial sums, then one final reduction."""
        self.be.grad_norm_partial(self.g, self.scratch["norm_partial"])
        return self.be.grad_norm_final(self.scratch["norm_partial"])

    def gather_rows(self, rows: np.ndarray) -> np.ndarray:
        """The row losses of every rank's micro-batches, rank after rank, on every rank (so each
        takes the same decisions: non-finite steps, the bandit's rewards)."""
        if self.comm.size == 1:
            return rows
        n = len(rows)
        out = np.zeros(n * self.comm.size, dtype=np.float64)
        out[self.comm.rank * n:(self.comm.rank + 1) * n] = rows
        return self.comm.allreduce_host(out, "sum")  # x + 0 = x exactly: a gather

    def scale_grads(self, scale: float) -> None:
        self.be.grad_scale(self.g, scale)

    def update(self, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, clip: float) -> None:
        """The optimizer step without a host sync: the gradient norm, the decisions (clip to `clip`,
        undo the loss scale, skip a non-finite step: Backend.step_control) and AdamW all queued on
        the device. self.ctrl holds the decisions (CTRL) until the next update; read them with
        readback, then set adam_t from CTRL_T."""
        self.be.grad_norm_partial(self.g, self.scratch["norm_partial"])
        self.be.step_control(self.scratch["norm_partial"], self.ctrl, clip, self.loss_scale, beta1, beta2)
        self.be.adamw(self.w, self.g, self.m, self.v, self.decay, lr, beta1, beta2, eps, weight_decay, 1, ctrl=self.ctrl)

    def readback(self, arrays):
        """Host copies of device arrays (e.g. self.ctrl and row losses) as of now: .get() returns them,
        waiting only for the work queued before this call (Backend.readback)."""
        return self.be.readback(arrays)

    def set_loss_scale(self, scale: float) -> None:
        self.loss_scale = float(scale)
        self.scale_good_steps = 0
        self.be.set_loss_scale(self.loss_scale)

    def loss_scale_grow(self) -> None:
        """After a clean optimizer step: count it, and double the scale after a window of them."""
        self.scale_good_steps += 1
        if self.scale_good_steps >= LOSS_SCALE_WINDOW and self.loss_scale < LOSS_SCALE_MAX:
            self.set_loss_scale(min(LOSS_SCALE_MAX, self.loss_scale * 2))

    # -------------------------------------------------------------- state
    def load_state(self, weights, m=None, v=None, adam_t: int = 0) -> None:
        """Copy weights (and optimizer state) in, e.g. from a checkpoint."""
        for dst, src in ((self.w, weights), (self.m, m), (self.v, v)):
            if src is not None:
                if src.shape != dst.shape:
                    raise ValueError(f"state has {src.shape[0]} parameters, this model {dst.shape[0]}")
                dst[...] = self.xp.asarray(src)
        self.be.invalidate_weight_cache()
        self.adam_t = adam_t
        self.ctrl[CTRL_T] = adam_t
