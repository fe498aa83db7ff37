"""A run's loss.jsonl: its record format, the trainer's writer (RunLogWriter), a reader that
rebuilds the full picture, an incremental tail with a bounded series and a step index (the
dashboard, the audit's plots) and the cut a resume makes (cut_run_records).

The format (2026-11-30, "compact"; andrea/trainer.py writes it through RunLogWriter): one training
record per step,

    {"step", "loss", "ema", "smma", "lr", "grad_norm", "clipped", "skipped", "tokens_per_s",
     "step_s", "rows": rows in the batch, "mix": {source: rows drawn from it}, "weights": {...},
     "focus": [...], "phase": first step of the curriculum's phase}

where `weights` (the curriculum's source weights), `focus` and `phase` (since 2026-12-02) are written
only when they differ from the ones last written (at phase boundaries) and on the first record a
trainer process writes; a reader carries them forward. `step_s` is the step's wall time (since 2026-12-02; its tokens/s is
the batch's tokens over it), without the work between steps, which has records of its own:
`{"kind": "periodic", "step", "seconds", "eval_s", "sample_s", "ckpt_s", "replan_s"}` (the kinds
that ran) after the work done at step `step`. Validation records, `{"kind": "eval", "step", ...}`,
share the file too. A record without a kind is a training step; a kind a reader does not know is
not one.
Files written before (weights and focus on every line, the mix as shares and no `rows`) read the
same: `expand` gives every training record its weights, focus and mix shares in either format.

A 200,000-step run writes ~65 MB this way (~330 bytes a step; `step_s` adds ~20) where the former format wrote ~137 MB.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

log = logging.getLogger("andrea.runlog")

SCALARS = ("loss", "ema", "smma", "lr", "grad_norm", "tokens_per_s", "step_s")
BLOCK = 1024  # training records per step-index entry: a zoom reads from the entry before its range
FINE_BUCKETS = 16384  # the most buckets the tail keeps; past it, neighbours merge and buckets double
MAX_POINTS = 2000  # the most points a view returns
READ_CHUNK = 4 << 20  # bytes decoded at a time (Arrow's reader is fastest on blocks of a few MB)
ZOOM_EXACT_STEPS = 8192  # a zoom this narrow or narrower returns every step, read from the file
SIGNATURE = 64  # bytes before the read offset remembered to notice a file cut and written again


# ----------------------------------------------------------------------------- records
class RecordCompactor:
    """Writes training records with weights and focus only when they change. One per open log
    file: a new trainer process starts with a full record, so no reader needs an earlier file."""

    def __init__(self):
        self.weights = self.focus = self.phase = None

    def dumps(self, rec: dict) -> str:
        if rec.get("kind", "train") == "train":
            rec = dict(rec)
            for key in ("weights", "focus", "phase"):
                if key in rec:
                    if rec[key] == getattr(self, key):
                        del rec[key]
                    else:
                        setattr(self, key, rec[key])
        return json.dumps(rec) + "\n"


class Expander:
    """Rebuilds full training records in file order: weights and focus carried forward, the mix as
    shares of the batch. Validation records pass through."""

    def __init__(self):
        self.weights: dict = {}
        self.focus: list = []
        self.phase: int | None = None

    def __call__(self, rec: dict) -> dict:
        if rec.get("kind", "train") != "train":
            return rec
        out = dict(rec)
        self.weights = out.setdefault("weights", self.weights)
        self.focus = out.setdefault("focus", self.focus)
        if "phase" in out or self.phase is not None:  # logs written before 2026-12-02 have none
            self.phase = out.setdefault("phase", self.phase)
        if "rows" in out:  # compact: the mix as counts
            rows = out.pop("rows")
            out["mix"] = {k: v / rows for k, v in out.get("mix", {}).items()}
        return out


def read_records(path: str | os.PathLike) -> list[dict]:
    """Every record of a loss.jsonl in file order, training records expanded (`Expander`). A
    missing file reads as empty; a torn last line (a write in progress, a crash) is left out; a
    malformed line elsewhere is skipped and counted in the log."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    torn = not data.endswith(b"\n")
    expand, out, bad = Expander(), [], 0
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or "step" not in rec:
                raise ValueError("not a record")
        except ValueError:
            if not (torn and i == len(lines) - 1):
                bad += 1
            continue
        out.append(expand(rec))
    if bad:
        log.warning("%s: skipped %d malformed line(s)", path, bad)
    return out


def read_run_log(path: str | os.PathLike) -> tuple[list[dict], list[dict]]:
    """A run's loss.jsonl as (training records, validation records), training records expanded."""
    records = read_records(path)
    return ([r for r in records if r.get("kind", "train") == "train"], [r for r in records if r.get("kind") == "eval"])


def _lines_backwards(fh, size: int, chunk: int = 1 << 16):
    """(offset, bytes) of each line of a file, the last first (a last line without its newline
    included), reading it backwards in chunks."""
    pos, buf = size, b""
    while pos > 0:
        n = min(chunk, pos)
        pos -= n
        fh.seek(pos)
        buf = fh.read(n) + buf
        parts = buf.split(b"\n")
        first = 0 if pos == 0 else 1  # parts[0] may be the end of a line that starts further back
        offsets, o = [], pos
        for p in parts:
            offsets.append(o)
            o += len(p) + 1
        for i in range(len(parts) - 1, first - 1, -1):
            yield offsets[i], parts[i]
        buf = parts[0] if first else b""


def _train_line(line: bytes) -> bool:
    """A training record's line, told without decoding it (a record without a kind is one)."""
    return b'"kind"' not in line or b'"kind": "train"' in line


def eval_records(path: str | os.PathLike) -> dict[int, dict]:
    """The validation records of a loss.jsonl, by step ({} for a missing file). Only their lines
    are decoded: a 200,000-step log reads in about a second. A torn last line is left out, a
    malformed one skipped."""
    path = Path(path)
    if not path.exists():
        return {}
    out = {}
    with open(path, "rb") as fh:
        for line in fh:
            if b'"kind": "eval"' in line and line.endswith(b"\n"):
                try:
                    r = json.loads(line)
                    out[int(r["step"])] = r
                except (ValueError, KeyError, TypeError):
                    continue
    return out


def last_train_step(path: str | os.PathLike) -> int:
    """The step of the last training record of a loss.jsonl, read from its end (-1: none)."""
    path = Path(path)
    if not path.exists():
        return -1
    with open(path, "rb") as fh:
        for _, line in _lines_backwards(fh, fh.seek(0, os.SEEK_END)):
            if not line.strip() or not _train_line(line):
                continue
            try:
                return int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                continue
    return -1


PHASE_KEYS = ("weights", "focus", "phase")


class PhaseTracker:
    """The curriculum's phases from training records in file order: a new phase where the record
    marks one (`phase`, since 2026-12-02), or where the weights or the focus change (a resume under
    new floors or caps inside a phase; in an older log, with no mark, every boundary that changed
    them: a phase that drew the same weights and focus as the one before cannot be seen there). The
    full record a resumed trainer writes first repeats what is in force: not a new phase."""

    def __init__(self):
        self.cur: dict = dict.fromkeys(PHASE_KEYS)
        self.phases: list[dict] = []  # {"start", "weights", "focus", "phase"}; each ends where the next starts
        self.marks = False  # the log marks its phases

    def add(self, step: int, written: dict) -> bool:
        """A training record at `step` that wrote `written` (some of weights, focus, phase).
        True when it starts a phase."""
        changed = {k for k in PHASE_KEYS if k in written and _same(k, written[k]) != _same(k, self.cur[k])}
        if not changed:
            return False
        self.cur.update({k: written[k] for k in changed})
        self.marks |= self.cur["phase"] is not None
        start = self.cur["phase"] if "phase" in changed and self.cur["phase"] is not None else step
        self.phases.append({"start": int(start), "weights": dict(self.cur["weights"] or {}),
                            "focus": list(self.cur["focus"] or []), "phase": self.cur["phase"]})
        return True

    def view(self, last_step: int) -> dict:
        """The phases with their ends ([start, end) steps), the last ending after `last_step`."""
        out = [dict(p) for p in self.phases]
        for a, b in zip(out, out[1:]):
            a["end"] = b["start"]
        if out:
            out[-1]["end"] = max(last_step + 1, out[-1]["start"] + 1)
        return {"phases": out, "last_step": last_step, "marks_phases": any(p["phase"] is not None for p in out)}


def _same(key: str, value):
    """A value as compared for a change: weights without their zeros (a record may name a source
    at 0 that another leaves out)."""
    if key == "weights" and isinstance(value, dict):
        return {k: v for k, v in value.items() if v}
    return value


def phases(path: str | os.PathLike) -> dict:
    """The curriculum's phases in a loss.jsonl (PhaseTracker), read fast (only the lines that set
    weights, focus or phase are decoded): {"phases": [{"start", "end", "weights", "focus",
    "phase"}] in step order, "last_step", "marks_phases": whether the log marks its phases}."""
    path = Path(path)
    tracker, bad = PhaseTracker(), 0
    marks = tuple(f'"{k}"'.encode() for k in PHASE_KEYS)
    with open(path, "rb") as fh:
        for line in fh:
            if not line.endswith(b"\n"):
                break  # a line being written
            if not any(m in line for m in marks) or not _train_line(line):
                continue
            try:
                r = json.loads(line)
                step = int(r["step"])
            except (ValueError, KeyError, TypeError):
                bad += 1
                continue
            tracker.add(step, {k: r[k] for k in PHASE_KEYS if k in r})
    if bad:
        log.warning("%s: %d malformed line(s) skipped", path, bad)
    return tracker.view(last_train_step(path))


def truncate_log(path: str | os.PathLike, keep: Callable[[dict], bool]) -> int:
    """Cut a JSON-lines log back to its last record that `keep` accepts (a resume: the records of
    steps that will run again go). Records are in step order, so what goes is a tail: it is found
    reading backwards from the end, and the file is cut there with one truncate (atomic, and the
    kept bytes are not rewritten: a 137 MB log is not copied for a resume). A torn or malformed
    line in that tail goes with it. Returns the bytes dropped."""
    path = Path(path)
    if not path.exists():
        return 0
    with open(path, "r+b") as fh:
        size = fh.seek(0, os.SEEK_END)
        cut = 0
        for off, line in _lines_backwards(fh, size):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                ok = isinstance(rec, dict) and bool(keep(rec))
            except (ValueError, KeyError, TypeError):
                ok = False
            if ok:
                cut = off + len(line)
                break
        fh.seek(cut)
        if cut and fh.read(1) != b"\n":  # the kept line had no newline yet: the next append would join it
            fh.seek(cut)
            fh.write(b"\n")
        cut += 1 if cut else 0
        fh.truncate(cut)
        return max(0, size - cut)


def cut_run_records(run_dir: str | os.PathLike, step: int, parity_bytes: int | None = None) -> None:
    """A resume at `step`: the records written after its checkpoint belong to steps that will run
    again and go. A step's training record comes before its checkpoint (the one of step N saw
    the weights before step N's update: records of steps below N stay), its samples, validation
    and the work between steps at step N just before or after it (they stay). One truncate each,
    reading only the logs' tails: a 200,000-step log is neither read whole nor copied. With
    `parity_bytes`, parity/batches.bin is cut to that many bytes (the batches recorded so far)."""
    run_dir = Path(run_dir)
    truncate_log(run_dir / "loss.jsonl",
                 lambda r: r["step"] < step if r.get("kind", "train") == "train" else r["step"] <= step)
    truncate_log(run_dir / "samples.jsonl", lambda r: r["step"] <= step)
    batches = run_dir / "parity" / "batches.bin"
    if parity_bytes is not None and batches.exists():
        with open(batches, "r+b") as fh:
            fh.truncate(parity_bytes)


class RunLogWriter:
    """The writer of a run's loss.jsonl: records appended in order by a background thread, so the
    step loop never waits on the disk; training records compacted (RecordCompactor, one per open
    file: a new trainer process starts with a full record). Other appends (parity batches) share
    the thread and its order. A write that failed (a full disk) is raised at the next record, not
    lost, and the queue never holds more than a few steps. A writer made with `enabled=False`
    (a rank other than 0) writes nothing."""

    MAX_QUEUED = 64

    def __init__(self, path: str | os.PathLike, enabled: bool = True):
        self.path, self.enabled = Path(path), enabled
        self._pool: ThreadPoolExecutor | None = None
        self._fh = None
        self._compactor = RecordCompactor()
        self._writes: list[Future] = []

    def open(self) -> None:
        """Start appending (after a resume has cut the file: cut_run_records)."""
        if self.enabled:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="andrea-log")
            self._fh = open(self.path, "a", encoding="utf-8")
            self._compactor = RecordCompactor()  # a new file position: its first record is whole

    def record(self, rec: dict) -> None:
        """Append a record to loss.jsonl (in order, in the background)."""
        self.submit(self._write_line, rec)

    def append_bytes(self, path: str | os.PathLike, data: bytes) -> None:
        """Append `data` to another file, in order with the records (parity/batches.bin)."""
        self.submit(_append, Path(path), data)

    def submit(self, fn: Callable, *args) -> None:
        """Queue a write on the log thread."""
        if not self.enabled:
            return
        while self._writes and (self._writes[0].done() or len(self._writes) > self.MAX_QUEUED):
            self._writes.pop(0).result()
        self._writes.append(self._pool.submit(fn, *args))

    def flush(self) -> None:
        """Until every queued write is done (a failed one is raised here)."""
        while self._writes:
            self._writes.pop(0).result()

    def close(self) -> None:
        """Every queued write done, the file closed, the thread ended."""
        try:
            self.flush()
        finally:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def _write_line(self, rec: dict) -> None:
        self._fh.write(self._compactor.dumps(rec))  # weights and focus only where they change
        self._fh.flush()


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


# ----------------------------------------------------------------------------- decoding
def _number(v) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_null(t)


def _well_typed(t: pa.Table) -> bool:
    """Every line had an integer step, numbers where numbers belong, weights as numbers."""
    names = t.column_names
    if "step" not in names or not pa.types.is_integer(t.schema.field("step").type) or t.column("step").null_count:
        return False
    if not all(_numeric(t.schema.field(k).type) for k in SCALARS if k in names):
        return False
    if "weights" in names:
        w = t.schema.field("weights").type
        if not (pa.types.is_null(w) or (pa.types.is_struct(w) and all(_numeric(f.type) for f in w))):
            return False
    return "kind" not in names or pa.types.is_string(t.schema.field("kind").type) or pa.types.is_null(t.schema.field("kind").type)


SCALAR_SCHEMA = pa.schema([("step", pa.int64()), ("kind", pa.string())] + [(k, pa.float64()) for k in SCALARS])


def _find_all(data: bytes, needle: bytes) -> list[int]:
    """Where needle occurs in data (bytes.find: several times faster than a regex scan)."""
    out, i = [], data.find(needle)
    while i >= 0:
        out.append(i)
        i = data.find(needle, i + 1)
    return out


def _table(data: bytes, nl: np.ndarray) -> tuple[pa.Table, np.ndarray, int, dict | None]:
    """Complete lines (ending at the newlines `nl`) as an Arrow table (Arrow's JSON reader: several
    times faster than a loop of json.loads), the line index of each row, the count of malformed
    lines, and, for compact records, {line: record} of the few lines that set weights or focus.

    Compact records (weights on few lines) are read for the step and scalars only (Arrow skips the
    rest: ~3x faster), and the lines that set weights or focus through json.loads. A block Arrow
    cannot read (a malformed line, a NaN loss) is read line by line instead."""
    n_lines = len(nl)
    try:
        # blocks of 512 KiB: Arrow decodes them on all cores (~2x on two cores for the former format)
        ro = pa_json.ReadOptions(block_size=1 << 19)
        changes = _find_all(data, b'"weights": ') + _find_all(data, b'"focus": ') + _find_all(data, b'"phase": ')
        if len(changes) * 4 < n_lines:
            t = pa_json.read_json(pa.BufferReader(data), read_options=ro, parse_options=pa_json.ParseOptions(
                explicit_schema=SCALAR_SCHEMA, unexpected_field_behavior="ignore"))
            if t.num_rows == n_lines and not t.column("step").null_count:
                lines = np.unique(np.searchsorted(nl, changes))
                starts = np.concatenate(([0], nl[:-1] + 1))
                sparse = {int(i): json.loads(data[starts[i] : nl[i]]) for i in lines}
                if all(isinstance(r, dict) for r in sparse.values()):
                    return t, np.arange(n_lines), 0, sparse
        else:
            t = pa_json.read_json(pa.BufferReader(data), read_options=ro)
            if t.num_rows == n_lines and _well_typed(t):
                return t, np.arange(n_lines), 0, None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        pass
    recs, rows, bad = [], [], 0
    for i, line in enumerate(data.split(b"\n")[:n_lines]):
        try:
            r = json.loads(line)
            kind = r.get("kind")
            rec = {"step": int(r["step"]), "kind": kind if isinstance(kind, str) else None}
            for k in SCALARS:
                v = r.get(k)
                rec[k] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
            w = r.get("weights")
            rec["weights"] = {str(k): float(v) for k, v in w.items()} if isinstance(w, dict) else None
            f = r.get("focus")
            rec["focus"] = [str(x) for x in f] if isinstance(f, list) else None
            p = r.get("phase")
            rec["phase"] = p if isinstance(p, int) and not isinstance(p, bool) else None
        except (ValueError, KeyError, TypeError, AttributeError):
            bad += 1
            continue
        recs.append(rec)
        rows.append(i)
    if not recs:
        return pa.table({"step": pa.array([], pa.int64())}), np.zeros(0, np.int64), bad, None
    return pa.Table.from_pylist(recs), np.asarray(rows, np.int64), bad, None


class Decoded:
    """One stretch of the log as arrays: training steps with their scalars and weights (carried
    forward from `carry`), where each training line starts, focus where written, the rows that
    may start a phase of the curriculum (`marks`: (training row, what it wrote of weights, focus
    and phase), for PhaseTracker), and the positions of the validation lines and of the other
    records (the work between steps)."""

    def __init__(self, data: bytes, base: int, carry: dict[str, float], sources: list[str]):
        nl = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
        starts = np.concatenate(([0], nl[:-1] + 1)) if len(nl) else np.zeros(0, np.int64)
        t, rows, self.malformed, sparse = _table(data, nl)
        starts = starts[rows]
        n = t.num_rows
        names = t.column_names
        is_eval, tr = np.zeros(n, bool), np.ones(n, bool)
        if "kind" in names:
            kind = t.column("kind").cast(pa.string())
            is_eval = pc.fill_null(pc.equal(kind, "eval"), False).to_numpy(zero_copy_only=False)
            tr = pc.fill_null(pc.equal(kind, "train"), True).to_numpy(zero_copy_only=False)  # no kind: a step
        self.eval_spans = [(int(starts[i]), int(nl[rows[i]])) for i in np.flatnonzero(is_eval)]  # within data
        self.other_spans = [(int(starts[i]), int(nl[rows[i]])) for i in np.flatnonzero(~tr & ~is_eval)]
        self.step = t.column("step").to_numpy(zero_copy_only=False)[tr].astype(np.int64)
        self.offset = starts[tr].astype(np.int64) + base
        self.scalars = {}
        for k in SCALARS:
            if k in names:
                self.scalars[k] = t.column(k).cast(pa.float64()).to_numpy(zero_copy_only=False)[tr]
            else:
                self.scalars[k] = np.full(len(self.step), np.nan)
        m = len(self.step)
        # weights: a row that has them replaces the whole set; a source missing from it is 0
        self.sources = list(sources)
        given: dict[str, np.ndarray] = {}
        present = np.zeros(m, bool)
        self._focus_sparse: dict[int, list] | None = None
        self.marks: list[tuple[int, dict]] = []
        if sparse is not None:  # the few lines that set weights, focus or phase, by training row
            train_row = np.cumsum(tr) - 1
            self._focus_sparse = {}
            focus_present = np.zeros(m, bool)
            ks, ws = [], []
            for line, r in sparse.items():
                if not tr[line]:
                    continue
                k = int(train_row[line])
                written = {key: r[key] for key in PHASE_KEYS if key in r}
                if written:
                    self.marks.append((k, written))
                if isinstance(r.get("weights"), dict):
                    ks.append(k)
                    ws.append(r["weights"])
                if isinstance(r.get("focus"), list):
                    focus_present[k] = True
                    self._focus_sparse[k] = r["focus"]
            present[ks] = True
            for src in dict.fromkeys(s for w in ws for s in w):
                if src not in self.sources:
                    self.sources.append(src)
                vals = [w.get(src, np.nan) for w in ws]
                try:
                    v = np.asarray(vals, float)
                except (TypeError, ValueError):  # a value that is not a number: as if absent
                    v = np.array([x if isinstance(x, (int, float)) else np.nan for x in vals], float)
                given[src] = np.full(m, np.nan)
                given[src][ks] = v
        elif "weights" in names and pa.types.is_struct(t.schema.field("weights").type):
            w = t.column("weights").combine_chunks()
            present = w.is_valid().to_numpy(zero_copy_only=False)[tr]
            for f in w.type:
                given[f.name] = pc.struct_field(w, f.name).cast(pa.float64()).to_numpy(zero_copy_only=False)[tr]
                if f.name not in self.sources:
                    self.sources.append(f.name)
        w_present = present
        last = np.maximum.accumulate(np.where(present, np.arange(m), -1)) if m else np.zeros(0, np.int64)
        self.weights = np.empty((m, len(self.sources)))
        for j, s in enumerate(self.sources):
            v = np.nan_to_num(given[s], nan=0.0) if s in given else np.zeros(m)
            self.weights[:, j] = np.where(last >= 0, v[np.maximum(last, 0)], carry.get(s, 0.0))
        self.focus_col = t.column("focus") if "focus" in names and sparse is None else None
        if sparse is not None:
            present = focus_present
        else:
            present = (self.focus_col.is_valid().to_numpy(zero_copy_only=False)[tr]
                       if self.focus_col is not None else np.zeros(m, bool))
        self._focus_last = np.maximum.accumulate(np.where(present, np.arange(m), -1)) if m else np.zeros(0, np.int64)
        self._focus_rows = np.flatnonzero(tr)
        if sparse is None and m:  # every line may carry weights and focus (the earlier format): the rows where they change
            self.marks = self._changes(t, tr, w_present, present, carry)

    def _changes(self, t: pa.Table, tr: np.ndarray, w_present: np.ndarray, f_present: np.ndarray, carry: dict) -> list:
        """The rows of a stretch with weights and focus on every line where either (or a phase
        mark) changes: compared as arrays, only those rows decoded (a 137 MB log reads no slower)."""
        prev = np.vstack(([carry.get(s, 0.0) for s in self.sources], self.weights[:-1]))
        rows = np.flatnonzero(w_present & (self.weights != prev).any(axis=1))

        def changes(values: np.ndarray, present: np.ndarray) -> np.ndarray:
            at = np.flatnonzero(present)
            v = values[at]
            return at[np.r_[True, v[1:] != v[:-1]]] if len(at) else at

        focus_at = np.zeros(0, np.int64)
        if self.focus_col is not None and f_present.any():
            joined = pc.binary_join(self.focus_col.take(self._focus_rows), "\x1f").to_numpy(zero_copy_only=False)
            focus_at = changes(joined, f_present)
        phase = None
        if "phase" in t.column_names and _numeric(t.schema.field("phase").type):
            phase = t.column("phase").cast(pa.float64()).to_numpy(zero_copy_only=False)[tr]
            rows = np.union1d(rows, changes(phase, ~np.isnan(phase)))
        rows = np.union1d(rows, focus_at)
        focus = dict(zip(rows.tolist(), self.focus_col.take(self._focus_rows[rows]).to_pylist())) if self.focus_col is not None else {}
        out = []
        for k in rows.tolist():
            written = {"weights": dict(zip(self.sources, self.weights[k].tolist()))} if w_present[k] else {}
            if focus.get(k) is not None:
                written["focus"] = focus[k]
            if phase is not None and not np.isnan(phase[k]):
                written["phase"] = int(phase[k])
            out.append((k, written))
        return out

    def focus_before(self, k: int, carry: list) -> list:
        """The focus in force before training row k (`carry` when no row before k wrote one)."""
        if k == 0 or self._focus_last[k - 1] < 0:
            return carry
        if self._focus_sparse is not None:
            return self._focus_sparse[int(self._focus_last[k - 1])]
        return self.focus_col.take([int(self._focus_rows[self._focus_last[k - 1]])]).to_pylist()[0]


# ----------------------------------------------------------------------------- buckets
# how each bucket column merges: a bucket spans steps [step_first, step]
MERGE = {"id": "first", "step_first": "first", "step": "last", "n": "sum", "loss": "last", "loss_min": "min",
         "loss_max": "max", "ema": "last", "smma": "last", "lr": "last", "grad_norm": "max", "grad_norm_min": "min",
         "tokens_per_s": "last"}


def _reduce(cols: dict[str, np.ndarray], starts: np.ndarray) -> dict[str, np.ndarray]:
    ends = np.concatenate((starts[1:], [len(cols["id"])])) - 1
    out = {}
    for k, v in cols.items():
        how = MERGE.get(k, "sum")  # the weights ("w:<source>") are summed: their mean is the share
        if how == "first":
            out[k] = v[starts]
        elif how == "last":
            out[k] = v[ends]
        elif how == "sum":
            out[k] = np.add.reduceat(v, starts)
        else:
            with np.errstate(invalid="ignore"):
                out[k] = (np.fmin if how == "min" else np.fmax).reduceat(v, starts)
    return out


def _group(cols: dict[str, np.ndarray], ids: np.ndarray) -> dict[str, np.ndarray]:
    """Merge consecutive rows of equal id (ids non-decreasing)."""
    starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    g = _reduce({**cols, "id": ids}, starts)
    return g


class Buckets:
    """The run's training records as at most `limit` buckets of `width` steps (a power of two),
    each bucket aligned at a multiple of its width. Per bucket: the first and last step, the count,
    the smallest and largest loss and gradient norm (a spike stays visible however long the run),
    the last loss, EMA, SMMA, learning rate and tokens/s, and the mean weight of each source.
    When a record would make one bucket too many, neighbours merge and the width doubles, so the
    memory held is bounded by `limit`, not by the run's length."""

    def __init__(self, limit: int = FINE_BUCKETS):
        self.limit, self.width = limit, 1
        self.cols: dict[str, np.ndarray] = {k: np.zeros(0) for k in MERGE}
        self.cols["id"] = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.cols["id"])

    @staticmethod
    def rows(step: np.ndarray, scalars: dict[str, np.ndarray], weights: np.ndarray, sources: list[str]) -> dict[str, np.ndarray]:
        """Per-step rows in bucket form (a bucket of one step)."""
        r = {"id": step.copy(), "step_first": step.astype(float), "step": step.astype(float), "n": np.ones(len(step)),
             "loss": scalars["loss"], "loss_min": scalars["loss"], "loss_max": scalars["loss"], "ema": scalars["ema"],
             "smma": scalars["smma"], "lr": scalars["lr"], "grad_norm": scalars["grad_norm"],
             "grad_norm_min": scalars["grad_norm"], "tokens_per_s": scalars["tokens_per_s"]}
        for j, s in enumerate(sources):
            r["w:" + s] = weights[:, j]
        return r

    def add(self, rows: dict[str, np.ndarray]) -> None:
        if not len(rows["id"]):
            return
        rows = dict(rows)
        rows["id"] = rows["id"] // self.width
        n_old = len(self)
        for k in rows:  # a source seen for the first time weighed 0 before
            if k not in self.cols:
                self.cols[k] = np.zeros(n_old)
        for k in self.cols:
            if k not in rows:
                rows[k] = np.zeros(len(rows["id"]))
        # the newest bucket may still be filling: it is merged again with the new rows
        tail = {k: np.concatenate((v[-1:], rows[k])) for k, v in self.cols.items()} if n_old else rows
        merged = _group({k: v for k, v in tail.items() if k != "id"}, tail["id"])
        self.cols = {k: np.concatenate((v[: n_old - 1], merged[k])) for k, v in self.cols.items()} if n_old else merged
        while len(self) > self.limit:
            self.width *= 2
            self.cols = _group({k: v for k, v in self.cols.items() if k != "id"}, self.cols["id"] // 2)

    def view(self, max_points: int = MAX_POINTS, lo: int | None = None, hi: int | None = None) -> dict:
        """The buckets overlapping steps [lo, hi], merged further (aligned, by powers of two) to at
        most max_points."""
        c = self.cols
        if lo is not None or hi is not None:
            sel = np.ones(len(self), bool)
            if lo is not None:
                sel &= c["step"] >= lo
            if hi is not None:
                sel &= c["step_first"] <= hi
            c = {k: v[sel] for k, v in c.items()}
        g = 1
        while len(c["id"]) and (c["id"][-1] // g - c["id"][0] // g + 1) > max_points:
            g *= 2
        if g > 1:
            c = _group({k: v for k, v in c.items() if k != "id"}, c["id"] // g)
        return columns(c, self.width * g)


def columns(c: dict[str, np.ndarray], bucket_steps: int) -> dict:
    """Bucket columns as a view: arrays (NaN: a value the records lacked), weights as means."""
    n = np.maximum(c["n"], 1)
    out = {"bucket_steps": int(bucket_steps), "step": c["step"].astype(np.int64), "step_first": c["step_first"].astype(np.int64)}
    for k in ("loss", "loss_min", "loss_max", "ema", "smma", "lr", "grad_norm", "grad_norm_min", "tokens_per_s"):
        out[k] = c[k]
    out["weights"] = {k[2:]: v / n for k, v in sorted(c.items()) if k.startswith("w:")}
    return out


def jsonable(d):
    """A view with its arrays as lists, NaN as None."""
    if isinstance(d, dict):
        return {k: jsonable(v) for k, v in d.items()}
    if isinstance(d, np.ndarray):
        return d.tolist() if d.dtype.kind in "iu" else [x if x == x else None for x in d.tolist()]
    return d


# ----------------------------------------------------------------------------- the tail
class RunLog:
    """A loss.jsonl read incrementally: each `poll` reads only the bytes appended since the last
    (up to a budget), decodes them in one go and folds them into the bounded `Buckets`; an index
    remembers the byte offset of every BLOCK-th training record (with the weights and focus in force
    there) so `zoom` reads a step range from the file at full resolution without re-reading it.

    A file cut and written again (a resume truncates it; a rename gives a new inode) is noticed by
    its inode, a size below the read offset, or the bytes just before the offset no longer being
    the ones read; the log is then read again from the start. Thread-safe (the dashboard's server
    answers requests on several threads)."""

    def __init__(self, path: str | os.PathLike, limit: int = FINE_BUCKETS):
        self.path, self.limit = Path(path), limit
        self.lock = threading.RLock()
        self.generation = 0
        self._reset()

    def _reset(self) -> None:
        self.generation += 1
        self.ident = None
        self.offset = 0
        self.size = 0
        self.signature = b""
        self.n_train = 0
        self.last_step = -1
        self.malformed = 0
        self.out_of_order = 0
        # the run's speed: tokens and wall time of the steps that have one (step_s), and the work
        # between steps ("periodic" records)
        self.timed_steps = 0
        self.timed_tokens = 0.0
        self.step_s = 0.0
        self.periodic_s = 0.0
        self.sources: list[str] = []
        self.weights: dict[str, float] = {}
        self.focus: list = []
        self.buckets = Buckets(self.limit)
        self.index_steps: list[int] = []  # first step of each block
        self.index: list[tuple[int, dict, list]] = []  # (byte offset, weights and focus in force there)
        # the curriculum's phases (the walk on the simplex): one entry per phase, ~30 bytes and the
        # weights each (a 200,000-step run of 7–42-step phases holds ~10,000)
        self.phases = PhaseTracker()
        self._walk_start: list[int] = []  # the phases as columns, grown as they come (walk: no pass over them per answer)
        self._walk_cols: dict[str, list[float]] = {}
        self.evals: list[dict] = []
        # the validation records as columns too, grown as they come (the dashboard sends them all)
        self.eval_cols: dict[str, list] = {"step": [], "loss": [], "bpb": []}
        self.eval_sources: dict[str, list] = {}
        self.last: dict | None = None

    @property
    def behind(self) -> int:
        """Bytes in the file not yet read."""
        return max(0, self.size - self.offset)

    def poll(self, max_bytes: int | None = None) -> bool:
        """Read what is new (at most max_bytes of it, whole lines). True when something changed."""
        with self.lock:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                if self.offset:
                    self._reset()
                    return True
                return False
            ident = (st.st_dev, st.st_ino)
            changed = False
            if self.offset and (ident != self.ident or st.st_size < self.offset or not self._signature_holds()):
                log.info("%s was cut or written again: reading it from the start", self.path)
                self._reset()
                changed = True
            self.ident, self.size = ident, st.st_size
            if st.st_size == self.offset:
                return changed
            budget = st.st_size - self.offset if max_bytes is None else min(max_bytes, st.st_size - self.offset)
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                progressed = False
                while budget > 0:
                    data = fh.read(min(budget, READ_CHUNK))
                    cut = data.rfind(b"\n") + 1
                    if cut == 0 and progressed:  # the budget ends inside a line: it is read next time
                        break
                    while cut == 0 and self.offset + len(data) < st.st_size:  # a line longer than the budget
                        more = fh.read(1 << 16)
                        if not more:
                            break
                        data += more
                        cut = data.rfind(b"\n") + 1
                    if cut == 0:  # only a line still being written
                        break
                    self._ingest(data[:cut])
                    changed = progressed = True
                    budget -= cut
                    fh.seek(self.offset)
            return changed

    def _signature_holds(self) -> bool:
        n = len(self.signature)
        with open(self.path, "rb") as fh:
            fh.seek(self.offset - n)
            return fh.read(n) == self.signature

    def _ingest(self, data: bytes) -> None:
        base = self.offset
        d = Decoded(data, base, self.weights, self.sources)
        self.malformed += d.malformed
        for a, b in d.eval_spans:
            try:
                r = json.loads(data[a:b])
                step = int(r["step"])
            except (ValueError, KeyError, TypeError):
                self.malformed += 1
                continue
            self._add_eval(r, step)
        for a, b in d.other_spans:
            try:
                r = json.loads(data[a:b])
            except ValueError:
                self.malformed += 1
                continue
            v = r.get("seconds") if isinstance(r, dict) and r.get("kind") == "periodic" else None
            if isinstance(v, (int, float)) and math.isfinite(v):
                self.periodic_s += v
        # steps only go forward in a log; a line that does not (never written by the trainer) is
        # counted and left out
        ok = d.step > np.maximum.accumulate(np.concatenate(([self.last_step], d.step)))[:-1]
        if not ok.all():
            self.out_of_order += int((~ok).sum())
        idx = np.flatnonzero(ok)
        m = len(idx)
        for k, written in d.marks:
            if ok[k]:
                self.phases.add(int(d.step[k]), written)
        if m:
            step, W = d.step[idx], d.weights[idx]
            scalars = {k: v[idx] for k, v in d.scalars.items()}
            for k in range((-self.n_train) % BLOCK, m, BLOCK):
                row = int(idx[k])
                before_w = dict(zip(d.sources, d.weights[row - 1].tolist())) if row else dict(self.weights)
                before_f = d.focus_before(row, self.focus)
                self.index_steps.append(int(step[k]))
                self.index.append((int(d.offset[row]), before_w, before_f))
            self.buckets.add(Buckets.rows(step, scalars, W, d.sources))
            step_s, tps = scalars["step_s"], scalars["tokens_per_s"]
            timed = np.isfinite(step_s) & np.isfinite(tps) & (step_s > 0)
            self.timed_steps += int(timed.sum())
            self.step_s += float(step_s[timed].sum())
            # a step's tokens are a whole number: rounded per step, the written figures' rounding does not add up
            self.timed_tokens += float(np.rint(tps[timed] * step_s[timed]).sum())
            self.n_train += m
            self.last_step = int(step[-1])
            self.last = {"step": self.last_step, **{k: (None if math.isnan(v[-1]) else float(v[-1])) for k, v in scalars.items()}}
        if len(d.step):
            self.weights = dict(zip(d.sources, d.weights[-1].tolist()))
            self.focus = d.focus_before(len(d.step), self.focus)
        self.sources = d.sources
        self.offset = base + len(data)
        self.signature = (self.signature + data)[-SIGNATURE:]

    def _add_eval(self, r: dict, step: int) -> None:
        self.evals.append(r)
        n = len(self.eval_cols["step"])
        self.eval_cols["step"].append(step)
        for k in ("loss", "bpb"):
            v = r.get(k)
            self.eval_cols[k].append(v if isinstance(v, (int, float)) else None)
        sources = r.get("sources") if isinstance(r.get("sources"), dict) else {}
        for s, v in sources.items():
            if s not in self.eval_sources:
                self.eval_sources[s] = [None] * n
        for s, col in self.eval_sources.items():
            v = sources.get(s)
            col.append(v.get("bpb") if isinstance(v, dict) and isinstance(v.get("bpb"), (int, float)) else None)

    def eval_view(self, lo: int | None = None, hi: int | None = None) -> dict:
        """The validation records (steps [lo, hi]) as arrays: loss, bits per byte, and bits per
        byte per source (NaN where a record lacks one)."""
        with self.lock:
            step = np.asarray(self.eval_cols["step"], np.int64)
            sel = np.ones(len(step), bool)
            if lo is not None:
                sel &= step >= lo
            if hi is not None:
                sel &= step <= hi
            col = lambda v: np.asarray(v, float)[sel]  # noqa: E731 (None -> NaN)
            return {"step": step[sel], "loss": col(self.eval_cols["loss"]), "bpb": col(self.eval_cols["bpb"]),
                    "sources": {s: col(v) for s, v in sorted(self.eval_sources.items())}}

    # ------------------------------------------------------------------ views
    def walk(self, max_points: int = MAX_POINTS, lo: int | None = None, hi: int | None = None) -> dict:
        """The curriculum's phases overlapping steps [lo, hi] as columns: first step, end (the next
        phase's first step), the weights and the focus of each; more than max_points phases are
        merged g at a time (`phases_per_point`: the weights their mean over their steps, the focus
        the last one's). `marks_phases`: the log marks its phases (else a phase is a change of the
        weights or the focus, PhaseTracker)."""
        with self.lock:
            ph = self.phases.phases
            for p in ph[len(self._walk_start):]:
                n = len(self._walk_start)
                for src in p["weights"]:
                    self._walk_cols.setdefault(src, [0.0] * n)
                for src, col in self._walk_cols.items():
                    col.append(_number(p["weights"].get(src)))
                self._walk_start.append(p["start"])
            start = np.asarray(self._walk_start, np.int64)
            n = len(start)
            end = np.append(start[1:], max(self.last_step + 1, int(start[-1]) + 1)) if n else start
            sel = np.ones(n, bool)
            if lo is not None:
                sel &= end > lo
            if hi is not None:
                sel &= start <= hi
            rows = np.flatnonzero(sel)
            sources = list(self._walk_cols)
            W = np.array([np.asarray(self._walk_cols[src])[rows] for src in sources]).T.reshape(len(rows), len(sources))
            start, end = start[rows], end[rows]
            focus = [ph[i]["focus"] for i in rows]
            marks = self.phases.marks
        g = -(-len(rows) // max_points) if len(rows) > max_points else 1
        if g > 1:
            ids = np.arange(len(rows)) // g
            first = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
            steps = (end - start).astype(float)
            W = np.add.reduceat(W * steps[:, None], first) / np.add.reduceat(steps, first)[:, None]
            last = np.r_[first[1:], len(rows)] - 1
            start, end, focus = start[first], end[last], [focus[i] for i in last]
        return {"start": start, "end": end, "weights": {s: W[:, j] for j, s in enumerate(sources)}, "focus": focus,
                "phases_per_point": g, "marks_phases": marks, "n_phases": len(rows)}

    def series(self, max_points: int = MAX_POINTS) -> dict:
        with self.lock:
            return self._meta() | self.buckets.view(max_points)

    def _meta(self) -> dict:
        return {"n_steps": self.n_train, "last": self.last, "steps_done": self.last_step + 1, "speed": self.speed(),
                "behind_bytes": self.behind, "malformed": self.malformed, "focus": list(self.focus or [])}

    def speed(self) -> dict:
        """The run's tokens/s over the wall time of its steps (`tokens_per_s`), and over that plus
        the validation, samples, checkpoints and re-plans between them (`tokens_per_s_with_periodic`);
        None for a log whose steps carry no wall time (written before 2026-12-02: its tokens_per_s
        figures cannot be trusted, see andrea/trainer.py _finish_step)."""
        with self.lock:
            tokens, step_s, periodic_s = self.timed_tokens, self.step_s, self.periodic_s
            timed = self.timed_steps > 0 and step_s > 0
            return {"steps": self.timed_steps, "tokens": round(tokens), "step_s": step_s, "periodic_s": periodic_s,
                    "tokens_per_s": tokens / step_s if timed else None,
                    "tokens_per_s_with_periodic": tokens / (step_s + periodic_s) if timed else None}

    def zoom(self, lo: int, hi: int, max_points: int = MAX_POINTS) -> dict:
        """Steps [lo, hi]: every step, read from the file by the index, when the range holds at most
        ZOOM_EXACT_STEPS; otherwise the held buckets there (`exact` says which)."""
        with self.lock:
            if hi - lo + 1 > ZOOM_EXACT_STEPS or not self.index:
                return self._meta() | self.buckets.view(max_points, lo, hi) | {"exact": False, "from": lo, "to": hi}
            i = max(0, bisect.bisect_right(self.index_steps, lo) - 1)
            j = bisect.bisect_right(self.index_steps, hi)
            start, carry_w, _ = self.index[i]
            end = self.index[j][0] if j < len(self.index) else self.offset
            with open(self.path, "rb") as fh:
                fh.seek(start)
                data = fh.read(end - start)
            d = Decoded(data, start, carry_w, list(carry_w))
            sel = (d.step >= lo) & (d.step <= hi)
            rows = Buckets.rows(d.step[sel], {k: v[sel] for k, v in d.scalars.items()}, d.weights[sel], d.sources)
            return self._meta() | columns(rows, 1) | {"exact": True, "from": lo, "to": hi}
