"""NCCL between 2 GPUs (andrea/comm.py's NCCLComm), on a machine with at least 2 (run on the
device: `python3 -m pytest tests/test_comm_gpu.py`). Skipped, saying so, with fewer GPUs; CI has none."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from andrea import comm

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    import cupy as cp

    N_GPU = cp.cuda.runtime.getDeviceCount()
except Exception:  # ImportError, or CUDA without a device
    N_GPU = 0

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(N_GPU < 2, reason=f"NCCL tests need 2 GPUs with CuPy; this machine has {N_GPU}")]

HAVE_MPI = importlib.util.find_spec("mpi4py") is not None
try:
    comm.mpirun_path()
except FileNotFoundError:
    HAVE_MPI = False


def reports(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def check(rs: list[dict]) -> None:
    assert sorted(r["rank"] for r in rs) == [0, 1]
    for r in rs:
        assert r["class"] == "NCCLComm" and r["size"] == 2
        want = {f"allreduce {op} {dt}" for op in ("sum", "mean", "max") for dt in ("float32", "float64")}
        assert want <= set(r["checks"]), r["checks"]
        assert "allreduce sum float32 on a side stream" in r["checks"]
        assert {"broadcast root 0", "broadcast root 1", "any"} <= set(r["checks"])
        # bf16 gradients are reduced in bf16: it must work wherever ml_dtypes is installed
        if importlib.util.find_spec("ml_dtypes"):
            assert {f"allreduce {op} bfloat16" for op in ("sum", "mean", "max")} <= set(r["checks"]), r["checks"]
        # NVLink multicast stays off on every rank where the parent had it off
        assert r["env"].get("NCCL_NVLS_ENABLE") == os.environ.get("NCCL_NVLS_ENABLE")


@pytest.mark.skipif(not HAVE_MPI, reason="no mpi4py/mpirun here (pip install '.[mpi]')")
def test_nccl_under_mpirun_agrees_with_numpy():
    env = comm.launch_environment({"PYTHONPATH": REPO})
    out = subprocess.run(comm.mpirun_command(2, [sys.executable, "-m", "andrea.comm", "--selftest", "--backend", "cupy"]),
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    rs = reports(out.stdout)
    check(rs)
    assert sorted(r["local_rank"] for r in rs) == [0, 1]  # one GPU each


def test_nccl_through_the_file_rendezvous_as_srun_starts_it(tmp_path):
    """Two tasks as srun would start them (no MPI): NCCL's id goes through a shared directory."""
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_"))}
        env = comm.launch_environment({"PYTHONPATH": REPO, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank),
                                       "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "4242"}, base=env)
        procs.append(subprocess.Popen([sys.executable, "-m", "andrea.comm", "--selftest", "--backend", "cupy",
                                       "--rendezvous-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=300))
    finally:
        for p in procs:
            p.kill()
    for p, (stdout, stderr) in zip(procs, outs):
        assert p.returncode == 0, stdout + stderr
    check([r for stdout, _ in outs for r in reports(stdout)])
    assert not list(tmp_path.iterdir())  # rank 0 removed the id once both had joined
