"""Long runs (issue 20): loss.jsonl's compact records, the incremental reader behind the dashboard,
its zoom, the resume's cut and the audit's plots, on synthetic 200,000-step logs in the former and
the compact format. Time limits are ratios against reading the same file once (every line through
json.loads), so they hold on a slow or busy machine as on a fast one."""

import importlib.util
import json
import os
import shutil
import statistics
import time

import numpy as np
import pandas as pd
import pytest

from andrea.dashboard import LossData
from andrea.runlog import (
    FINE_BUCKETS,
    MAX_POINTS,
    Expander,
    RecordCompactor,
    RunLog,
    eval_records,
    last_train_step,
    phases,
    read_records,
    read_run_log,
    truncate_log,
)
from conftest import REPO, write_jsonl

spec = importlib.util.spec_from_file_location("dashboard_longrun", REPO / "bench" / "dashboard_longrun.py")
longrun = importlib.util.module_from_spec(spec)
spec.loader.exec_module(longrun)
write_log = longrun.write_synthetic_log

N = 200_000
SPIKE = 123_457
# limits, as fractions of one plain read of the same file
FIRST_READ = 1.0  # the dashboard's first answer, reading the whole log (measured ~0.3)
STEADY = 0.02  # an answer after a few steps were appended (measured < 0.005)
IDLE = 0.005  # an answer when nothing changed
ZOOM = 0.05  # 2,000 steps at full resolution
TRUNCATE = 0.02  # a resume's cut of the last 1,000 steps
AUDIT = 1.0  # the audit's plots, beyond their cost on a short log


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t, out


@pytest.fixture(scope="module", params=["full", "compact"])
def long_log(request, tmp_path_factory):
    """A 200,000-step run directory in the given format, and the time of one plain read of it."""
    run = tmp_path_factory.mktemp(f"longrun-{request.param}")
    write_log(run / "loss.jsonl", N, request.param, spike_at=SPIKE)
    plain, n = timed(longrun.plain_read, run / "loss.jsonl")
    assert n == N + N // 250
    return request.param, run, plain


def test_compact_records_halve_the_log_and_read_the_same(tmp_path):
    for fmt in ("full", "compact"):
        write_log(tmp_path / f"{fmt}.jsonl", 5000, fmt, seed=3)
    full, compact = read_run_log(tmp_path / "full.jsonl"), read_run_log(tmp_path / "compact.jsonl")
    assert len(full[0]) == 5000 and full == compact  # weights, focus and mix shares rebuilt on every record
    assert all(r["weights"] and r["focus"] and abs(sum(r["mix"].values()) - 1) < 1e-9 for r in compact[0])
    assert (tmp_path / "compact.jsonl").stat().st_size < 0.55 * (tmp_path / "full.jsonl").stat().st_size
    a, b = RunLog(tmp_path / "full.jsonl"), RunLog(tmp_path / "compact.jsonl")
    a.poll(), b.poll()
    sa, sb = a.series(), b.series()
    assert sa["step"].tolist() == sb["step"].tolist() and sa["loss_max"].tolist() == sb["loss_max"].tolist()
    for s in sa["weights"]:
        assert np.allclose(sa["weights"][s], sb["weights"][s], atol=1e-9)


def test_weights_and_focus_are_written_only_when_they_change():
    w1, w2 = {"a": 0.75, "b": 0.25}, {"a": 0.25, "b": 0.75}
    recs = [{"step": i, "loss": 1.0, "rows": 4, "mix": {"a": 3, "b": 1}, "weights": w1 if i < 3 else w2,
             "focus": ["a"] if i < 3 else ["b"]} for i in range(5)]
    c = RecordCompactor()
    lines = [json.loads(c.dumps(r)) for r in recs[:4]] + [json.loads(c.dumps({"kind": "eval", "step": 4, "loss": 2.0}))]
    assert ["weights" in r for r in lines] == [True, False, False, True, False]
    assert json.loads(RecordCompactor().dumps(recs[4]))["weights"] == w2  # a new trainer process starts whole
    e = Expander()
    full = [e(r) for r in lines]
    assert [r["weights"] for r in full[:4]] == [w1, w1, w1, w2] and full[2]["focus"] == ["a"]
    assert full[1]["mix"] == {"a": 0.75, "b": 0.25} and "rows" not in full[1]
    assert full[4] == {"kind": "eval", "step": 4, "loss": 2.0}


def test_long_log_answers_stay_fast(long_log, tmp_path):
    """First read, steady-state polls, idle polls and a zoom on a 200,000-step log."""
    fmt, run, plain = long_log
    path = tmp_path / "loss.jsonl"
    shutil.copyfile(run / "loss.jsonl", path)  # steps are appended to it
    data = LossData(path, poll_bytes=None)
    t_first, body = timed(data.response)
    d = json.loads(body)
    assert t_first < FIRST_READ * plain, (t_first, plain)
    assert d["n_steps"] == N and d["last"]["step"] == N - 1 and d["behind_bytes"] == 0
    assert len(d["step"]) <= MAX_POINTS and d["bucket_steps"] > 1 and len(d["eval"]["step"]) == N // 250
    assert max(d["loss_max"]) == 50.0  # the one-step spike survives the buckets
    assert len(data.log.buckets) <= FINE_BUCKETS
    steady, idle = [], []
    for k in range(5):  # three steps appended between two requests, as while training
        write_log(path, N + 3 * (k + 1), fmt, start=N + 3 * k, seed=k + 1)
        steady.append(timed(data.response)[0])
        idle.append(timed(data.response)[0])
    d = json.loads(data.response())
    assert d["n_steps"] == N + 15 and d["last"]["step"] == N + 14
    assert statistics.median(steady) < STEADY * plain, (steady, plain)
    assert statistics.median(idle) < IDLE * plain, (idle, plain)
    t_zoom, body = timed(data.response, SPIKE - 1000, SPIKE + 999)
    z = json.loads(body)
    assert t_zoom < ZOOM * plain, (t_zoom, plain)
    assert z["exact"] and z["step"] == list(range(SPIKE - 1000, SPIKE + 1000)) and z["loss"][1000] == 50.0
    assert z["loss"] == z["loss_max"] and len(z["weights"]) == 13 and z["eval"]["step"] == list(range(122500, 124500, 250))


def test_resume_cut_of_a_long_log_is_fast_and_exact(long_log, tmp_path):
    fmt, run, plain = long_log
    path = tmp_path / "loss.jsonl"
    shutil.copyfile(run / "loss.jsonl", path)
    data = path.read_bytes()
    stop = N - 1000  # the checkpoint's step: training records before it stay, validations up to it
    t, dropped = timed(truncate_log, path, lambda r: r["step"] <= stop if r.get("kind") == "eval" else r["step"] < stop)
    assert t < TRUNCATE * plain, (t, plain)
    cut = data.index(b'{"step": %d,' % stop)
    assert path.read_bytes() == data[:cut] and dropped == len(data) - cut
    assert data[:cut].splitlines()[-1].startswith(b'{"kind": "eval", "step": %d,' % stop)


def test_audit_plots_of_a_long_log(long_log, tmp_path):
    from andrea.audit import plots

    fmt, run, plain = long_log
    df = pd.DataFrame({"domain": ["chat", "code"], "coherence": [60.0, 40.0], "judge_score": [None, None]})
    short = tmp_path / "short"
    short.mkdir()
    write_log(short / "loss.jsonl", 500, fmt)
    t_short, _ = timed(plots, short, df, tmp_path / "p1")  # matplotlib's own cost
    t_long, made = timed(plots, run, df, tmp_path / "p2")
    assert t_long - t_short < AUDIT * plain, (t_long, t_short, plain)
    assert {"Training loss", "Validation bits per byte"} <= set(made) and made["Training loss"].stat().st_size > 10_000


def test_reading_in_budgets_equals_reading_at_once(tmp_path):
    path = tmp_path / "loss.jsonl"
    write_log(path, 30_000, "compact", spike_at=777)
    whole, parts = RunLog(path, limit=512), RunLog(path, limit=512)
    whole.poll()
    polls = 0
    while parts.poll(64 << 10):
        polls += 1
    assert polls > 20 and parts.n_train == whole.n_train == 30_000 and parts.index == whole.index
    a, b = whole.series(), parts.series()
    for k in ("step", "step_first", "loss", "loss_min", "loss_max", "ema", "smma", "lr", "grad_norm", "grad_norm_min"):
        assert a[k].tolist() == b[k].tolist(), k
    for s in a["weights"]:  # sums in another order: the last bits may differ
        assert np.allclose(a["weights"][s], b["weights"][s], rtol=0, atol=1e-12)
    assert a["bucket_steps"] == 64 and len(whole.buckets) <= 512 and a["loss_max"].max() == 50.0


def test_zoom_returns_the_records_exactly(tmp_path):
    path = tmp_path / "loss.jsonl"
    write_log(path, 5000, "compact", seed=5)
    rl = RunLog(path)
    rl.poll()
    train, evals = read_run_log(path)
    for lo, hi in ((0, 0), (1023, 1025), (2000, 4999), (4990, 6000)):
        z = rl.zoom(lo, hi)
        want = [r for r in train if lo <= r["step"] <= hi]
        assert z["exact"] and z["step"].tolist() == [r["step"] for r in want]
        for k in ("loss", "ema", "smma", "lr", "grad_norm", "tokens_per_s"):
            assert z[k].tolist() == [r[k] for r in want], k
        for s, ws in z["weights"].items():
            assert ws.tolist() == [r["weights"].get(s, 0.0) for r in want], s
    z = rl.zoom(0, 10_000)  # wider than ZOOM_EXACT_STEPS: the held buckets, no file read
    assert not z["exact"] and z["step"][-1] == 4999


def test_tail_follows_a_resume_that_cuts_the_log(tmp_path):
    path = tmp_path / "loss.jsonl"
    write_log(path, 1000, "compact", seed=1)
    rl = RunLog(path)
    rl.poll()
    assert rl.n_train == 1000
    # a resume from step 600 cuts the log, and the run writes past where the reader had got to
    truncate_log(path, lambda r: r["step"] <= 600 if r.get("kind") == "eval" else r["step"] < 600)
    write_log(path, 1500, "compact", seed=2, start=600)
    assert rl.poll()
    train, _ = read_run_log(path)
    s = rl.series()
    assert rl.n_train == 1500 and s["step"].tolist() == list(range(1500))
    assert s["loss"].tolist() == [r["loss"] for r in train]  # the new steps, not the old ones
    # a log written again under the same name (a new inode), then removed
    tmp = tmp_path / "new.jsonl"
    write_log(tmp, 40, "full", seed=9)
    os.replace(tmp, path)
    assert rl.poll() and rl.n_train == 40
    path.unlink()
    assert rl.poll() and rl.n_train == 0 and rl.series()["step"].tolist() == []


def test_torn_and_malformed_lines(tmp_path, caplog):
    path = tmp_path / "loss.jsonl"
    write_log(path, 10, "compact", eval_every=0)
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = json.dumps({**json.loads(lines[3]), "loss": float("nan")}) + "\n"  # a skipped step's loss, as json writes it
    path.write_text("".join(lines[:5]) + "not json\n" + "".join(lines[5:9]) + lines[9][:30])  # a torn last line
    rl = RunLog(path)
    rl.poll()
    assert rl.n_train == 9 and rl.malformed == 1 and rl.last["step"] == 8
    assert np.isnan(rl.series()["loss"][3]) and json.loads(LossData(path).response())["loss"][3] is None
    with open(path, "a") as fh:  # the writer finishes the line
        fh.write(lines[9][30:])
    assert rl.poll() and rl.n_train == 10 and rl.last["step"] == 9
    recs = read_records(path)
    assert [r["step"] for r in recs] == list(range(10)) and "skipped 1 malformed line" in caplog.text
    # a resume drops a torn last line with the steps that will run again
    path.write_text("".join(lines[:6]) + lines[6][:20])
    truncate_log(path, lambda r: r["step"] < 100)
    assert path.read_text() == "".join(lines[:6])


def _timed_log(path, fmt: str, malformed: bool = False) -> None:
    """Ten steps of 0.01 s and 128 tokens each (so 12,800 tokens/s), a validation and the work
    between steps after step 5 (0.1 s), as the trainer writes them; `fmt` "compact" (weights where
    they change) or "full" (on every line)."""
    comp = RecordCompactor()
    with open(path, "w") as fh:
        for i in range(10):
            rec = {"step": i, "loss": 2.0, "ema": 2.0, "smma": 2.0, "lr": 0.1, "grad_norm": 1.0, "clipped": False,
                   "skipped": False, "tokens_per_s": 12800.0, "step_s": 0.01, "rows": 4, "mix": {"a": 4},
                   "weights": {"a": 1.0}, "focus": ["a"]}
            fh.write(comp.dumps(rec) if fmt == "compact" else json.dumps(rec) + "\n")
            if i == 4:
                fh.write(json.dumps({"kind": "eval", "step": 5, "loss": 2.0, "bpb": 1.5, "tokens": 10, "sources": {}}) + "\n")
                fh.write(json.dumps({"kind": "periodic", "step": 5, "seconds": 0.1, "eval_s": 0.06, "sample_s": 0.04}) + "\n")
            if malformed and i == 6:
                fh.write('{"step": oops}\n')


@pytest.mark.parametrize("fmt,malformed", [("compact", False), ("full", False), ("compact", True)])
def test_speed_is_tokens_over_the_steps_wall_time(tmp_path, fmt, malformed):
    """Issue 45: the run's tokens/s is its tokens over its steps' wall time (`step_s`), and over
    that plus the work between steps ("periodic" records), which are not training steps."""
    path = tmp_path / "loss.jsonl"
    _timed_log(path, fmt, malformed)
    rl = RunLog(path)
    rl.poll()
    assert rl.n_train == 10 and [r["step"] for r in rl.evals] == [5] and rl.malformed == malformed
    sp = rl.speed()
    assert sp["steps"] == 10 and sp["tokens"] == 1280 and sp["step_s"] == pytest.approx(0.1)
    assert sp["tokens_per_s"] == pytest.approx(12800) and sp["tokens_per_s_with_periodic"] == pytest.approx(6400)
    train, evals = read_run_log(path)
    assert [r["step"] for r in train] == list(range(10)) and len(evals) == 1
    d = json.loads(LossData(path, poll_bytes=None).response())
    assert d["steps_done"] == 10 and d["speed"]["tokens_per_s"] == pytest.approx(12800) and d["n_steps"] == 10
    # a resume's cut keeps the work recorded at its checkpoint's step
    truncate_log(path, lambda r: r["step"] < 5 if r.get("kind", "train") == "train" else r["step"] <= 5)
    assert [json.loads(l).get("kind", "train") for l in path.read_text().splitlines()[-2:]] == ["eval", "periodic"]


def test_speed_of_a_log_without_step_times_is_not_made_up(tmp_path):
    """A log written before steps had their wall time: its tokens_per_s figures are not to be
    trusted (issue 45), so there is no overall rate."""
    path = tmp_path / "loss.jsonl"
    path.write_text("".join(json.dumps({"step": i, "loss": 1.0, "tokens_per_s": 5e6}) + "\n" for i in range(5)))
    d = json.loads(LossData(path, poll_bytes=None).response())
    assert d["speed"]["tokens_per_s"] is None and d["speed"]["tokens_per_s_with_periodic"] is None
    assert d["steps_done"] == 5


def test_phases_are_read_from_both_log_formats(tmp_path):
    w1, w2 = {"a": 0.7, "b": 0.3}, {"a": 0.2, "b": 0.8}
    # the compact format with the phase mark: a new phase with the same weights and focus still counts,
    # and the full record a resumed trainer writes first is not a new phase
    rows = [{"step": 0, "loss": 5, "weights": w1, "focus": ["a"], "phase": 0}, {"step": 1, "loss": 5},
            {"kind": "eval", "step": 2, "loss": 4, "sources": {}}, {"step": 2, "loss": 5, "phase": 2},
            {"step": 3, "loss": 5, "weights": w2, "focus": ["b"], "phase": 3},
            {"step": 4, "loss": 5, "weights": w2, "focus": ["b"], "phase": 3}, {"step": 5, "loss": 5}]
    ph = phases(write_jsonl(tmp_path / "new.jsonl", rows))
    assert [(p["start"], p["end"], p["weights"], p["focus"]) for p in ph["phases"]] == [
        (0, 2, w1, ["a"]), (2, 3, w1, ["a"]), (3, 6, w2, ["b"])]
    assert ph["marks_phases"] and ph["last_step"] == 5
    # the earlier format: weights and focus on every line, no phase mark: a new point where they change
    old = [{"step": s, "loss": 5, "weights": w1 if s < 3 else w2, "focus": ["a"] if s < 3 else ["b"]} for s in range(5)]
    ph = phases(write_jsonl(tmp_path / "old.jsonl", old))
    assert [(p["start"], p["end"]) for p in ph["phases"]] == [(0, 3), (3, 5)] and not ph["marks_phases"]



def test_the_tail_finds_the_same_phases_read_in_any_pieces(tmp_path):
    """The dashboard's walk (RunLog, reading what was appended since the last poll) gives the phases
    the whole-file reader gives, in both formats, however the file is cut into polls; a log of more
    phases than the page takes is merged, the weights their mean over the steps."""
    w = [{"a": 0.7, "b": 0.3}, {"a": 0.2, "b": 0.8}, {"a": 0.5, "b": 0.5}]
    compact, c = [], RecordCompactor()
    for s in range(60):
        k = s // 7  # phases of 7 steps; phase 3 draws the weights and focus of phase 2: only its mark tells
        if s == 31:
            c = RecordCompactor()  # a resumed trainer: its first record is whole, and no new phase
        rec = {"step": s, "loss": 5.0, "ema": 5.0, "smma": 5.0, "lr": 0.1, "grad_norm": 1.0, "tokens_per_s": 1.0,
               "weights": w[min(k, 2)], "focus": ["a"] if k % 2 and k != 3 else ["b"], "phase": 7 * k}
        compact.append(json.loads(c.dumps(rec)))
        if s % 10 == 9:
            compact.append({"kind": "eval", "step": s, "loss": 4.0, "sources": {}})
    old = [{"step": s, "loss": 5.0, "weights": w[s // 20], "focus": ["a"] if s < 40 else ["b"]} for s in range(60)]
    for name, rows in (("compact", compact), ("old", old)):
        path = write_jsonl(tmp_path / f"{name}.jsonl", rows)
        want = phases(path)
        starts = [p["start"] for p in want["phases"]]
        assert starts == ([0, 7, 14, 21, 28, 35, 42, 49, 56] if name == "compact" else [0, 20, 40]), (name, starts)
        for chunk in (None, 97, 1000):
            t = RunLog(path)
            while t.poll(chunk):
                pass
            v = t.walk()
            assert v["start"].tolist() == starts and v["end"].tolist() == [p["end"] for p in want["phases"]], (name, chunk)
            assert v["focus"] == [p["focus"] for p in want["phases"]] and v["marks_phases"] == (name == "compact")
            assert v["weights"]["a"].tolist() == [p["weights"]["a"] for p in want["phases"]]
    t = RunLog(tmp_path / "compact.jsonl")
    t.poll()
    m = t.walk(max_points=4)  # 9 phases, 3 at a time
    assert m["phases_per_point"] == 3 and m["start"].tolist() == [0, 21, 42] and m["end"].tolist() == [21, 42, 60]
    assert m["weights"]["a"].tolist() == pytest.approx([(0.7 + 0.2 + 0.5) / 3, 0.5, 0.5])  # 7 steps each
    assert eval_records(tmp_path / "compact.jsonl").keys() == {9, 19, 29, 39, 49, 59}
    assert last_train_step(tmp_path / "compact.jsonl") == 59 == last_train_step(tmp_path / "old.jsonl")
    assert last_train_step(tmp_path / "none.jsonl") == -1 and eval_records(tmp_path / "none.jsonl") == {}
