"""The backend interface: every kernel pair of the model (design §3.1), the optimizer's steps, and
the buffer services an engine needs, as methods of one object.

Each Engine owns its backend object; a backend keeps no process-wide mutable state (its
precision, loss scale, weight copies, scratch buffers and BLAS handles are its own), so two
engines in one process (a training run and its validation, or a bf16 and an fp32 model in a
benchmark) never step on each other.

What a backend can do beyond the required methods is declared, not probed: the class attributes
under "capabilities" say whether it replays a pass as a CUDA graph, recomputes GELU in the
backward pass, plans the embedding backward from the token IDs on the host, and which
precisions it computes in. The defaults below are the plain answers (no, no, no, fp32), with
plain implementations of the buffer services for a backend whose arrays live where NumPy's do.

Conventions for the kernel pairs (the NumPy backend is the reference): a function writes into
buffers it is given; backward functions *add* weight gradients (`+=`), so micro-batches add into
one gradient buffer; input gradients marked "+=" in the docstrings accumulate, the rest overwrite.
Shapes: B batch, T time, d model width, H heads, D head width, M MLP width, V vocabulary.
"""

from __future__ import annotations

import abc
import math
from typing import Callable, ClassVar

import numpy as np


# step_control's buffer: the update's decisions, where the update (and later the host) reads them
CTRL = ("norm", "applied", "gscale", "bc1", "bc2", "t")
CTRL_NORM, CTRL_APPLIED, CTRL_GSCALE, CTRL_BC1, CTRL_BC2, CTRL_T = range(len(CTRL))


class Readback:
    """Host copies of device arrays, ready now (get() returns them)."""

    def __init__(self, arrays):
        self.arrays = arrays

    def get(self) -> list:
        return self.arrays


class _Done:
    def wait(self) -> None:
        pass


class Backend(abc.ABC):
    """One device's kernels and buffers, in one precision."""

    name: ClassVar[str]
    # ------------------------------------------------------------------ capabilities (declared)
    precisions: ClassVar[tuple[str, ...]] = ("fp32",)
    can_capture: ClassVar[bool] = False  # capture(fn) records a pass as a replayable CUDA graph
    plans_tokens: ClassVar[bool] = False  # plan_tokens() makes an embedding-backward plan on the host
    index_dtype: ClassVar[type] = np.int64  # token and target IDs on the device
    decay_dtype: ClassVar[type] = np.float32  # the weight-decay mask
    reduce_dtypes: ClassVar[tuple[str, ...]] = ("float32",)  # what reduce_async can send gradients in

    def __init__(self, precision: str = "fp32"):
        if precision not in self.precisions:
            raise ValueError(f"precision {precision!r}: the {self.name} backend computes in {', '.join(self.precisions)}")
        self.precision = precision

    @property
    def recomputes_gelu(self) -> bool:
        """mlp_bwd recomputes a = gelu(h) into the buffer it is given, so the engine allocates one
        such buffer for all layers instead of one per layer."""
        return False

    def plan_gelu(self, tokens: int, kept_bytes: int) -> None:
        """Told by the training activations, before they are allocated, the tokens of a pass and the
        bytes that saving every layer's a = gelu(h) would take: a backend that may recompute a
        (recomputes_gelu) decides here whether to."""

    # ------------------------------------------------------------------ buffers
    xp: ClassVar[object] = np  # the array module of the backend's arrays

    def plan_buffer(self, name: str, shape: tuple, dtype, n_head: int) -> tuple[tuple, object]:
        """The engine's buffer `name` as this backend stores it: (shape, dtype). A backend may keep
        a buffer in another layout or type (e.g. 16-bit activations, q/k/v interleaved)."""
        return shape, dtype

    def zeros(self, shape, dtype):
        return self.xp.zeros(shape, dtype=dtype)

    def set_backward_arena(self, buf) -> None:
        """Bytes that are dead while the layers' backward runs (most of the loss's probabilities:
        written by the forward's last step, read by the loss backward, which comes before the
        layers'; Activations.arena), which the backend may use as scratch there. Ignored here."""

    def decay_buffer(self, mask: np.ndarray):
        """The weight-decay mask (decay_dtype, one entry per parameter) as adamw takes it."""
        return self.xp.asarray(mask)

    def register_weights(self, w, head) -> None:
        """The flat weight buffer `w` (and `head`, the output head's view into it), for a backend
        that keeps a copy of the weights in another type (refreshed by adamw)."""

    def invalidate_weight_cache(self) -> None:
        """The weights changed outside adamw (a load): derived copies are stale."""

    def plan_tokens(self, tokens: np.ndarray):
        """Host-side work on a batch's token IDs for the embedding backward (plans_tokens), or None.
        Touches no device buffer: the trainer runs it in a background thread."""
        return None

    def upload_tokens(self, host: np.ndarray, dev, plan=None) -> None:
        """Copy token IDs into the device buffer `dev`, with their plan when one was made."""
        dev[...] = self.xp.asarray(host)

    def upload(self, host: np.ndarray, dev) -> None:
        dev[...] = self.xp.asarray(host)

    def to_host(self, a) -> np.ndarray:
        """A buffer as a NumPy array (the array itself where it already is one)."""
        return np.asarray(a)

    def host_buffer(self, shape, dtype) -> np.ndarray:
        """A host array that copies queued on the device's stream can read and write (a captured
        pass included): pinned memory on a GPU."""
        return np.empty(shape, dtype=dtype)

    def upload_async(self, dev, host) -> None:
        """dev = host (both contiguous, host from host_buffer), queued in stream order on a GPU."""
        dev[...] = host

    def download_async(self, host, dev) -> None:
        """host = dev (dev 2-D with unit column stride, host a contiguous host_buffer of its shape),
        queued in stream order on a GPU: read it after wait()."""
        host[...] = self.to_host(dev)

    def wait(self) -> None:
        """Until the work queued so far (the copies of download_async included) is done."""

    def mark(self):
        """A point in the work queued so far: an object whose wait() returns once that work is
        done (a recorded CUDA event on a GPU; here the work is already done)."""
        return _Done()

    def snapshot(self, a):
        """The value of `a` now, for a writer thread to bring to the host later: an array, or an
        object with .host() (engine.materialise turns either into a NumPy array)."""
        return np.array(a, copy=True)

    def set_loss_scale(self, scale: float) -> None:
        """The fp16 loss scale, for a backend whose loss kernel multiplies the gradients by it on the
        device (so a captured graph follows changes); the others get it as backward's dloss."""

    def capture(self, fn: Callable[[], None]) -> Callable[[], None]:
        """`fn`, recorded once and replayed (can_capture)."""
        raise NotImplementedError(f"the {self.name} backend cannot capture a pass")

    def reduce_async(self, comm, buf, dtype: str = "float32") -> None:
        """Average `buf` (a slice of the flat fp32 gradients) over the ranks of `comm`, sent in
        `dtype` (one of reduce_dtypes). Here at once; a GPU backend queues it on a stream of its
        own, beside the rest of the backward pass."""
        if dtype not in self.reduce_dtypes:
            raise ValueError(f"the {self.name} backend reduces gradients in {' or '.join(self.reduce_dtypes)}, not {dtype}")
        comm.allreduce(buf, "mean")

    def reduce_join(self) -> None:
        """Wait (on the device) for the reductions reduce_async queued."""

    def release(self) -> None:
        """Free what the backend keeps between calls (scratch, weight copies); the engine that owns
        it must not train on after this."""

    def implementation(self) -> str:
        """Which implementations run the pass where the backend has a choice (for the trainer's plan
        line); "" where it has none."""
        return ""

    def begin_pass(self) -> None:
        """Called by the engine before each forward pass (e.g. the fp8 mode's delayed scales move on)."""

    def precision_state(self):
        """State of the precision's own that a checkpoint must carry for a resumed run to continue
        exactly (the fp8 mode's delayed scales), JSON-ready; None when there is none."""
        return None

    def load_precision_state(self, state) -> None:
        """precision_state()'s value back. A state another precision wrote (a run resumed in another
        precision) matters only to that precision and is ignored, as is None."""

    # ------------------------------------------------------------------ embedding
    @abc.abstractmethod
    def embed_fwd(self, tokens, wte, wpe, out) -> None:
        """out[b, t] = wte[tokens[b, t]] + wpe[t] (wpe may be a slice starting at a later position)."""

    @abc.abstractmethod
    def embed_bwd(self, dout, tokens, dwte, dwpe) -> None:
        """dwte[tokens[b, t]] += dout[b, t], dwpe[t] += Σ_b dout[b, t], in a fixed order."""

    # ------------------------------------------------------------------ layernorm
    @abc.abstractmethod
    def layernorm_fwd(self, x, g, b, out, mean, rstd, eps, feeds=None) -> None:
        """out = (x − mean)·rstd·γ + β over the last axis; saves mean and rstd. `feeds`: (product,
        its first weight) that reads out ("qkv" or "mlp1"), or None: a backend that planned out in
        its own form for that product (plan_buffer; the CuPy fp8 mode: its e4m3 operand) writes it so."""

    @abc.abstractmethod
    def add_layernorm_fwd(self, x, f, res, g, b, out, mean, rstd, eps, feeds=None) -> None:
        """res = x + f (the residual add), out = LayerNorm(res); `feeds` as layernorm_fwd."""

    @abc.abstractmethod
    def layernorm_bwd(self, dout, x, mean, rstd, g, dx, dg, db, branch=None, feeds=None) -> None:
        """dx += LayerNorm's input gradient; dγ, dβ +=; with `branch`, the updated dx is copied
        there too (the gradient of the residual branch that joined the stream here), in the form a
        backend planned for the product `feeds` ((product, its weight), as layernorm_fwd's).
        `branch` may be dx itself (the model makes them one buffer where they are planned alike):
        then there is nothing to copy."""

    # ------------------------------------------------------------------ attention
    @abc.abstractmethod
    def attn_qkv_fwd(self, x, wq, wk, wv, qkv, n_head) -> None:
        """q, k, v = x·W_Q, x·W_K, x·W_V, split into heads, into the qkv buffer."""

    @abc.abstractmethod
    def attn_qkv_bwd(self, dqkv, x, wq, wk, wv, dx, dwq, dwk, dwv) -> None:
        """dx = Σ dq·W_Qᵀ + dk·W_Kᵀ + dv·W_Vᵀ (overwrites); dW += xᵀ·dq, …"""

    @abc.abstractmethod
    def attn_fwd(self, qkv, y, lse) -> None:
        """Causal softmax(q·kᵀ/√D)·v per head into y[B, T, d]; saves each score row's log-sum-exp."""

    @abc.abstractmethod
    def attn_bwd(self, dy, qkv, y, lse, dqkv) -> None:
        """dq, dk, dv from dy, recomputing the probabilities from lse."""

    @abc.abstractmethod
    def attn_out_fwd(self, y, wo, out) -> None:
        """out = y·W_O."""

    @abc.abstractmethod
    def attn_out_bwd(self, dout, y, wo, dy, dwo) -> None:
        """dy = dout·W_Oᵀ; dW_O += yᵀ·dout. dout is only read (it may be the residual stream's gradient)."""

    def attn_probs(self, qkv, lse):
        """The probabilities attn_fwd applied, P[b, h, i, j] = exp(q_i·k_j/√D − lse_i) for j ≤ i and
        0 after, recomputed from the q, k and log-sum-exp the forward saved, as the backward pass
        recomputes them ([B, H, T, T] fp32, a new array: for short sequences and the geometry
        views, andrea/geometry.py; a flash forward never holds them). Written with the array
        module over qkv_heads, so a backend on another device computes them there; the NumPy
        backend's attn_bwd reads its own version of it."""
        xp = self.xp
        q, k, _ = self.qkv_heads(qkv)
        f32 = xp.float32
        s = xp.matmul(q.astype(f32), k.astype(f32).transpose(0, 1, 3, 2)) * f32(1.0 / math.sqrt(q.shape[-1]))
        T = s.shape[-1]
        s += xp.triu(xp.full((T, T), -xp.inf, dtype=f32), 1)  # key j > query i: the future
        s -= lse.astype(f32)[..., None]
        return xp.exp(s, out=s)

    def qkv_heads(self, qkv):
        """q, k, v of a qkv buffer as [B, H, T, D] views (the layout plan_buffer chose)."""
        return qkv[0], qkv[1], qkv[2]

    # ------------------------------------------------------------------ generation (KV cache)
    # The cache's position lives on the host (pos) and in a one-element device array (pos_dev) that
    # the pass advances itself: a backend that captures the one-token step as a CUDA graph reads
    # pos_dev, the others pos. These defaults are written with the array module.
    @property
    def kv_dtype(self):
        """The type of the KV cache's keys and values."""
        return np.dtype(np.float32)

    def decodes_on_device(self, head_dim: int, context: int) -> bool:
        """Whether the one-token step of this shape reads its position on the device only (and
        allocates nothing), so that it can be captured and replayed."""
        return False

    def embed_cached_fwd(self, tokens, wte, wpe, pos: int, pos_dev, out) -> None:
        """embed_fwd for a chunk that starts at position pos."""
        self.embed_fwd(tokens, wte, wpe[pos:pos + tokens.shape[1]], out)

    def advance_position(self, pos_dev, n: int) -> None:
        """pos_dev += n, on the device (inside a captured step)."""
        pos_dev += n

    def attn_cached_fwd(self, qkv, k_cache, v_cache, pos: int, y, pos_dev=None) -> None:
        """Generation: the keys and values of this chunk's n positions go into the cache at
        [pos, pos + n) ([B, H, T_max, D] each); its queries attend causally over the cache's first
        pos + n positions. Written with the array module, so any backend that stores qkv as
        [3, B, H, T, D] (or says otherwise in qkv_heads) has it."""
        xp = self.xp
        q, k, v = self.qkv_heads(qkv)
        B, H, n, D = q.shape
        k_cache[:, :, pos:pos + n] = k
        v_cache[:, :, pos:pos + n] = v
        K, V = k_cache[:, :, :pos + n], v_cache[:, :, :pos + n]
        # copy=False: the cache and fp32 buffers are used as they are (no copy of the cache per token)
        f32 = xp.float32
        s = xp.matmul(q.astype(f32, copy=False), K.transpose(0, 1, 3, 2).astype(f32, copy=False)) * (1.0 / math.sqrt(D))
        # query i (at position pos + i) sees keys 0..pos + i
        s += xp.triu(xp.full((n, pos + n), -xp.inf, dtype=xp.float32), pos + 1)
        s -= s.max(axis=-1, keepdims=True)
        p = xp.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        y[...] = xp.matmul(p, V.astype(f32, copy=False)).transpose(0, 2, 1, 3).reshape(B, n, H * D)

    # ------------------------------------------------------------------ MLP
    @abc.abstractmethod
    def mlp_fwd(self, x, w1, w2, h, a, out) -> None:
        """h = x·W_1 (saved), a = gelu(h) (saved unless recomputes_gelu), out = a·W_2."""

    @abc.abstractmethod
    def mlp_bwd(self, dout, x, h, a, w1, w2, dx, dw1, dw2) -> None:
        """dx = the MLP's input gradient (overwrites); dW_1, dW_2 +=. dout is only read (it may be the
        residual stream's gradient)."""

    # ------------------------------------------------------------------ loss and head
    @abc.abstractmethod
    def loss_fwd(self, x, w, targets, probs, losses) -> float | None:
        """logits = x·wᵀ, softmax into `probs`, per-position cross-entropy into losses[B, T];
        returns the mean loss (None while a graph is being captured)."""

    @abc.abstractmethod
    def loss_bwd(self, x, w, targets, probs, dx, dw, dloss: float = 1.0) -> None:
        """Gradient of the mean loss times dloss: dx = dlogits·w (overwrites), dw += dlogitsᵀ·x."""

    def logits_fwd(self, x, w):
        """Generation: logits = x·wᵀ for the rows of x ([n, d] → [n, V], fp32)."""
        xp = self.xp
        f32 = xp.float32  # copy=False: fp32 weights (the head) are not copied per generated token
        return xp.matmul(x.reshape(-1, x.shape[-1]).astype(f32, copy=False), w.T.astype(f32, copy=False))

    @abc.abstractmethod
    def sample_tokens(self, logits, seeds, draws, tokens, ring, temperature: float, top_k: int,
                      top_p: float | None) -> None:
        """Generation: each row's next token, chosen where the logits are (numpy_backend.sample_tokens
        is the definition): tokens[b] (the next step's input, [B] or [B, 1]) = the pick (0 for −1:
        non-finite logits), ring[b, draws[b] % R] = the pick (ring: a host_buffer, or None),
        draws[b] += 1; seeds [B] uint64, draws [B] int32. Greedy at temperature ≤ 0, else
        1 ≤ top_k ≤ SAMPLE_CANDIDATES. Abstract: this interface sits below the NumPy reference, so it
        has no host version to fall back on (the GPU backend runs kernels/sampling.cu)."""

    # ------------------------------------------------------------------ optimizer
    @abc.abstractmethod
    def grad_norm_partial(self, grads, partial) -> None:
        """Stage 1 of the global norm: per-block sums of squares into `partial` (fp64)."""

    @abc.abstractmethod
    def grad_norm_final(self, partial) -> float:
        """Stage 2: the square root of their sum, on the host."""

    @abc.abstractmethod
    def grad_scale(self, grads, scale: float) -> None:
        """grads *= scale."""

    @abc.abstractmethod
    def adamw(self, w, g, m, v, decay, lr, beta1, beta2, eps, weight_decay, step, gscale=1.0, ctrl=None) -> None:
        """One fused AdamW update over the flat buffers (gradients times gscale first). With `ctrl`
        (step_control's buffer) the update takes gscale and the bias corrections from there, and
        is skipped where it says so; `step` and `gscale` are then ignored."""

    def step_control(self, partial, ctrl, clip: float, scale: float, beta1: float, beta2: float) -> None:
        """The optimizer step's decisions from the gradient norm's partial sums, into `ctrl` (CTRL:
        [norm, applied, gscale, bc1, bc2, t], fp64, in the backend's memory), where the update
        reads them: so that the host need not wait for the norm before launching it (the GPU
        backend does this in a kernel). norm = sqrt(sum of partials) / scale (the fp16 loss scale);
        a non-finite norm skips the update (applied 0, t unchanged); else t += 1, bc1 = 1 − β₁ᵗ,
        bc2 = 1 − β₂ᵗ, gscale = min(1, clip / norm) / scale."""
        norm = self.grad_norm_final(partial) / scale
        ctrl[CTRL_NORM] = norm
        ok = math.isfinite(norm)
        ctrl[CTRL_APPLIED] = float(ok)
        if ok:
            t = ctrl[CTRL_T] + 1.0
            ctrl[CTRL_T] = t
            ctrl[CTRL_GSCALE] = (clip / norm if norm > clip else 1.0) / scale
            ctrl[CTRL_BC1] = 1.0 - beta1**t
            ctrl[CTRL_BC2] = 1.0 - beta2**t

    def readback(self, arrays) -> "Readback":
        """Copies of `arrays` on the host, for later: readback(...).get() returns them. Here (the host
        backend) copied at once; a GPU backend queues the copies behind the work that fills the
        arrays and get() waits for those copies alone."""
        return Readback([np.array(a) for a in arrays])
