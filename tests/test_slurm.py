"""The workflow on a real SLURM cluster (ci/slurm-cluster.sh starts one on this machine): the
quickstart DAG with every rule as its own SLURM job, and a training job cancelled by the
scheduler resuming when the workflow runs again. Skipped, with the reason, without a cluster."""

import json
import shutil
import subprocess
import sys
import time

import pytest

from conftest import REPO, wait_for_checkpoint
from test_workflow import QUICK_TRAIN, set_config

pytestmark = pytest.mark.slow


def cluster_up() -> bool:
    if not shutil.which("sbatch") or not shutil.which("sacct"):
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


needs_slurm = pytest.mark.skipif(not cluster_up(), reason="no SLURM cluster here (bash ci/slurm-cluster.sh install && bash ci/slurm-cluster.sh start)")

SLURM_ARGS = ["--executor", "slurm", "--jobs", "4", "--slurm-init-seconds-before-status-checks", "1",
              "--slurm-no-account", "--latency-wait", "10"]


def snakemake_slurm(workdir, *args, wait=True):
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir), *SLURM_ARGS, *args]
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


def jobs_since(start: str) -> list[dict]:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "--starttime", start, "--format=JobID,JobName,Comment,State"],
                         capture_output=True, text=True, check=True).stdout
    return [dict(zip(("id", "name", "comment", "state"), l.split("|"))) for l in out.splitlines() if l]


@needs_slurm
def test_quickstart_dag_runs_as_slurm_jobs(workflow_dir):
    set_config(workflow_dir, {**QUICK_TRAIN, "cluster.job_threads": 1, "cluster.train_mem_mb": 4000})
    start = time.strftime("%Y-%m-%dT%H:%M:%S")
    proc = snakemake_slurm(workflow_dir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = workflow_dir / "results"
    assert json.loads((res / "ANDREA-tiny" / "audit" / "summary.json").read_text())["samples"] == 8
    jobs = jobs_since(start)
    rules = {j["comment"].split("_wildcards_")[0].removeprefix("rule_") for j in jobs if j["state"] == "COMPLETED"}
    assert {"pull_hermes3", "prep_megachat", "filter_shape", "train_tokenizer", "encode", "shards", "train", "audit"} <= rules, jobs


@needs_slurm
def test_scancelled_training_resumes_when_the_workflow_runs_again(workflow_dir):
    set_config(workflow_dir, {**QUICK_TRAIN, "cluster.job_threads": 1, "cluster.train_mem_mb": 4000, "train.ANDREA-tiny.max_steps": 600, "train.ANDREA-tiny.checkpoint_every": 20,
                              "train.ANDREA-tiny.sample_every": 1000})
    proc = snakemake_slurm(workflow_dir, "results/ANDREA-tiny/ckpt", wait=False)
    runs = workflow_dir / "results" / "ANDREA-tiny" / "runs"
    wait_for_checkpoint(runs, proc, timeout=600)
    queue = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i %k"], capture_output=True, text=True).stdout
    train = [line.split()[0] for line in queue.splitlines() if "rule_train_" in line]
    assert train, queue
    # SIGTERM to the job's processes: what SLURM sends first at a time limit or a preemption
    # (a plain `scancel` leaves the state "CANCELLED by <uid>", which plugin 2.8 does not parse)
    subprocess.run(["scancel", "--signal=TERM", train[0]], check=True)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0
    (run_dir,) = runs.iterdir()
    stopped = json.loads((run_dir / "state.json").read_text())["step"]
    assert 0 < stopped < 600
    again = snakemake_slurm(workflow_dir, "results/ANDREA-tiny/ckpt")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    log = (workflow_dir / "results" / "logs" / "train" / "ANDREA-tiny.log").read_text()
    assert f"resumed ANDREA-tiny at step {stopped}" in log
    recs = [json.loads(l) for l in (run_dir / "loss.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r.get("kind", "train") == "train"] == list(range(600))  # validation records apart


@needs_slurm
def test_a_two_rank_training_job_runs_through_the_workflow(workflow_dir):
    """train.<model>.ranks: 2 becomes one SLURM job of two tasks whose ranks (mpirun inside the
    allocation, MPI between them) train one run; rank 0 alone writes it."""
    set_config(workflow_dir, {**QUICK_TRAIN, "cluster.job_threads": 1, "cluster.train_mem_mb": 4000,
                              "train.ANDREA-tiny.ranks": 2, "train.ANDREA-tiny.max_steps": 60})
    start = time.strftime("%Y-%m-%dT%H:%M:%S")
    proc = snakemake_slurm(workflow_dir, "results/ANDREA-tiny/ckpt")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = (workflow_dir / "results" / "ANDREA-tiny" / "runs").iterdir()
    assert json.loads((run_dir / "plan.json").read_text())["batch"]["ranks"] == 2
    recs = [json.loads(l) for l in (run_dir / "loss.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r.get("kind", "train") == "train"] == list(range(60))
    out = subprocess.run(["sacct", "-n", "-X", "-P", "--starttime", start, "--format=Comment,NTasks,AllocCPUS,State"],
                         capture_output=True, text=True, check=True).stdout
    train = [line.split("|") for line in out.splitlines() if line.startswith("rule_train_")]
    assert train and train[-1][3] == "COMPLETED" and int(train[-1][2]) >= 2, out
