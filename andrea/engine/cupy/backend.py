"""CupyBackend: the kernel pairs of andrea/engine/backend.py on an NVIDIA GPU, in one precision (the
package's docstring, andrea/engine/cupy/__init__.py, describes the precisions and the modules)."""

from __future__ import annotations

import os

import cupy as cp
import cupyx
import numpy as np

from andrea.engine.backend import Backend
from andrea.engine.cupy import attention, attention_mma, classifier, decode, elementwise, embedding, layernorm, sampling
from andrea.engine.cupy.cudnn_attention import CudnnAttention, deterministic_from_env, implementation_from_env, workspace_cap
from andrea.engine.cupy.cudnn_attention import takes as cudnn_takes
from andrea.engine.cupy.cublaslt import EPILOGUE_DGELU, EPILOGUE_GELU_AUX, Lt, tune_mode_from_env
from andrea.engine.cupy.fp8 import ALL_PRODUCTS, Fp8, check_shapes
from andrea.engine.cupy.gemm import Cublas
from andrea.engine.cupy.graphs import CapturedPass
from andrea.engine.cupy.kernels import kernel
from andrea.engine.cupy.layernorm import _ln_vec, ln_fused_rows, ln_fused_smem, smem_optin
from andrea.engine.cupy.weights import BF16, VOCAB_PAD, Weights, defines, half_dtype, is_16bit
from andrea.model import coarse_decay_mask

# 16-bit in the 16-bit modes (in fp8 ln1, ln2 and d_branch may be bytes instead: FP8_LN_OUTPUTS, FP8_LN_BWD_SMEM)
H16_BUFFERS = {"ln1", "ln2", "lnf", "att_y", "mlp_h", "mlp_a", "d_y", "d_branch"}
# 16-bit too where the vectorised LayerNorm kernels apply (C % 4 == 0, C <= 1536): the branch a matrix
# product adds to the residual stream, and the gradient of a LayerNorm's output (both written by
# matrix products, as PyTorch's autocast writes them; the residual stream and its gradient are 16-bit
# too where residual_from_env says bf16)
H16_LN_SIDES = {"branch", "d_ln"}
# fp8: the LayerNorm outputs that feed an fp8 product, stored as its e4m3 operand (transposed, one byte a
# value) by the LayerNorm itself, and the product that reads them
FP8_LN_OUTPUTS = {"ln1": "qkv", "ln2": "mlp"}
# fp8: the residual branch's gradient (the LayerNorm backward's 16-bit copy of dx, read by the attention
# output's and the second MLP product's backward) as those products' e5m2 operand and its transpose,
# written by the LayerNorm backward itself, where its tile fits beside the warps' sums in this many
# bytes of shared memory (decision: two blocks a multiprocessor; ANDREA-120M's width, not 480M's)
FP8_LN_BWD_SMEM = 100 * 1024


def residual_from_env(precision: str) -> str:
    """The residual stream's type (its saved copies and its gradient): "bf16" in the bf16 and fp8 modes
    (decision, 2026-12-01: as llm.c's and Megatron-LM's defaults; half the bytes of the LayerNorms
    around every block, half the residuals' memory; `bench/fp8_gate.py --precisions bf16:fp32 bf16`
    measured the loss: BENCHMARKS.md), "fp32" in fp32 and fp16 (fp16's scaled gradients need fp32's
    range). ANDREA_RESIDUAL=fp32 keeps the fp32 stream in the bf16 and fp8 modes too. Widths the
    vectorised LayerNorm kernels do not take (C % 4 != 0 or C > 1536) keep it fp32 (plan_buffer)."""
    raw = os.environ.get("ANDREA_RESIDUAL", "bf16")
    if raw not in ("bf16", "fp32"):
        raise ValueError(f"ANDREA_RESIDUAL={raw!r}: give bf16 (the default in the bf16 and fp8 modes) or fp32")
    return raw if precision in ("bf16", "fp8") else "fp32"


GELU_KEEP_TOKENS = 16384  # ANDREA_GELU=auto keeps a = gelu(h) from this many tokens a pass
GELU_KEEP_SHARE = 8  # ... where the kept buffers take at most 1/GELU_KEEP_SHARE of the GPU's memory


def gelu_policy_from_env(precision: str) -> str:
    """Whether the bf16 and fp16 modes save each layer's a = gelu(h) for the backward ("keep") or
    recompute it there from h ("recompute"); ANDREA_GELU picks, "auto" by default (decision,
    2026-12-01: keep from GELU_KEEP_TOKENS tokens a pass, where the kept buffers take at most
    1/GELU_KEEP_SHARE of the GPU's memory: they are a third as large as the rest of the layers' saved
    activations, so a batch whose activations take over 3/8 of the GPU recomputes; BENCHMARKS.md).
    The choice depends only on the model, the batch and the GPU's size, never on what is free at the
    time: kept and recomputed round differently, and ranks and resumed runs must compute alike.
    Kept, the backward's product that makes a's gradient applies gelu'(h) as its epilogue
    (cuBLASLt's DGELU) and no elementwise pass runs: B·T·4d fewer 16-bit values moved three times a
    layer, for L·B·T·4d more saved (+27 % saved activations at ANDREA-120M B=32). Measured on an H200
    (bf16): ANDREA-120M B=32 +2.1 %, B=8 +0.9 %, ANDREA-12M B=32 +0.8 %, B=8 −1.8 %. (Recomputed, the
    DGELU epilogue does not pay: a's recompute pass remains; bench/mlp_gemm_bench.py.) fp8 always
    recomputes (one pass casts h's gradient and a to fp8 together); fp32 always keeps a."""
    raw = os.environ.get("ANDREA_GELU", "auto")
    if raw not in ("auto", "keep", "recompute"):
        raise ValueError(f"ANDREA_GELU={raw!r}: give auto, keep or recompute")
    return raw if precision in ("bf16", "fp16") else ("keep" if precision == "fp32" else "recompute")


def _consecutive(mats) -> bool:
    """Equal-shaped matrices back to back in memory (W_Q, W_K, W_V in the flat buffers)?"""
    step = mats[0].size * mats[0].itemsize
    return all(b.data.ptr - a.data.ptr == step for a, b in zip(mats, mats[1:]))


class _EventMark:
    """Backend.mark on the GPU: a CUDA event recorded on the current stream."""

    def __init__(self, event):
        self.event = event

    def wait(self) -> None:
        self.event.synchronize()


class Readback:
    """Host copies of device arrays, for later: copies into pinned host memory queued on the current
    stream behind the work that fills the arrays, and an event after them; get() waits for that
    event alone (not for whatever was queued since), so the host can run a step ahead."""

    def __init__(self, arrays):
        self.host = [cupyx.empty_pinned(a.shape, a.dtype) for a in arrays]
        for a, h in zip(arrays, self.host):
            a.get(out=h, blocking=False)
        self.ready = cp.cuda.Event(disable_timing=True)
        self.ready.record()

    def get(self) -> list:
        self.ready.synchronize()
        return [np.array(h) for h in self.host]  # out of the pinned buffers, which go back to the pool

    def __del__(self):
        # pinned memory freed while a copy into it is in flight could be handed out again meanwhile
        ready = getattr(self, "ready", None)
        if ready is not None:
            ready.synchronize()


class Snapshot:
    """A buffer's value now, brought to the host later: a device-side copy (a fraction of a
    millisecond) and an event, so a checkpoint costs the step loop almost nothing; host() runs in
    the writer's thread and transfers on a stream of its own, beside the training kernels."""

    def __init__(self, a):
        self.device_id = a.device.id
        self.copy = a.copy()
        self.ready = cp.cuda.Event(disable_timing=True)
        self.ready.record()

    def host(self) -> np.ndarray:
        with cp.cuda.Device(self.device_id):
            stream = cp.cuda.Stream(non_blocking=True)
            stream.wait_event(self.ready)
            out = self.copy.get(stream=stream)
            stream.synchronize()
        self.copy = None  # the device memory goes back to the pool
        return out


class CupyBackend(Backend):
    """The kernels and buffers of one engine on an NVIDIA GPU, in one precision."""

    name = "cupy"
    precisions = ("fp32", "bf16", "fp16", "fp8")
    can_capture = True
    plans_tokens = True
    index_dtype = np.int32
    decay_dtype = np.uint8  # the weight-decay mask as bytes (a quarter of an fp32 mask's memory)
    reduce_dtypes = ("float32", "bfloat16") if BF16 is not None else ("float32",)
    xp = cp

    def __init__(self, precision: str = "fp32"):
        super().__init__(precision)
        if precision in ("bf16", "fp8") and BF16 is None:
            raise RuntimeError(f"{precision} needs ml_dtypes (pip install -c constraints.txt ml_dtypes) with CuPy >= 14")
        self.defines = defines(precision)
        self.weights = Weights(precision)
        self._scratch: dict = {}  # (key, shape, dtype) -> buffer the kernels need besides the engine's
        self._embed_plans: dict = {}  # (device token buffer, size) -> packed plan buffer, filled by upload_tokens
        self._staging: dict = {}  # (device buffer, bytes) -> two [pinned host buffer, event of its last copy] (_stage)
        self._cublas: dict = {}  # device -> Cublas (handle and workspace)
        self._lt: dict = {}  # device -> Lt (cuBLASLt handle and workspace: the 16-bit and fp8 products)
        self._loss_scale = None  # on the device, read by the classifier kernel (created on first use)
        self._loss_scale_now = 1.0
        # data parallelism: reductions of the gradients on a stream beside the backward pass
        self._reduce_stream = None
        self._reduce_pending = False
        self._reduce_stage = None  # bf16 staging for reductions sent in bfloat16 (grown on the eager pass)
        self._prefill_lse = None  # generation: the flash kernel's log-sum-exp for a prompt (grown as needed)
        self._events = [cp.cuda.Event(disable_timing=True) for _ in range(64)]
        self._event_i = 0
        self.fp8 = Fp8(self) if precision == "fp8" else None  # the fp8 products' scales, histories, counts
        self.gelu_epilogue = os.environ.get("ANDREA_GELU_EPILOGUE", "1") != "0"
        self.gelu_policy = gelu_policy_from_env(precision)  # each layer's a = gelu(h) saved, or recomputed
        self.keep_gelu = self.gelu_policy == "keep"  # plan_gelu decides "auto"
        # the 16-bit modes' training attention: "cudnn" (cuDNN's fused kernels, where the frontend is
        # installed), "flash" (ours) or "mma" (ours with the mma.sync forward); ANDREA_ATTENTION picks
        self.attention = implementation_from_env() if precision != "fp32" else "flash"
        self.attention_deterministic = deterministic_from_env()
        self.forwards_ran: set = set()  # our 16-bit attention forwards that ran: "wgmma", "mma.sync" (attention.py)
        self.backwards_ran: set = set()  # and backwards
        self.attention_workspace_cap = workspace_cap()
        self._cudnn: dict = {}  # device -> CudnnAttention
        self.backward_arena = None  # bytes dead during the layers' backward (set_backward_arena)
        self.residual = residual_from_env(precision)  # the residual stream's type: "bf16" or "fp32"
        self.residual_planned = None  # the type plan_buffer gave the last residual stream it planned

    @property
    def recomputes_gelu(self) -> bool:
        """The 16-bit modes keep only the MLP's pre-activation h unless keep_gelu: mlp_bwd recomputes
        a = gelu(h) into the buffer it is given (the engine then allocates one, not one per layer)."""
        return self.precision != "fp32" and not self.keep_gelu

    def plan_gelu(self, tokens: int, kept_bytes: int) -> None:
        if self.gelu_policy == "auto":
            total = cp.cuda.runtime.memGetInfo()[1]  # the GPU's size, not what is free: the same choice every run
            self.keep_gelu = tokens >= GELU_KEEP_TOKENS and kept_bytes * GELU_KEEP_SHARE <= total

    @property
    def half(self):
        """The 16-bit activation dtype of a 16-bit mode (None in fp32)."""
        return None if self.precision == "fp32" else half_dtype(self.precision)

    # ------------------------------------------------------------------ internals
    def kernel(self, module: str, function: str, head_dim: int | None = None, extra_defines: tuple = ()):
        """A kernel of kernels/<module>.cu, built for this backend's 16-bit type."""
        return kernel(module, function, head_dim, extra_defines + self.defines)

    def scratch(self, key: str, shape: tuple, dtype) -> cp.ndarray:
        """Buffers the kernels need besides the engine's, allocated once per shape."""
        k = (key, shape, np.dtype(dtype))
        if k not in self._scratch:
            self._scratch[k] = cp.zeros(shape, dtype=dtype)
        return self._scratch[k]

    @staticmethod
    def _per_device(handles: dict, make):
        """The current device's entry of `handles` (library handles are per device), made on first use."""
        dev = cp.cuda.runtime.getDevice()
        if dev not in handles:
            handles[dev] = make()
        return handles[dev]

    def _blas(self) -> Cublas:
        return self._per_device(self._cublas, Cublas)

    def implementation(self) -> str:
        if self.precision == "fp32":
            return "CUDA-core flash attention, cuBLAS"
        if self.attention == "cudnn":
            att = f"cuDNN attention ({'deterministic' if self.attention_deterministic else 'non-deterministic backward'})"
        else:
            att = "our tensor-core flash attention" + _kernels_ran(self.forwards_ran, self.backwards_ran)
        refused = sorted({key for c in self._cudnn.values() for key in c.refused()})
        if refused:  # (direction, B, H, T, D)
            att += f" (our kernels for the shapes it refused: {refused})"
        instead = sorted({key for c in self._cudnn.values() for key in c.ours_instead})
        if instead:  # (B, H, T, D)
            att += f" (our backward instead of cuDNN's in batch slices or a workspace of its own: {instead})"
        stream = self.residual_planned or self.residual  # what plan_buffer gave the model's width
        gelu = "" if self.precision == "fp32" else f", GELU {'kept' if self.keep_gelu else 'recomputed'}"
        if self._fp8("mlp"):  # chosen on the first pass (the trainer's warm-up runs it before its plan line)
            fused = self.fp8.gelu_fused
            gelu = ", gelu(h) to e4m3 " + ("not chosen yet (no pass has run)" if fused is None else
                                          "in the product's epilogue" if fused else "in a cast pass")
        elif self.fp8 is not None:  # ANDREA_FP8_PRODUCTS without mlp: the MLP runs in 16 bits
            gelu = f", the MLP in 16 bits{gelu}"
        tuning = {"graph": " with timed algorithms", "sustained": " with algorithms timed under sustained load", "off": ""}
        return f"{att}, cuBLASLt{tuning[tune_mode_from_env()]}, {stream} residual stream{gelu}"

    def _cudnn_attention(self, *buffers):
        """This device's CudnnAttention where it runs these 16-bit buffers, else None (our kernels)."""
        if self.attention != "cudnn" or not cudnn_takes(*buffers):
            return None
        return self._per_device(self._cudnn, lambda: CudnnAttention(self.attention_deterministic, self.attention_workspace_cap))

    def lt(self) -> Lt:
        # one workspace for both libraries: their products run one after another on one stream
        return self._per_device(self._lt, lambda: Lt(workspace=self._blas().workspace))

    def _loss_scale_buffer(self):
        """The loss scale on the device (read by the classifier kernel, so a captured graph follows
        changes of the scale without being captured again)."""
        if self._loss_scale is None:
            self._loss_scale = cp.full(1, self._loss_scale_now, dtype=cp.float32)
        return self._loss_scale

    def graph_buffers(self) -> tuple:
        """The device buffers a captured pass reads and writes, for it to hold while it lives."""
        return (list(self._scratch.values()), self.weights.mirror, list(self._embed_plans.values()),
                self._loss_scale_buffer(), [c.workspace for c in (*self._cublas.values(), *self._lt.values())],
                None if self.fp8 is None else self.fp8.buffers())

    def _operand(self, x, weight: bool = False):
        return self.weights.operand(x, weight)

    # ------------------------------------------------------------------ matrix products
    def gemm(self, a, b, c, ta: bool = False, tb: bool = False, accumulate: bool = False, alpha: float = 1.0) -> None:
        """c (row-major [m, n], fp32, bf16 or fp16) = alpha · op(a) · op(b), or += with `accumulate`,
        with fp32 accumulation: 16-bit operands through cuBLASLt with the fastest algorithm
        (cublaslt.Lt.gemm), fp32 through cublasGemmEx (gemm.Cublas.gemm)."""
        if is_16bit(a):
            self.lt().gemm(a, b, c, ta, tb, accumulate, alpha)
            return
        self._blas().gemm(a, b, c, ta, tb, accumulate, alpha)

    def bgemm(self, a, b, c, m, n, k, lda, ldb, ldc, sa, sb, sc, batch, ta=False, tb=False, accumulate=False) -> None:
        """Row-major strided-batched C[i] = op(A[i]) · op(B[i]) (gemm.Cublas.bgemm)."""
        self._blas().bgemm(a, b, c, m, n, k, lda, ldb, ldc, sa, sb, sc, batch, ta, tb, accumulate)

    def _mm(self, a, b):
        out = cp.empty((a.shape[0], b.shape[1]), dtype=cp.float32)
        self.gemm(self._operand(a), self._operand(b, weight=True), out)
        return out

    # ------------------------------------------------------------------ buffers
    def plan_buffer(self, name: str, shape: tuple, dtype, n_head: int):
        """The engine's buffer `name` as this backend stores it: (shape, dtype). In the 16-bit modes the
        activations that feed matrix products are 16-bit, q/k/v are one [B, T, 3, H, D] buffer per layer
        (one GEMM writes it, attention reads it in place), and the logits' rows are padded to a
        multiple of VOCAB_PAD entries (aligned shapes for the tensor-core GEMMs). In fp8 the outputs
        of the LayerNorms before fp8 products, and the residual branch's gradient, are bytes: those
        products' operands, cast by the LayerNorms themselves."""
        if self.precision == "fp32":
            return shape, dtype
        if self.fp8 is not None and name == "qkv":  # the fp8 products' shapes, checked when the engine is built
            *_, B, H, T, D = shape
            check_shapes(B * T, H * D)
        if self.fp8 is not None and name == "mlp_h":
            *_, B, T, M = shape
            check_shapes(B * T, M)
        if name in FP8_LN_OUTPUTS and self._fp8(FP8_LN_OUTPUTS[name]) and _ln_vec(shape[-1]):
            return shape, np.dtype(np.uint8)  # the fp8 product's operand, transposed (Fp8.layernorm_fwd)
        if name == "d_branch" and self._fp8_ln_bwd(shape[-1], int(np.prod(shape[:-1]))):
            return (2, *shape), np.dtype(np.uint8)  # e5m2: the operand, then its transpose (Fp8.layernorm_bwd)
        if name in ("qkv", "d_qkv"):  # [..., 3, B, H, T, D] -> [..., B, T, 3, H, D]
            *lead, three, B, H, T, D = shape
            return (*lead, B, T, three, H, D), self.half
        if name == "probs":
            *lead, V = shape
            return (*lead, -(-V // VOCAB_PAD) * VOCAB_PAD), self.half
        if name in H16_BUFFERS:
            return shape, self.half
        if name in H16_LN_SIDES and _ln_vec(shape[-1]):
            return shape, self.half
        if name in ("res", "d_res"):  # the residual stream and its gradient (residual_from_env)
            r16 = self.residual == "bf16" and _ln_vec(shape[-1])
            self.residual_planned = "bf16" if r16 else "fp32"
            return shape, (self.half if r16 else dtype)
        return shape, dtype

    def set_backward_arena(self, buf) -> None:
        self.backward_arena = buf.view(cp.uint8).reshape(-1) if buf is not None and buf.flags.c_contiguous else None

    def _from_arena(self, shape, dtype, avoid=None, head=False):
        """A buffer in the backward arena for scratch of the layers' backward, at its end (or its
        start: `head`), where it fits without overlapping `avoid` (a buffer the same pass uses,
        which may live there too: the model's GELU buffer); None where it does not. A buffer at the
        head lies on the GELU buffer: only for a pass outside the MLP backward, which recomputes
        that buffer before reading it."""
        arena = self.backward_arena
        need = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if arena is None or need > arena.size:
            return None
        start = 0 if head else (arena.size - need) // 256 * 256
        lo, hi = arena.data.ptr + start, arena.data.ptr + start + need
        if avoid is not None and lo < avoid.data.ptr + avoid.nbytes and avoid.data.ptr < hi:
            return None
        return arena[start:start + need].view(dtype).reshape(shape)

    def decay_buffer(self, mask):
        """The mask a byte per granule of parameters (model.coarse_decay_mask): adamw finds the
        granule from the two sizes."""
        return cp.asarray(coarse_decay_mask(mask.astype(np.uint8))[0])

    def register_weights(self, w, head=None) -> None:
        """Keep a 16-bit copy of the flat weight buffer `w` (the 16-bit modes) that AdamW refreshes as
        it updates w; `head` (a view into w: the output head, [V, d]) gets zero rows up to a multiple
        of VOCAB_PAD. A backend serves one engine: registering again replaces the copy (a captured
        graph keeps the one it reads alive). In fp8, where the q/k/v, attention-output and MLP
        products all read 8-bit copies of the fp32 weights, the 16-bit copy holds the head alone."""
        every = self.fp8 is not None and self.fp8.products == frozenset(ALL_PRODUCTS)
        self.weights.register(w, head, head_only=every and head is not None)

    def invalidate_weight_cache(self) -> None:
        """Forget the 16-bit weight copies (after the weights change outside AdamW, e.g. a load)."""
        self.weights.invalidate()

    @staticmethod
    def plan_tokens(host) -> np.ndarray:
        """Plan the embedding backward on the host from a batch of token IDs: positions sorted stably
        by token, the segment of each distinct token, and their count, packed into one int32 array.
        embed_bwd then needs no device sort and no host sync (so a graph can hold it). Host work only:
        the trainer runs it in a background thread while the previous step runs."""
        flat = np.ascontiguousarray(host).reshape(-1)
        if flat.size and 0 <= flat.min() and flat.max() < 1 << 16:
            # NumPy's stable sort of 16-bit integers is a radix sort: 10x faster than on int64 at
            # 32K tokens (0.24 vs 2.4 ms), and this runs once per step on the host
            flat = flat.astype(np.uint16)
        order = np.argsort(flat, kind="stable")
        st = flat[order]
        starts = np.flatnonzero(np.concatenate(([True], st[1:] != st[:-1])))
        n = flat.size
        packed = np.zeros(3 * n + 2, dtype=np.int32)  # order [n] | seg [n + 1] | uniq [n] | count [1]
        packed[:n] = order
        packed[n:n + starts.size] = starts
        packed[n + starts.size] = n
        packed[2 * n + 1:2 * n + 1 + starts.size] = st[starts]
        packed[3 * n + 1] = starts.size
        return packed

    def upload_tokens(self, host, dev, plan=None) -> None:
        """Copy a batch of token IDs into the device buffer `dev`, with its embedding-backward plan
        (plan_tokens) when given: a batch without one only goes forward (validation); the next
        training batch uploads its own plan before any backward reads it."""
        if plan is not None:
            key = (dev.data.ptr, dev.size)
            if key not in self._embed_plans:
                self._embed_plans[key] = cp.zeros(plan.size, dtype=cp.int32)
            self._stage(plan, self._embed_plans[key])
        self._stage(host, dev)

    def upload(self, host, dev) -> None:
        self._stage(host, dev)

    def _stage(self, host, dev) -> None:
        """dev[...] = host, queued on the current stream without the host waiting for the device: the
        values go into one of two pinned host buffers kept for `dev` (the one whose last copy is
        done: a step ago), and from there to the device asynchronously. A copy from pageable
        memory instead waits for the copies before it, so the host could not queue the next step
        while this one runs."""
        src = np.ascontiguousarray(host, dtype=dev.dtype).reshape(dev.shape)
        key = (dev.data.ptr, dev.nbytes)
        ring = self._staging.get(key)
        if ring is None:
            ring = self._staging[key] = [[cupyx.empty_pinned(dev.shape, dev.dtype), None] for _ in range(2)]
        slot = ring[0]
        ring.append(ring.pop(0))
        if slot[1] is not None:
            slot[1].synchronize()
        np.copyto(slot[0], src)
        stream = cp.cuda.get_current_stream()
        dev.data.copy_from_host_async(slot[0].ctypes.data, dev.nbytes, stream)
        slot[1] = cp.cuda.Event(disable_timing=True)
        slot[1].record(stream)

    def to_host(self, a) -> np.ndarray:
        return cp.asnumpy(a)

    def host_buffer(self, shape, dtype) -> np.ndarray:
        return cupyx.empty_pinned(shape, dtype=dtype)

    # cudaMemcpyAsync between pinned and device memory on the current stream: no staging, no wait,
    # and a captured CUDA graph replays it (the one-token step's token upload and logits download)
    def upload_async(self, dev, host) -> None:
        if dev.nbytes != host.nbytes or not dev.flags.c_contiguous or not host.flags.c_contiguous:
            raise ValueError(f"upload_async: contiguous arrays of the same size, got {dev.shape} and {host.shape}")
        cp.cuda.runtime.memcpyAsync(dev.data.ptr, host.ctypes.data, host.nbytes, cp.cuda.runtime.memcpyHostToDevice,
                                    cp.cuda.get_current_stream().ptr)

    def download_async(self, host, dev) -> None:
        rows, cols = dev.shape
        width = cols * dev.itemsize
        if host.shape != dev.shape or host.dtype != dev.dtype or not host.flags.c_contiguous or dev.strides[1] != dev.itemsize:
            raise ValueError(f"download_async: a contiguous host array of {dev.shape} {dev.dtype} from rows with unit "
                             f"column stride, got {host.shape} {host.dtype} from strides {dev.strides}")
        cp.cuda.runtime.memcpy2DAsync(host.ctypes.data, width, dev.data.ptr, dev.strides[0], width, rows,
                                      cp.cuda.runtime.memcpyDeviceToHost, cp.cuda.get_current_stream().ptr)

    def wait(self) -> None:
        cp.cuda.get_current_stream().synchronize()

    def mark(self):
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(cp.cuda.get_current_stream())
        return _EventMark(ev)

    def snapshot(self, a) -> Snapshot:
        return Snapshot(a)

    def set_loss_scale(self, scale: float) -> None:
        """Gradients of the 16-bit fast path come out multiplied by `scale` (fp16 loss scaling; the
        classifier kernel reads it from the device)."""
        if self.precision == "fp32":
            super().set_loss_scale(scale)  # 1.0, or an error: the fp32 kernels do not scale
            return
        if scale != self._loss_scale_now:
            self._loss_scale_now = scale
            if self._loss_scale is not None:
                self._loss_scale.fill(scale)

    def capture(self, fn) -> CapturedPass:
        """fn recorded once as a CUDA graph (on its first call, after an eager warm-up) and replayed."""
        if self.precision == "fp32":
            raise ValueError("CUDA-graph capture needs the 16-bit fast path (the fp32 path allocates temporaries)")
        return CapturedPass(self, fn)

    def reduce_async(self, comm, buf, dtype: str = "float32") -> None:
        """Average `buf` over the ranks on a stream of this backend's own, once what the current
        stream has queued so far (the gradients of `buf`) is done: the all-reduce of one block's
        gradients runs while the backward pass computes the next block's. Under graph capture the
        side stream forks from the captured stream and joins it again in reduce_join, so a captured
        pass replays its reductions too. In bfloat16 the gradients are rounded into a staging
        buffer, averaged there (half the bytes on the wire) and widened back: the stream orders
        the three steps, so one staging buffer serves every bucket."""
        if dtype not in self.reduce_dtypes:
            super().reduce_async(comm, buf, dtype)  # refuses it, saying what this backend sends
        if self._reduce_stream is None:
            self._reduce_stream = cp.cuda.Stream(non_blocking=True)
        ready = self._event()
        ready.record(cp.cuda.get_current_stream())
        self._reduce_stream.wait_event(ready)
        if dtype == "float32":
            comm.allreduce(buf, "mean", stream=self._reduce_stream)
        else:
            if self._reduce_stage is None or self._reduce_stage.size < buf.size:
                # allocated on the eager warm-up pass, never while a graph is captured
                self._reduce_stage = cp.empty(buf.size, dtype=BF16)
            stage = self._reduce_stage[: buf.size]
            with self._reduce_stream:
                stage[...] = buf
                comm.allreduce(stage, "mean", stream=self._reduce_stream)
                buf[...] = stage
        self._reduce_pending = True

    def reduce_join(self) -> None:
        if self._reduce_pending:
            done = self._event()
            done.record(self._reduce_stream)
            cp.cuda.get_current_stream().wait_event(done)
            self._reduce_pending = False

    def _event(self) -> cp.cuda.Event:
        """An event from a fixed ring (a pass records the same few, so none is created while a
        graph is captured or replayed)."""
        ev = self._events[self._event_i % len(self._events)]
        self._event_i += 1
        return ev

    def release(self) -> None:
        """Drop every buffer this backend keeps between calls (scratch, 16-bit weight copies, embedding
        plans) and its cuBLAS handles; its engine must not train on after it (AdamW would no longer
        refresh the weight copy). Graphs it captured keep what they use."""
        self._scratch.clear()
        self.weights.clear()
        self._embed_plans.clear()
        self._staging.clear()
        for blas in (*self._cublas.values(), *self._lt.values()):
            blas.close()
        self._cublas.clear()
        self._lt.clear()
        self._cudnn.clear()
        if self.fp8 is not None:
            self.fp8.release()

    def _fp8(self, product: str) -> bool:
        """Does this product ("qkv", "out", "mlp") run in fp8?"""
        return self.fp8 is not None and product in self.fp8.products

    def _fp8_ln_bwd(self, C: int, N: int) -> bool:
        """Does the LayerNorm backward cast the residual branch's gradient for fp8 products itself?"""
        return (self._fp8("out") and self._fp8("mlp") and _ln_vec(C) and C <= 128 * 8
                and ln_fused_smem(C) + ln_fused_rows(N) * (C + 4) <= min(FP8_LN_BWD_SMEM, smem_optin()))

    def begin_pass(self) -> None:
        """fp8: each site's amaxes of the last pass join its history, and its scale follows (on the device)."""
        if self.fp8 is not None:
            self.fp8.begin_pass()

    def precision_state(self):
        """fp8: the delayed scales' state (Fp8.state), for a checkpoint; None otherwise."""
        return None if self.fp8 is None else self.fp8.state()

    def load_precision_state(self, state) -> None:
        """fp8: Fp8.load_state; in the other precisions an fp8 run's state is ignored (Backend's rule)."""
        if state is not None and self.fp8 is not None:
            self.fp8.load_state(state)

    def fp8_counts(self) -> dict:
        """fp8: values cast so far, and how many overflowed (saturated) or underflowed (to zero), in all
        and by role (Fp8.counts_dict; a host sync)."""
        if self.fp8 is None:
            raise ValueError(f"fp8 counts: this backend computes in {self.precision}")
        return self.fp8.counts_dict()

    # ------------------------------------------------------------------ embedding
    def embed_fwd(self, tokens, wte, wpe, out) -> None:
        embedding.embed_fwd(self, tokens, wte, wpe, out)

    def embed_bwd(self, dout, tokens, dwte, dwpe) -> None:
        embedding.embed_bwd(self, dout, tokens, dwte, dwpe)

    # ------------------------------------------------------------------ layernorm
    def layernorm_fwd(self, x, g, b, out, mean, rstd, eps=1e-5, feeds=None) -> None:
        layernorm.layernorm_fwd(self, x, g, b, out, mean, rstd, eps, feeds)

    def add_layernorm_fwd(self, x, f, res, g, b, out, mean, rstd, eps=1e-5, feeds=None) -> None:
        layernorm.add_layernorm_fwd(self, x, f, res, g, b, out, mean, rstd, eps, feeds)

    def layernorm_bwd(self, dout, x, mean, rstd, g, dx, dg, db, branch=None, feeds=None) -> None:
        layernorm.layernorm_bwd(self, dout, x, mean, rstd, g, dx, dg, db, branch, feeds)

    # ------------------------------------------------------------------ attention
    def attn_qkv_fwd(self, x, wq, wk, wv, qkv, n_head) -> None:
        if self._fp8("qkv"):  # one product of width 3d: x·[W_Q W_K W_V], the three weights one fp8 tensor
            B, T, _, H, D = qkv.shape
            self.fp8.linear_fwd(x.reshape(-1, H * D), (wq, wk, wv), qkv.reshape(B * T, 3 * H * D), "qkv")
            return
        if is_16bit(qkv):  # one strided-batched GEMM: q, k, v = x·W_Q, x·W_K, x·W_V into [B·T, 3, d]
            B, T, _, H, D = qkv.shape
            d = H * D
            ws = [self._operand(w, weight=True) for w in (wq, wk, wv)]
            x2 = self._operand(x.reshape(-1, d))
            if _consecutive(ws):
                self.bgemm(x2, ws[0], qkv, B * T, d, d, d, d, 3 * d, 0, d * d, d, 3)
            else:
                q2 = qkv.reshape(B * T, 3 * d)
                for i, w in enumerate(ws):
                    self.gemm(x2, w, q2[:, i * d:(i + 1) * d])
            return
        B, T, d = x.shape
        D = d // n_head
        x2 = x.reshape(-1, d)
        for i, w in enumerate((wq, wk, wv)):
            qkv[i] = self._mm(x2, w).reshape(B, T, n_head, D).transpose(0, 2, 1, 3)

    def attn_qkv_bwd(self, dqkv, x, wq, wk, wv, dx, dwq, dwk, dwv) -> None:
        if self._fp8("qkv"):
            B, T, _, H, D = dqkv.shape
            d = H * D
            self.fp8.linear_bwd(dqkv.reshape(B * T, 3 * d), x.reshape(-1, d), (wq, wk, wv), dx.reshape(-1, d),
                                (dwq, dwk, dwv), "qkv")
            return
        if is_16bit(dqkv):
            B, T, _, H, D = dqkv.shape
            d = H * D
            g2 = dqkv.reshape(B * T, 3 * d)
            x2 = self._operand(x.reshape(-1, d))
            dx2 = dx.reshape(-1, d)
            # dx = Σ_i dqkv_i · W_iᵀ as one product of depth 3d: [W_Q W_K W_V] side by side ([d, 3d], a
            # copy of 6d² bytes) instead of three of depth d (cuBLAS ran those at 250-410 TFLOP/s)
            # (in the backward arena: nothing else lives there during this product)
            wcat = self._from_arena((d, 3 * d), g2.dtype, head=True)
            if wcat is None:
                wcat = self.scratch("qkv_wcat", (d, 3 * d), g2.dtype)
            ops = [self._operand(w, weight=True) for w in (wq, wk, wv)]
            if _consecutive(ops) and all(o.flags.c_contiguous for o in ops):  # one strided copy of [3, d, d]
                three = cp.ndarray((3, d, d), ops[0].dtype, memptr=ops[0].data)
                wcat.reshape(d, 3, d)[...] = three.transpose(1, 0, 2)
            else:
                for i, w in enumerate(ops):  # strided copies (cp.concatenate may upload a pointer table)
                    wcat[:, i * d:(i + 1) * d] = w
            self.gemm(g2, wcat, dx2, tb=True)
            if _consecutive([dwq, dwk, dwv]):  # dW_i += xᵀ · dqkv_i, one strided-batched GEMM
                self.bgemm(x2, g2, dwq, d, d, B * T, d, 3 * d, d, 0, d, d * d, 3, ta=True, accumulate=True)
            else:
                for i, dw in enumerate((dwq, dwk, dwv)):
                    self.gemm(x2, g2[:, i * d:(i + 1) * d], dw, ta=True, accumulate=True)
            return
        B, T, d = x.shape
        x2 = self._operand(x.reshape(-1, d))
        dx2 = dx.reshape(-1, d)
        for i, (w, dw) in enumerate(((wq, dwq), (wk, dwk), (wv, dwv))):
            g = self._operand(dqkv[i].transpose(0, 2, 1, 3).reshape(-1, d))
            self.gemm(g, self._operand(w, weight=True), dx2, tb=True, accumulate=i > 0)
            self.gemm(x2, g, dw, ta=True, accumulate=True)

    def attn_fwd(self, qkv, y, lse) -> None:
        cudnn = self._cudnn_attention(qkv, y, lse)
        if cudnn is None or not cudnn.fwd(self, qkv, y, lse):
            attention.attn_fwd(self, qkv, y, lse)

    def attn_bwd(self, dy, qkv, y, lse, dqkv) -> None:
        cudnn = self._cudnn_attention(qkv, y, lse, dy, dqkv)
        if cudnn is None or not cudnn.bwd(self, dy, qkv, y, lse, dqkv):
            attention.attn_bwd(self, dy, qkv, y, lse, dqkv)

    # ------------------------------------------------------------------ generation (KV cache)
    @property
    def kv_dtype(self):
        return np.dtype(np.float32) if self.precision == "fp32" else np.dtype(self.half)

    def embed_cached_fwd(self, tokens, wte, wpe, pos, pos_dev, out) -> None:
        decode.embed_at(self, tokens, wte, wpe, pos_dev, out)

    def advance_position(self, pos_dev, n) -> None:
        decode.advance(self, pos_dev, n)

    def decodes_on_device(self, head_dim, context) -> bool:
        return self.precision != "fp32" and decode.fits(head_dim, context)

    def attn_cached_fwd(self, qkv, k_cache, v_cache, pos, y, pos_dev=None) -> None:
        """16-bit: one new token per row with the decode kernel (position read on the device: the
        step can be captured); a prompt from an empty cache with the flash kernel over the chunk.
        Otherwise (fp32, a chunk after cached positions, shapes these kernels do not take) the
        array-module version."""
        B, n, D = qkv.shape[0], qkv.shape[1], qkv.shape[-1]
        one = n == 1 and decode.fits(D, k_cache.shape[2])
        prompt = n > 1 and pos == 0 and attention_mma.flash_takes(D)
        if not is_16bit(qkv) or pos_dev is None or not (one or prompt):
            super().attn_cached_fwd(qkv, k_cache, v_cache, pos, y)
            return
        if one and decode.warps_take(D):  # the key and value stored by the attention kernel itself
            decode.attn_decode_store(self, qkv, k_cache, v_cache, pos_dev, y)
            return
        decode.kv_store(self, qkv, k_cache, v_cache, pos_dev)
        if one:
            decode.attn_decode(self, qkv, k_cache, v_cache, pos_dev, y)
        else:
            H = qkv.shape[3]
            need = B * H * n
            if self._prefill_lse is None or self._prefill_lse.size < need:  # grown, never one per prompt length
                self._prefill_lse = cp.empty(need, cp.float32)
            attention.attn_fwd(self, qkv, y, self._prefill_lse[:need].reshape(B, H, n))

    def logits_fwd(self, x, w):
        """16-bit: x·wᵀ into a fixed fp32 buffer (the head's 16-bit copy, padded rows included: no
        allocation, so the one-token step can be captured); returned as its first V columns."""
        if not is_16bit(x):
            return super().logits_fwd(x, w)
        d = x.shape[-1]
        x2, V = x.reshape(-1, d), w.shape[0]
        wp = self.weights.view(w, padded=True)
        if wp is None:
            wp = self._operand(w, weight=True)
        out = self.scratch("logits", (x2.shape[0], wp.shape[0]), cp.float32)  # one per row count (prompts: last position)
        self.gemm(self._operand(x2), wp, out, tb=True)
        return out[:, :V]

    def sample_tokens(self, logits, seeds, draws, tokens, ring, temperature, top_k, top_p) -> None:
        sampling.sample_tokens(self, logits, seeds, draws, tokens, ring, temperature, top_k, top_p)

    def qkv_heads(self, qkv):
        """q, k, v as [B, H, T, D] views: of the 16-bit [B, T, 3, H, D] buffer, or of fp32's [3, B, H, T, D]."""
        return attention.qkv_heads(qkv) if is_16bit(qkv) else super().qkv_heads(qkv)

    def attn_out_fwd(self, y, wo, out) -> None:
        d = y.shape[-1]
        if self._fp8("out"):
            self.fp8.linear_fwd(y.reshape(-1, d), (wo,), out.reshape(-1, out.shape[-1]), "out")
            return
        self.gemm(self._operand(y.reshape(-1, d)), self._operand(wo, weight=True), out.reshape(-1, out.shape[-1]))

    def attn_out_bwd(self, dout, y, wo, dy, dwo) -> None:
        d = y.shape[-1]
        if self._fp8("out"):
            self.fp8.linear_bwd(dout.reshape(-1, dout.shape[-1]), y.reshape(-1, d), (wo,), dy.reshape(-1, d), (dwo,), "out")
            return
        g = self._operand(dout.reshape(-1, dout.shape[-1]))
        self.gemm(g, self._operand(wo, weight=True), dy.reshape(-1, d), tb=True)
        self.gemm(self._operand(y.reshape(-1, d)), g, dwo, ta=True, accumulate=True)

    # ------------------------------------------------------------------ MLP
    def gelu(self, h, out) -> None:
        elementwise.gelu(self, h, out)

    def _gelu_epilogue(self, h) -> bool:
        """The 16-bit MLP's GELU as the epilogue of its first product, which writes h and a = gelu(h)
        (h's rows a multiple of 8 elements apart, as cuBLASLt needs; self.gelu_epilogue = False, or
        ANDREA_GELU_EPILOGUE=0, runs it as an elementwise pass, for measuring)."""
        return self.gelu_epilogue and is_16bit(h) and h.shape[-1] % 8 == 0

    def mlp_fwd(self, x, w1, w2, h, a, out) -> None:
        d = x.shape[-1]
        M = h.shape[-1]
        if self._fp8("mlp"):  # a = gelu(h) goes straight from h into the second product's fp8 operand
            self.fp8.mlp_fwd(x.reshape(-1, d), w1, w2, h.reshape(-1, M), out.reshape(-1, d))
            return
        x2, w1p = self._operand(x.reshape(-1, d)), self._operand(w1, weight=True)
        # one product writes h and a = gelu(h), no elementwise pass (a from the fp32 accumulator: within
        # a unit in the last place of the a that mlp_bwd recomputes from the 16-bit h for dW2)
        if self._gelu_epilogue(h):
            self.lt().gemm(x2, w1p, a.reshape(-1, M), epilogue=EPILOGUE_GELU_AUX, aux=h.reshape(-1, M))
        else:
            self.gemm(x2, w1p, h.reshape(-1, M))
            self.gelu(h, a)
        self.gemm(self._operand(a.reshape(-1, M)), self._operand(w2, weight=True), out.reshape(-1, d))

    def mlp_bwd(self, dout, x, h, a, w1, w2, dx, dw1, dw2) -> None:
        d = x.shape[-1]
        M = h.shape[-1]
        m = x.size // d
        fast = is_16bit(h)
        # fp8: dout may be the e5m2 operand and its transpose already (Fp8.layernorm_bwd)
        g = dout.reshape(-1, d) if dout.dtype == np.uint8 else self._operand(dout.reshape(-1, d))
        da_dtype = h.dtype if fast else cp.float32
        da = self._from_arena((m, M), da_dtype, avoid=a)
        if da is None:
            da = self.scratch("mlp_da", (m, M), da_dtype)
        if self._fp8("mlp"):
            self.fp8.mlp_bwd(g, x.reshape(-1, d), h, w1, w2, dx.reshape(-1, d), dw1, dw2, da)
            return
        w2p = self._operand(w2, weight=True)
        if not self.recomputes_gelu and self._gelu_epilogue(h):
            # a saved by the forward (keep_gelu): the product writes h's gradient, gelu'(h) its epilogue
            self.lt().gemm(g, w2p, da, tb=True, epilogue=EPILOGUE_DGELU, aux=h.reshape(-1, M))
        else:
            # a's gradient, then one pass applies gelu'(h), recomputing a for dW2 where it was not saved
            self.gemm(g, w2p, da, tb=True)
            elementwise.gelu_bwd(self, h, da, a)
        self.gemm(self._operand(a.reshape(-1, M)), g, dw2, ta=True, accumulate=True)
        dap = self._operand(da)
        self.gemm(self._operand(x.reshape(-1, d)), dap, dw1, ta=True, accumulate=True)
        self.gemm(dap, self._operand(w1, weight=True), dx.reshape(-1, d), tb=True)

    def residual_add_bwd(self, dout, df) -> None:
        elementwise.residual_add_bwd(self, dout, df)

    # ------------------------------------------------------------------ loss
    def loss_fwd(self, x, w, targets, probs, losses):
        return classifier.loss_fwd(self, x, w, targets, probs, losses)

    def loss_bwd(self, x, w, targets, probs, dx, dw, dloss=1.0) -> None:
        classifier.loss_bwd(self, x, w, targets, probs, dx, dw, dloss)

    # ------------------------------------------------------------------ optimizer
    def grad_norm_partial(self, grads, partial, block=1 << 16) -> None:
        elementwise.grad_norm_partial(self, grads, partial, block)

    def grad_norm_final(self, partial) -> float:
        return elementwise.grad_norm_final(self, partial)

    def grad_scale(self, grads, scale) -> None:
        elementwise.grad_scale(self, grads, scale)

    def step_control(self, partial, ctrl, clip, scale, beta1, beta2) -> None:
        elementwise.step_control(self, partial, ctrl, clip, scale, beta1, beta2)

    def readback(self, arrays) -> "Readback":
        return Readback(arrays)

    def adamw(self, w, g, m, v, decay, lr, beta1, beta2, eps, weight_decay, step, gscale=1.0, ctrl=None) -> None:
        elementwise.adamw(self, w, g, m, v, decay, lr, beta1, beta2, eps, weight_decay, step, gscale, ctrl)


def _kernels_ran(forwards: set, backwards: set) -> str:
    """Which of our 16-bit attention kernels ran, for the plan line (before any pass: nothing)."""
    if not forwards and not backwards:
        return ""
    if forwards == backwards == {"mma.sync"}:
        return " (forward and backward by mma.sync)"
    names = {"fwd": {"wgmma": "the forward by Hopper wgmma with TMA", "mma.sync": "the forward by mma.sync"},
             "bwd": {"wgmma": "the backward by Hopper wgmma", "mma.sync": "the backward by mma.sync"}}
    parts = []
    for way, ran in (("fwd", forwards), ("bwd", backwards)):
        said = [names[way][r] for r in sorted(ran, reverse=True)]  # wgmma first
        if len(said) == 2:
            said[1] = "by mma.sync where that did not run"
        if said:
            parts.append(", ".join(said))
    return f" ({'; '.join(parts)})"
