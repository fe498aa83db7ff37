"""The fp8 mode of the CuPy backend: the q/k/v, attention-output and MLP products in 8 bits.

The recipe is andrea/fp8.py's (its NumPy simulation is the reference): e4m3 for weights and
activations, e5m2 for gradients, per-tensor power-of-two scales from the amaxes of each site's
last 16 casts (delayed scaling), fp32 accumulation, fp32 master weights and Adam state; everything
else runs as in bf16 (the embeddings, LayerNorms, attention, the output head and the loss), the
LayerNorms next to a product writing its 8-bit operand themselves (below).

Hopper's fp8 tensor cores take both operands with the reduction dimension contiguous ("TN"), so
each product reads its operands in the layout it needs, made by the cast kernels
(kernels/fp8.cu) in the same pass as the cast:

  forward   y = x·W      x [m, k] as cast;                 W as Wᵀ [n, k] (cast once per pass)
  input     dx = dy·Wᵀ   dy [m, n] as cast (e5m2);         W [k, n] as cast
  weight    dW += xᵀ·dy  xᵀ [k, m]: x cast again, or kept; dyᵀ [n, m] (e5m2, with dy's cast)

Where a LayerNorm makes the operand, it casts it itself: the LayerNorms before the q/k/v and first
MLP products write x as cast and xᵀ (kept for the weight gradient in place of the 16-bit output,
which is never stored: a byte a value instead of two), and the LayerNorm backward writes the
residual branch's gradient, the dy of the attention-output and second MLP products, as cast and
transposed (layernorm_fwd, layernorm_bwd; the same bytes as the 16-bit value's
cast). The attention output, which attention's backward needs in 16 bits, is cast again at the
scale the forward used, which gives the forward's 8-bit values bit for bit (the reference's
`requantize`). The MLP's GELU never makes a 16-bit a: the first product's cuBLASLt epilogue writes
h (16-bit, kept for the backward) and a = gelu(h) cast to e4m3 at its site's scale, with a's amax
(mlp_fwd; where cuBLASLt has no such algorithm, or ANDREA_GELU_EPILOGUE=0, a cast pass makes a from
h instead), and one backward pass over h and a's gradient writes h's gradient in e5m2 (and
transposed) and a again, transposed, for dW2. The epilogue's a comes from the fp32 product, the
backward's from h rounded to 16 bits: the two casts of a differ by one e4m3 step in a few values
(as the bf16 mode's epilogue a and its backward's recomputed a differ in the last bf16 place). The
weights are cast once a pass, all in one launch at its start (after the first pass, which casts each
as it comes).

Scales, amax histories and the counts of overflows and underflows live on the device (fp8_update
moves each pass's amaxes into the histories before its first cast), so a pass captured as a CUDA
graph replays all of it. The products run through cuBLASLt (cublaslt.py), which reads the inverse
scales from the device.
"""

from __future__ import annotations

import os
import warnings

import cupy as cp
import numpy as np

from andrea.engine.cupy.cublaslt import Lt, NoAlgorithm
from andrea.engine.cupy.kernels import ln_nv
from andrea.engine.cupy.layernorm import layernorm_bwd_one_pass, ln_fused_rows
from andrea.engine.cupy.weights import is_16bit
from andrea.engine.fp8_records import FP8_MULTIPLE, fp8_capable

HISTORY = 16  # as kernels/fp8.cu FP8_HISTORY and andrea/fp8.py's default
MAX_SITES = 4096  # device arrays allocated once (a graph holds them); a 480M model uses 16 layers x 12
FORMATS = {"e4m3": 448.0, "e5m2": 57344.0}
INV_STRIDE = 4  # kernels/fp8.cu FP8_INV_STRIDE
CAST_COLS = 4 * 64  # columns per block of the fp8_cast_* kernels (kernels/fp8.cu: FP8_TILES tiles of 64)
LN_FP8_ROWS = 32  # rows per block of add_layernorm_fp8 (kernels/fp8.cu)
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


def check_shapes(rows: int, *cols: int) -> None:
    """fp8 products need every dimension a multiple of 16 (cuBLASLt's fp8 kernels: 16-byte aligned rows)."""
    bad = [n for n in (rows, *cols) if n % FP8_MULTIPLE]
    if bad:
        raise ValueError(f"precision fp8 needs B·T and the model's widths to be multiples of 16; got {bad} "
                         f"(B·T = {rows}, widths {list(cols)}): use bf16 for this shape")


def _not_capturing() -> None:
    """A site's first cast must run eagerly: captured, its scale would come from the tensor's own
    amax at every replay instead of the history. CapturedPass's eager warm-up sees every site first."""
    if cp.cuda.get_current_stream().is_capturing():
        raise RuntimeError("an fp8 site is cast for the first time while a CUDA graph is captured; "
                           "run the pass eagerly once first")


def require_fp8_gpu() -> None:
    """fp8 products need an fp8 GPU: compute capability 8.9 (Ada) or 9.0 (Hopper) and up."""
    cc = cp.cuda.Device().compute_capability  # "90", "89", "100"
    if not fp8_capable(cc):
        raise RuntimeError(f"precision fp8 needs an fp8 GPU (compute capability 8.9 or higher: Ada, Hopper); "
                           f"this one is {cc[:-1]}.{cc[-1]}: use bf16")


class Fp8:
    """One backend's fp8 state (sites, scales, histories, counts on the device) and its products."""

    def __init__(self, backend):
        require_fp8_gpu()
        self.be = backend
        self.amax_now = cp.full(MAX_SITES, -1.0, dtype=cp.float32)
        self.hist = cp.zeros((MAX_SITES, HISTORY), dtype=cp.float32)
        self.scale = cp.ones(MAX_SITES, dtype=cp.float32)
        self.inv = cp.ones((MAX_SITES, INV_STRIDE), dtype=cp.float32)  # inv[site, 0]: 16-byte aligned, as cuBLASLt needs
        # for products whose output is a site's e4m3 operand (the GELU epilogue): lt[site, 0, 0] its scale,
        # lt[site, 1, 0] the amax cuBLASLt writes (-1: none; fp8_update takes it in), 16-byte aligned
        self.lt = cp.zeros((MAX_SITES, 2, INV_STRIDE), dtype=cp.float32)
        self.lt[:, 0, 0] = 1.0
        self.lt[:, 1, 0] = -1.0
        self.fmax = cp.ones(MAX_SITES, dtype=cp.float32)
        self.counts = cp.zeros((MAX_SITES, 3), dtype=cp.uint64)
        self.sites: dict = {}  # (role, weight pointer) -> index
        self.primed: set = set()  # sites cast at least once (their scale has something to go on)
        self.weights: dict = {}  # first weight's pointer -> (Wᵀ [n, k], W [k, n]) e4m3 copies
        # every weight cast seen, as jobs of one launch (fp8_cast_f32_e4m3_jobs) that casts them all at
        # the start of each later pass: {(x, q) pointers: (x, q, qt, site)}, and the device tables
        self.jobs: dict = {}
        self.job_table = None  # (pointers [n, 6] int64, ints [n, 5] int32, blocks, sites) on the device
        self.weights_cast = False  # this pass's weights were cast by the jobs' launch
        self.branch_site = None  # the site the LayerNorm backward last cast the branch's gradient for
        self.products = products_from_env()
        self.gelu_fused = None  # the MLP's GELU in the first product's epilogue: None until its first pass tries it
        self.gelu_fused_ran = False  # an epilogue product has run: from then on, one that cannot run is an error

    def buffers(self) -> list:
        """What a captured pass reads and writes besides the backend's scratch."""
        return [self.amax_now, self.hist, self.scale, self.inv, self.lt, self.fmax, self.counts,
                list(self.weights.values()), self.job_table]

    def release(self) -> None:
        self.weights.clear()
        self.jobs.clear()
        self.job_table = None
        self.weights_cast = False

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
        """Each site's amaxes since the last call join its history; scales from the histories. Then
        every weight cast an earlier pass made, in one launch (the pass's products find them done)."""
        n = len(self.sites)
        if n:
            self.be.kernel("fp8", "fp8_update")(((n + 127) // 128,), (128,), (self.amax_now, self.hist, self.scale, self.inv,
                                                                      self.lt, self.fmax, np.int32(n)))
        self.weights_cast = self.job_table is not None
        if self.weights_cast:
            ptrs, ints, blocks, _ = self.job_table
            self.be.kernel("fp8", "fp8_cast_f32_e4m3_jobs")((blocks,), (256,), (
                ptrs, ints, np.int32(len(ints)), self.scale, self.amax_now, self.counts))

    def _add_job(self, x, q, qt, site: int) -> None:
        """A weight cast for the jobs' launch (made on the eager pass that casts it first: the tables
        are device arrays)."""
        key = (x.data.ptr, q.data.ptr)
        if key in self.jobs or cp.cuda.get_current_stream().is_capturing():
            return
        self.jobs[key] = (x, q, qt, site)
        ptrs, ints, first = [], [], 0
        for x_, q_, qt_, site_ in self.jobs.values():
            rows, cols = x_.shape
            bx = -(-cols // CAST_COLS)
            ptrs.append([x_.data.ptr, x_.strides[0] // 4, q_.data.ptr, q_.strides[0], qt_.data.ptr, qt_.strides[0]])
            ints.append([rows, cols, site_, first, bx])
            first += bx * -(-rows // 64)
        self.job_table = (cp.asarray(np.array(ptrs, np.int64)), cp.asarray(np.array(ints, np.int32)), first,
                          {site_ for *_, site_ in self.jobs.values()})

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
        self.be.kernel("fp8", "fp8_scale_from_now")((1,), (1,), (self.amax_now, self.scale, self.inv, self.lt, self.fmax,
                                                               np.int32(site)))
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
        """The weights' e4m3 copies (site, Wᵀ, W): cast here on a pass that the jobs' launch has not
        cast them on (their first), which adds them to it."""
        site, wt, wp = self._weights(ws)
        if self.weights_cast and site in self.job_table[3]:
            return site, wt, wp
        if site not in self.primed:
            self.prime(site, ws, "e4m3")
        at = 0
        for w in ws:
            ni = w.shape[1]
            q, qt = wp[:, at:at + ni], wt[at:at + ni]
            self.cast(w, site, "e4m3", q=q, qt=qt)
            self._add_job(w, q, qt, site)
            at += ni
        return site, wt, wp

    def _lt(self) -> Lt:
        return self.be.lt()  # the backend's handle and workspace (the 16-bit epilogue products use them too)

    def mm(self, a, sa: int, fa: str, bt, sb: int, fb: str, c, accumulate=False, fast=False) -> None:
        inv = self.inv.data.ptr
        self._lt().matmul(a, inv + 4 * INV_STRIDE * sa, fa, bt, inv + 4 * INV_STRIDE * sb, fb, c, accumulate, fast)

    def _u8(self, key: str, shape) -> cp.ndarray:
        return self.be.scratch("fp8_" + key, tuple(shape), cp.uint8)

    # ------------------------------------------------------------------ the LayerNorms before products
    def layernorm_site(self, feeds, rows: int, suffix: str, fmt: str) -> int:
        """The site of a LayerNorm's cast for the product `feeds` ((role, its first weight)): its
        operand (suffix ".x", e4m3) or its output gradient (".dy", e5m2). The kernels store rows 8
        at a time, transposed."""
        if feeds is None or rows % 8:
            raise ValueError(f"an fp8 LayerNorm cast needs the product it feeds (feeds={feeds!r}) and rows in "
                             f"multiples of 8 (got {rows})")
        role, w = feeds
        return self._site(role + suffix, w, fmt)

    def layernorm_fwd(self, x, f, res, g, b, out, mean, rstd, eps, feeds) -> None:
        """res = x + f (f None: no add, res None) and LayerNorm(res) cast to e4m3 for the product `feeds`
        ((role, its first weight)): into that product's operand (the scratch linear_fwd reads) and,
        transposed, into `out` (bytes [rows, C] seen as [C, rows]: what the product's weight gradient
        reads in the backward pass, instead of casting a 16-bit output again). kernels/fp8.cu
        add_layernorm_fp8: the values, amax and counts of the 16-bit LayerNorm then its cast."""
        C = x.shape[-1]
        N = x.size // C
        site = self.layernorm_site(feeds, N, ".x", "e4m3")
        xq = self._u8(f"x{C}", (N, C))
        if res is not None and is_16bit(x) != is_16bit(res):
            raise ValueError("the residual stream's input and output must have one type (16-bit or fp32)")
        fn = self.be.kernel("fp8", f"add_layernorm_fp8_{'r16_' if is_16bit(x) else ''}{ln_nv(C)}")
        smem = LN_FP8_ROWS * (C + 4)
        if fn.max_dynamic_shared_size_bytes < smem:
            fn.max_dynamic_shared_size_bytes = smem

        def launch(q, qt, record, count):
            fn((-(-N // LN_FP8_ROWS),), (256,), (x, 0 if f is None else f, 0 if res is None else res, g, b, q, qt, mean,
                                                rstd, np.int32(N), np.int32(C), np.float32(eps), np.int32(site), self.scale,
                                                self.amax_now, self.counts, np.int32(record), np.int32(count)),
               shared_mem=smem)

        if site not in self.primed:  # the first cast: the scale from the output's own amax
            _not_capturing()
            launch(0, 0, 1, 0)
            self._scale_from_own_amax(site)
        launch(xq, out.reshape(C, N), 1, 1)

    def layernorm_bwd(self, dout, x, mean, rstd, g, dx, dg, db, branch, feeds) -> None:
        """CupyBackend.layernorm_bwd whose branch is the e5m2 gradient of the product `feeds` ((role, its weight)):
        branch [2, N, C] bytes holds the operand [N, C], then its transpose [C, N]
        (layernorm_bwd_fused_fp8: the 16-bit copy's cast, as fp8_cast_h16_e5m2 casts it). The site's
        first cast (eager) runs the 16-bit path and casts its copy, which sets the site's scale."""
        C = x.shape[-1]
        N = x.size // C
        site = self.branch_site = self.layernorm_site(feeds, N, ".dy", "e5m2")
        flat = branch.reshape(-1)
        q, qt = flat[:N * C].reshape(N, C), flat[N * C:].reshape(C, N)
        if site not in self.primed:
            if is_16bit(dx):  # a 16-bit residual gradient is the branch's 16-bit gradient itself
                self.be.layernorm_bwd(dout, x, mean, rstd, g, dx, dg, db)
                self.cast(dx.reshape(N, C), site, "e5m2", q=q, qt=qt)
                return
            copy = cp.empty((N, C), self.be.half)
            self.be.layernorm_bwd(dout, x, mean, rstd, g, dx, dg, db, branch=copy)
            self.cast(copy, site, "e5m2", q=q, qt=qt)
            return
        if is_16bit(x) != is_16bit(dx):
            raise ValueError("the residual stream and its gradient must have one type (16-bit or fp32)")
        kern = self.be.kernel("fp8", f"layernorm_bwd_fused_fp8_{'r16_' if is_16bit(x) else ''}{ln_nv(C)}")
        # its transposing tile: a block's rows of the 16-bit gradient (kernels/fp8.cu)
        layernorm_bwd_one_pass(self.be, kern, (dout, x, mean, rstd, g, dx), (q, qt),
                               (np.int32(site), self.scale, self.amax_now, self.counts, np.int32(1), np.int32(1)), dg, db,
                               extra_smem=ln_fused_rows(N) * (C + 4))

    # ------------------------------------------------------------------ the products
    def _operand(self, x2, ws, role: str, gelu: bool = False) -> tuple:
        """A forward product's operands: (x2's site, x2 [m, k] cast to e4m3, the weights' site, Wᵀ);
        x2 in bytes: the LayerNorm before it has cast it already (layernorm_fwd). `gelu`: x2 is h,
        and a = gelu(h) is cast."""
        m, k = x2.shape
        sx = self._site(role + ".x", ws[0], "e4m3")
        xq = self._u8(f"x{k}", (m, k))
        if x2.dtype != np.uint8:
            self.cast(x2, sx, "e4m3", q=xq, gelu=gelu)
        elif sx not in self.primed:
            raise RuntimeError(f"the fp8 operand of {role} was not cast by the LayerNorm before it")
        sw, wt, _ = self.cast_weights(ws)
        return sx, xq, sw, wt

    def linear_fwd(self, x2, ws, out2, role: str, gelu: bool = False) -> None:
        """out2 [m, Σn] = x2 · [ws side by side] with x2 [m, k] cast to e4m3 (`gelu`: x2 is h, a = gelu(h) is
        cast); x2 in bytes: the LayerNorm before it has cast it already (layernorm_fwd)."""
        sx, xq, sw, wt = self._operand(x2, ws, role, gelu)
        self.mm(xq, sx, "e4m3", wt, sw, "e4m3", out2, fast=True)

    def linear_bwd(self, g2, x2, ws, dx2, dws, role: str) -> None:
        """dx2 = g2 · Wᵀ (overwritten) and dws[i] += x2ᵀ · g2[:, block i], g2 [m, Σn] cast to e5m2 and
        x2 [m, k] cast again at its forward scale; g2 in bytes [2m, Σn]: cast already, with its
        transpose (the LayerNorm backward); x2 in bytes: its cast's transpose (the LayerNorm)."""
        sg = self._site(role + ".dy", ws[0], "e5m2")
        gq, gt = self._grad_cast(g2, x2.shape[0], sg)
        self._linear_bwd_cast(gq, gt, sg, x2, ws, dx2, dws, role)

    def _grad_cast(self, g2, m: int, sg: int) -> tuple:
        """A product's output gradient g2 [m, n] cast to e5m2 at site sg: (operand [m, n], its transpose);
        g2 in bytes [2m, n]: the LayerNorm backward cast it already (both, back to back)."""
        n = g2.shape[1]
        if g2.dtype == np.uint8:
            if sg not in self.primed or self.branch_site != sg:
                raise RuntimeError("an fp8 gradient was not cast for this product by the LayerNorm backward before it")
            flat = g2.reshape(-1)
            return flat[:m * n].reshape(m, n), flat[m * n:].reshape(n, m)
        gq, gt = self._u8(f"g{n}", (m, n)), self._u8(f"gt{n}", (n, m))
        self.cast(g2, sg, "e5m2", q=gq, qt=gt)
        return gq, gt

    def _linear_bwd_cast(self, gq, gt, sg, x2, ws, dx2, dws, role: str) -> None:
        """linear_bwd from the gradient already cast: gq [m, Σn] and its transpose gt, site sg."""
        m, k = x2.shape
        sw, _, wp = self._weights(ws)
        self.mm(gq, sg, "e5m2", wp, sw, "e4m3", dx2)
        sx = self._site(role + ".x", ws[0], "e4m3")
        if x2.dtype == np.uint8:  # the forward's LayerNorm kept x's cast, transposed
            xt = x2.reshape(k, m)
        else:
            xt = self._u8(f"xt{k}", (k, m))
            self.cast(x2, sx, "e4m3", qt=xt, record=False)
        at = 0
        for dw in dws:
            ni = dw.shape[1]
            self.mm(xt, sx, "e4m3", gt[at:at + ni], sg, "e5m2", dw, accumulate=True)
            at += ni

    def mlp_fwd(self, x2, w1, w2, h2, out2) -> None:
        """h2 = x2·W1 (16-bit, kept for the backward) and out2 = gelu(h2)·W2, a = gelu(h) in e4m3 made by
        the first product's epilogue (the cast pass instead where cuBLASLt offers no such algorithm,
        found on the first pass, or the backend's gelu_epilogue is off: ANDREA_GELU_EPILOGUE=0)."""
        if self.gelu_fused is None:  # chosen on the first pass, the eager one (which falls back if it must)
            self.gelu_fused = bool(self.be.gelu_epilogue and h2.shape[1] % 8 == 0)
        if not self.gelu_fused:
            self.linear_fwd(x2, (w1,), h2, "mlp1")
            self.linear_fwd(h2, (w2,), out2, "mlp2", gelu=True)  # sites keyed by w2: a = gelu(h) is its input
            return
        m, M = h2.shape
        sx, xq, sw1, wt1 = self._operand(x2, (w1,), "mlp1")
        sa = self._site("mlp2.x", w2, "e4m3")
        aq = self._u8(f"a{M}", (m, M))  # not x{M}: with M = k it would be xq, which this product reads
        if sa not in self.primed:  # a's first scale from its own amax: h made once without the epilogue
            self.mm(xq, sx, "e4m3", wt1, sw1, "e4m3", h2, fast=True)
            self.prime(sa, [h2], "e4m3", gelu=True)
        inv = self.inv.data.ptr
        lt = self.lt.data.ptr + 4 * 2 * INV_STRIDE * sa
        try:
            self._lt().matmul(xq, inv + 4 * INV_STRIDE * sx, "e4m3", wt1, inv + 4 * INV_STRIDE * sw1, "e4m3", aq,
                              fast=True, aux=h2, d_scale=lt, amax_d=lt + 4 * INV_STRIDE)
            self.gelu_fused_ran = True
        except NoAlgorithm as err:  # none on this GPU: found by the first layer of the eager first pass
            if self.gelu_fused_ran or cp.cuda.get_current_stream().is_capturing():
                raise  # (a shape met later, with layers already run the other way: not switched halfway)
            warnings.warn(f"fp8: cuBLASLt has no GELU epilogue writing e4m3 ({err}); a is cast from h instead")
            self.gelu_fused = False
            self.mm(xq, sx, "e4m3", wt1, sw1, "e4m3", h2, fast=True)
            self.cast(h2, sa, "e4m3", q=aq, gelu=True)
        sw2, wt2, _ = self.cast_weights((w2,))
        self.mm(aq, sa, "e4m3", wt2, sw2, "e4m3", out2, fast=True)

    def mlp_bwd(self, g2, x2, h, w1, w2, dx2, dw1, dw2, da) -> None:
        """da: a [m, M] 16-bit scratch for a's gradient. One pass over h and da (fp8_gelu_bwd_cast_tiles)
        casts h's gradient to e5m2 (and its transpose) and a = gelu(h) again for dW2, so neither
        h's gradient nor a is ever stored in 16 bits."""
        m, M = da.shape
        sg = self._site("mlp2.dy", w2, "e5m2")
        gq, gt = self._grad_cast(g2, m, sg)
        sw2, _, w2p = self._weights((w2,))
        self.mm(gq, sg, "e5m2", w2p, sw2, "e4m3", da)
        sa = self._site("mlp2.x", w2, "e4m3")
        sd = self._site("mlp1.dy", w1, "e5m2")
        # their own names: with M = d, g{M}/gt{M} would be the dout casts above, still to be read
        dq, dqt, aqt = self._u8(f"dh{M}", (m, M)), self._u8(f"dht{M}", (M, m)), self._u8(f"at{M}", (M, m))
        fn = self.be.kernel("fp8", "fp8_gelu_bwd_cast_tiles")  # FP8_TILES tiles of 64 x 64 a block, as the casts
        grid = (-(-M // CAST_COLS), (m + 63) // 64)

        def launch(outs, record, count):  # count_a: a's cast is counted here where the epilogue made a
            fn(grid, (256,), (da, h, np.int32(m), np.int32(M), *outs[:2], np.int32(sd), outs[2], np.int32(sa),
                              self.scale, self.amax_now, self.counts, np.int32(record), np.int32(count),
                              np.int32(count and bool(self.gelu_fused))))

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
        now = np.maximum(now, cp.asnumpy(self.lt[:n, 1, 0]))  # the epilogues' amaxes, as fp8_update takes them in
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
            self.lt[i, 0, 0] = site["scale"]
            self.lt[i, 1, 0] = -1.0
            self.counts[i] = cp.asarray(np.array(site["counts"], np.uint64))
            if site["primed"]:
                self.primed.add(i)
            else:
                self.primed.discard(i)

    def counts_dict(self) -> dict:
        """Values cast so far, and how many overflowed (saturated) or underflowed (to zero), over all
        sites; per role too ("qkv.x", "mlp1.dy", "w", ...). Where the first MLP product's epilogue
        casts a (gelu_fused), a's role ("mlp2.x") is counted by the backward's cast of a, at the same
        scale: training passes count it, forward-only passes (validation, warm-up) do not."""
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
