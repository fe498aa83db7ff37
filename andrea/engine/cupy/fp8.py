"""The fp8 mode of the CuPy backend: the q/k/v, attention-output and MLP products in 8 bits.

The recipe is andrea/fp8.py's (its NumPy simulation is the reference): e4m3 for weights and
activations, e5m2 for gradients, per-tensor power-of-two scales from the amaxes of each site's
last 16 casts (delayed scaling), fp32 accumulation, fp32 master weights and Adam state; everything
else runs as in bf16 (the embeddings, LayerNorms, attention, the output head and the loss).

Hopper's fp8 tensor cores take both operands with the reduction dimension contiguous ("TN"), so
each product reads its operands in the layout it needs, made by the cast kernels
(kernels/fp8.cu) in the same pass as the cast:

  forward   y = x·W      x [m, k] as cast;                 W as Wᵀ [n, k] (cast once per pass)
  input     dx = dy·Wᵀ   dy [m, n] as cast (e5m2);         W [k, n] as cast
  weight    dW += xᵀ·dy  xᵀ [k, m]: x cast again;          dyᵀ [n, m] (e5m2, with dy's cast)

The backward pass casts the saved 16-bit activations again at the scale the forward used, which
gives the forward's 8-bit values bit for bit (the reference's `requantize`), instead of keeping
8-bit transposed copies of every layer's inputs. The MLP's GELU is fused into casts both ways:
the forward casts a = gelu(h) straight from h (a is never stored), and one backward pass over h
and a's gradient writes h's gradient in e5m2 (and transposed) and a again, transposed, for dW2.

Scales, amax histories and the counts of overflows and underflows live on the device (fp8_update
moves each pass's amaxes into the histories before its first cast), so a pass captured as a CUDA
graph replays all of it. The products run through cuBLASLt (called with ctypes, like cuBLAS in
gemm.py), which reads the inverse scales from the device.
"""

from __future__ import annotations

import ctypes
import functools
import os

import cupy as cp
import numpy as np

HISTORY = 16  # as kernels/fp8.cu FP8_HISTORY and andrea/fp8.py's default
MAX_SITES = 4096  # device arrays allocated once (a graph holds them); a 480M model uses 16 layers x 12
FORMATS = {"e4m3": 448.0, "e5m2": 57344.0}
INV_STRIDE = 4  # kernels/fp8.cu FP8_INV_STRIDE
CAST_COLS = 4 * 64  # columns per block of the fp8_cast_* kernels (kernels/fp8.cu: FP8_TILES tiles of 64)
# the products that run in fp8 (ANDREA_FP8_PRODUCTS, comma-separated, picks a subset: for measuring
# what each gains; the others run as in bf16)
ALL_PRODUCTS = ("qkv", "out", "mlp")


def products_from_env() -> frozenset:
    names = os.environ.get("ANDREA_FP8_PRODUCTS", ",".join(ALL_PRODUCTS))
    chosen = frozenset(n.strip() for n in names.split(",") if n.strip())
    unknown = chosen - set(ALL_PRODUCTS)
    if unknown:
        raise ValueError(f"ANDREA_FP8_PRODUCTS: unknown products {sorted(unknown)}; choose from {', '.join(ALL_PRODUCTS)}")
    return chosen


_CUDA_R_32F, _CUDA_R_16BF, _CUDA_R_8F_E4M3, _CUDA_R_8F_E5M2, _COMPUTE_32F = 0, 14, 28, 29, 68
_TYPE = {"e4m3": _CUDA_R_8F_E4M3, "e5m2": _CUDA_R_8F_E5M2}
# cublasLt.h (CUDA 12 and 13)
_DESC_TRANSA, _DESC_TRANSB, _DESC_A_SCALE, _DESC_B_SCALE, _DESC_FAST_ACCUM = 3, 4, 17, 18, 25
_PREF_MAX_WORKSPACE = 1
_PREF_MIN_ALIGNMENT = (5, 6, 7, 8)  # CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES
_OP_N, _OP_T = 0, 1
_HEURISTIC_BYTES = 96  # sizeof(cublasLtMatmulHeuristicResult_t); its algo (64 bytes) comes first
_ALGOS = 8  # heuristic results asked for
WORKSPACE_BYTES = 32 << 20
_ONE = np.ones(1, dtype=np.float32)
_ZERO = np.zeros(1, dtype=np.float32)


def check_shapes(rows: int, *cols: int) -> None:
    """fp8 products need every dimension a multiple of 16 (cuBLASLt's fp8 kernels: 16-byte aligned rows)."""
    bad = [n for n in (rows, *cols) if n % 16]
    if bad:
        raise ValueError(f"precision fp8 needs B·T and the model's widths to be multiples of 16; got {bad} "
                         f"(B·T = {rows}, widths {list(cols)}): use bf16 for this shape")


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    """The libcublasLt next to the libcublas CuPy loaded."""
    cp.cuda.device.get_cublas_handle()
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/libcublasLt.so" in line}
    if not paths:
        raise RuntimeError("libcublasLt is not loaded in this process (it comes with libcublas)")
    lib = ctypes.CDLL(paths.pop())
    vp, i32, u64, i64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t
    lib.cublasLtCreate.argtypes = [ctypes.POINTER(vp)]
    lib.cublasLtDestroy.argtypes = [vp]
    lib.cublasLtMatmulDescCreate.argtypes = [ctypes.POINTER(vp), i32, i32]
    lib.cublasLtMatmulDescSetAttribute.argtypes = [vp, i32, vp, sz]
    lib.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(vp), i32, u64, u64, i64]
    lib.cublasLtMatmulPreferenceCreate.argtypes = [ctypes.POINTER(vp)]
    lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [vp, i32, vp, sz]
    lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [vp, vp, vp, vp, vp, vp, vp, i32, vp, ctypes.POINTER(i32)]
    lib.cublasLtMatmul.argtypes = [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, sz, vp]
    return lib


def _not_capturing() -> None:
    """A site's first cast must run eagerly: captured, its scale would come from the tensor's own
    amax at every replay instead of the history. CapturedPass's eager warm-up sees every site first."""
    if cp.cuda.get_current_stream().is_capturing():
        raise RuntimeError("an fp8 site is cast for the first time while a CUDA graph is captured; "
                           "run the pass eagerly once first")


def require_fp8_gpu() -> None:
    """fp8 products need an fp8 GPU: compute capability 8.9 (Ada) or 9.0 (Hopper) and up."""
    cc = cp.cuda.Device().compute_capability  # "90", "89", "100"
    if int(cc) < 89:
        raise RuntimeError(f"precision fp8 needs an fp8 GPU (compute capability 8.9 or higher: Ada, Hopper); "
                           f"this one is {cc[:-1]}.{cc[-1]}: use bf16")


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed with cuBLAS status {status}")


def _alignment(ptr: int) -> int:
    """The largest power of two up to 256 that divides a pointer."""
    return min(256, ptr & -ptr) if ptr else 256


class Lt:
    """A cuBLASLt handle, its workspace, and a plan (descriptors and the heuristic's algorithm) per shape."""

    def __init__(self):
        self.lib = lib = _library()
        self.handle = ctypes.c_void_p()
        _check(lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.workspace = cp.empty(WORKSPACE_BYTES, dtype=cp.uint8)
        self.plans: dict = {}

    def _plan(self, m, n, k, ta, tb, tc, fast, scales, align):
        key = (m, n, k, ta, tb, tc, fast, align)
        plan = self.plans.get(key)
        if plan is not None:
            return plan
        lib = self.lib
        desc = ctypes.c_void_p()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _COMPUTE_32F, _CUDA_R_32F), "cublasLtMatmulDescCreate")
        self._set_scales(desc, scales)  # before the heuristic: an algorithm chosen without scales may not take them
        for attr, value in ((_DESC_TRANSA, _OP_T), (_DESC_TRANSB, _OP_N)):
            v = ctypes.c_int32(value)
            _check(lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), 4), "cublasLtMatmulDescSetAttribute")
        f = ctypes.c_int8(1 if fast else 0)
        _check(lib.cublasLtMatmulDescSetAttribute(desc, _DESC_FAST_ACCUM, ctypes.byref(f), 1), "set FAST_ACCUM")
        # column-major: D [n, m] = A_ltᵀ · B_lt, A_lt = the second operand stored [n, k] (k contiguous),
        # B_lt = the first stored [m, k]
        layouts = []
        for dtype, rows, cols in ((tb, k, n), (ta, k, m), (tc, n, m)):
            lay = ctypes.c_void_p()
            _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dtype, rows, cols, rows), "cublasLtMatrixLayoutCreate")
            layouts.append(lay)
        pref = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        ws = ctypes.c_uint64(WORKSPACE_BYTES)
        _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE, ctypes.byref(ws), 8), "set workspace")
        for attr, value in zip(_PREF_MIN_ALIGNMENT, align):  # the operands' own alignment (default: 256 bytes)
            v = ctypes.c_uint32(value)
            _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, attr, ctypes.byref(v), 4), "set alignment")
        results = (ctypes.c_ubyte * (_HEURISTIC_BYTES * _ALGOS))()
        count = ctypes.c_int32(0)
        la, lb, lc = layouts
        _check(lib.cublasLtMatmulAlgoGetHeuristic(self.handle, desc, la, lb, lc, lc, pref, _ALGOS, ctypes.byref(results),
                                                  ctypes.byref(count)), "cublasLtMatmulAlgoGetHeuristic")
        if count.value < 1:
            raise RuntimeError(f"cuBLASLt has no fp8 algorithm for m={m} n={n} k={k} (types {ta}, {tb} -> {tc})")
        algos = [ctypes.addressof(results) + i * _HEURISTIC_BYTES for i in range(count.value)]
        plan = self.plans[key] = [desc, la, lb, lc, pref, results, algos]
        return plan

    def _set_scales(self, desc, scales) -> None:
        for attr, ptr in zip((_DESC_A_SCALE, _DESC_B_SCALE), scales):
            p = ctypes.c_void_p(ptr)
            _check(self.lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(p), 8), "set scale pointer")

    def matmul(self, a, a_inv, ta: str, bt, b_inv, tb: str, c, accumulate: bool = False, fast: bool = False) -> None:
        """Row-major c [m, n] (bf16 or fp32) = (a · btᵀ) · a_inv · b_inv, or += with `accumulate`:
        a [m, k] and bt [n, k] fp8 (formats ta, tb), both k-contiguous; a_inv, b_inv device
        pointers to the operands' inverse scales. `fast`: fp8 accumulation without cuBLASLt's
        periodic promotion to fp32 (the forward products, as Transformer Engine does)."""
        m, k = a.shape
        n = bt.shape[0]
        if bt.shape[1] != k or c.shape != (m, n):
            raise ValueError(f"fp8 matmul shapes: a {a.shape}, bt {bt.shape}, c {c.shape}")
        tc = _CUDA_R_32F if c.dtype == np.float32 else _CUDA_R_16BF
        # cuBLASLt's A is our bt, its B our a; C and D are c (a plan per alignment: fp32 gradient views
        # into the flat buffer may sit only 16 bytes apart from a 256-byte boundary)
        align = tuple(_alignment(x.data.ptr) for x in (bt, a, c, c))
        plan = self._plan(m, n, k, _TYPE[ta], _TYPE[tb], tc, fast, (b_inv, a_inv), align)
        desc, la, lb, lc, _, _, algos = plan
        self._set_scales(desc, (b_inv, a_inv))
        status = None
        for i, algo in enumerate(algos):  # the heuristic's first that runs (the rest are dropped once one has)
            status = self.lib.cublasLtMatmul(
                self.handle, desc, _ONE.ctypes.data, bt.data.ptr, la, a.data.ptr, lb,
                (_ONE if accumulate else _ZERO).ctypes.data, c.data.ptr, lc, c.data.ptr, lc,
                algo, self.workspace.data.ptr, WORKSPACE_BYTES, cp.cuda.get_current_stream().ptr)
            if status == 0:
                plan[6] = algos[i:i + 1]
                return
        _check(status, f"cublasLtMatmul (m={m} n={n} k={k}, {ta} x {tb}, {len(algos)} algorithms tried)")

    def close(self) -> None:
        if self.handle:
            _check(self.lib.cublasLtDestroy(self.handle), "cublasLtDestroy")
            self.handle = ctypes.c_void_p()
        self.workspace = None


class Fp8:
    """One backend's fp8 state (sites, scales, histories, counts on the device) and its products."""

    def __init__(self, backend):
        require_fp8_gpu()
        self.be = backend
        self.amax_now = cp.full(MAX_SITES, -1.0, dtype=cp.float32)
        self.hist = cp.zeros((MAX_SITES, HISTORY), dtype=cp.float32)
        self.scale = cp.ones(MAX_SITES, dtype=cp.float32)
        self.inv = cp.ones((MAX_SITES, INV_STRIDE), dtype=cp.float32)  # inv[site, 0]: 16-byte aligned, as cuBLASLt needs
        self.fmax = cp.ones(MAX_SITES, dtype=cp.float32)
        self.counts = cp.zeros((MAX_SITES, 3), dtype=cp.uint64)
        self.sites: dict = {}  # (role, weight pointer) -> index
        self.primed: set = set()  # sites cast at least once (their scale has something to go on)
        self.weights: dict = {}  # first weight's pointer -> (Wᵀ [n, k], W [k, n]) e4m3 copies
        self.lt = None
        self.products = products_from_env()

    def buffers(self) -> list:
        """What a captured pass reads and writes besides the backend's scratch."""
        return [self.amax_now, self.hist, self.scale, self.inv, self.fmax, self.counts,
                list(self.weights.values()), None if self.lt is None else self.lt.workspace]

    def release(self) -> None:
        self.weights.clear()
        if self.lt is not None:
            self.lt.close()
            self.lt = None

    # ------------------------------------------------------------------ scales and casts
    def _site(self, role: str, w, fmt: str) -> int:
        key = (role, w.data.ptr, fmt)
        i = self.sites.get(key)
        if i is None:
            i = self.sites[key] = len(self.sites)
            if i >= MAX_SITES:
                raise RuntimeError(f"more than {MAX_SITES} fp8 sites")
            self.fmax[i] = FORMATS[fmt]
        return i

    def begin_pass(self) -> None:
        """Each site's amaxes since the last call join its history; scales from the histories."""
        n = len(self.sites)
        if n:
            self.be.kernel("fp8", "fp8_update")(((n + 127) // 128,), (128,), (self.amax_now, self.hist, self.scale, self.inv,
                                                                      self.fmax, np.int32(n)))

    def cast(self, x, site: int, fmt: str, q=None, qt=None, record: bool = True, gelu: bool = False) -> None:
        """x [rows, cols] (bf16; fp32 for e4m3 weights; unit column stride) cast at the site's scale
        into q [rows, cols] and/or qt [cols, rows] (uint8 views, unit column stride). `record`: x's
        amax joins the site's history and the cast is counted (a forward cast, or a gradient's);
        without it x is cast again at the scale of the site's latest cast (the backward reading
        the forward's operand). `gelu`: x is h, and a = gelu(h) in 16 bits is cast."""
        if record and site not in self.primed:
            self.prime(site, [x], fmt, gelu)
        elif site not in self.primed:
            raise RuntimeError("an fp8 operand is cast again before its first cast")
        self._launch_cast(x, site, fmt, gelu, q, qt, record, record)

    def _launch_cast(self, x, site: int, fmt: str, gelu: bool, q, qt, record: bool, count: bool) -> None:
        rows, cols = x.shape
        src = "f32" if x.dtype == np.float32 else "h16"
        fn = self.be.kernel("fp8", f"fp8_cast_{src}_{fmt}" + ("_gelu" if gelu else ""))
        fn((-(-cols // CAST_COLS), -(-rows // 64)), (256,), (
            x, np.int64(x.strides[0] // x.itemsize), 0 if q is None else q, np.int64(0 if q is None else q.strides[0]),
            0 if qt is None else qt, np.int64(0 if qt is None else qt.strides[0]), np.int32(rows), np.int32(cols),
            np.int32(site), self.scale, self.amax_now, self.counts, np.int32(record), np.int32(count)))

    def prime(self, site: int, xs, fmt: str, gelu: bool = False) -> None:
        """A site's first cast has no history: its scale comes from the amax of the tensors xs (the
        parts of one tensor), as in the reference. Runs on the eager warm-up pass, before any capture."""
        _not_capturing()
        for x in xs:
            self._launch_cast(x, site, fmt, gelu, None, None, True, False)  # the amax alone
        self._scale_from_own_amax(site)

    def _scale_from_own_amax(self, site: int) -> None:
        self.be.kernel("fp8", "fp8_scale_from_now")((1,), (1,), (self.amax_now, self.scale, self.inv, self.fmax, np.int32(site)))
        self.primed.add(site)

    def _weights(self, ws, role: str = "w"):
        """The e4m3 copies of the weights ws (each [k, n_i], side by side: one tensor, one scale):
        Wᵀ [Σn_i, k] for the forward and W [k, Σn_i] for the input gradient, cast once per pass."""
        site = self._site(role, ws[0], "e4m3")
        key = ws[0].data.ptr
        k = ws[0].shape[0]
        n = sum(w.shape[1] for w in ws)
        if key not in self.weights:
            self.weights[key] = (cp.empty((n, k), dtype=cp.uint8), cp.empty((k, n), dtype=cp.uint8))
        wt, wp = self.weights[key]
        return site, wt, wp

    def cast_weights(self, ws) -> tuple:
        site, wt, wp = self._weights(ws)
        if site not in self.primed:
            self.prime(site, ws, "e4m3")
        at = 0
        for w in ws:
            ni = w.shape[1]
            self.cast(w, site, "e4m3", q=wp[:, at:at + ni], qt=wt[at:at + ni])
            at += ni
        return site, wt, wp

    def _lt(self) -> Lt:
        if self.lt is None:
            self.lt = Lt()
        return self.lt

    def mm(self, a, sa: int, fa: str, bt, sb: int, fb: str, c, accumulate=False, fast=False) -> None:
        inv = self.inv.data.ptr
        self._lt().matmul(a, inv + 4 * INV_STRIDE * sa, fa, bt, inv + 4 * INV_STRIDE * sb, fb, c, accumulate, fast)

    def _u8(self, key: str, shape) -> cp.ndarray:
        return self.be.scratch("fp8_" + key, tuple(shape), cp.uint8)

    # ------------------------------------------------------------------ the products
    def linear_fwd(self, x2, ws, out2, role: str, gelu: bool = False) -> None:
        """out2 [m, Σn] = x2 · [ws side by side] with x2 [m, k] cast to e4m3 (`gelu`: x2 is h, a = gelu(h) is cast)."""
        m, k = x2.shape
        sx = self._site(role + ".x", ws[0], "e4m3")
        xq = self._u8(f"x{k}", (m, k))
        self.cast(x2, sx, "e4m3", q=xq, gelu=gelu)
        sw, wt, _ = self.cast_weights(ws)
        self.mm(xq, sx, "e4m3", wt, sw, "e4m3", out2, fast=True)

    def linear_bwd(self, g2, x2, ws, dx2, dws, role: str) -> None:
        """dx2 = g2 · Wᵀ (overwritten) and dws[i] += x2ᵀ · g2[:, block i], g2 [m, Σn] cast to e5m2 and
        x2 [m, k] cast again at its forward scale."""
        m, n = g2.shape
        sg = self._site(role + ".dy", ws[0], "e5m2")
        gq, gt = self._u8(f"g{n}", (m, n)), self._u8(f"gt{n}", (n, m))
        self.cast(g2, sg, "e5m2", q=gq, qt=gt)
        self._linear_bwd_cast(gq, gt, sg, x2, ws, dx2, dws, role)

    def _linear_bwd_cast(self, gq, gt, sg, x2, ws, dx2, dws, role: str) -> None:
        """linear_bwd from the gradient already cast: gq [m, Σn] and its transpose gt, site sg."""
        m, k = x2.shape
        sw, _, wp = self._weights(ws)
        self.mm(gq, sg, "e5m2", wp, sw, "e4m3", dx2)
        sx = self._site(role + ".x", ws[0], "e4m3")
        xt = self._u8(f"xt{k}", (k, m))
        self.cast(x2, sx, "e4m3", qt=xt, record=False)
        at = 0
        for dw in dws:
            ni = dw.shape[1]
            self.mm(xt, sx, "e4m3", gt[at:at + ni], sg, "e5m2", dw, accumulate=True)
            at += ni

    def mlp_fwd(self, x2, w1, w2, h2, out2) -> None:
        self.linear_fwd(x2, (w1,), h2, "mlp1")
        self.linear_fwd(h2, (w2,), out2, "mlp2", gelu=True)  # sites keyed by w2: a = gelu(h) is its input

    def mlp_bwd(self, g2, x2, h, w1, w2, dx2, dw1, dw2, da) -> None:
        """da: a [m, M] 16-bit scratch for a's gradient. One pass over h and da (fp8_gelu_bwd_cast)
        casts h's gradient to e5m2 (and its transpose) and a = gelu(h) again for dW2, so neither
        h's gradient nor a is ever stored in 16 bits."""
        m, M = da.shape
        d = g2.shape[1]
        sg = self._site("mlp2.dy", w2, "e5m2")
        gq, gt = self._u8(f"g{d}", (m, d)), self._u8(f"gt{d}", (d, m))
        self.cast(g2, sg, "e5m2", q=gq, qt=gt)
        sw2, _, w2p = self._weights((w2,))
        self.mm(gq, sg, "e5m2", w2p, sw2, "e4m3", da)
        sa = self._site("mlp2.x", w2, "e4m3")
        sd = self._site("mlp1.dy", w1, "e5m2")
        # their own names: with M = d, g{M}/gt{M} would be the dout casts above, still to be read
        dq, dqt, aqt = self._u8(f"dh{M}", (m, M)), self._u8(f"dht{M}", (M, m)), self._u8(f"at{M}", (M, m))
        fn = self.be.kernel("fp8", "fp8_gelu_bwd_cast")
        grid = ((M + 63) // 64, (m + 63) // 64)

        def launch(outs, record, count):
            fn(grid, (256,), (da, h, np.int32(m), np.int32(M), *outs[:2], np.int32(sd), outs[2], np.int32(sa),
                              self.scale, self.amax_now, self.counts, np.int32(record), np.int32(count)))

        if sd not in self.primed:  # h's gradient's first cast: its scale from its own amax
            _not_capturing()
            launch((0, 0, 0), 1, 0)
            self._scale_from_own_amax(sd)
        launch((dq, dqt, aqt), 1, 1)
        self.mm(aqt, sa, "e4m3", gt, sg, "e5m2", dw2, accumulate=True)
        self._linear_bwd_cast(dq, dqt, sd, x2, (w1,), dx2, (dw1,), "mlp1")

    # ------------------------------------------------------------------ checkpoints
    def _base(self):
        mirror = self.be.weights.mirror
        return None if mirror is None else mirror.w

    def state(self) -> dict:
        """What a resumed run needs to continue exactly (JSON-ready, a host sync): each site (role,
        format, and its weight's offset in the flat weight buffer: pointers change between
        processes) with its history, the amax since the last update, its scale, whether its first
        cast has run, and its counts. Sites of arrays outside the registered weights are left out."""
        base = self._base()
        if base is None or not self.sites:
            return {"sites": []}
        n = len(self.sites)
        hist, now, scale, counts = (cp.asnumpy(a[:n]) for a in (self.hist, self.amax_now, self.scale, self.counts))
        out = []
        for (role, ptr, fmt), i in self.sites.items():
            off = (ptr - base.data.ptr) // 4
            if not 0 <= off < base.size:
                continue
            out.append({"role": role, "fmt": fmt, "offset": int(off), "hist": [float(x) for x in hist[i]],
                        "amax_now": float(now[i]), "scale": float(scale[i]), "primed": i in self.primed,
                        "counts": [int(c) for c in counts[i]]})
        return {"history": HISTORY, "sites": out}

    def load_state(self, state: dict) -> None:
        """The sites of state() back, onto this backend's registered weights."""
        base = self._base()
        if base is None:
            raise RuntimeError("fp8 state: register the weights first (the engine does)")
        if state.get("sites") and state.get("history") != HISTORY:
            raise ValueError(f"fp8 state with histories of {state.get('history')} amaxes; this build keeps {HISTORY}")
        for site in state.get("sites", []):
            if not 0 <= site["offset"] < base.size:
                raise ValueError(f"fp8 state: site {site['role']} at offset {site['offset']} is outside the "
                                 f"{base.size:,} weights of this model")
            i = self._site(site["role"], base[site["offset"]:], site["fmt"])
            self.hist[i] = cp.asarray(np.array(site["hist"], np.float32))
            self.amax_now[i] = site["amax_now"]
            self.scale[i] = site["scale"]
            self.inv[i, 0] = 1.0 / site["scale"]
            self.counts[i] = cp.asarray(np.array(site["counts"], np.uint64))
            if site["primed"]:
                self.primed.add(i)
            else:
                self.primed.discard(i)

    def counts_dict(self) -> dict:
        """Values cast so far, and how many overflowed (saturated) or underflowed (to zero), over all
        sites; per role too ("qkv.x", "mlp1.dy", "w", ...)."""
        c = cp.asnumpy(self.counts[:len(self.sites)]).astype(np.int64)
        total = c.sum(axis=0) if len(c) else np.zeros(3, np.int64)
        roles: dict = {}
        for (role, _, _), i in self.sites.items():
            r = roles.setdefault(role, np.zeros(3, np.int64))
            r += c[i]
        out = {"values": int(total[0]), "overflow": int(total[1]), "underflow": int(total[2])}
        out["by_role"] = {r: {"values": int(v[0]), "overflow": int(v[1]), "underflow": int(v[2])} for r, v in sorted(roles.items())}
        return out

    def scales(self) -> dict:
        """Each site's current scale (role, format) -> list over layers in the order they were first cast."""
        s = cp.asnumpy(self.scale[:len(self.sites)])
        out: dict = {}
        for (role, _, fmt), i in self.sites.items():
            out.setdefault(f"{role}:{fmt}", []).append(float(s[i]))
        return out
