"""Live loss dashboard: `andrea dashboard RUN_DIR` serves a page on localhost that asks for the
run's files every few seconds and plots them with Chart.js (vendored in static/, MIT licence):
loss (raw, EMA, SMMA), validation bits per byte (overall and per source), learning rate, gradient
norm, the curriculum's source weights over time and as a walk on the simplex of sources (the radial
projection and the ternary plot of three source families, as andrea/geometry.py draws them after
the run: one point per phase of the curriculum, where loss.jsonl's `phase` marks one, or in a log
written before it had the mark, where the weights or the focus changed; RunLog.walk, read with the
same incremental tail), and the latest samples with their coherence scores.
Its status line counts steps as the train log does (`step 500/500`: `steps_done`) and gives the
run's tokens over its steps' wall time, with and without the work between them (RunLog.speed).

Long runs: the server tails loss.jsonl (andrea/runlog.py), reading only what was appended since the
page last asked, and keeps the whole run as at most 16,384 buckets of a power-of-two number of
steps; the page gets at most 2,000 of them, each with the smallest and largest loss and gradient
norm in it (a spike stays visible at a million steps). `/data/loss?from=A&to=B` zooms: every step
of a range of up to 8,192 steps, read from the file through an index of byte offsets.
"""

from __future__ import annotations

import json
import logging
import mimetypes
import threading
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pandas as pd

from andrea.io import read_jsonl
from andrea.runlog import MAX_POINTS, RunLog, jsonable

log = logging.getLogger("andrea.dashboard")

STATIC = Path(str(resources.files("andrea") / "dashboard" / "static"))
POLL_BYTES = 1 << 20  # the most of the log one request reads: a long log is caught up over several
__all__ = ["MAX_POINTS", "LossData", "loss_series", "make_server", "find_run_dir", "overview"]


def _encode(v) -> str:
    """JSON of a view: arrays through pandas' C encoder (a 2,000-point view in a few ms, where
    json.dumps takes ~15 ms), ten decimals (what a chart shows); NaN as null."""
    if isinstance(v, np.ndarray):
        return pd.Series(v).to_json(orient="values", double_precision=10)
    if isinstance(v, dict):
        return "{" + ",".join(json.dumps(str(k)) + ":" + _encode(x) for k, x in v.items()) + "}"
    return json.dumps(v)


class LossData:
    """What the dashboard serves from loss.jsonl: a `RunLog` tailing the file, the bucketed series
    for the whole run, every validation record, and zooms into a step range. Answers are cached
    until the file changes, so a page polling an idle (or finished) run costs a stat and a 64-byte
    read."""

    def __init__(self, path: Path, poll_bytes: int | None = POLL_BYTES):
        self.log = RunLog(path)
        self.poll_bytes = poll_bytes
        self._lock = threading.Lock()
        self._cache: tuple | None = None
        self._evals: tuple | None = None

    def _eval_json(self, lo: int | None = None, hi: int | None = None, exact: bool = False) -> str:
        """Validation records as columns (the whole run's cached until one is added)."""
        key = (self.log.generation, len(self.log.evals), lo, hi, exact)
        if self._evals and self._evals[0] == key:
            return self._evals[1]
        v = self.log.eval_view(lo, hi)
        out = json.dumps(jsonable(v)) if exact else _encode(v)
        self._evals = (key, out)
        return out

    def response(self, lo: int | None = None, hi: int | None = None) -> bytes:
        """The JSON the page asks for: the whole run (bucketed), or steps [lo, hi] (zoomed)."""
        with self._lock:
            self.log.poll(self.poll_bytes)
            key = (self.log.generation, self.log.offset, self.log.size, lo, hi)
            if self._cache and self._cache[0] == key:
                return self._cache[1]
            if lo is None and hi is None:
                d = self.log.series()
                body = (_encode(d)[:-1] + ',"exact":' + json.dumps(d["bucket_steps"] == 1) + ',"eval":' + self._eval_json()
                        + ',"walk":' + _encode(self.log.walk()) + "}")
            else:
                lo = 0 if lo is None else lo
                hi = max(self.log.last_step, lo) if hi is None else hi
                d = self.log.zoom(lo, hi)
                # every step as written (repr of each float): the exact records
                body = ((json.dumps(jsonable(d)) if d["exact"] else _encode(d))[:-1] + ',"eval":' + self._eval_json(lo, hi, d["exact"])
                        + ',"walk":' + _encode(self.log.walk(lo=lo, hi=hi)) + "}")
            self._cache = (key, body.encode())
            return self._cache[1]


def loss_series(run_dir: Path) -> dict:
    """loss.jsonl read whole, as the page gets it: training records in at most MAX_POINTS
    buckets (every step while the run is shorter), and every validation record."""
    return json.loads(LossData(Path(run_dir) / "loss.jsonl", poll_bytes=None).response())


def overview(run_dir: Path, families: dict | None = None) -> dict:
    """The plan, a few fields of the run's state, and the source families of the walk on the
    simplex (geometry.families of the config; None: the ternary plot is not drawn)."""
    out = {"run_dir": str(run_dir), "families": families}
    for name in ("plan.json", "state.json"):
        p = run_dir / name
        if p.exists():
            d = json.loads(p.read_text())
            if name == "state.json":
                d = {k: d[k] for k in ("step", "checkpoint", "ema", "smma", "best", "tokens_seen", "low_samples") if k in d}
            out[name.split(".")[0]] = d
    return out


class Handler(BaseHTTPRequestHandler):
    def __init__(self, *args, run_dir: Path, loss: LossData, families: dict | None = None, **kwargs):
        self.run_dir, self.loss, self.families = run_dir, loss, families
        super().__init__(*args, **kwargs)

    def log_message(self, fmt, *args):  # quiet: the terminal belongs to the user
        log.debug(fmt, *args)

    def _send(self, body: bytes, ctype: str, code: int = 200) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 (http.server's name)
        url = urlsplit(self.path)
        path = url.path
        if path in ("/", "/index.html"):
            return self._send((STATIC / "index.html").read_bytes(), "text/html; charset=utf-8")
        if path.startswith("/static/"):
            f = (STATIC / path[len("/static/") :]).resolve()
            if f.parent == STATIC.resolve() and f.is_file():
                return self._send(f.read_bytes(), mimetypes.guess_type(f.name)[0] or "application/octet-stream")
        if path == "/data/loss":  # ?from=A&to=B: steps A..B, every one of them when the range is narrow enough
            q = parse_qs(url.query)
            try:
                lo, hi = (int(q[k][0]) if k in q else None for k in ("from", "to"))
            except ValueError:
                return self._send(b"from and to are step numbers", "text/plain", 400)
            return self._send(self.loss.response(lo, hi), "application/json")
        data = {
            "/data/samples": lambda: read_jsonl(self.run_dir / "samples.jsonl")[-20:],
            "/data/overview": lambda: overview(self.run_dir, self.families),
        }.get(path)
        if data:
            return self._send(json.dumps(data()).encode(), "application/json")
        self._send(b"not found", "text/plain", 404)


def make_server(run_dir: str | Path, host: str = "127.0.0.1", port: int = 8050, families: dict | None = None) -> ThreadingHTTPServer:
    """`families`: the three source families of the ternary view of the curriculum's walk."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run directory (results/<model>/runs/<key>/)")
    return ThreadingHTTPServer((host, port), partial(Handler, run_dir=run_dir, loss=LossData(run_dir / "loss.jsonl"),
                                                     families=families))


def find_run_dir(results: str | Path, model: str) -> Path:
    """The most recently active run directory of a model."""
    runs = sorted(Path(results, model, "runs").glob("*/loss.jsonl"), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise FileNotFoundError(f"{Path(results, model, 'runs')}: no run with a loss.jsonl yet")
    return runs[-1].parent
