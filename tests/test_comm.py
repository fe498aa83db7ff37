"""The communicator layer (andrea/comm.py): one rank costs nothing, the launcher's variables pick
the implementation, real 2- and 3-rank MPI runs agree with NumPy, a failing rank ends the whole
job instead of hanging it, and the file rendezvous that carries NCCL's id without MPI."""

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from andrea import comm
from andrea.comm import SingleProcess, file_rendezvous, from_environment, launch_info, mpirun_command

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def have_mpi() -> bool:
    try:
        comm.mpirun_path()
    except FileNotFoundError:
        return False
    return importlib.util.find_spec("mpi4py") is not None


needs_mpi = pytest.mark.skipif(not have_mpi(), reason="no mpi4py/mpirun here (pip install -c constraints.txt '.[mpi]')")


def run_ranks(n: int, argv: list[str], extra_env: dict | None = None, timeout: float = 60):
    env = comm.launch_environment({"PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), **(extra_env or {})})
    return subprocess.run(mpirun_command(n, argv), capture_output=True, text=True, env=env, timeout=timeout)


# --- one rank -------------------------------------------------------------------------------


def test_single_process_is_the_identity_and_touches_nothing():
    c = SingleProcess()
    assert (c.rank, c.size, c.local_rank, c.is_root) == (0, 1, 0, True)
    buf = np.arange(5, dtype=np.float32)
    buf.flags.writeable = False  # any write into it would raise
    for op in ("sum", "mean", "max"):
        c.allreduce(buf, op)
        c.allreduce(buf, op, stream=object())
    assert np.array_equal(buf, np.arange(5))
    host = np.array([3.0, 4.0])
    assert c.allreduce_host(host, "mean") is host and np.array_equal(host, [3.0, 4.0])
    c.broadcast(buf, 0)
    assert c.any(True) is True and c.any(False) is False
    c.barrier()
    c.close()


def test_single_process_rejects_what_more_ranks_would_reject():
    c = SingleProcess()
    with pytest.raises(ValueError, match="unknown reduction 'avg'"):
        c.allreduce(np.zeros(2), "avg")
    with pytest.raises(ValueError, match="root 1"):
        c.broadcast(np.zeros(2), root=1)


def test_one_rank_imports_neither_mpi_nor_cupy():
    code = ("import sys; from andrea.comm import from_environment, SingleProcess; "
            "c = from_environment('numpy'); d = from_environment('cupy'); "
            "assert type(c) is SingleProcess and type(d) is SingleProcess; "
            "print(sorted(m for m in ('mpi4py', 'cupy', 'pyarrow') if m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_"))}
    env["PYTHONPATH"] = REPO
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --- the launcher's variables ---------------------------------------------------------------


def test_launch_info_reads_each_launcher():
    ompi = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "PMIX_NAMESPACE": "prterun-x-1@1"}
    assert launch_info(ompi) == {"launcher": "openmpi", "rank": 3, "size": 4, "local_rank": 1, "key": "prterun-x-1@1"}
    pmi = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1"}
    assert launch_info(pmi) == {"launcher": "pmi", "rank": 1, "size": 2, "local_rank": 1, "key": "pmi"}
    srun = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "6", "SLURM_LOCALID": "1",
            "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "77"}
    assert launch_info(srun) == {"launcher": "slurm", "rank": 5, "size": 6, "local_rank": 1, "key": "slurm-77.0"}
    # OpenMPI's mpirun inside an sbatch allocation: the ranks also carry the batch shell's SLURM_*
    assert launch_info({**srun, **ompi})["launcher"] == "openmpi"


def test_a_batch_scripts_own_shell_is_one_process():
    # sbatch --ntasks=4 sets SLURM_NTASKS=4 and SLURM_PROCID=0 in the script itself, which is not a
    # task srun started: it must not wait for 3 peers that will never come.
    batch = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "77"}
    assert launch_info(batch)["size"] == 1
    assert type(from_environment("cupy", env=batch)) is SingleProcess
    assert launch_info({})["size"] == 1


@pytest.mark.parametrize("env, message", [
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "2"}, "rank 2.*size 2"),
    ({"PMI_RANK": "zero", "PMI_SIZE": "2"}, "PMI_RANK='zero' is not an integer"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "0"}, "size 0"),
])
def test_inconsistent_launcher_variables_are_named(env, message):
    with pytest.raises(ValueError, match=message):
        launch_info(env)


class Recorder:
    """Stands in for MPIComm / NCCLComm: records how from_environment built it."""

    made: list = []

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs, self.comm = args, kwargs, "mpi-handle"
        Recorder.made.append(self)

    def close(self):
        self.closed = True


@pytest.fixture
def recorded(monkeypatch):
    Recorder.made = []
    mpi = type("FakeMPI", (Recorder,), {})
    nccl = type("FakeNCCL", (Recorder,), {})
    monkeypatch.setattr(comm, "MPIComm", mpi)
    monkeypatch.setattr(comm, "NCCLComm", nccl)
    return mpi, nccl


OMPI2 = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "PMIX_NAMESPACE": "ns"}
SRUN2 = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "3", "SLURM_JOB_ID": "9"}


def test_from_environment_numpy_under_mpirun_is_mpi(recorded):
    mpi, nccl = recorded
    c = from_environment("numpy", env=OMPI2)
    assert type(c) is mpi and c.kwargs == {"local_rank": 1, "expected_size": 2, "launcher": "openmpi"}


def test_from_environment_cupy_under_mpirun_passes_nccls_id_through_mpi(recorded):
    mpi, nccl = recorded
    c = from_environment("cupy", env=OMPI2)
    assert type(c) is nccl and c.args == (1, 2, 1)
    assert c.kwargs["mpi_comm"] == "mpi-handle" and c.kwargs["rendezvous_dir"] is None
    helper = [m for m in Recorder.made if type(m) is mpi]
    assert len(helper) == 1 and helper[0].closed  # MPI only carried the id


def test_from_environment_cupy_under_srun_uses_the_file_rendezvous(recorded, tmp_path):
    mpi, nccl = recorded
    c = from_environment("cupy", rendezvous_dir=tmp_path, env=SRUN2)
    assert type(c) is nccl and c.args == (1, 2, 1)
    assert c.kwargs["mpi_comm"] is None and c.kwargs["rendezvous_dir"] == tmp_path
    assert c.kwargs["rendezvous_key"] == "slurm-9.3"
    assert not [m for m in Recorder.made if type(m) is mpi]
    with pytest.raises(ValueError, match="rendezvous directory"):
        from_environment("cupy", env=SRUN2)


def test_from_environment_cupy_without_mpi4py_falls_back_to_the_file(recorded, monkeypatch, tmp_path):
    mpi, nccl = recorded

    def no_mpi4py(*a, **k):
        raise ImportError("no mpi4py")

    monkeypatch.setattr(comm, "MPIComm", no_mpi4py)
    c = from_environment("cupy", rendezvous_dir=tmp_path, env=OMPI2)
    assert type(c) is nccl and c.kwargs["mpi_comm"] is None and c.kwargs["rendezvous_key"] == "ns"
    with pytest.raises(ImportError, match="andrea\\[mpi\\]"):
        from_environment("cupy", env=OMPI2)


def test_from_environment_rejects_an_unknown_backend():
    with pytest.raises(ValueError, match="unknown backend 'torch'"):
        from_environment("torch", env={})


# --- launching ------------------------------------------------------------------------------


def test_launch_environment_keeps_nvlink_multicast_off():
    base = {"NCCL_NVLS_ENABLE": "0", "PATH": "/bin"}
    env = comm.launch_environment({"NCCL_NVLS_ENABLE": "1", "PATH": "/usr/bin", "X": "y"}, base=base)
    assert env == {"NCCL_NVLS_ENABLE": "0", "PATH": "/usr/bin", "X": "y"}


@needs_mpi
def test_mpirun_command(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    cmd = mpirun_command(2, [sys.executable, "-m", "andrea.comm", "--selftest"])
    assert cmd[1:3] == ["-n", "2"]
    assert cmd[-6:] == [sys.executable, "-m", "mpi4py", "-m", "andrea.comm", "--selftest"]
    if comm._is_openmpi(cmd[0]):
        assert "--oversubscribe" in cmd and ("--allow-run-as-root" in cmd) == (os.geteuid() == 0)
        assert cmd[cmd.index("-x") + 1] == "NCCL_NVLS_ENABLE"
    assert mpirun_command(1, ["hostname"])[-1] == "hostname"  # not Python: run as given
    with pytest.raises(ValueError):
        mpirun_command(0, ["hostname"])


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])  # 3 ranks on CI's 2 cores: oversubscribed
def test_mpi_collectives_agree_with_numpy(n):
    out = run_ranks(n, [sys.executable, "-m", "andrea.comm", "--selftest"], {"NCCL_NVLS_ENABLE": "0"})
    assert out.returncode == 0, out.stdout + out.stderr
    reports = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in reports) == list(range(n))
    for r in reports:
        assert r["class"] == "MPIComm" and r["size"] == n and r["local_rank"] == r["rank"]  # one host
        assert {f"allreduce {op} {dt}" for op in ("sum", "mean", "max") for dt in ("float32", "float64")} <= set(r["checks"])
        assert {"broadcast root 0", f"broadcast root {n - 1}", "any"} <= set(r["checks"])
        assert r["env"] == {"NCCL_NVLS_ENABLE": "0"}


@needs_mpi
def test_a_failing_rank_ends_the_job_instead_of_hanging_it(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import numpy as np\nfrom andrea.comm import from_environment\n"
                      "c = from_environment('numpy')\n"
                      "if c.rank == 1:\n    raise RuntimeError('rank 1 broke')\n"
                      "c.allreduce(np.ones(4))\nprint('rank', c.rank, 'went on')\n")
    t0 = time.monotonic()
    out = run_ranks(2, [sys.executable, str(script)], timeout=60)
    assert out.returncode != 0
    assert "rank 1 broke" in out.stderr and "went on" not in out.stdout
    assert time.monotonic() - t0 < 30


@needs_mpi
def test_mpi_comm_rejects_what_it_cannot_reduce(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("import numpy as np\nfrom andrea.comm import from_environment\n"
                      "c = from_environment('numpy')\nerrors = []\n"
                      "for buf, op in ((np.ones(4, dtype=np.int32), 'mean'), (np.ones((4, 4))[:, 0], 'sum')):\n"
                      "    try:\n        c.allreduce(buf, op)\n    except (TypeError, ValueError) as e:\n"
                      "        errors.append(str(e))\n"
                      "print(errors)\nc.close()\n")
    out = run_ranks(2, [sys.executable, str(script)])
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("a mean needs a floating-point buffer") == 2 and out.stdout.count("must be contiguous") == 2


# --- the file rendezvous (NCCL's id without MPI) --------------------------------------------


def test_file_rendezvous_hands_rank_0s_payload_to_a_waiting_rank(tmp_path):
    got = {}
    waiter = threading.Thread(target=lambda: got.update(r1=file_rendezvous(tmp_path, "job.0", rank=1, timeout_s=20)))
    waiter.start()
    time.sleep(0.2)  # rank 1 is already polling when rank 0 writes
    payload = bytes(range(256)) * 2
    assert file_rendezvous(tmp_path, "job.0", rank=0, payload=payload) == payload
    waiter.join(20)
    assert got["r1"] == payload
    assert [p.name for p in tmp_path.iterdir()] == ["rendezvous.job.0.json"]  # no temp file left
    comm.remove_rendezvous(tmp_path, "job.0")
    assert not list(tmp_path.iterdir())


def test_file_rendezvous_times_out_with_a_clear_error(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"rank 1: no rendezvous file .*rendezvous\.job\.1\.json after 0.3 s.*share"):
        file_rendezvous(tmp_path, "job.1", rank=1, timeout_s=0.3)
    assert time.monotonic() - t0 < 5


def test_file_rendezvous_names_a_corrupt_file(tmp_path):
    (tmp_path / "rendezvous.k.json").write_text("{not json")
    with pytest.raises(ValueError, match="rendezvous.k.json is not valid JSON"):
        file_rendezvous(tmp_path, "k", rank=1, timeout_s=1)
    (tmp_path / "rendezvous.k.json").write_text('{"payload": 5}')
    with pytest.raises(ValueError, match="no valid 'payload'"):
        file_rendezvous(tmp_path, "k", rank=1, timeout_s=1)
    with pytest.raises(ValueError, match="rank 0 publishes"):
        file_rendezvous(tmp_path, "k", rank=0)


def test_the_nccl_id_survives_the_file_rendezvous_in_either_form():
    """CuPy 14 gives NCCL's unique id as bytes, older CuPy as a tuple of (signed) C chars: both
    come back as they went, in the form NcclCommunicator takes."""
    from andrea.comm import _decode_uid, _encode_uid

    raw = bytes(range(256))[:128]
    assert _decode_uid(_encode_uid(raw)) == raw
    chars = tuple(range(-64, 64))
    assert _decode_uid(_encode_uid(chars)) == chars
