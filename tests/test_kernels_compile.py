"""The CUDA sources compile, with no GPU: every andrea/kernels/*.cu through NVRTC (the compiler CuPy's
RawModule uses on the device) with the production loader's options (andrea/engine/cupy/kernels.py),
in the bf16 and fp16 builds and at the head sizes the models use, for Hopper (sm_90, the H200s the
project trains on; sm_90a, a cubin, for the warp-group MMA family, whose ptxas report must show no
spills and no serialized wgmma); and every extern "C" kernel that dev/cuda's coverage test lists is
in the result. So a kernel that does not compile, or a macro that names its kernels wrongly, fails CI
instead of a device call. NVRTC and the CUDA headers come from NVIDIA's wheels (the test extra,
Linux x86-64); elsewhere the test is skipped, saying so."""

import ctypes
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
KERNELS = REPO / "andrea" / "kernels"
sys.path.insert(0, str(REPO / "dev" / "cuda"))
import common  # noqa: E402  (dev/cuda/common.py: kernel_names, the coverage test's parser)

HEAD_DIMS = {"attention": (32, 64), "attention_mma": (32, 64), "attention_wgmma": (16, 32, 64)}  # -DHEAD_DIM: ANDREA-12M's, 120M's and 480M's
# families written for an architecture-specific target (wgmma: sm_90a only), compiled to its cubin
ARCH = {"attention_wgmma": "sm_90a"}
# dev/cuda/attention_wgmma.py's variants (its FWD_VARIANTS and BWD_VARIANTS, less the launcher's own
# FWD_PERSIST): each must compile as cleanly as the defaults, every kernel of the file with it
import attention_wgmma as _wgmma_dev  # noqa: E402  (dev/cuda/attention_wgmma.py: imports without CuPy)

_WGMMA = [tuple(d for d in v[1] if not d.startswith("FWD_PERSIST")) for v in _wgmma_dev.FWD_VARIANTS + _wgmma_dev.BWD_VARIANTS]
VARIANTS = {"attention_wgmma": tuple(dict.fromkeys(d for d in _WGMMA if d))}


def _nvrtc():
    """(the NVRTC library, the CUDA include folder) from the nvidia-cuda-nvrtc/-runtime wheels, or None."""
    try:
        import nvidia
    except ImportError:
        return None
    for root in map(Path, nvidia.__path__):
        for lib in sorted(root.glob("cu*/lib/libnvrtc.so.*")) + sorted(root.glob("cuda_nvrtc/lib/libnvrtc.so.*")):
            include = next((p.parent for p in root.glob("*/include/cuda_bf16.h")), None)
            if include is None:
                continue
            for builtins in lib.parent.glob("libnvrtc-builtins.so*"):  # NVRTC opens it by name
                ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(str(lib)), include
    return None


NVRTC = _nvrtc()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(NVRTC is None, reason="NVRTC is not installed (pip install -e '.[test]' brings "
                                                       "nvidia-cuda-nvrtc and nvidia-cuda-runtime on Linux x86-64)")]


def compile_ptx(path: Path, defines: tuple, arch: str | None = None) -> tuple:
    """path compiled with the loader's options and `defines`, for compute_90 (PTX only) or for `arch`
    (a cubin, ptxas reporting): (the PTX, NVRTC's log), or AssertionError with the log."""
    lib, include = NVRTC
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), path.read_bytes(), path.name.encode(), 0, None, None) == 0
    opts = [b"-std=c++17", f"-I{KERNELS}".encode(), b"-lineinfo", f"-I{include}".encode()]
    opts += [f"-arch={arch}".encode(), b"--ptxas-options=-v"] if arch else [b"-arch=compute_90"]
    opts += [f"-D{d}".encode() for d in defines]
    status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    text = log.value.decode(errors="replace")
    assert status == 0, f"{path.name} {defines}: NVRTC failed\n{text[:4000]}"
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value.decode(), text


CASES = [(cu.stem, defines + tuple(f"HEAD_DIM={d}" for d in ([hd] if hd else [])))
         for cu in sorted(KERNELS.glob("*.cu"))
         for hd in HEAD_DIMS.get(cu.stem, (None,))
         for defines in ((), ("ANDREA_FP16",)) + VARIANTS.get(cu.stem, ())]


@pytest.mark.parametrize("name, defines", CASES, ids=[f"{n}-{'-'.join(d) or 'bf16'}" for n, d in CASES])
def test_kernel_source_compiles_with_every_kernel(name, defines):
    path = KERNELS / f"{name}.cu"
    ptx, log = compile_ptx(path, defines, ARCH.get(name))
    if name in ARCH:  # ptxas ran: registers within the launch bounds without local memory, wgmma left asynchronous
        assert "Used" in log and not re.search(r"[1-9]\d* bytes spill (stores|loads)", log), f"{path.name} {defines}: spills\n{log}"
        assert "wgmma" not in log.lower(), f"{path.name} {defines}: ptxas serialized wgmma\n{log}"
        assert "setmaxnreg" not in log.lower(), f"{path.name} {defines}: ptxas ignored setmaxnreg\n{log}"
    entries = set(re.findall(r"\.entry\s+(\w+)", ptx))
    missing = set(common.kernel_names(path)) - entries
    assert not missing, f"{path.name} {defines}: kernels named in the source but not compiled: {sorted(missing)}"
