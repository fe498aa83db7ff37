"""One table of exit statuses for a training run (andrea.launch.Exit, the README's table), the same
from both entry points: `andrea train` and the workflow's train job (workflow/scripts/train.py).
The trainer is replaced by one whose run returns or raises what each case needs (the real paths
to each status run end to end in test_trainer.py and test_data_parallel.py)."""

import json
import logging
import runpy
import sys
from types import SimpleNamespace

import pytest

import andrea.launch as launch
from andrea.launch import Exit
from andrea.optim import NonFiniteHalt
from andrea.trainer import CoherenceHalt, TrainingRefused
from conftest import REPO

SIGNAL = {"finished": False, "step": 7, "reason": "signal"}
# (run's result or exception, exit status, what the message says)
CASES = {
    "finished": ({"finished": True, "step": 10}, 0, None),
    "refused": (TrainingRefused("would take 3 days"), 2, "refusing to train: would take 3 days"),
    "coherence halt": (CoherenceHalt("coherence gate: 2 consecutive samples"), 3, "halted: coherence gate: 2 consecutive"),
    "non-finite halt": (NonFiniteHalt("3 consecutive steps with a non-finite loss"), 4, "halted: 3 consecutive steps"),
    "signal": (SIGNAL, 5, "stopped at step 7, checkpoint written in"),
    "error": (RuntimeError("another trainer is running in this run directory"), 1, "another trainer is running"),
}


class FakeTrainer:
    outcome = None

    def __init__(self, config, model, shards, run_dir, force=False):
        self.step, self.root = 7, True

    def run(self, out_dir=None):
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


@pytest.fixture
def here(monkeypatch):
    """Trains in this process (no ranks) with FakeTrainer; the logging set-up of the entry points undone after."""
    monkeypatch.setattr(launch, "Trainer", FakeTrainer)
    monkeypatch.setattr(launch, "train_as_ranks", lambda *a, **k: None)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for h in root.handlers:
        if h not in handlers:
            h.close()
    root.handlers[:] = handlers
    root.setLevel(level)


def cli_train(tmp_path, capsys, *extra) -> tuple[int, str, str]:
    from andrea.cli import main

    status = main(["train", "--config", str(REPO / "config" / "config.yaml"), "--model", "ANDREA-tiny",
                   "--shards", str(tmp_path / "shards.json"), "--run-dir", str(tmp_path / "run"), *extra])
    out, err = capsys.readouterr()
    return status, out, err


def workflow_train(tmp_path, monkeypatch) -> tuple[int, str]:
    """workflow/scripts/train.py as Snakemake runs it, with its `snakemake` object: (exit status, its log)."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "1")  # the script sets them: restored after
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.syspath_prepend(str(REPO / "workflow" / "scripts"))
    log = tmp_path / "train.log"
    job = SimpleNamespace(threads=1, log=[str(log)], wildcards=SimpleNamespace(model="ANDREA-tiny"),
                          input=SimpleNamespace(shards=str(tmp_path / "shards.json")),
                          params=SimpleNamespace(run_dir=str(tmp_path / "run")), output=[str(tmp_path / "ckpt")], config={})
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(REPO / "workflow" / "scripts" / "train.py"), init_globals={"snakemake": job}, run_name="__main__")
    return exit_.value.code, log.read_text()


@pytest.mark.parametrize("case", [c for c in CASES if c != "error"])
def test_each_outcome_exits_with_one_status_from_both_entry_points(case, here, tmp_path, capsys, monkeypatch):
    FakeTrainer.outcome, status, message = CASES[case]
    cli_status, out, err = cli_train(tmp_path, capsys)
    job_status, job_log = workflow_train(tmp_path, monkeypatch)
    assert cli_status == job_status == status
    if message is None:
        assert err == "" and "ERROR" not in job_log
    else:
        assert err.startswith(f"andrea: {message}") and "Traceback" not in err, err
        assert f"ERROR andrea.train: {message}" in job_log and "Traceback" not in job_log
    # the CLI's standard output: the run's result, where it finished or stopped at a checkpoint
    assert (json.loads(out) if out else None) == (FakeTrainer.outcome if status in (0, 5) else None)
    if case == "signal":  # each entry point says how to resume
        assert "run the same command again to resume" in err and "run the workflow again to resume" in job_log


def test_an_error_exits_1_from_both_entry_points(here, tmp_path, capsys, monkeypatch):
    FakeTrainer.outcome, status, message = CASES["error"]
    cli_status, _, err = cli_train(tmp_path, capsys)
    assert cli_status == status and err.startswith(f"andrea: error: {message}")
    # the job script leaves it to the interpreter: an uncaught exception exits 1, logged by setup_logging's hook
    with pytest.raises(RuntimeError, match=message):
        workflow_train(tmp_path, monkeypatch)
    assert cli_train(tmp_path, capsys, "--ranks", "0")[0] == 1  # bad input
    cli_status, _, err = cli_train(tmp_path, capsys, "--model", "ANDREA-nope")  # the last --model wins
    assert cli_status == 2 and err.startswith("andrea: configuration error: unknown model 'ANDREA-nope'")


@pytest.mark.parametrize("case", list(CASES))
def test_ranks_exit_0_and_the_launcher_exits_with_rank_0s_outcome(case, here, tmp_path, capsys, monkeypatch):
    """A launched rank writes its outcome for the launcher and exits 0 (a non-zero exit makes MPI
    abort the job); the launcher, `andrea train` or the job, exits with the outcome's status."""
    FakeTrainer.outcome, status, message = CASES[case]
    result_file = tmp_path / "result.json"
    if case == "error":  # a rank that fails exits non-zero and writes nothing
        assert cli_train(tmp_path, capsys, "--result", str(result_file))[0] == 1 and not result_file.exists()
        launched = (1, None)
    else:
        rank_status, out, _ = cli_train(tmp_path, capsys, "--result", str(result_file))
        assert rank_status == 0 and out == ""
        launched = (0, json.loads(result_file.read_text()))
    monkeypatch.setattr(launch, "train_as_ranks", lambda *a, **k: launched)
    cli_status, _, err = cli_train(tmp_path, capsys)
    job_status, job_log = workflow_train(tmp_path, monkeypatch)
    assert cli_status == job_status == status
    if case == "error":
        assert err.startswith("andrea: the ranks failed (exit status 1)")
        assert "ERROR andrea.train: the ranks failed (exit status 1)" in job_log
    elif message is not None:
        assert err.startswith(f"andrea: {message}") and f"ERROR andrea.train: {message}" in job_log
