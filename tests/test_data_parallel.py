"""Data-parallel training with real MPI ranks on the CPU (the NumPy backend; the NCCL path is
tests/test_comm_gpu.py on a machine with two GPUs): 2 ranks × B rows train exactly what 1 rank ×
2B rows trains, a signal to the launcher stops every rank at one checkpoint, and the run resumes
on another number of ranks."""

import json
import signal

import numpy as np
import pytest

from andrea.checkpoint import read_checkpoint
from andrea.comm import mpirun_path
from test_trainer import interrupt, loss_lines, records, shards, train, write_config  # noqa: F401  (shards: fixture)

try:
    mpirun_path()
    import mpi4py  # noqa: F401

    HAVE_MPI = True
except (FileNotFoundError, ImportError):
    HAVE_MPI = False

pytestmark = pytest.mark.skipif(not HAVE_MPI, reason="no mpirun/mpi4py here (pip install -c constraints.txt -e '.[mpi]')")

SHORT = {"max_steps": 40, "checkpoint_every": 20, "eval_every": 20, "sample_every": 20}


def without_timing(recs):
    return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "step_s", "seconds")} for r in recs]


def test_two_ranks_of_b_rows_train_what_one_rank_of_2b_rows_trains(shards, tmp_path):  # noqa: F811
    one = train(write_config(tmp_path / "one.yaml", batch_size=8, **SHORT), shards, tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    two = train(write_config(tmp_path / "two.yaml", batch_size=4, **SHORT), shards, tmp_path / "two", "--ranks", "2")
    assert two.returncode == 0, two.stderr[-3000:]
    assert "2 ranks × 4 rows × 1 micro-batches (gradients averaged in float32) = 256 tokens/step" in two.stderr  # the plan line
    a, b = without_timing(records(tmp_path / "one")), without_timing(records(tmp_path / "two"))
    assert [r["step"] for r in a] == [r["step"] for r in b] and len(a) > 40  # training and validation records
    for ra, rb in zip(a, b):
        # the same rows (so the same mix and bandit), the same losses up to the order of float sums
        assert ra.get("mix") == rb.get("mix") and ra.get("weights") == rb.get("weights"), ra["step"]
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-5), ra["step"]
    wa = read_checkpoint(tmp_path / "one" / "final.bin").weights
    wb = read_checkpoint(tmp_path / "two" / "final.bin").weights
    assert np.abs(wa - wb).max() < 1e-5 * np.abs(wa).max()
    # rank 0 alone wrote: one sample per sample step, one plan
    samples = [json.loads(line) for line in (tmp_path / "two" / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [20, 40]
    assert json.loads((tmp_path / "two" / "plan.json").read_text())["batch"]["ranks"] == 2


def test_a_signal_stops_every_rank_at_one_checkpoint_and_the_run_resumes_on_one_rank(shards, tmp_path):  # noqa: F811
    cfg = write_config(tmp_path / "c.yaml", batch_size=4, max_steps=160, checkpoint_every=40, eval_every=40, sample_every=80)
    run = tmp_path / "run"
    rc, err = interrupt(cfg, shards, run, 30, signal.SIGTERM, "--ranks", "2")
    assert rc == 5, err[-3000:]  # the launcher exits as one process does (andrea.launch.Exit.STOPPED); the ranks exit 0
    stopped = json.loads((run / "state.json").read_text())["step"]
    assert 30 <= stopped < 160 and "stopped by a signal" in err
    assert json.loads((run / "launch" / "result.json").read_text()) == {"finished": False, "step": stopped, "reason": "signal"}
    steps = [r["step"] for r in loss_lines(run)]
    assert steps == list(range(len(steps))) and len(steps) >= stopped  # one record per step: rank 0's
    p = train(cfg, shards, run)  # one rank now: the global batch halves, the run goes on
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"resumed micro at step {stopped}" in p.stderr
    assert [r["step"] for r in loss_lines(run)] == list(range(160))
