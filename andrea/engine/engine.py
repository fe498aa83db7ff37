"""The training engine: the model's forward and backward passes as a sequence of kernel pairs
(SPEC §3.1) over buffers planned and allocated once (SPEC §3.2).

Weights, gradients and Adam's m and v are one flat buffer each, in the parameter order of
andrea/model.py (so a checkpoint is three contiguous copies). Activations saved for the backward
pass and the scratch it needs are allocated here, from the config, before step 1; the engine
reports this plan. A backend supplies the kernels: andrea/engine/numpy_backend.py (the reference,
any CPU) or andrea/engine/cupy_backend.py (NVIDIA GPUs), which may store a buffer in its own
layout and type (plan_buffer), fuse neighbouring steps (residual add + LayerNorm) and replay
forward + backward as one CUDA graph (capture).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

import numpy as np

from andrea.model import LN_EPS, ModelConfig, decay_mask, init_weights, n_params, param_layout, views

LOSS_SCALE_MAX = 2.0**15
LOSS_SCALE_WINDOW = 200

BACKENDS = {"numpy": "andrea.engine.numpy_backend", "cupy": "andrea.engine.cupy_backend"}


def load_backend(name: str):
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
    try:
        return importlib.import_module(BACKENDS[name])
    except ImportError as e:
        raise RuntimeError(f"backend {name!r} is not available here ({e}); the CuPy backend needs an NVIDIA GPU "
                           "and `pip install -e '.[gpu]'`") from None


def materialise(x) -> np.ndarray:
    """A host array from an Engine.snapshot (or an array, as it is)."""
    return x.host() if hasattr(x, "host") else x


def gpu_status() -> tuple[bool, str]:
    """Whether the CuPy backend can run here, and why (or why not), in words for the plan line."""
    try:
        import cupy
    except ImportError:
        return False, "CuPy is not installed (pip install -e '.[gpu]' on a machine with an NVIDIA GPU)"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
        if n == 0:
            return False, "CuPy sees no CUDA GPU"
        dev = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return True, f"CUDA GPU {dev.id} of {n}: {name} (compute capability {dev.compute_capability})"
    except Exception as e:  # no driver, no device, a broken install: the CPU is the honest answer
        return False, f"CuPy cannot use a CUDA GPU here ({type(e).__name__}: {e})"


def resolve_backend(backend: str, precision: str) -> tuple[str, str, str]:
    """The backend and precision a run uses, and why. `backend: auto` (the shipped default) takes
    CuPy when a CUDA GPU is usable, NumPy otherwise; `precision: auto` takes bf16 on CuPy (the fast
    path) and fp32 on NumPy (the only precision it has)."""
    if backend == "auto":
        ok, why = gpu_status()
        backend, why = ("cupy" if ok else "numpy"), f"auto: {why}"
    elif backend in BACKENDS:
        why = "set in the config"
    else:
        raise ValueError(f"unknown backend {backend!r}; available: auto, {', '.join(BACKENDS)}")
    if precision == "auto":
        precision = "bf16" if backend == "cupy" else "fp32"
    elif backend == "numpy" and precision != "fp32":
        raise ValueError(f"precision {precision!r} needs the CuPy GPU backend, but this run uses NumPy ({why}); "
                         "set precision: auto (or fp32) to train on the CPU")
    return backend, precision, why


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
                 dtype: str = "float32", seed: int = 0, precision: str = "fp32"):
        self.cfg = cfg
        self.B = batch_size
        self.T = seq_len or cfg.context
        if self.T > cfg.context:
            raise ValueError(f"sequence length {self.T} exceeds the model's context {cfg.context}")
        self.be = load_backend(backend)
        self.backend = backend
        self.xp = getattr(self.be, "xp", np)
        self.precision = precision
        if hasattr(self.be, "set_precision"):
            self.be.set_precision(precision)
        elif precision != "fp32":
            raise ValueError(f"the {backend} backend computes in fp32 only, not {precision}")
        self.dtype = np.dtype(dtype)
        self.layout = param_layout(cfg)
        self.n_params = n_params(cfg)
        # one flat buffer each for weights, gradients, Adam m and v
        xp = self.xp
        self.w = xp.asarray(init_weights(cfg, seed, self.dtype))
        self.g = xp.zeros_like(self.w)
        self.m = xp.zeros_like(self.w)
        self.v = xp.zeros_like(self.w)
        self.decay = xp.asarray(decay_mask(self.layout, getattr(self.be, "DECAY_DTYPE", self.dtype)))
        self.P = views(self.w, self.layout)
        self.G = views(self.g, self.layout)
        self.adam_t = 0  # updates applied so far (bias correction)
        self._allocate()
        # CUDA graphs: the 16-bit GPU paths replay forward + backward as one captured graph
        self.graphs = bool(getattr(self.be, "capture", None)) and precision in ("bf16", "fp16") and \
            os.environ.get("ANDREA_CUDA_GRAPHS", "1") != "0"
        self._captured = None
        # fp16 loss scaling (decision): start at 2^15, the largest at which the classifier's scaled
        # gradient (|softmax - onehot| <= 1) still fits fp16; halve on overflow (andrea/optim.py),
        # double after LOSS_SCALE_WINDOW clean steps, never above the start
        self.loss_scale = LOSS_SCALE_MAX if precision == "fp16" else 1.0
        self.scale_good_steps = 0

    # -------------------------------------------------------------- buffers
    def _allocate(self) -> None:
        c, B, T, dt = self.cfg, self.B, self.T, self.dtype
        L, d, H, D, M, V = c.n_layer, c.d_model, c.n_head, c.head_dim, c.d_mlp, c.vocab_size
        xp = self.xp
        plan = getattr(self.be, "plan_buffer", None)  # a backend may store a buffer in another layout/dtype
        # a backend that recomputes gelu(h) in the backward pass needs one buffer for it, not L
        self._shared_gelu = getattr(self.be, "recomputes_gelu", lambda: False)()

        def z(name, *shape):
            shape, dtype = plan(name, shape, dt, H) if plan else (shape, dt)
            return xp.zeros(shape, dtype=dtype)

        self.acts = {
            name: z(name, *shape) for name, shape in {
                "res": (2 * L + 1, B, T, d),  # residual stream: layer input, after attention, …, final
                "ln1": (L, B, T, d), "ln1_mean": (L, B, T), "ln1_rstd": (L, B, T),
                "qkv": (L, 3, B, H, T, D), "att_y": (L, B, T, d), "att_lse": (L, B, H, T),
                "ln2": (L, B, T, d), "ln2_mean": (L, B, T), "ln2_rstd": (L, B, T),
                "mlp_h": (L, B, T, M), "mlp_a": (1 if self._shared_gelu else L, B, T, M),
                "lnf": (B, T, d), "lnf_mean": (B, T), "lnf_rstd": (B, T),
                "probs": (B, T, V), "losses": (B, T),
            }.items()
        }
        self.scratch = {
            name: z(name, *shape) for name, shape in {
                "branch": (B, T, d), "d_res": (B, T, d), "d_branch": (B, T, d), "d_ln": (B, T, d),
                "d_y": (B, T, d), "d_qkv": (3, B, H, T, D),
            }.items()
        }
        self.scratch["norm_partial"] = xp.zeros(max(1, -(-self.n_params // (1 << 16))), dtype=np.float64)
        index = getattr(self.be, "INDEX_DTYPE", np.int64)
        self.tokens = xp.zeros((B, T), dtype=index)
        self.targets = xp.zeros((B, T), dtype=index)
        if hasattr(self.be, "register_weights"):  # e.g. a bf16 copy that AdamW keeps fresh
            self.be.register_weights(self.w, head=self.P[self.head])

    def memory_plan(self) -> MemoryPlan:
        return MemoryPlan(
            parameters=sum(a.nbytes for a in (self.w, self.g, self.m, self.v, self.decay)),
            activations=sum(a.nbytes for a in self.acts.values()) + self.tokens.nbytes + self.targets.nbytes,
            scratch=sum(a.nbytes for a in self.scratch.values()),
            n_params=self.n_params,
        )

    @property
    def head(self):
        return ("wte" if self.cfg.tied_head else "head")

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
        index = getattr(self.be, "INDEX_DTYPE", np.int64)
        plan = self.be.plan_tokens(tokens) if backward and hasattr(self.be, "plan_tokens") else None
        return PreparedBatch(np.ascontiguousarray(tokens, dtype=index), np.ascontiguousarray(targets, dtype=index), plan)

    def _upload(self, tokens, targets=None) -> None:
        batch = tokens if isinstance(tokens, PreparedBatch) else self.prepare(tokens, targets)
        if getattr(self.be, "PRECISION", self.precision) != self.precision:  # another engine in this process
            self.be.set_precision(self.precision)
        if hasattr(self.be, "set_loss_scale"):  # the device copy is the backend's: other engines may have set it
            self.be.set_loss_scale(self.loss_scale)
        if hasattr(self.be, "upload_tokens"):  # with the embedding backward's plan, when made
            self.be.upload_tokens(batch.tokens, self.tokens, plan=batch.plan)
        else:
            self.tokens[...] = self.xp.asarray(batch.tokens)
        self.targets[...] = self.xp.asarray(batch.targets)

    def forward(self, tokens, targets=None) -> float:
        """Mean cross-entropy over B×T; per-position losses stay in acts['losses']. `tokens` may be
        a PreparedBatch (then no targets)."""
        self._upload(tokens, targets)
        return self._forward()

    def forward_backward(self, tokens, targets=None) -> np.ndarray:
        """One micro-batch: forward, then backward (gradients added into self.g). Returns the mean
        loss of each batch row, on the host. With CUDA graphs the pass is one graph launch.
        `tokens` may be a PreparedBatch (then no targets)."""
        if isinstance(tokens, PreparedBatch) and tokens.plan is None and hasattr(self.be, "plan_tokens"):
            raise ValueError("this batch was prepared for a forward pass only (prepare(..., backward=False))")
        self._upload(tokens, targets)
        if self.graphs:
            if self._captured is None:
                self._captured = self.be.capture(self._forward_backward)
            self._captured()
        else:
            self._forward_backward()
        return self.row_losses()

    def _forward_backward(self) -> None:
        self._forward()
        self.backward()

    def _forward(self):
        be, P, A, S = self.be, self.P, self.acts, self.scratch
        H, L = self.cfg.n_head, self.cfg.n_layer
        res = A["res"]
        ln = lambda l, n: P[f"h{l}.{n}"] if l < L else P[n.replace("ln1", "lnf")]  # noqa: E731
        be.embed_fwd(self.tokens, P["wte"], P["wpe"], res[0])
        be.layernorm_fwd(res[0], P["h0.ln1.g"], P["h0.ln1.b"], A["ln1"][0], A["ln1_mean"][0], A["ln1_rstd"][0], LN_EPS)
        for l in range(L):
            p = lambda n: P[f"h{l}.{n}"]  # noqa: E731
            be.attn_qkv_fwd(A["ln1"][l], p("wq"), p("wk"), p("wv"), A["qkv"][l], H)
            be.attn_fwd(A["qkv"][l], A["att_y"][l], A["att_lse"][l])
            be.attn_out_fwd(A["att_y"][l], p("wo"), S["branch"])
            # residual add + LN2, fused
            be.add_layernorm_fwd(res[2 * l], S["branch"], res[2 * l + 1], p("ln2.g"), p("ln2.b"), A["ln2"][l],
                                 A["ln2_mean"][l], A["ln2_rstd"][l], LN_EPS)
            be.mlp_fwd(A["ln2"][l], p("w1"), p("w2"), A["mlp_h"][l], A["mlp_a"][self._gelu_slot(l)], S["branch"])
            # residual add + the next LayerNorm (LN1 of the next layer, or LN_f), fused
            nxt = (A["ln1"][l + 1], A["ln1_mean"][l + 1], A["ln1_rstd"][l + 1]) if l + 1 < L else (A["lnf"], A["lnf_mean"], A["lnf_rstd"])
            be.add_layernorm_fwd(res[2 * l + 1], S["branch"], res[2 * l + 2], ln(l + 1, "ln1.g"), ln(l + 1, "ln1.b"), *nxt, LN_EPS)
        return be.loss_fwd(A["lnf"], P[self.head], self.targets, A["probs"], A["losses"])

    def _gelu_slot(self, l: int) -> int:
        return 0 if self._shared_gelu else l

    def backward(self, dloss: float = 1.0) -> None:
        """Gradients of the last forward's mean loss (times dloss, and times loss_scale in fp16),
        added into self.g."""
        be, P, G, A, S = self.be, self.P, self.G, self.acts, self.scratch
        res = A["res"]
        d_res, d_branch, d_ln = S["d_res"], S["d_branch"], S["d_ln"]
        be.loss_bwd(A["lnf"], P[self.head], self.targets, A["probs"], d_ln, G[self.head], dloss)
        d_res[:] = 0
        # each LayerNorm backward also hands the residual gradient to the branch below it (fused)
        be.layernorm_bwd(d_ln, res[-1], A["lnf_mean"], A["lnf_rstd"], P["lnf.g"], d_res, G["lnf.g"], G["lnf.b"], branch=d_branch)
        for l in reversed(range(self.cfg.n_layer)):
            p = lambda n: P[f"h{l}.{n}"]  # noqa: E731
            g = lambda n: G[f"h{l}.{n}"]  # noqa: E731
            be.mlp_bwd(d_branch, A["ln2"][l], A["mlp_h"][l], A["mlp_a"][self._gelu_slot(l)], p("w1"), p("w2"), d_ln, g("w1"), g("w2"))
            be.layernorm_bwd(d_ln, res[2 * l + 1], A["ln2_mean"][l], A["ln2_rstd"][l], p("ln2.g"), d_res, g("ln2.g"), g("ln2.b"),
                             branch=d_branch)
            be.attn_out_bwd(d_branch, A["att_y"][l], p("wo"), S["d_y"], g("wo"))
            be.attn_bwd(S["d_y"], A["qkv"][l], A["att_y"][l], A["att_lse"][l], S["d_qkv"])
            be.attn_qkv_bwd(S["d_qkv"], A["ln1"][l], p("wq"), p("wk"), p("wv"), d_ln, g("wq"), g("wk"), g("wv"))
            be.layernorm_bwd(d_ln, res[2 * l], A["ln1_mean"][l], A["ln1_rstd"][l], p("ln1.g"), d_res, g("ln1.g"), g("ln1.b"),
                             branch=d_branch if l > 0 else None)
        be.embed_bwd(d_res, self.tokens, G["wte"], G["wpe"])

    def row_losses(self) -> np.ndarray:
        """Mean loss of each batch row (what the curriculum attributes to a row's source), on the host."""
        return self.host(self.acts["losses"].mean(axis=1))

    def snapshot(self, a):
        """The value of a buffer now, for a writer thread to take later: `materialise(result)` is a
        host array. On the GPU a device-side copy (the transfer happens in the writer's thread);
        on the CPU a copy."""
        return self.be.snapshot(a) if hasattr(self.be, "snapshot") else np.array(a, copy=True)

    def host(self, a) -> np.ndarray:
        """A buffer as a NumPy array (a copy from the GPU, the array itself on the CPU)."""
        return self.be.to_host(a) if hasattr(self.be, "to_host") else np.asarray(a)

    # -------------------------------------------------------------- optimizer
    def zero_grads(self) -> None:
        self.g[:] = 0

    def grad_norm(self) -> float:
        """Global L2 norm of all gradients: per-block partial sums, then one final reduction."""
        self.be.grad_norm_partial(self.g, self.scratch["norm_partial"])
        return self.be.grad_norm_final(self.scratch["norm_partial"])

    def scale_grads(self, scale: float) -> None:
        self.be.grad_scale(self.g, scale)

    def adamw(self, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, gscale: float = 1.0) -> None:
        """One AdamW update; the gradients are multiplied by gscale first (clipping, fused)."""
        self.adam_t += 1
        self.be.adamw(self.w, self.g, self.m, self.v, self.decay, lr, beta1, beta2, eps, weight_decay, self.adam_t, gscale)

    def set_loss_scale(self, scale: float) -> None:
        self.loss_scale = float(scale)
        self.scale_good_steps = 0

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
        if hasattr(self.be, "invalidate_weight_cache"):
            self.be.invalidate_weight_cache()
        self.adam_t = adam_t
