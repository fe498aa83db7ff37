"""The dashboard and the other readers of loss.jsonl on long runs (issue 20).

Writes synthetic run logs of 200,000 and 1,000,000 steps shaped like the trainer's (13 sources, a
bandit phase every 7-42 steps, batches of 8 rows, a validation record every 250 steps), in the
former format (weights, focus and mix shares on every line) and the compact one (andrea/runlog.py),
and times on each file, in one process:

  plain read      every line through json.loads: the yardstick ("reading the file once")
  old series      the dashboard's former loss_series (read everything, keep every k-th step)
  first read      the dashboard's first answer when it reads the whole log in one request
  catch-up        the page's requests while the server reads the log POLL_BYTES at a time
  steady          a request after a few steps were appended (the page asks every 5 s)
  idle            a request when nothing was appended
  zoom            2,000 steps at full resolution; a 100,000-step range (buckets)
  truncate        a resume's cut of the last 1,000 steps
  audit read      the audit's loss plot data (one read into bounded buckets)

Requests go through the dashboard's HTTP server. Usage:
    python bench/dashboard_longrun.py [--steps 200000 1000000] [--formats full compact]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from andrea.dashboard import POLL_BYTES, make_server  # noqa: E402
from andrea.io import read_jsonl  # noqa: E402
from andrea.runlog import RunLog, truncate_log  # noqa: E402

SOURCES = ["hermes3-general", "hermes3-creative", "hermes3-roleplay", "chat", "smoltalk", "oasst", "gutenberg",
           "dictionary", "repo-docs", "repo-docstrings", "repo-commits", "irc", "synthetic-chat"]


def write_synthetic_log(path: Path, n_steps: int, fmt: str = "compact", eval_every: int = 250, rows: int = 8,
                        seed: int = 0, spike_at: int | None = None, start: int = 0) -> None:
    """A loss.jsonl of steps start..n_steps-1 as the trainer writes it (`fmt` "compact", or "full":
    the former format), fast enough for tests: lines from templates, random draws vectorised."""
    rng = np.random.default_rng(seed)
    steps = np.arange(start, n_steps)
    n = len(steps)
    loss = 3.0 + 5.0 * np.exp(-steps / 20000) + 0.1 * rng.random(n)
    if spike_at is not None and start <= spike_at < n_steps:
        loss[spike_at - start] = 50.0
    ema = loss - 0.01
    smma = loss - 0.02
    lr = 3e-4 * (0.1 + 0.9 * rng.random(n))
    norm = 2.0 * rng.random(n)
    tps = np.round(1e5 * rng.random(n), 1)
    # bandit phases: a new focus (1-4 sources) and weights every 7-42 steps
    lengths = rng.choice([7, 14, 21, 28, 42], size=n // 7 + 2)
    bounds = np.cumsum(np.concatenate(([0], lengths)))
    phase = np.searchsorted(bounds, np.arange(n), side="right") - 1
    n_phases = int(phase[-1]) + 1 if n else 0
    focus, weights, wjson, fjson = [], [], [], []
    for _ in range(n_phases):
        f = list(rng.choice(SOURCES, size=int(rng.integers(1, 5)), replace=False))
        raw = np.array([1.0 if s in f else 0.05 for s in SOURCES])
        w = np.round(raw / raw.sum(), 6)
        focus.append(f)
        weights.append(w)
        wjson.append(json.dumps(dict(zip(SOURCES, w.tolist()))))
        fjson.append(json.dumps(f))
    cum = np.cumsum(np.array(weights), axis=1) if n_phases else np.zeros((0, len(SOURCES)))
    cum /= cum[:, -1:] if n_phases else 1
    drawn = np.empty((n, rows), np.int64)
    u = rng.random((n, rows))
    for p in range(n_phases):  # phases are consecutive runs of steps
        a, b = int(bounds[p]), min(int(bounds[p + 1]), n)
        drawn[a:b] = np.minimum(np.searchsorted(cum[p], u[a:b]), len(SOURCES) - 1)
    counts = np.zeros((n, len(SOURCES)), np.int64)
    np.add.at(counts, (np.repeat(np.arange(n), rows), drawn.ravel()), 1)
    counts = counts.tolist()
    steps, loss, ema, smma, lr, norm, tps, phase = (a.tolist() for a in (steps, loss, ema, smma, lr, norm, tps, phase))
    order = np.argsort(SOURCES)  # the trainer writes the mix sorted by source name
    evals_src = json.dumps({s: {"loss": 1.0, "bpb": 1.1, "perplexity": 2.7, "tokens": 2048} for s in SOURCES})
    out = []
    last_phase = -1
    for i in range(n):
        s = steps[i]
        if eval_every and s % eval_every == 0:
            out.append(f'{{"kind": "eval", "step": {s}, "loss": {loss[i]!r}, "bpb": {loss[i] / 2!r}, "tokens": 26624, '
                       f'"seconds": 1.5, "sources": {evals_src}}}\n')
        c = counts[i]
        mix = [(SOURCES[j], c[j]) for j in order if c[j]]
        head = (f'{{"step": {s}, "loss": {loss[i]!r}, "ema": {ema[i]!r}, "smma": {smma[i]!r}, "lr": {lr[i]!r}, '
                f'"grad_norm": {norm[i]!r}, "clipped": false, "skipped": false, "tokens_per_s": {tps[i]!r}, ')
        p = phase[i]
        if fmt == "full":
            mixs = ", ".join(f'"{k}": {v / rows!r}' for k, v in mix)
            out.append(head + f'"mix": {{{mixs}}}, "weights": {wjson[p]}, "focus": {fjson[p]}}}\n')
        else:
            mixs = ", ".join(f'"{k}": {v}' for k, v in mix)
            tail = f', "weights": {wjson[p]}, "focus": {fjson[p]}' if p != last_phase else ""
            out.append(head + f'"rows": {rows}, "mix": {{{mixs}}}{tail}}}\n')
        last_phase = p
        if len(out) >= 50_000:
            with open(path, "a") as fh:
                fh.write("".join(out))
            out = []
    with open(path, "a") as fh:
        fh.write("".join(out))


def plain_read(path: Path) -> int:
    """Every line through json.loads: what reading the log once costs."""
    with open(path, "rb") as fh:
        return len([json.loads(line) for line in fh])


def old_loss_series(run_dir: Path, max_points: int = 2000) -> dict:
    """The dashboard's loss_series before issue 20 (kept here to compare against): the whole file
    into dicts on every request, every k-th training record kept."""
    records = read_jsonl(run_dir / "loss.jsonl")
    rows, evals = [r for r in records if r.get("kind", "train") == "train"], [r for r in records if r.get("kind") == "eval"]
    eval_sources = sorted({s for r in evals for s in r.get("sources", {})})
    k = max(1, -(-len(rows) // max_points))
    picked = rows[::k]
    if rows and picked[-1] is not rows[-1]:
        picked.append(rows[-1])
    sources = sorted({s for r in picked for s in r.get("weights", {})})
    return {
        "n_steps": len(rows), "step": [r["step"] for r in picked], "loss": [r["loss"] for r in picked],
        "ema": [r.get("ema") for r in picked], "smma": [r.get("smma") for r in picked], "lr": [r["lr"] for r in picked],
        "grad_norm": [r["grad_norm"] for r in picked], "tokens_per_s": [r.get("tokens_per_s") for r in picked],
        "weights": {s: [r.get("weights", {}).get(s, 0.0) for r in picked] for s in sources},
        "eval": {"step": [r["step"] for r in evals], "loss": [r.get("loss") for r in evals], "bpb": [r.get("bpb") for r in evals],
                 "sources": {s: [r["sources"].get(s, {}).get("bpb") for r in evals] for s in eval_sources}},
    }


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t, out


def get(url: str) -> tuple[float, dict]:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as r:
        body = r.read()
    return time.perf_counter() - t, json.loads(body)


def bench_file(run_dir: Path, n_steps: int, fmt: str) -> dict:
    path = run_dir / "loss.jsonl"
    res = {"steps": n_steps, "format": fmt, "MB": path.stat().st_size / 1e6}
    res["plain read"], _ = timed(plain_read, path)
    res["old series"], old = timed(old_loss_series, run_dir)
    assert old["n_steps"] == n_steps
    # the dashboard reading the whole log in its first request (as `loss_series` and the audit do)
    def first_read():
        rl = RunLog(path)
        rl.poll()
        return rl.series()

    res["first read"], _ = timed(first_read)
    res["audit read"] = res["first read"]
    srv = make_server(run_dir, port=0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/data/loss"
    try:
        lat, t0 = [], time.perf_counter()
        while True:  # the page asks again at once while the server is behind
            dt, d = get(url)
            lat.append(dt)
            if not d["behind_bytes"]:
                break
        res["catch-up total"], res["catch-up requests"] = time.perf_counter() - t0, len(lat)
        res["catch-up max"], res["catch-up median"] = max(lat), statistics.median(lat)
        assert d["n_steps"] == n_steps and len(d["step"]) <= 2000
        steady, idle = [], []
        for k in range(20):  # a few steps appended between two requests, as while training
            write_synthetic_log(path, n_steps + 3 * (k + 1), fmt, start=n_steps + 3 * k, seed=k + 1)
            steady.append(get(url)[0])
            idle.append(get(url)[0])
        res["steady median"], res["steady max"] = statistics.median(steady), max(steady)
        res["idle median"] = statistics.median(idle)
        mid = n_steps // 2
        res["zoom 2k"], z = get(f"{url}?from={mid}&to={mid + 1999}")
        assert z["exact"] and z["step"] == list(range(mid, mid + 2000))
        res["zoom 100k"], z = get(f"{url}?from={mid - 50000}&to={mid + 49999}")
        assert not z["exact"] and len(z["step"]) <= 2000
    finally:
        srv.shutdown()
        srv.server_close()
    last = n_steps + 59
    res["truncate"], dropped = timed(truncate_log, path, lambda r: r["step"] <= last - 1000 if r.get("kind") == "eval" else r["step"] < last - 1000)
    assert dropped > 0
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, nargs="+", default=[200_000, 1_000_000])
    ap.add_argument("--formats", nargs="+", default=["full", "compact"], choices=["full", "compact"])
    args = ap.parse_args()
    rows = []
    for n in args.steps:
        for fmt in args.formats:
            tmp = Path(tempfile.mkdtemp(prefix="andrea-longrun-"))
            try:
                t = time.perf_counter()
                write_synthetic_log(tmp / "loss.jsonl", n, fmt)
                print(f"{n:,} steps, {fmt}: written in {time.perf_counter() - t:.1f} s (load average {os.getloadavg()[0]:.1f})", flush=True)
                r = bench_file(tmp, n, fmt)
                print(json.dumps(r), flush=True)
                rows.append(r)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    ms = lambda s: f"{s * 1000:,.0f} ms" if s < 10 else f"{s:,.1f} s"  # noqa: E731
    print(f"\nPOLL_BYTES {POLL_BYTES / 2**20:.0f} MiB; load average {os.getloadavg()[0]:.1f} at the end\n")
    print("| steps | format | MB | plain read | old series (per request) | first read (one request) | catch-up: requests, total, max | steady (median / max) | idle | zoom 2k steps | zoom 100k steps | truncate 1k steps |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['steps']:,} | {r['format']} | {r['MB']:.0f} | {ms(r['plain read'])} | {ms(r['old series'])} | {ms(r['first read'])} | "
              f"{r['catch-up requests']}, {ms(r['catch-up total'])}, {ms(r['catch-up max'])} | {ms(r['steady median'])} / {ms(r['steady max'])} | "
              f"{ms(r['idle median'])} | {ms(r['zoom 2k'])} | {ms(r['zoom 100k'])} | {ms(r['truncate'])} |")


if __name__ == "__main__":
    main()
