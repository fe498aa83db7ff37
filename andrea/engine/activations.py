"""The buffers a pass over the model needs, planned and allocated once on a backend: what each
block's forward pass keeps for its backward pass (LayerActivations, in Activations), the scratch of
the backward pass, and the keys and values of the positions generated so far (KVCache).

andrea/model.py's `forward` and `backward` read and write these buffers by name; how many there are,
their shapes, the backend's layout and type for each (Backend.plan_buffer) and which ones share
memory is decided here, so that the model says what it computes and this module where it lives.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from andrea.model import ModelConfig


@dataclass
class LayerActivations:
    """What one block's forward pass keeps for its backward pass (views into Activations)."""

    ln1: object
    ln1_mean: object
    ln1_rstd: object
    qkv: object
    att_y: object
    att_lse: object
    ln2: object
    ln2_mean: object
    ln2_rstd: object
    mlp_h: object
    mlp_a: object


class Activations:
    """The buffers of a forward pass over a [B, T] batch, allocated once on a backend (which may
    store a buffer in its own layout and type: Backend.plan_buffer).

    `saved`: every layer keeps its own activations for the backward pass (training); without it
    one set is reused by every layer (generation and forward-only use), and the residual stream
    alternates between two buffers. `backward`: the scratch the backward pass needs is allocated
    too."""

    def __init__(self, cfg: ModelConfig, B: int, T: int, be, dtype=np.float32, saved: bool = True, backward: bool = True):
        L, d, H, D, M, V = cfg.n_layer, cfg.d_model, cfg.n_head, cfg.head_dim, cfg.d_mlp, cfg.vocab_size
        n = L if saved else 1  # layers with buffers of their own

        def z(name, *shape):
            shape, dt = be.plan_buffer(name, shape, dtype, H)
            return be.zeros(shape, dt)

        if saved and backward:  # training: the backend may recompute gelu(h) rather than save it per layer
            be.plan_gelu(B * T, _nbytes(*be.plan_buffer("mlp_a", (L, B, T, M), dtype, H)))
        # a backend that recomputes gelu(h) in the backward pass needs one buffer for it, not L
        gelu_slots = 1 if (be.recomputes_gelu or not saved) else L

        shapes = {
            "res": (2 * L + 1 if saved else 2, B, T, d),  # residual stream: layer input, after attention, …, final
            "ln1": (n, B, T, d), "ln1_mean": (n, B, T), "ln1_rstd": (n, B, T),
            "qkv": (n, 3, B, H, T, D), "att_y": (n, B, T, d), "att_lse": (n, B, H, T),
            "ln2": (n, B, T, d), "ln2_mean": (n, B, T), "ln2_rstd": (n, B, T),
            "mlp_h": (n, B, T, M), "mlp_a": (gelu_slots, B, T, M),
            "lnf": (B, T, d), "lnf_mean": (B, T), "lnf_rstd": (B, T),
        }
        if backward or saved:  # the training loss: probabilities (their gradient in place) and per-position losses
            shapes |= {"probs": (B, T, V), "losses": (B, T)}
        # The probabilities are dead while the layers run (written by the loss's forward after the last
        # layer, read by its backward before the first layer's), so buffers of one phase live inside
        # them with no memory of their own: at their head the one GELU buffer of a backend that
        # recomputes it; at their tail the forward's branch (last read by the last layer) and the
        # backward's d_y (written and read inside one layer's backward). The part before the tail is
        # `arena`: scratch the backend may use in the layers' backward (Backend.set_backward_arena);
        # scratch there may lie on the GELU buffer, which the MLP backward recomputes before reading.
        self.aliased = set()
        self.arena = None
        inside = {"mlp_a"} if be.recomputes_gelu and "probs" in shapes else set()
        self.saved = {name: z(name, *shape) for name, shape in shapes.items() if name not in inside}
        self.scratch = {}
        tail = {"branch": (B, T, d)} | ({"d_y": (B, T, d)} if backward else {})
        probs = self.saved.get("probs")
        if probs is not None and probs.flags.c_contiguous:
            flat = probs.reshape(-1).view(np.uint8)
            tail_start = flat.size
            if inside:
                a_shape, a_dt = be.plan_buffer("mlp_a", shapes["mlp_a"], dtype, H)
                head_end = _nbytes(a_shape, a_dt)
                if head_end <= flat.size:
                    self.saved["mlp_a"] = flat[:head_end].view(a_dt).reshape(a_shape)
                    self.aliased.add("mlp_a")
            head_end = -(-self.saved["mlp_a"].nbytes // 256) * 256 if "mlp_a" in self.aliased else 0
            for name, shape in tail.items():
                t_shape, t_dt = be.plan_buffer(name, shape, dtype, H)
                start = (flat.size - _nbytes(t_shape, t_dt)) // 256 * 256
                if start >= head_end:
                    self.scratch[name] = flat[start:start + _nbytes(t_shape, t_dt)].view(t_dt).reshape(t_shape)
                    self.aliased.add(name)
                    tail_start = min(tail_start, start)
            self.arena = flat[:tail_start]
        for name in inside - self.aliased:
            self.saved[name] = z(name, *shapes[name])
        self.scratch |= {name: z(name, *shape) for name, shape in tail.items() if name not in self.aliased}
        if backward:
            self.scratch |= {name: z(name, *shape) for name, shape in {
                "d_res": (B, T, d), "d_ln": (B, T, d), "d_qkv": (3, B, H, T, D),
            }.items()}
            # the branch's gradient is the residual stream's, in the form the product after it reads:
            # where the backend stores both alike, one buffer serves both (no copy)
            b_shape, b_dt = be.plan_buffer("d_branch", (B, T, d), dtype, H)
            d_res = self.scratch["d_res"]
            if tuple(b_shape) == d_res.shape and np.dtype(b_dt) == d_res.dtype:
                self.scratch["d_branch"] = d_res
                self.aliased.add("d_branch")
            else:
                self.scratch["d_branch"] = z("d_branch", B, T, d)
        A = self.saved
        # each layer's views, made once (a pass asks for them per layer, per token when generating)
        self.layers = [LayerActivations(**{f.name: A[f.name][min(l, n - 1)] for f in fields(LayerActivations) if f.name != "mlp_a"},
                                        mlp_a=A["mlp_a"][min(l, gelu_slots - 1)]) for l in range(L)]
        self.residuals = self.saved["res"]
        self.branch = self.scratch["branch"]
        self.lnf, self.lnf_mean, self.lnf_rstd = self.saved["lnf"], self.saved["lnf_mean"], self.saved["lnf_rstd"]

    def res(self, i: int):
        """The residual stream after its i-th update (0: the embeddings, 2l + 1: block l's attention
        added, 2l + 2: its MLP added)."""
        return self.residuals[i % len(self.residuals)]  # without saved layers two buffers alternate

    def layer(self, l: int) -> LayerActivations:
        return self.layers[l]

    def nbytes(self) -> tuple[int, int]:
        """(saved activations, scratch) in bytes; a buffer inside another counted once."""
        return (sum(a.nbytes for k, a in self.saved.items() if k not in self.aliased),
                sum(a.nbytes for k, a in self.scratch.items() if k not in self.aliased))


class KVCache:
    """Keys and values of the positions generated so far, per layer: [L, B, H, context, D] in the
    backend's kv_dtype. The position is kept twice: on the host (`pos`) and on the device
    (`pos_dev`, advanced by the pass itself, so that a captured one-token step can be replayed)."""

    def __init__(self, cfg: ModelConfig, be, B: int = 1):
        shape = (cfg.n_layer, B, cfg.n_head, cfg.context, cfg.head_dim)
        self.k, self.v = be.zeros(shape, be.kv_dtype), be.zeros(shape, be.kv_dtype)
        self.B = B
        self.pos = 0
        self.pos_dev = be.zeros((1,), np.int32)

    def reset(self) -> None:
        self.pos = 0
        self.pos_dev.fill(0)


def _nbytes(shape: tuple, dtype) -> int:
    return int(np.prod(shape)) * np.dtype(dtype).itemsize
