"""Causal self-attention on Hopper's warp-group tensor cores (kernels/attention_wgmma.cu: wgmma.mma_async
with shared-memory matrix descriptors, FlashAttention-3's schedule), forward and backward, on the
buffers of attention_mma.py: one [B, T, 3, H, D] 16-bit qkv buffer with strides, y and dy [B, T, H·D]
16-bit, lse [B, H, T] fp32 (the log-sum-exp of each score row, as attention_mma and cuDNN save it), dq,
dk, dv written into a buffer shaped like qkv.

The forward runs in two builds (kernels/attention_wgmma.cu says how): every thread loading with cp.async
(the default), or warp-specialized (-DFWD_WS=1): a producer warp group moving tiles with the
tensor-memory accelerator from tensor maps made here (cuTensorMapEncodeTiled, the CUDA driver's, through
ctypes: CuPy does not expose it), one tile a CTA or, with the launcher's own define FWD_PERSIST=1, as
many CTAs as the SMs hold, each looping over tiles.

The backward, by flash_bwd's flags:
  deterministic=True, fused=False   (the default) dQ and dK/dV in two kernels, no atomics; delta first
                                    (flash_bwd_prep)
  deterministic=False               one pass (flash_bwd_fused) that sums dq with fp32 atomics into a
                                    zeroed accumulator, then flash_bwd_dq_convert: NOT deterministic (the
                                    low bits of dq change from run to run)
  deterministic=True, fused=True    the same pass with the key blocks' dq sums ordered by semaphores
                                    (FlashAttention-3's deterministic mode): the same bits every run
The fused ones start with flash_bwd_prep (delta, and the zeroing the atomic sums need).

wgmma exists only on the architecture sm_90a (H100/H200, compute capability 9.0 exactly), which CuPy's
RawModule does not target: it appends its own -arch=sm_<cc> to the options, and it derives that from
the device's compute capability as a number. So these kernels are compiled here with NVRTC directly
(cupy.cuda.nvrtc, -arch=sm_90a: a cubin) and the cubin loaded with cupy.cuda.function.Module, with
the production loader's options otherwise (kernels.py: -std=c++17 -I<kernels> -lineinfo
-DHEAD_DIM=<D>, the backend's -D defines; CuPy's include folders and -ftz=true, as RawModule adds).
Each direction is built alone (-DWG_KERNELS=<mask>). ANDREA_WGMMA_CUBIN_CACHE=<folder> keeps the cubins
there, keyed by source and options (dev/cuda/attention_wgmma.py compiles its variants in parallel
processes that way).

attention.py runs PRODUCTION_FWD (the warp-specialized, ping-pong, persistent forward: the fastest variant of
dev/cuda/attention_wgmma.py at five of the six model shapes, 2 % behind the best at the sixth) where fwd_takes
says it can, and PRODUCTION_BWD where bwd_takes does; elsewhere attention_mma's kernels, whose lse is the
same quantity ((m + log2 l)·ln 2 per row), so either backward follows either forward.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import hashlib
import math
import os

import cupy as cp
import numpy as np

from andrea.engine.cupy.attention_mma import _mma_args
from andrea.engine.cupy.kernels import KERNELS, blocks

ARCH = "sm_90a"
CAPABILITY = "90"  # the only compute capability an sm_90a cubin runs on
HEAD_DIMS = (16, 32, 64)  # attention_wgmma.cu: a tile row of D 16-bit values is one swizzle atom (32, 64, 128 bytes)
# kernels/attention_wgmma.cu's defaults, overridden by -D defines of the same names (dev/cuda variants):
# warp groups per CTA, keys (or, for dK/dV, queries) per streamed tile, ring stages, the warp-specialized
# forward (FWD_MINB None: the .cu's default, 2 CTAs an SM where the tiles are small), the dK/dV overlap
CONFIG = {"FWD_WS": 0, "FWD_WG": 2, "FWD_BN": 64, "FWD_STAGES": 3, "FWD_MINB": None, "FWD_PERSIST": 0,
          "DQ_WG": 2, "DQ_BN": 64, "DQ_STAGES": 3, "KV_WG": 2, "KV_BM": 64, "KV_STAGES": 3, "KV_OVERLAP": 0}
LAUNCHER_ONLY = ("FWD_PERSIST",)  # read here, never passed to the compiler
# the forward attention.py dispatches: on an H200 faster than mma.sync's at all six model shapes and the fastest
# variant at five (BENCHMARKS.md, "Hopper attention of our own, round two": 0.0563 ms at 120M B=8 against
# mma.sync's 0.0842; at 12M B=32 0.1693 against the best variant's 0.1656)
PRODUCTION_FWD = ("FWD_WS=1", "FWD_BN=128", "FWD_PINGPONG=1", "FWD_PERSIST=1", "FWD_SKIP_RESCALE=1")
# the backward attention.py dispatches (the two-kernel, deterministic one, one warp group a CTA, the dK/dV
# products of one query tile under the next one's exponentials): the fastest deterministic variant at all six
# model shapes on an H200, in 26-36 % less time than mma.sync and within 6 % of cuDNN's; see
# BENCHMARKS.md, "Hopper attention of our own, round three"
PRODUCTION_BWD = ("DQ_WG=1", "KV_WG=1", "KV_OVERLAP=1")
# WG_KERNELS masks: the kernels each direction builds
FWD_KERNELS, BWD_SPLIT_KERNELS, BWD_FUSED_KERNELS = 1, 2 | 4 | 16, 8 | 16
KERNEL_BITS = {"flash_fwd": 1, "flash_bwd_dq": 2, "flash_bwd_dkdv": 4, "flash_bwd_fused": 8, "flash_bwd_prep": 16,
               "flash_bwd_dq_convert": 16}


@functools.lru_cache(maxsize=None)
def config(defines: tuple = ()) -> dict:
    """CONFIG with `defines` ("FWD_BN=128", ...) applied (cached: read it, do not change it)."""
    cfg = dict(CONFIG)
    for d in defines:
        name, _, value = d.partition("=")
        if name in cfg:
            cfg[name] = int(value)
    if cfg["FWD_MINB"] is None:
        cfg["FWD_MINB"] = 1 if cfg["FWD_WS"] else (2 if cfg["FWD_WG"] * cfg["FWD_BN"] <= 128 else 1)
    return cfg


@functools.lru_cache(maxsize=None)
def compile_defines(defines: tuple, mask: int) -> tuple:
    """The -D defines of a build: `defines` without the launcher's own, and the kernels it holds."""
    kept = tuple(d for d in defines if d.partition("=")[0] not in LAUNCHER_ONLY)
    return kept if any(d.startswith("WG_KERNELS=") for d in kept) else kept + (f"WG_KERNELS={mask}",)


@functools.lru_cache(maxsize=None)
def launch(kernel_name: str, D: int, defines: tuple = ()) -> tuple:
    """(rows a CTA owns, threads per CTA, bytes of dynamic shared memory) of a kernel: the .cu's
    FWD_BM/DQ_BM/KV_BN, *_NT and *_SMEM (1 KB to align the base to 1024 bytes, then the tiles)."""
    c, rb = config(defines), 2 * D  # bytes per tile row
    if kernel_name == "flash_fwd":  # Q; K and V stages (FWD_WS: a producer warp group and the mbarriers)
        rows, st = 64 * c["FWD_WG"], c["FWD_STAGES"]
        smem = 1024 + rows * rb + 2 * st * c["FWD_BN"] * rb
        if c["FWD_WS"]:
            return rows, 128 * c["FWD_WG"] + 128, smem + 8 * (2 * st + 2)
        return rows, 128 * c["FWD_WG"], smem
    if kernel_name == "flash_bwd_dq":  # Q, dO; K and V stages
        rows = 64 * c["DQ_WG"]
        return rows, 128 * c["DQ_WG"], 1024 + 2 * rows * rb + 2 * c["DQ_STAGES"] * c["DQ_BN"] * rb
    if kernel_name in ("flash_bwd_dkdv", "flash_bwd_fused"):  # K, V; Q, dO, lse and delta stages (fused: dSᵀ, exchange)
        rows, st = 64 * c["KV_WG"], c["KV_STAGES"]
        bm = 64 if kernel_name == "flash_bwd_fused" else c["KV_BM"]  # the fused pass's query tiles are 64 always
        smem = 1024 + 2 * rows * rb + 2 * st * bm * rb + 2 * st * bm * 4
        if kernel_name == "flash_bwd_fused":
            smem += rows * 128 + (64 * D * 4 if c["KV_WG"] == 2 else 0)
        return rows, 128 * c["KV_WG"], smem
    raise ValueError(f"attention_wgmma has no kernel {kernel_name!r} with a tiled launch")


def cache_dir() -> str | None:
    """Where cubins are kept: ANDREA_WGMMA_CUBIN_CACHE, else a folder in CuPy's kernel cache (as CuPy keeps
    the other kernels' builds, so a training run does not compile them again); "" or "0": nowhere."""
    cache = os.environ.get("ANDREA_WGMMA_CUBIN_CACHE")
    if cache is None:  # CuPy's own rule for its cache (CUPY_CACHE_DIR, else ~/.cupy/kernel_cache); no public API gives it
        base = os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser("~/.cupy/kernel_cache")
        return None if base.startswith("~") else os.path.join(base, "andrea_wgmma")  # no home to expand: no cache
    return None if cache in ("", "0") else cache


def takes(D: int) -> bool:
    """The head sizes the kernels are written for, on a device that runs sm_90a code."""
    return D in HEAD_DIMS and cp.cuda.Device().compute_capability == CAPABILITY


def cubin(name: str, head_dim: int, defines: tuple = ()) -> bytes:
    """kernels/<name>.cu compiled by NVRTC for sm_90a with -DHEAD_DIM=<head_dim> and -D<d> for each
    define: the cubin (no GPU needed; from ANDREA_WGMMA_CUBIN_CACHE's folder when it holds it)."""
    from cupy._core.core import assemble_cupy_compiler_options  # CuPy's include folders (CUDA's headers, CCCL)
    from cupy.cuda import nvrtc

    path = KERNELS / f"{name}.cu"
    if not path.exists():
        raise FileNotFoundError(f"{path}: CUDA sources not found (reinstall the package, or set ANDREA_KERNELS to the kernels/ folder of a checkout)")
    opts = ("-std=c++17", f"-I{KERNELS}", "-lineinfo", f"-DHEAD_DIM={head_dim}") + tuple(f"-D{d}" for d in defines)
    opts = assemble_cupy_compiler_options(opts) + ("-ftz=true", f"-arch={ARCH}")
    source = path.read_text()
    cache = cache_dir()
    if cache:
        headers = "".join(p.read_text() for p in sorted(KERNELS.glob("*.cuh")))
        key = hashlib.sha256("\0".join((source, headers, str(nvrtc.getVersion())) + opts).encode()).hexdigest()
        hit = os.path.join(cache, f"{name}-{key[:32]}.cubin")
        try:
            with open(hit, "rb") as f:
                return f.read()
        except OSError:  # not there yet, or unreadable: compile
            pass
    prog = nvrtc.createProgram(source, path.name, (), ())
    try:
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as err:
            raise RuntimeError(f"NVRTC could not compile {path.name} for {ARCH} {defines}: {err}\n{nvrtc.getProgramLog(prog)}") from None
        code = nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    if cache:
        tmp = f"{hit}.{os.getpid()}"
        try:
            os.makedirs(cache, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(code)
            os.replace(tmp, hit)  # whole or absent: parallel compilers of the same key race harmlessly
        except OSError as err:  # a read-only or full disk costs the next process a compile, never this run
            _warn_once(f"the wgmma cubin cache {cache} cannot be written ({err}); compiling without it")
    return code


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    import logging

    logging.getLogger(__name__).warning(message)


@functools.lru_cache(maxsize=None)
def module(name: str, head_dim: int, defines: tuple = (), device: int = 0) -> cp.cuda.function.Module:
    """The cubin of kernels/<name>.cu (see cubin) loaded on `device` (a module is per device)."""
    code = cubin(name, head_dim, defines)
    with cp.cuda.Device(device):
        mod = cp.cuda.function.Module()
        mod.load(code)
    return mod


@functools.lru_cache(maxsize=None)
def _function(name: str, function: str, head_dim: int, defines: tuple, device: int, smem: int):
    f = module(name, head_dim, defines, device).get_function(function)
    if smem > 48 * 1024:  # more than the default cap of dynamic shared memory: ask for it
        cp.cuda.driver.funcSetAttribute(f.ptr, cp.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
    return f


def kernel(name: str, function: str, head_dim: int, defines: tuple = (), smem: int = 0):
    """The kernel `function` of kernels/<name>.cu for the current device (see module), allowed `smem`
    bytes of dynamic shared memory."""
    return _function(name, function, head_dim, tuple(defines), cp.cuda.runtime.getDevice(), smem)


def wg_kernel(function: str, D: int, defines: tuple, smem: int = 0, mask: int | None = None):
    """attention_wgmma.cu's `function`, built with the kernels of its direction (compile_defines; `mask`:
    the build to take it from where two hold it: flash_bwd_prep is in both backward builds)."""
    bit = KERNEL_BITS[function]
    if mask is None:
        mask = FWD_KERNELS if bit == 1 else BWD_SPLIT_KERNELS if bit in (2, 4) else BWD_FUSED_KERNELS
    return kernel("attention_wgmma", function, D, compile_defines(tuple(defines), mask), smem)


def _run(name: str, D: int, T: int, BH: int, defines: tuple, args: tuple) -> None:
    rows, threads, smem = launch(name, D, defines)
    wg_kernel(name, D, defines, smem)(((T + rows - 1) // rows, BH), (threads,), args, shared_mem=smem)


def _heads(qkv) -> tuple:
    B, T, H, D, ptrs, strides = _mma_args(qkv)
    if D not in HEAD_DIMS:
        raise ValueError(f"head_dim {D}: attention_wgmma takes {HEAD_DIMS}")
    return B, T, H, D, ptrs, strides


# ----------------------------------------------------------------------------- tensor maps (FWD_WS)

# cuda.h's enumerators (CUDA 12/13): 16-bit elements copied as raw bits (the zero fill past T is the same
# for bf16 and fp16), no interleave, the swizzle matching a tile row of 128/64/32 bytes, L2 lines of 256 bytes
_U16, _INTERLEAVE_NONE, _L2_256B, _OOB_ZEROS = 1, 0, 3, 0
_SWIZZLE = {128: 3, 64: 2, 32: 1}


@functools.lru_cache(maxsize=None)
def _encode_tiled():
    lib = ctypes.CDLL("libcuda.so.1")  # the driver, already loaded by CuPy
    f = lib.cuTensorMapEncodeTiled
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                  ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    f.restype = ctypes.c_int
    return f


def tensor_map(ptr: int, B: int, T: int, H: int, D: int, rows: int) -> bytes:
    """The 128-byte CUtensorMap of a [B, T, 3, H, D] 16-bit buffer at device address ptr seen as the 5-D
    tensor (D, H, 3, T, B) (innermost first, packed), a box of `rows` rows of one head's q, k or v:
    what flash_fwd's TMA copies read (rows past T come as zeros)."""
    C = H * D
    dims = (ctypes.c_uint64 * 5)(D, H, 3, T, B)
    strides = (ctypes.c_uint64 * 4)(2 * D, 2 * C, 2 * 3 * C, 2 * 3 * C * T)  # bytes, of dims 1..4
    box = (ctypes.c_uint32 * 5)(D, 1, 1, rows, 1)
    unit = (ctypes.c_uint32 * 5)(1, 1, 1, 1, 1)
    buf = ctypes.create_string_buffer(128 + 64)
    at = (ctypes.addressof(buf) + 63) // 64 * 64  # the map must be 64-byte aligned
    rc = _encode_tiled()(at, _U16, 5, ptr, dims, strides, box, unit, _INTERLEAVE_NONE, _SWIZZLE[2 * D], _L2_256B,
                         _OOB_ZEROS)
    if rc != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {rc} (B={B} T={T} H={H} D={D} rows={rows})")
    return ctypes.string_at(at, 128)


# key -> the maps on the device, least recently used first. Those a CUDA graph was captured with are never
# dropped (the graph reads them for as long as it lives: a few hundred bytes per buffer, shape and boxes; a
# training engine's buffers are made once); of the rest (eager calls: generation's prompts of every length)
# the least recently used go beyond MAX_EAGER_MAPS
_MAPS: collections.OrderedDict = collections.OrderedDict()
_CAPTURED: set = set()
MAX_EAGER_MAPS = 256


def _map_key(qkv, box_q: int, box_kv: int) -> tuple:
    B, T, _, H, D = qkv.shape
    return qkv.data.ptr, B, T, H, D, box_q, box_kv, cp.cuda.runtime.getDevice()


def tensor_maps(qkv, box_q: int, box_kv: int):
    """flash_fwd's two tensor maps of qkv (boxes of box_q and box_kv rows) in device memory, made once
    per buffer, shape and boxes (a map holds the buffer's address)."""
    B, T, _, H, D = qkv.shape
    key = _map_key(qkv, box_q, box_kv)
    if _capturing():
        _CAPTURED.add(key)  # (fwd_takes has checked that the maps exist)
    if key in _MAPS:
        _MAPS.move_to_end(key)
        return _MAPS[key]
    raw = tensor_map(qkv.data.ptr, B, T, H, D, box_q) + tensor_map(qkv.data.ptr, B, T, H, D, box_kv)
    _MAPS[key] = maps = cp.asarray(np.frombuffer(raw, dtype=np.uint64))  # CuPy allocations are 256-byte aligned
    eager = [k for k in _MAPS if k not in _CAPTURED]
    for old in eager[:max(0, len(eager) - MAX_EAGER_MAPS)]:
        del _MAPS[old]  # freed in stream order: a kernel queued before still reads it whole
    return maps


@functools.lru_cache(maxsize=None)
def _sm_count(device: int) -> int:
    return cp.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]


def _capturing() -> bool:
    return cp.cuda.get_current_stream().is_capturing()


def fwd_takes(qkv, defines: tuple = PRODUCTION_FWD) -> bool:
    """Whether flash_fwd with `defines` runs on this 16-bit qkv buffer: a head size the kernels are written
    for on an sm_90a device; for the warp-specialized builds also a contiguous, 16-byte aligned buffer, and
    its tensor maps already made when a CUDA graph is being captured (making them copies from the host,
    which a capture cannot hold; the eager warm-up before a capture makes them)."""
    D = qkv.shape[-1]
    if qkv.ndim != 5 or not takes(D):
        return False
    cfg = config(tuple(defines))
    if not cfg["FWD_WS"]:
        return True
    if not qkv.flags.c_contiguous or qkv.data.ptr % 16:
        return False
    return not _capturing() or _map_key(qkv, launch("flash_fwd", D, tuple(defines))[0], cfg["FWD_BN"]) in _MAPS


def bwd_takes(qkv, y, lse, dy, dqkv) -> bool:
    """Whether flash_bwd runs on these buffers: a head size the kernels are written for on an sm_90a
    device, and buffers the 16-byte loads and copies can read row by row (contiguous, 16-byte aligned;
    lse contiguous)."""
    if qkv.ndim != 5 or not takes(qkv.shape[-1]) or not lse.flags.c_contiguous:
        return False
    return all(a.flags.c_contiguous and a.data.ptr % 16 == 0 for a in (qkv, y, dy, dqkv))


# ----------------------------------------------------------------------------- the passes


def flash_fwd(be, qkv, y, lse, defines: tuple = ()) -> None:
    """y = causal softmax(q·kᵀ/√D)·v per head, lse saved; qkv [B, T, 3, H, D] 16-bit (`be`: the backend,
    for its 16-bit type's defines; `defines`: a variant's, see CONFIG)."""
    B, T, H, D, (q, k, v), strides = _heads(qkv)
    defines = tuple(defines) + tuple(be.defines)
    cfg, scale = config(defines), np.float32(1.0 / math.sqrt(D))
    if not cfg["FWD_WS"]:
        _run("flash_fwd", D, T, B * H, defines, (q, k, v, y, lse, np.int32(H), np.int32(T), *strides, scale))
        return
    if not qkv.flags.c_contiguous or qkv.data.ptr % 16:
        raise ValueError("the warp-specialized forward reads qkv through tensor maps: a contiguous, 16-byte aligned buffer")
    rows, threads, smem = launch("flash_fwd", D, defines)
    maps = tensor_maps(qkv, rows, cfg["FWD_BN"])
    work = (T + rows - 1) // rows * B * H  # (query block, head) tiles
    grid = min(work, _sm_count(cp.cuda.runtime.getDevice()) * cfg["FWD_MINB"]) if cfg["FWD_PERSIST"] else work
    wg_kernel("flash_fwd", D, defines, smem)((grid,), (threads,), (maps, y, lse, np.int32(H), np.int32(T),
                                                                   np.int32(B * H), scale), shared_mem=smem)


def flash_bwd(be, dy, qkv, y, lse, dqkv, defines: tuple = (), deterministic: bool = True, fused: bool = False) -> None:
    """dq, dk, dv into dqkv (overwritten) from dy, recomputing the probabilities from lse. deterministic
    and not fused: the two-kernel backward (delta by flash_bwd_prep first); not deterministic:
    the fused pass with atomic dq sums; deterministic and fused: the fused pass with ordered dq sums."""
    B, T, H, D, (q, k, v), strides = _heads(qkv)
    dq, dk, dv = _mma_args(dqkv)[4]
    defines = tuple(defines) + tuple(be.defines)
    delta = be.scratch("flash_delta", (B, H, T), cp.float32)
    ht, scale = (np.int32(H), np.int32(T)), np.float32(1.0 / math.sqrt(D))
    if deterministic and not fused:  # delta alone (nothing zeroed: the pointers only fill the slots)
        wg_kernel("flash_bwd_prep", D, defines, mask=BWD_SPLIT_KERNELS)(
            (blocks(B * T * H * (D // 8), 256),), (256,), (dy, y, delta, delta, np.int64(0), delta, np.int64(0), np.int32(B), *ht))
        _run("flash_bwd_dq", D, T, B * H, defines, (q, k, v, dy, lse, delta, dq, *ht, *strides, scale))
        _run("flash_bwd_dkdv", D, T, B * H, defines, (q, k, v, dy, lse, delta, dk, dv, *ht, *strides, scale))
        return
    n_qt = (T + 63) // 64  # 64-query tiles a head: dq_acc's and the semaphores' unit
    dq_acc = be.scratch("wgmma_dq_acc", (B * H * n_qt * 64 * D,), cp.float32)
    sem = be.scratch("wgmma_dq_sem", (B * H * n_qt,), cp.int32)
    n4 = dq_acc.size // 4
    zero, n_sem = (0, sem.size) if deterministic else (n4, 0)  # ordered: the first writer stores; atomic: zeros
    wg_kernel("flash_bwd_prep", D, defines)((blocks(B * T * H * (D // 8), 256),), (256,),
                                            (dy, y, delta, dq_acc, np.int64(zero), sem, np.int64(n_sem), np.int32(B), *ht))
    rows, threads, smem = launch("flash_bwd_fused", D, defines)
    wg_kernel("flash_bwd_fused", D, defines, smem)(((T + rows - 1) // rows, B * H), (threads,),
                                                   (q, k, v, dy, lse, delta, dk, dv, dq, dq_acc, sem, *ht, *strides, scale,
                                                    np.int32(deterministic)), shared_mem=smem)
    if not deterministic:
        wg_kernel("flash_bwd_dq_convert", D, defines)((blocks(n4, 256),), (256,), (dq_acc, dq, *ht, *strides, scale,
                                                                                    np.int64(n4)))
