"""Matrix products through cuBLASLt, called with ctypes like cuBLAS in gemm.py, on a handle and
workspace of the backend's own:

- the 16-bit modes' products (the backend's gemm; the strided-batched q/k/v products stay on
  cuBLAS), with the algorithm that runs fastest: cuBLASLt's heuristic offers up to 8, and its first
  (cublasGemmEx's choice) ran the model's products up to 10 % slower than the best. A plan's first
  eager call times them all, replayed from CUDA graphs as training runs them (graph_times), and
  keeps the fastest (products of at least TUNE_MIN_WORK multiply-adds), recorded in a file per GPU
  and cuBLASLt version, so a resumed run on the same machine computes with the same algorithms
  (the same bits; the section of choices timed by five eager calls, before 2026-12-01, is not
  read, so a run resumed across that upgrade is timed again and may take other algorithms);
- the MLP's GELU as the epilogue of its first product (GELU_AUX writes a = gelu(h) and h in one
  pass). GELU's gradient as an epilogue (DGELU) is here for bench/mlp_gemm_bench.py, which found it
  no faster than the backend's pass;
- fp8 products with per-tensor scales read from the device (fp8.py), the MLP's first one with the
  GELU epilogue writing a = gelu(h) cast to e4m3 (at a scale read from the device, its amax written
  there) and h in 16 bits, where cuBLASLt offers that combination.

A plan (descriptors and algorithms) is made once per shape, layout and alignment; pointers that
change between calls (scales, the epilogue's h) are set on the descriptor before each call, host
work only, so the products can sit in a captured CUDA graph.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import json
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import cupy as cp
import numpy as np

from andrea.engine.cupy.gemm import _COMPUTE_32F, _CUDA_R_16BF, _CUDA_R_32F, _ONE, _OP_N, _OP_T, _ZERO, WORKSPACE_BYTES
from andrea.engine.cupy.gemm import check_status as _check
from andrea.engine.cupy.gemm import dtype_code as _dtype_code
from andrea.engine.cupy.gemm import loaded_library
from andrea.engine.cupy.weights import leading_dim

_CUDA_R_8F_E4M3, _CUDA_R_8F_E5M2 = 28, 29
FP8_TYPES = {"e4m3": _CUDA_R_8F_E4M3, "e5m2": _CUDA_R_8F_E5M2}
# cublasLt.h (CUDA 12 and 13)
_DESC_TRANSA, _DESC_TRANSB, _DESC_EPILOGUE, _DESC_AUX_POINTER, _DESC_AUX_LD = 3, 4, 7, 11, 12
_DESC_SM_COUNT_TARGET, _DESC_A_SCALE, _DESC_B_SCALE, _DESC_FAST_ACCUM = 15, 17, 18, 25
_DESC_D_SCALE, _DESC_AMAX_D, _DESC_AUX_DATA_TYPE = 20, 21, 22
EPILOGUE_DEFAULT, EPILOGUE_GELU_AUX, EPILOGUE_DGELU = 1, 32 | 128, 64 | 128
_PREF_MAX_WORKSPACE = 1
_PREF_MIN_ALIGNMENT = (5, 6, 7, 8)  # CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES
_HEURISTIC_BYTES = 96  # sizeof(cublasLtMatmulHeuristicResult_t); its algo (64 bytes) comes first
_ALGOS = 8  # heuristic results asked for
TUNE_REPS = 5  # calls per algorithm of the tuner before 2026-12-01 (bench/gemm_energy.py compares with it)
# the tuner replays each algorithm from a CUDA graph of TUNE_GRAPH_CALLS calls for about TUNE_MS ms
# (in two passes, in turn with the others): five eager calls could not tell the algorithms apart at
# B·T = 8192 and picked ones 6.5 % slower in sum than the fastest under graph replay, as training runs
TUNE_GRAPH_CALLS = 10
TUNE_MS = 10.0
TUNING_METHOD = "graph-timed"  # in the tuning file's section name: choices timed otherwise are not reused
# ANDREA_GEMM_TUNE=sustained (an option to measure, not the default): each plan's algorithms replayed
# for about TUNE_SUSTAINED_MS after TUNE_SUSTAINED_WARM_MS of replay of them all, nearer the power-capped
# clock a long training step runs at than TUNE_MS is (the 10 ms timing ran the MLP's weight gradients
# on tiles PyTorch's heuristic does not take, 16 % slower a call at ANDREA-480M B=8 in training)
TUNE_SUSTAINED_MS = 200.0
TUNE_SUSTAINED_WARM_MS = 100.0
TUNE_MODES = {"1": "graph", "graph": "graph", "sustained": "sustained", "0": "off", "off": "off"}
# products smaller than this (m·n·k) keep the heuristic's first algorithm: the training passes' products
# are larger (ANDREA-12M at B=8: 8192 x 384 x 1536), while generation makes a plan per prompt length
TUNE_MIN_WORK = 1 << 32


class NoAlgorithm(RuntimeError):
    """cuBLASLt offers no algorithm for a product as described (its types, epilogue, layouts)."""


_STATUS_NOT_SUPPORTED = 15  # cublasStatus_t CUBLAS_STATUS_NOT_SUPPORTED


def tune_mode_from_env() -> str:
    """How a plan's algorithm is chosen (ANDREA_GEMM_TUNE): "graph" (1, the default: the heuristic's
    candidates timed by graph replays of about TUNE_MS), "sustained" (replays of about TUNE_SUSTAINED_MS
    after a warm-up) or "off" (0: the heuristic's first, as cublasGemmEx takes)."""
    raw = os.environ.get("ANDREA_GEMM_TUNE", "1")
    if raw not in TUNE_MODES:
        raise ValueError(f"ANDREA_GEMM_TUNE={raw!r}: give 1 (or graph), sustained, or 0 (or off)")
    return TUNE_MODES[raw]


def tuning_method(mode: str, candidates: int) -> str:
    """The tuning file's section suffix of a tuning mode and candidate count: choices made another way
    (or among other candidates: an index means another algorithm) are not reused."""
    method = {"graph": TUNING_METHOD, "sustained": "sustained-timed"}[mode]
    return method if candidates == _ALGOS else f"{method} {candidates} candidates"


def tuning_path() -> Path:
    """Where tuned choices are kept: $ANDREA_GEMM_TUNING, else ~/.cache/andrea/cublaslt-tuning.json."""
    env = os.environ.get("ANDREA_GEMM_TUNING")
    return Path(env) if env else Path.home() / ".cache" / "andrea" / "cublaslt-tuning.json"


_TUNING: dict = {}  # (tuning file, "<GPU> cuBLASLt <version>") -> {plan: algorithm index}: this process's choices


def _read_tuning(path: Path) -> dict:
    """The tuning file's sections ({} where there is none; one that does not parse is a warning: it
    is a cache, timed again)."""
    if not path.exists():
        return {}
    try:
        store = json.loads(path.read_text())
        if not isinstance(store, dict):
            raise ValueError("not a JSON object")
        return store
    except (OSError, ValueError) as err:
        warnings.warn(f"{path}: unreadable GEMM tuning file ({err}); timing the algorithms again")
        return {}


def _write_tuning(path: Path, store: dict) -> None:
    """The store written to a temporary file beside it and renamed over it (a crash never leaves half a file)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(store, fh, indent=0, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def tuned_choice(section: str, plan: str, n_algos: int, time_them) -> int | None:
    """The algorithm index of `plan` on this GPU and cuBLASLt (`section`): this process's earlier
    choice, else the tuning file's, else time_them() (the index of the fastest, None if none ran),
    recorded there. The file is read and written under an exclusive lock (beside it), so the
    processes of one machine (data-parallel ranks, parallel jobs) take one choice per plan: the
    first to time it sets it. A directory that cannot be written keeps the choices in this process."""
    path = tuning_path()
    mine = _TUNING.setdefault((path, section), {})
    if plan in mine:
        return mine[plan]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_name(path.name + ".lock"), "a")
    except OSError as err:
        warnings.warn(f"{path}: GEMM tuning not saved ({err}); a later run times the algorithms again")
        lock = None
    try:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        store = _read_tuning(path)
        known = store.get(section, {}).get(plan) if isinstance(store.get(section), dict) else None
        if isinstance(known, int) and not isinstance(known, bool) and 0 <= known < n_algos:
            mine[plan] = known
            return known
        best = time_them()
        if best is not None:
            mine[plan] = best
            if not isinstance(store.get(section), dict):
                store[section] = {}
            store[section][plan] = best
            if lock is not None:
                try:
                    _write_tuning(path, store)
                except OSError as err:
                    warnings.warn(f"{path}: GEMM tuning not saved ({err}); a later run times the algorithms again")
        return best
    finally:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()


def _section(lib) -> str:
    """This GPU's and cuBLASLt's section of the tuning file: a choice holds for both."""
    lib.cublasLtGetVersion.restype = ctypes.c_size_t
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    return f"{name} cuBLASLt {lib.cublasLtGetVersion()}"


@dataclass
class _Plan:
    """A product's descriptor, layouts and preference (ctypes handles kept alive here), the
    heuristic's algorithms, the index of the one in use (None until the first call), the plan's
    name in the tuning file, what it computes (for errors), and whether it is large enough to tune."""

    desc: ctypes.c_void_p
    layouts: list  # cuBLASLt's A, B, C and, where its type differs from C's, D
    pref: ctypes.c_void_p
    results: object
    algos: list
    chosen: int | None
    name: str
    what: str
    tunable: bool


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    """libcublasLt with the argument types of the calls made here."""
    lib = loaded_library("libcublasLt")
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


def graph_times(call, n: int, calls: int = TUNE_GRAPH_CALLS, ms: float = TUNE_MS, warm_ms: float = 0.0) -> list[float]:
    """ms per call of algorithms 0..n-1 as a CUDA graph replays them: call(i) enqueues one call of
    algorithm i on the current stream and returns its status (nonzero: it does not run here; its time
    is inf). Each runs once eagerly (the warm-up), is captured `calls` times into a graph of its own,
    and is replayed for about `ms` in all, in two passes (forward, then backward through the
    algorithms, so that none is timed only at the GPU's coolest or hottest), after about `warm_ms` of
    replays of them all in turn (untimed: the clock settling under load). An algorithm whose
    capture fails is skipped (inf) like one whose call fails. The work runs on a stream of its own
    between two device synchronizations, so it neither waits on nor races the caller's (and must
    not run while another thread captures)."""
    cp.cuda.Device().synchronize()  # the operands are written
    stream = cp.cuda.Stream(non_blocking=True)
    graphs: dict = {}
    with stream:
        for i in range(n):
            if call(i) != 0:
                continue
            stream.begin_capture()
            try:
                try:
                    ok = all([call(i) == 0 for _ in range(calls)])
                finally:
                    graph = stream.end_capture()  # also after a failure: never leave the stream capturing
            except cp.cuda.runtime.CUDARuntimeError:  # a capture the algorithm invalidated
                continue
            if ok:
                graphs[i] = graph
        for graph in graphs.values():  # the first replay uploads the graph
            graph.launch(stream)
        stream.synchronize()
        one = {}
        for i, graph in graphs.items():
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            one[i] = max(cp.cuda.get_elapsed_time(start, end), 1e-3)
        if warm_ms > 0 and graphs:
            for i in graphs:
                for _ in range(max(1, round(warm_ms / len(graphs) / one[i]))):
                    graphs[i].launch(stream)
            stream.synchronize()
        total = dict.fromkeys(graphs, 0.0)
        replays = dict.fromkeys(graphs, 0)
        order = list(graphs)
        for sweep in (order, order[::-1]):
            for i in sweep:
                reps = max(1, round(ms / 2 / len(graphs) / one[i]))
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record(stream)
                for _ in range(reps):
                    graphs[i].launch(stream)
                end.record(stream)
                end.synchronize()
                total[i] += cp.cuda.get_elapsed_time(start, end)
                replays[i] += reps
    cp.cuda.Device().synchronize()
    return [total[i] / (replays[i] * calls) if i in graphs else float("inf") for i in range(n)]


def _alignment(ptr: int) -> int:
    """The largest power of two up to 256 that divides a pointer."""
    return min(256, ptr & -ptr) if ptr else 256


class Lt:
    """A cuBLASLt handle, its workspace, and a plan (descriptors and the heuristic's algorithms) per
    shape, layout and alignment."""

    def __init__(self, tune: bool | None = None, workspace=None, candidates: int = _ALGOS):
        # (first: a bad ANDREA_GEMM_TUNE is an error before a handle or workspace is made)
        self.tune_mode = tune_mode_from_env() if tune is None else ("graph" if tune else "off")
        self.tune = self.tune_mode != "off"
        self.lib = lib = _library()
        self.candidates = candidates  # heuristic results asked for per plan (bench/gemm_energy.py --algos asks more)
        self.handle = ctypes.c_void_p()
        _check(lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        # fixed: a captured graph may use it; `workspace` (WORKSPACE_BYTES): one shared with a cuBLAS
        # handle whose products run on the same stream, never at the same time as these
        self.workspace = cp.empty(WORKSPACE_BYTES, dtype=cp.uint8) if workspace is None else workspace
        if self.workspace.nbytes < WORKSPACE_BYTES:
            raise ValueError(f"cuBLASLt needs a workspace of {WORKSPACE_BYTES} bytes, got {self.workspace.nbytes}")
        self.plans: dict = {}
        # time the heuristic's algorithms on a plan's first eager call and keep the fastest: cuBLAS's
        # first choice ran the model's products up to 10 % slower than the best (bench/mlp_gemm_bench.py)

    def _set(self, desc, attr: int, value) -> None:
        _check(self.lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(value), ctypes.sizeof(value)),
               f"cublasLtMatmulDescSetAttribute({attr})")

    def _plan(self, key, attrs, layouts, align, what: str, work: int) -> _Plan:
        """The plan of `key`, made on first use: a descriptor with attrs [(attribute, ctypes value)]
        (set before the heuristic: an algorithm chosen without them may not take them), layouts
        [(type, rows, cols, ld)] of cuBLASLt's A, B and C (= D), or A, B, C and D (a D of another type:
        an fp8 output), the operands' alignments; work: m·n·k."""
        plan = self.plans.get(key)
        if plan is not None:
            return plan
        lib = self.lib
        desc = ctypes.c_void_p()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _COMPUTE_32F, _CUDA_R_32F), "cublasLtMatmulDescCreate")
        for attr, value in attrs:
            self._set(desc, attr, value)
        lays = []
        for dtype, rows, cols, ld in layouts:
            lay = ctypes.c_void_p()
            _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dtype, rows, cols, ld), "cublasLtMatrixLayoutCreate")
            lays.append(lay)
        pref = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        ws = ctypes.c_uint64(WORKSPACE_BYTES)
        _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE, ctypes.byref(ws), 8), "set workspace")
        for attr, value in zip(_PREF_MIN_ALIGNMENT, align):  # the operands' own alignment (default: 256 bytes)
            v = ctypes.c_uint32(value)
            _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, attr, ctypes.byref(v), 4), "set alignment")
        results = (ctypes.c_ubyte * (_HEURISTIC_BYTES * self.candidates))()
        count = ctypes.c_int32(0)
        status = lib.cublasLtMatmulAlgoGetHeuristic(self.handle, desc, *lays[:3], lays[-1], pref, self.candidates,
                                                    ctypes.byref(results), ctypes.byref(count))
        if status == _STATUS_NOT_SUPPORTED or (status == 0 and count.value < 1):
            raise NoAlgorithm(f"cuBLASLt has no algorithm for {what} (layouts (type, rows, cols, ld) of its A, B, C"
                              f"{' and D' if len(layouts) > 3 else ''}: {layouts}; operand alignments {align} bytes)")
        _check(status, "cublasLtMatmulAlgoGetHeuristic")
        algos = [ctypes.addressof(results) + i * _HEURISTIC_BYTES for i in range(count.value)]
        plan = self.plans[key] = _Plan(desc, lays, pref, results, algos, None, repr(key), what, work >= TUNE_MIN_WORK)
        return plan

    def _call(self, plan: _Plan, algo, a_lt, b_lt, c_ptr: int, beta, alpha, d_ptr: int | None = None) -> int:
        la, lb, lc, ld = plan.layouts + plan.layouts[2:] if len(plan.layouts) == 3 else plan.layouts
        return self.lib.cublasLtMatmul(
            self.handle, plan.desc, alpha.ctypes.data, a_lt.data.ptr, la, b_lt.data.ptr, lb, beta.ctypes.data,
            c_ptr, lc, c_ptr if d_ptr is None else d_ptr, ld, algo, self.workspace.data.ptr, WORKSPACE_BYTES,
            cp.cuda.get_current_stream().ptr)

    def _run(self, plan: _Plan, a_lt, b_lt, c, accumulate: bool, alpha=_ONE, d=None) -> None:
        """D = alpha · A_lt · B_lt (+ C with `accumulate`) with the plan's algorithm: the fastest where
        tuning is on (see _tune), else the heuristic's first that runs. D is c, or d (another type:
        then C is not read, and c only names a matrix of C's type)."""
        beta = _ONE if accumulate else _ZERO
        d_ptr = None if d is None else d.data.ptr
        if plan.chosen is None and self.tune and plan.tunable and len(plan.algos) > 1 and \
                not cp.cuda.get_current_stream().is_capturing():
            plan.chosen = self._tune(plan, a_lt, b_lt, c, beta, alpha, d)
        if plan.chosen is not None:
            if self._call(plan, plan.algos[plan.chosen], a_lt, b_lt, c.data.ptr, beta, alpha, d_ptr) == 0:
                return
            plan.chosen, plan.tunable = None, False  # (a recorded choice that does not run here) the first that runs
        status = None
        for i, algo in enumerate(plan.algos):
            status = self._call(plan, algo, a_lt, b_lt, c.data.ptr, beta, alpha, d_ptr)
            if status == 0:
                plan.chosen = i
                return
        _check(status, f"cublasLtMatmul ({plan.what}, {len(plan.algos)} algorithms tried)")

    def _tune(self, plan: _Plan, a_lt, b_lt, c, beta, alpha, d=None) -> int | None:
        """The index of the plan's fastest algorithm among the heuristic's (tuned_choice: timed once
        per machine, then read from the tuning file, so a resumed run takes the same algorithms and
        computes the same bits), each timed by graph_times: into c (or d) where the product overwrites
        it (the call after the tuning writes it again), into a scratch output where it accumulates
        (c's sum stays untouched)."""

        def time_them():
            out = c if beta is _ZERO else cp.zeros((c.shape[0], leading_dim(c)), dtype=c.dtype)
            d_ptr = None if d is None else d.data.ptr
            timing = {"ms": TUNE_SUSTAINED_MS, "warm_ms": TUNE_SUSTAINED_WARM_MS} if self.tune_mode == "sustained" else {}
            times = graph_times(lambda i: self._call(plan, plan.algos[i], a_lt, b_lt, out.data.ptr, beta, alpha, d_ptr),
                                len(plan.algos), **timing)
            best = min(range(len(times)), key=times.__getitem__)
            return None if times[best] == float("inf") else best

        section = f"{_section(self.lib)} {tuning_method(self.tune_mode, self.candidates)}"
        return tuned_choice(section, plan.name, len(plan.algos), time_them)

    def matmul(self, a, a_inv, ta: str, bt, b_inv, tb: str, c, accumulate: bool = False, fast: bool = False,
               aux=None, d_scale: int = 0, amax_d: int = 0) -> None:
        """fp8: row-major c [m, n] (bf16 or fp32) = (a · btᵀ) · a_inv · b_inv, or += with `accumulate`:
        a [m, k] and bt [n, k] fp8 (formats ta, tb), both k-contiguous ("TN", as Hopper's fp8 tensor
        cores take them); a_inv, b_inv device pointers to the operands' inverse scales (16-byte
        aligned). `fast`: fp8 accumulation without cuBLASLt's periodic promotion to fp32 (the
        forward products, as Transformer Engine does).

        With `aux` (bf16 [m, n], rows a multiple of 8 elements apart), the GELU epilogue: aux = the
        product, and c (uint8 [m, n]) = gelu(product) · *d_scale in e4m3, rounded to nearest and
        saturated, with *amax_d = max |gelu(product)| (d_scale, amax_d: device pointers, 16-byte
        aligned). Raises NoAlgorithm where cuBLASLt has none for it (fp8.py then casts)."""
        m, k = a.shape
        n = bt.shape[0]
        if bt.shape[1] != k or c.shape != (m, n):
            raise ValueError(f"fp8 matmul shapes: a {a.shape}, bt {bt.shape}, c {c.shape}")
        scales = [ctypes.c_void_p(b_inv), ctypes.c_void_p(a_inv)]
        # column-major: D [n, m] = A_ltᵀ · B_lt with A_lt = bt and B_lt = a; a plan per alignment (fp32
        # gradient views into the flat buffer may sit only 16 bytes apart from a 256-byte boundary)
        attrs = [(_DESC_A_SCALE, scales[0]), (_DESC_B_SCALE, scales[1]), (_DESC_TRANSA, ctypes.c_int32(_OP_T)),
                 (_DESC_TRANSB, ctypes.c_int32(_OP_N)), (_DESC_FAST_ACCUM, ctypes.c_int8(1 if fast else 0))]
        lays = [(FP8_TYPES[tb], k, n, k), (FP8_TYPES[ta], k, m, k)]
        if aux is None:
            tc = _CUDA_R_32F if c.dtype == np.float32 else _CUDA_R_16BF
            lays.append((tc, n, m, n))
            align = tuple(_alignment(x.data.ptr) for x in (bt, a, c, c))
        else:
            aux_ld = leading_dim(aux)
            if c.dtype != np.uint8 or aux.shape != (m, n) or _dtype_code(aux) != _CUDA_R_16BF or accumulate or \
                    aux_ld is None or aux_ld % 8 or not (d_scale and amax_d):
                raise ValueError(f"fp8 GELU epilogue: c {c.shape} {c.dtype} must be uint8 (e4m3), aux {aux.shape} "
                                 f"{aux.dtype} bf16 [m, n] with rows a multiple of 8 apart, no accumulation, and "
                                 "d_scale and amax_d given")
            tc = _CUDA_R_16BF  # C (never read: beta is 0) has aux's type, D is e4m3
            lays += [(tc, n, m, n), (_CUDA_R_8F_E4M3, n, m, n)]
            align = tuple(_alignment(x.data.ptr) for x in (bt, a, aux, c))
            attrs += [(_DESC_EPILOGUE, ctypes.c_uint32(EPILOGUE_GELU_AUX)),
                      (_DESC_AUX_POINTER, ctypes.c_void_p(aux.data.ptr)), (_DESC_AUX_LD, ctypes.c_int64(aux_ld)),
                      (_DESC_AUX_DATA_TYPE, ctypes.c_int32(_CUDA_R_16BF)),
                      (_DESC_D_SCALE, ctypes.c_void_p(d_scale)), (_DESC_AMAX_D, ctypes.c_void_p(amax_d))]
        key = ("fp8", m, n, k, ta, tb, tc, fast, align) + (() if aux is None else ("gelu", leading_dim(aux),
                                                                                  _alignment(aux.data.ptr)))
        what = f"fp8 m={m} n={n} k={k}, {ta} x {tb}" + (", GELU epilogue to e4m3" if aux is not None else "")
        plan = self._plan(key, attrs, lays, align, what, m * n * k)
        for attr, value in attrs:
            if attr in (_DESC_A_SCALE, _DESC_B_SCALE, _DESC_AUX_POINTER, _DESC_D_SCALE, _DESC_AMAX_D):
                self._set(plan.desc, attr, value)
        if aux is None:
            self._run(plan, bt, a, c, accumulate)
        else:
            self._run(plan, bt, a, aux, False, d=c)

    def gemm(self, a, b, c, ta: bool = False, tb: bool = False, accumulate: bool = False, alpha: float = 1.0,
             epilogue: int = EPILOGUE_DEFAULT, aux=None, sm_count: int = 0) -> None:
        """16-bit operands: row-major c [m, n] (16-bit or fp32) = epilogue(alpha · op(a) · op(b)), or +=
        with `accumulate`, with fp32 accumulation; a, b, c may be strided row views (unit column
        stride). EPILOGUE_GELU_AUX: c = gelu(·) and aux [m, n] = the product before it;
        EPILOGUE_DGELU: c = (·) ⊙ gelu'(aux). aux is 16-bit like c, with rows a multiple of 8
        elements apart (cuBLASLt's condition). sm_count: run on about that many SMs (0: all), leaving
        the rest to kernels of another stream (cuBLASLt's SM_COUNT_TARGET, a plan of its own)."""
        m, n = c.shape
        k = a.shape[0] if ta else a.shape[1]
        if (b.shape[1] if tb else b.shape[0]) != k or (a.shape[1] if ta else a.shape[0]) != m or \
                (b.shape[0] if tb else b.shape[1]) != n:
            raise ValueError(f"cuBLASLt gemm shapes: a {a.shape}{'ᵀ' if ta else ''}, b {b.shape}{'ᵀ' if tb else ''}, "
                             f"c {c.shape}")
        ldc = leading_dim(c)
        aux_ld = 0
        if epilogue != EPILOGUE_DEFAULT:
            if aux is None or aux.shape != c.shape or aux.dtype != c.dtype:
                raise ValueError(f"epilogue {epilogue} needs an aux matrix shaped and typed like c {c.shape} {c.dtype}")
            aux_ld = leading_dim(aux)
        if None in (leading_dim(a), leading_dim(b), ldc, aux_ld):
            raise ValueError("cuBLASLt gemm: every operand must be a 2-D row-major view with unit column stride")
        # row-major c = op(a)·op(b) is column-major cᵀ [n, m] = op(b)ᵀ · op(a)ᵀ: cuBLASLt's A is b (stored
        # column-major [n, k], or [k, n] transposed), its B is a
        lay_a = (_dtype_code(b), k if tb else n, n if tb else k, leading_dim(b))
        lay_b = (_dtype_code(a), m if ta else k, k if ta else m, leading_dim(a))
        lay_c = (_dtype_code(c), n, m, ldc)
        align = tuple(_alignment(x.data.ptr) for x in (b, a, c, c))
        aux_align = 0 if aux is None else _alignment(aux.data.ptr)  # the heuristic reads the aux pointer's alignment
        key = ("h16", lay_a, lay_b, lay_c, ta, tb, epilogue, aux_ld, align, aux_align) + ((sm_count,) if sm_count else ())
        what = f"m={m} n={n} k={k}{' with an epilogue' if aux is not None else ''}{f' on {sm_count} SMs' if sm_count else ''}"
        attrs = [(_DESC_TRANSA, ctypes.c_int32(_OP_T if tb else _OP_N)), (_DESC_TRANSB, ctypes.c_int32(_OP_T if ta else _OP_N)),
                 (_DESC_EPILOGUE, ctypes.c_uint32(epilogue))]
        if sm_count:
            attrs.append((_DESC_SM_COUNT_TARGET, ctypes.c_int32(sm_count)))
        if aux is not None:
            attrs += [(_DESC_AUX_POINTER, ctypes.c_void_p(aux.data.ptr)), (_DESC_AUX_LD, ctypes.c_int64(aux_ld))]
        plan = self._plan(key, attrs, [lay_a, lay_b, lay_c], align, what, m * n * k)
        if aux is not None:
            self._set(plan.desc, _DESC_AUX_POINTER, ctypes.c_void_p(aux.data.ptr))
        self._run(plan, b, a, c, accumulate, _ONE if alpha == 1.0 else np.full(1, alpha, dtype=np.float32))

    def close(self) -> None:
        if self.handle:
            _check(self.lib.cublasLtDestroy(self.handle), "cublasLtDestroy")
            self.handle = ctypes.c_void_p()
        self.workspace = None
