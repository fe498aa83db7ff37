"""NumPy backend: every forward/backward pair of design §3.1 on the CPU.

This is the readable reference and the oracle the CUDA kernels are tested against. Each function
writes into buffers it is given (planned and allocated once by the engine); backward functions
accumulate weight gradients with `+=`, so micro-batches add into one gradient buffer. Shapes:
B batch, T time, d model width, H heads, D head width, N = B·T rows, V vocabulary, M MLP width.
Works in float32 (training) and float64 (gradient checks): the dtype is the buffers'.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from andrea.engine.backend import CTRL_APPLIED, CTRL_GSCALE, CTRL_T, Backend
from andrea.fp8 import FP8Sites

GELU_C = math.sqrt(2.0 / math.pi)


# ----------------------------------------------------------------------------- embedding


def embed_fwd(tokens, wte, wpe, out):
    """out[b, t] = wte[tokens[b, t]] + wpe[t]."""
    T = tokens.shape[1]
    np.take(wte, tokens, axis=0, out=out)
    out += wpe[:T]


def embed_bwd(dout, tokens, dwte, dwpe):
    """Scatter-add into the embedding gradients. Rows are summed in a fixed order (sorted by
    token, stable), so the result is deterministic."""
    B, T, d = dout.shape
    dwpe[:T] += dout.sum(axis=0)
    flat_tok = tokens.reshape(-1)
    order = np.argsort(flat_tok, kind="stable")
    sorted_tok = flat_tok[order]
    uniq, starts = np.unique(sorted_tok, return_index=True)
    dwte[uniq] += np.add.reduceat(dout.reshape(-1, d)[order], starts, axis=0)


# ----------------------------------------------------------------------------- layernorm


def layernorm_fwd(x, g, b, out, mean, rstd, eps=1e-5, feeds=None):
    """out = (x − mean) · rstd · γ + β over the last axis; saves mean and rstd. (`feeds`: the product
    reading out; here out is always the plain output.)"""
    np.mean(x, axis=-1, out=mean)
    xc = x - mean[..., None]
    var = np.mean(xc * xc, axis=-1)
    np.divide(1.0, np.sqrt(var + eps), out=rstd)
    np.multiply(xc, rstd[..., None], out=out)
    out *= g
    out += b


def add_layernorm_fwd(x, f, res, g, b, out, mean, rstd, eps=1e-5, feeds=None):
    """The residual add and the LayerNorm after it: res = x + f, out = LayerNorm(res). (One pair
    of passes on the CPU; the GPU backend fuses them into one kernel.)"""
    residual_add(x, f, res)
    layernorm_fwd(res, g, b, out, mean, rstd, eps)


def layernorm_bwd(dout, x, mean, rstd, g, dx, dg, db, branch=None, feeds=None):
    """dx += LayerNorm's input gradient (the residual stream sums into it); dγ, dβ += . With
    `branch`, the updated dx is also copied there (residual_add_bwd for the branch that
    follows, fused)."""
    xhat = (x - mean[..., None]) * rstd[..., None]
    d = dout.shape[-1]
    dg += (dout * xhat).reshape(-1, d).sum(axis=0)
    db += dout.reshape(-1, d).sum(axis=0)
    dxhat = dout * g
    c1 = dxhat.mean(axis=-1, keepdims=True)
    c2 = (dxhat * xhat).mean(axis=-1, keepdims=True)
    dx += (dxhat - c1 - xhat * c2) * rstd[..., None]
    if branch is not None and branch is not dx:  # (where they are one buffer there is nothing to copy)
        residual_add_bwd(dx, branch)


# ----------------------------------------------------------------------------- attention


def attn_qkv_fwd(x, wq, wk, wv, qkv, n_head):
    """q, k, v = x·W_Q, x·W_K, x·W_V, split into heads: qkv[3, B, H, T, D]."""
    B, T, d = x.shape
    D = d // n_head
    x2 = x.reshape(-1, d)
    for i, w in enumerate((wq, wk, wv)):
        qkv[i] = (x2 @ w).reshape(B, T, n_head, D).transpose(0, 2, 1, 3)


def attn_qkv_bwd(dqkv, x, wq, wk, wv, dx, dwq, dwk, dwv):
    """dx = Σ dq·W_Qᵀ + …; dW += xᵀ·dq …"""
    B, T, d = x.shape
    x2 = x.reshape(-1, d)
    dx2 = dx.reshape(-1, d)
    dx2[:] = 0
    for i, (w, dw) in enumerate(((wq, dwq), (wk, dwk), (wv, dwv))):
        g = dqkv[i].transpose(0, 2, 1, 3).reshape(-1, d)
        dx2 += g @ w.T
        dw += x2.T @ g


@functools.lru_cache(maxsize=8)
def _causal_bias(T: int, dtype) -> np.ndarray:
    """0 where a query may look (j ≤ i), −inf where it must not (the future)."""
    return np.triu(np.full((T, T), -np.inf, dtype=dtype), 1)


def _causal_scores(q, k, scale):
    s = q @ k.transpose(0, 1, 3, 2)
    s *= scale
    s += _causal_bias(q.shape[2], s.dtype.type)
    return s


def attn_fwd(qkv, y, lse):
    """Causal softmax(q·kᵀ/√D)·v per head into y[B, T, d]; saves the log-sum-exp of each score
    row so the backward pass recomputes the probabilities instead of storing T×T of them."""
    q, k, v = qkv[0], qkv[1], qkv[2]
    B, H, T, D = q.shape
    s = _causal_scores(q, k, 1.0 / math.sqrt(D))
    mx = s.max(axis=-1, keepdims=True)
    p = np.exp(s - mx)
    den = p.sum(axis=-1, keepdims=True)
    lse[:] = (mx + np.log(den))[..., 0]
    p /= den
    y[:] = (p @ v).transpose(0, 2, 1, 3).reshape(B, T, H * D)


def attn_probs(qkv, lse):
    """The attention probabilities of the forward pass, P[b, h, i, j] = exp(q_i·k_j/√D − lse_i)
    (0 for a future j), recomputed from the q, k and log-sum-exp it saved: what the backward
    pass reads, and what the geometry views (andrea/geometry.py) show. [B, H, T, T], a new array."""
    q, k = qkv[0], qkv[1]
    return np.exp(_causal_scores(q, k, 1.0 / math.sqrt(q.shape[-1])) - lse[..., None])


def attn_bwd(dy, qkv, y, lse, dqkv):
    """Gradients of q, k, v from dy[B, T, d], recomputing P = exp(S − lse)."""
    q, k, v = qkv[0], qkv[1], qkv[2]
    B, H, T, D = q.shape
    scale = 1.0 / math.sqrt(D)
    p = attn_probs(qkv, lse)
    dyh = dy.reshape(B, T, H, D).transpose(0, 2, 1, 3)
    yh = y.reshape(B, T, H, D).transpose(0, 2, 1, 3)
    dqkv[2] = p.transpose(0, 1, 3, 2) @ dyh  # dv = Pᵀ·dy
    dp = dyh @ v.transpose(0, 1, 3, 2)
    delta = (dyh * yh).sum(axis=-1, keepdims=True)  # = Σ_j dP_ij P_ij
    ds = p * (dp - delta)
    ds *= scale
    dqkv[0] = ds @ k
    dqkv[1] = ds.transpose(0, 1, 3, 2) @ q


def attn_out_fwd(y, wo, out):
    out.reshape(-1, out.shape[-1])[:] = y.reshape(-1, y.shape[-1]) @ wo


def attn_out_bwd(dout, y, wo, dy, dwo):
    d = y.shape[-1]
    g = dout.reshape(-1, dout.shape[-1])
    dy.reshape(-1, d)[:] = g @ wo.T
    dwo += y.reshape(-1, d).T @ g


# ----------------------------------------------------------------------------- MLP


def gelu(h, out):
    """GELU, tanh approximation."""
    np.multiply(h, h, out=out)
    out *= 0.044715 * h
    out += h
    out *= GELU_C
    np.tanh(out, out=out)
    out += 1.0
    out *= 0.5 * h


def mlp_fwd(x, w1, w2, h, a, out, cast_a=None):
    """h = x·W_1 (saved pre-activation), a = gelu(h) (saved), out = a·W_2. `cast_a`: what the
    second product reads of a (fp8: its 8-bit values; a itself is saved as computed)."""
    d = x.shape[-1]
    h2 = h.reshape(-1, h.shape[-1])
    np.matmul(x.reshape(-1, d), w1, out=h2)
    gelu(h, a)
    a_in = a if cast_a is None else cast_a(a)
    out.reshape(-1, d)[:] = a_in.reshape(-1, a.shape[-1]) @ w2


def mlp_bwd(dout, x, h, a, w1, w2, dx, dw1, dw2, cast_dh=None):
    """The MLP's gradients; `cast_dh`: what the products read of h's gradient (fp8: 8 bits)."""
    d = x.shape[-1]
    M = h.shape[-1]
    g = dout.reshape(-1, d)
    dw2 += a.reshape(-1, M).T @ g
    da = g @ w2.T
    # GELU'(h) = ½(1 + t) + ½·h·(1 − t²)·c·(1 + 3·0.044715·h²), t = tanh(c·(h + 0.044715·h³)),
    # computed in place on two temporaries (this is the backward pass's largest elementwise work)
    hh = h.reshape(-1, M)
    u = hh * hh
    t = u * 0.044715
    t += 1.0
    t *= hh
    t *= GELU_C
    np.tanh(t, out=t)
    s = t * t
    np.subtract(1.0, s, out=s)
    s *= hh
    s *= 0.5 * GELU_C
    u *= 3 * 0.044715
    u += 1.0
    s *= u
    t += 1.0
    t *= 0.5
    s += t
    da *= s  # dh
    if cast_dh is not None:
        da = cast_dh(da)
    dw1 += x.reshape(-1, d).T @ da
    dx.reshape(-1, d)[:] = da @ w1.T


# ----------------------------------------------------------------------------- residual


def residual_add(x, f, out):
    np.add(x, f, out=out)


def residual_add_bwd(dout, df):
    """out = x + f passes its gradient to both: the stream's gradient stays `dout` (the engine
    keeps using that buffer for x), and the branch gets df = dout."""
    df[:] = dout


# ----------------------------------------------------------------------------- loss


def loss_fwd(x, w, targets, probs, losses):
    """Fused classifier: logits = x·wᵀ, softmax into `probs`, per-position cross-entropy into
    `losses[B, T]`. Returns the mean loss."""
    d = x.shape[-1]
    logits = probs.reshape(-1, w.shape[0])
    np.matmul(x.reshape(-1, d), w.T, out=logits)
    mx = logits.max(axis=-1, keepdims=True)
    logits -= mx
    np.exp(logits, out=logits)
    den = logits.sum(axis=-1, keepdims=True)
    logits /= den
    t = targets.reshape(-1)
    rows = np.arange(t.size)
    losses.reshape(-1)[:] = -np.log(np.maximum(logits[rows, t], np.finfo(logits.dtype).tiny))
    return float(losses.mean())


def loss_bwd(x, w, targets, probs, dx, dw, dloss=1.0):
    """Gradient of the mean loss (times dloss): dlogits = (p − onehot)·dloss/N;
    dx = dlogits·w, dw += dlogitsᵀ·x. Uses `probs` as scratch (it is overwritten)."""
    d = x.shape[-1]
    V = w.shape[0]
    dl = probs.reshape(-1, V)
    t = targets.reshape(-1)
    dl[np.arange(t.size), t] -= 1.0
    dl *= dloss / t.size
    dx.reshape(-1, d)[:] = dl @ w
    dw += dl.T @ x.reshape(-1, d)


# ----------------------------------------------------------------------------- optimizer


def grad_norm_partial(grads, partial, block=1 << 16):
    """Stage 1 of global clipping: per-block sums of squares into `partial`."""
    n = grads.size
    nb = partial.size
    for i in range(nb):
        seg = grads[i * block : min(n, (i + 1) * block)]
        partial[i] = np.dot(seg, seg) if seg.size else 0.0


def grad_norm_final(partial) -> float:
    """Stage 2: reduce the partial sums to one scalar and take the square root."""
    return float(np.sqrt(partial.sum(dtype=np.float64)))


def grad_scale(grads, scale):
    """Stage 3 (and micro-batch averaging): multiply every gradient by `scale`."""
    grads *= grads.dtype.type(scale)


def adamw(w, g, m, v, decay, lr, beta1, beta2, eps, weight_decay, step, gscale=1.0, ctrl=None):
    """One fused AdamW update over the flat buffers (step counts from 1). The gradients are first
    multiplied by gscale (global clipping, folded in). Decoupled weight decay (w −= lr·wd·w, only
    where `decay` is 1), then the bias-corrected Adam step. With `ctrl` (Backend.step_control's
    buffer) the step number and gscale come from there, and a step it marks not applied is skipped."""
    if ctrl is not None:
        if not ctrl[CTRL_APPLIED]:
            return
        step, gscale = ctrl[CTRL_T], float(ctrl[CTRL_GSCALE])
    if gscale != 1.0:
        grad_scale(g, gscale)
    tmp = g * (1 - beta1)
    m *= beta1
    m += tmp
    np.multiply(g, g, out=tmp)
    tmp *= 1 - beta2
    v *= beta2
    v += tmp
    np.multiply(decay, w, out=tmp)
    tmp *= lr * weight_decay
    w -= tmp
    bc1 = 1 - beta1**step
    bc2 = 1 - beta2**step
    np.divide(v, bc2, out=tmp)
    np.sqrt(tmp, out=tmp)
    tmp += eps
    np.divide(m, tmp, out=tmp)
    tmp *= lr / bc1
    w -= tmp


# ----------------------------------------------------------------------------- sampling

SAMPLE_CANDIDATES = 1024  # the most tokens one draw keeps (kernels/sampling.cu: its shared memory)
_M64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def draw_uniform(seed: int, draw: int) -> np.float32:
    """The draw-th uniform in [0, 1) of generator `seed`: splitmix64 of (seed, draw), 24 bits
    (exact in fp32). Counter-based: a row's draws depend on its seed and count alone."""
    x = _mix64((int(seed) + (int(draw) + 1) * 0x9E3779B97F4A7C15) & _M64)
    return np.float32((x >> 40) * 2.0**-24)


def sample_row(z, greedy: bool, inv_temp: np.float32, top_k: int, top_p: float, seed: int, draw: int) -> int:
    """One token from one row of fp32 logits (kernels/sampling.cu, step for step): −1 where a
    logit is NaN or +inf. Greedy: the first largest. Otherwise the top_k largest (the ties at the
    k-th all kept, to SAMPLE_CANDIDATES in index order), ranked by logit then index, p = exp((z −
    z_max)·inv_temp); the smallest prefix whose sum before each member is below top_p·total
    (all of them when top_p ≥ 1); the first member whose running sum exceeds u·(the kept sum)."""
    z = np.asarray(z, dtype=np.float32)
    if np.isnan(z).any() or np.isposinf(z).any():
        return -1
    if greedy:
        return int(np.argmax(z))
    V = z.size
    k = min(int(top_k), V)
    cut = np.partition(z, V - k)[V - k]
    cand = np.concatenate([np.flatnonzero(z > cut), np.flatnonzero(z == cut)])[:SAMPLE_CANDIDATES]
    cand = cand[np.lexsort((cand, -z[cand]))]
    v = z[cand]
    if not np.isfinite(v[0]):
        return -1
    p = np.exp((v - v[0]) * np.float32(inv_temp))
    cum = np.cumsum(p, dtype=np.float32)
    m, top_p = cum.size, np.float32(top_p)
    if top_p < 1:
        before = np.concatenate([[np.float32(0)], cum[:-1]])
        m = max(1, int(np.count_nonzero(before < top_p * cum[-1])))
    target = draw_uniform(seed, draw) * cum[m - 1]
    hit = np.flatnonzero(cum[:m - 1] > target)
    return int(cand[hit[0]] if hit.size else cand[m - 1])


def sample_tokens(logits, seeds, draws, tokens, ring, temperature: float, top_k: int, top_p: float | None) -> None:
    """Each row's next token from its logits ([B, V] fp32): the pick is sample_row's, with
    uniform(seeds[b], draws[b]); ring[b, draws[b] % R] = the pick (when a ring is given), tokens[b]
    = the pick, or 0 where it is −1 (the next step's input: an index into the embedding); draws[b] += 1."""
    greedy = temperature <= 0
    inv_temp = np.float32(0.0 if greedy else 1.0 / temperature)
    flat = tokens.reshape(-1)
    for b in range(logits.shape[0]):
        d = int(draws[b])
        pick = sample_row(logits[b], greedy, inv_temp, top_k, 1.0 if top_p is None else top_p, int(seeds[b]), d)
        flat[b] = max(pick, 0)
        if ring is not None:
            ring[b, d % ring.shape[1]] = pick
        draws[b] = d + 1


# ----------------------------------------------------------------------------- the backend object


class NumpyBackend(Backend):
    """The functions above as the engine's backend (andrea/engine/backend.py): fp32 on the CPU
    (float64 too, for gradient checks: the dtype is the buffers'). Precision "fp8" simulates the
    fp8 recipe of andrea/fp8.py: the operands of the q/k/v, output and MLP products rounded to
    e4m3 (weights, activations) or e5m2 (gradients) at delayed per-tensor scales, the rest fp32 (the
    reference for the CuPy backend's fp8 mode; training runs take fp8 on the GPU only)."""

    name = "numpy"
    precisions = ("fp32", "fp8")
    embed_fwd = staticmethod(embed_fwd)
    embed_bwd = staticmethod(embed_bwd)
    layernorm_fwd = staticmethod(layernorm_fwd)
    add_layernorm_fwd = staticmethod(add_layernorm_fwd)
    layernorm_bwd = staticmethod(layernorm_bwd)
    attn_qkv_fwd = staticmethod(attn_qkv_fwd)
    attn_qkv_bwd = staticmethod(attn_qkv_bwd)
    attn_fwd = staticmethod(attn_fwd)
    attn_bwd = staticmethod(attn_bwd)
    attn_probs = staticmethod(attn_probs)
    attn_out_fwd = staticmethod(attn_out_fwd)
    attn_out_bwd = staticmethod(attn_out_bwd)
    mlp_fwd = staticmethod(mlp_fwd)
    mlp_bwd = staticmethod(mlp_bwd)
    loss_fwd = staticmethod(loss_fwd)
    loss_bwd = staticmethod(loss_bwd)
    grad_norm_partial = staticmethod(grad_norm_partial)
    grad_norm_final = staticmethod(grad_norm_final)
    grad_scale = staticmethod(grad_scale)
    adamw = staticmethod(adamw)
    sample_tokens = staticmethod(sample_tokens)

    def __init__(self, precision: str = "fp32"):
        super().__init__(precision)
        self.fp8 = None
        if precision == "fp8":
            self.fp8 = FP8Sites()
            # the product ops of this object run the fp8 versions below
            self.attn_qkv_fwd, self.attn_qkv_bwd = self._fp8_attn_qkv_fwd, self._fp8_attn_qkv_bwd
            self.attn_out_fwd, self.attn_out_bwd = self._fp8_attn_out_fwd, self._fp8_attn_out_bwd
            self.mlp_fwd, self.mlp_bwd = self._fp8_mlp_fwd, self._fp8_mlp_bwd

    # ------------------------------------------------------------------ fp8 (simulated)
    # A site is (what, the weight's address): each product of each layer keeps its own scales. The
    # backward pass reads the forward's 8-bit activations and weights again (the same scale:
    # bit for bit the tensors the forward product read) and casts the incoming gradients to e5m2.
    def _q(self, x, what, w, fmt="e4m3"):
        return self.fp8.quantize(x, (what, w.__array_interface__["data"][0]), fmt)

    def _again(self, x, what, w):
        return self.fp8.requantize(x, (what, w.__array_interface__["data"][0]), "e4m3")

    def fp8_counts(self) -> dict:
        """Values cast to fp8 so far, and how many overflowed (saturated) or underflowed (to zero)."""
        return self.fp8.counts.as_dict()

    # W_Q, W_K, W_V are one tensor (one site, one scale), as the GPU's one product of width 3d reads them
    def _fp8_attn_qkv_fwd(self, x, wq, wk, wv, qkv, n_head):
        wq8, wk8, wv8 = np.split(self._q(np.concatenate([wq, wk, wv], axis=1), "w", wq), 3, axis=1)
        attn_qkv_fwd(self._q(x, "qkv.x", wq), wq8, wk8, wv8, qkv, n_head)

    def _fp8_attn_qkv_bwd(self, dqkv, x, wq, wk, wv, dx, dwq, dwk, dwv):
        wq8, wk8, wv8 = np.split(self._again(np.concatenate([wq, wk, wv], axis=1), "w", wq), 3, axis=1)
        attn_qkv_bwd(self._q(dqkv, "qkv.dy", wq, "e5m2"), self._again(x, "qkv.x", wq), wq8, wk8, wv8, dx, dwq, dwk, dwv)

    def _fp8_attn_out_fwd(self, y, wo, out):
        attn_out_fwd(self._q(y, "out.x", wo), self._q(wo, "w", wo), out)

    def _fp8_attn_out_bwd(self, dout, y, wo, dy, dwo):
        attn_out_bwd(self._q(dout, "out.dy", wo, "e5m2"), self._again(y, "out.x", wo), self._again(wo, "w", wo), dy, dwo)

    def _fp8_mlp_fwd(self, x, w1, w2, h, a, out):
        mlp_fwd(self._q(x, "mlp1.x", w1), self._q(w1, "w", w1), self._q(w2, "w", w2), h, a, out,
                cast_a=lambda a_: self._q(a_, "mlp2.x", w2))

    def _fp8_mlp_bwd(self, dout, x, h, a, w1, w2, dx, dw1, dw2):
        mlp_bwd(self._q(dout, "mlp2.dy", w2, "e5m2"), self._again(x, "mlp1.x", w1), h, self._again(a, "mlp2.x", w2),
                self._again(w1, "w", w1), self._again(w2, "w", w2), dx, dw1, dw2,
                cast_dh=lambda g: self._q(g, "mlp1.dy", w1, "e5m2"))
