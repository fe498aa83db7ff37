"""Live loss dashboard: `andrea dashboard RUN_DIR` serves a page on localhost that re-reads the
run's files every few seconds and plots them with Chart.js (vendored in static/, MIT licence):
loss (raw, EMA, SMMA), validation bits per byte (overall and per source), learning rate, gradient
norm, the bandit's source weights over time, and the latest samples with their coherence scores.
"""

from __future__ import annotations

import json
import logging
import mimetypes
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path

from andrea.io import read_jsonl, read_run_log

log = logging.getLogger("andrea.dashboard")

STATIC = Path(str(resources.files("andrea") / "dashboard" / "static"))
MAX_POINTS = 2000


def loss_series(run_dir: Path) -> dict:
    """loss.jsonl as columns: training records thinned to at most MAX_POINTS points (every k-th
    step, last kept), and every validation record."""
    rows, evals = read_run_log(run_dir / "loss.jsonl")
    eval_sources = sorted({s for r in evals for s in r.get("sources", {})})
    k = max(1, -(-len(rows) // MAX_POINTS))
    picked = rows[::k]
    if rows and picked[-1] is not rows[-1]:
        picked.append(rows[-1])
    sources = sorted({s for r in picked for s in r.get("weights", {})})
    return {
        "n_steps": len(rows),
        "step": [r["step"] for r in picked],
        "loss": [r["loss"] for r in picked],
        "ema": [r.get("ema") for r in picked],
        "smma": [r.get("smma") for r in picked],
        "lr": [r["lr"] for r in picked],
        "grad_norm": [r["grad_norm"] for r in picked],
        "tokens_per_s": [r.get("tokens_per_s") for r in picked],
        "weights": {s: [r.get("weights", {}).get(s, 0.0) for r in picked] for s in sources},
        "eval": {
            "step": [r["step"] for r in evals],
            "loss": [r.get("loss") for r in evals],
            "bpb": [r.get("bpb") for r in evals],
            "sources": {s: [r["sources"].get(s, {}).get("bpb") for r in evals] for s in eval_sources},
        },
    }


def overview(run_dir: Path) -> dict:
    out = {"run_dir": str(run_dir)}
    for name in ("plan.json", "state.json"):
        p = run_dir / name
        if p.exists():
            d = json.loads(p.read_text())
            if name == "state.json":
                d = {k: d[k] for k in ("step", "checkpoint", "ema", "smma", "best", "tokens_seen", "low_samples") if k in d}
            out[name.split(".")[0]] = d
    return out


class Handler(BaseHTTPRequestHandler):
    def __init__(self, *args, run_dir: Path, **kwargs):
        self.run_dir = run_dir
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
        path = self.path.split("?")[0]
        if path in ("/", "/index.html"):
            return self._send((STATIC / "index.html").read_bytes(), "text/html; charset=utf-8")
        if path.startswith("/static/"):
            f = (STATIC / path[len("/static/") :]).resolve()
            if f.parent == STATIC.resolve() and f.is_file():
                return self._send(f.read_bytes(), mimetypes.guess_type(f.name)[0] or "application/octet-stream")
        data = {
            "/data/loss": lambda: loss_series(self.run_dir),
            "/data/samples": lambda: read_jsonl(self.run_dir / "samples.jsonl")[-20:],
            "/data/overview": lambda: overview(self.run_dir),
        }.get(path)
        if data:
            return self._send(json.dumps(data()).encode(), "application/json")
        self._send(b"not found", "text/plain", 404)


def make_server(run_dir: str | Path, host: str = "127.0.0.1", port: int = 8050) -> ThreadingHTTPServer:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run directory (results/<model>/runs/<key>/)")
    return ThreadingHTTPServer((host, port), partial(Handler, run_dir=run_dir))


def find_run_dir(results: str | Path, model: str) -> Path:
    """The most recently active run directory of a model."""
    runs = sorted(Path(results, model, "runs").glob("*/loss.jsonl"), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise FileNotFoundError(f"{Path(results, model, 'runs')}: no run with a loss.jsonl yet")
    return runs[-1].parent
