"""The live dashboard: its data endpoints, and the page drawing a real run's curves in headless
Chromium (Debian's `chromium`; skipped, with the reason, when it is not installed)."""

import json
import re
import shutil
import subprocess
import threading
import urllib.request

import pytest

from andrea.dashboard import MAX_POINTS, loss_series, make_server
from andrea.io import read_run_log
from andrea.runlog import phases
from test_trainer import shards, straight  # noqa: F401  (fixtures: a real run on the embedded corpus)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
FAMILIES = {"chat": ["hermes3-general", "chat", "smoltalk", "oasst"], "prose": ["gutenberg"], "reference": ["dictionary"]}


@pytest.fixture
def server(straight):  # noqa: F811
    srv = make_server(straight, port=0, families=FAMILIES)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", straight
    srv.shutdown()


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read()


def test_data_endpoints_serve_the_run(server):
    url, run = server
    recs = [json.loads(l) for l in (run / "loss.jsonl").read_text().splitlines()]
    n = sum(r.get("kind", "train") == "train" for r in recs)
    evals = [r for r in recs if r.get("kind") == "eval"]
    status, body = get(f"{url}/data/loss")
    d = json.loads(body)
    assert status == 200 and d["n_steps"] == n == len(d["step"]) and len(d["ema"]) == n
    assert evals and d["eval"]["step"] == [r["step"] for r in evals] and d["eval"]["bpb"] == [r["bpb"] for r in evals]
    assert "dictionary" in d["eval"]["sources"]
    assert "chat" in d["weights"] and len(d["weights"]["chat"]) == n
    # the curriculum's walk: one point per phase the trainer marked, as the geometry's reader finds them
    ph = phases(run / "loss.jsonl")
    assert ph["marks_phases"] and d["walk"]["marks_phases"] and d["walk"]["phases_per_point"] == 1
    assert d["walk"]["start"] == [p["start"] for p in ph["phases"]] and d["walk"]["end"] == [p["end"] for p in ph["phases"]]
    assert d["walk"]["focus"] == [p["focus"] for p in ph["phases"]]
    assert d["walk"]["weights"]["chat"] == [p["weights"].get("chat", 0) for p in ph["phases"]]
    z = json.loads(get(f"{url}/data/loss?from=100&to=130")[1])["walk"]  # a zoom: the phases overlapping it
    assert z["start"] == [p["start"] for p in ph["phases"] if p["end"] > 100 and p["start"] <= 130]
    assert len(json.loads(get(f"{url}/data/samples")[1])) == 3
    assert json.loads(get(f"{url}/data/overview")[1])["plan"]["model"] == "micro"
    assert get(f"{url}/static/chart.umd.min.js")[1].startswith(b"/*!\n * Chart.js")
    with pytest.raises(urllib.error.HTTPError):
        get(f"{url}/static/../../config.py")


def test_status_counts_steps_as_the_log_does_and_gives_the_honest_speed(server):
    """Issue 45: the dashboard said "last step 239" where the log said `step 240/240`; and its
    headline rate was the last step's tokens/s, which could be millions on two CPU cores. The
    steps done are the log's count (and the last checkpoint's step), the speed the run's tokens
    over its steps' wall time, with and without the work between them, as the trainer sums them."""
    url, run = server
    d = json.loads(get(f"{url}/data/loss")[1])
    log = (run / "train.log").read_text()
    last_line = re.findall(r"step (\d+)/(\d+) loss", log)[-1]
    assert d["steps_done"] == int(last_line[0]) == int(last_line[1]) == 240
    assert d["last"]["step"] == 239  # loss.jsonl's record of the 240th step (its loss on the weights after 239)
    assert json.loads(get(f"{url}/data/overview")[1])["state"]["checkpoint"] == "step_000240.bin"
    sp, actual = d["speed"], json.loads((run / "plan.json").read_text())["actual_speed"]  # one attempt: the same sums
    assert sp["steps"] == actual["steps"] == 240 and sp["tokens"] == actual["tokens"] == 240 * 4 * 32
    for k in ("tokens_per_s", "tokens_per_s_with_periodic"):
        assert sp[k] == pytest.approx(actual[k], rel=1e-3), k
    assert sp["tokens_per_s_with_periodic"] < sp["tokens_per_s"] < 1e6
    page = get(f"{url}/")[1].decode()  # what the page shows: those figures, not the last step's
    assert "d.steps_done" in page and "sp.tokens_per_s_with_periodic" in page and "last.tokens_per_s" not in page


def test_zoom_serves_every_step_of_a_range(server):
    url, run = server
    train, evals = read_run_log(run / "loss.jsonl")
    d = json.loads(get(f"{url}/data/loss?from=50&to=130")[1])
    want = [r for r in train if 50 <= r["step"] <= 130]
    assert d["exact"] and d["step"] == [r["step"] for r in want] and d["bucket_steps"] == 1
    for k in ("loss", "ema", "smma", "lr", "grad_norm"):
        assert d[k] == [r[k] for r in want], k  # the values as written, not rounded for a chart
    assert d["weights"]["chat"] == [r["weights"]["chat"] for r in want]
    assert d["eval"]["step"] == [r["step"] for r in evals if 50 <= r["step"] <= 130]
    assert d["n_steps"] == len(train) and d["last"]["step"] == train[-1]["step"]
    with pytest.raises(urllib.error.HTTPError) as e:
        get(f"{url}/data/loss?from=ten")
    assert e.value.code == 400


def test_long_runs_are_thinned_for_the_browser(tmp_path):
    lines = [{"step": i, "loss": 1.0, "ema": 1.0, "smma": 1.0, "lr": 0.1, "grad_norm": 1.0, "weights": {"a": 1.0}} for i in range(5001)]
    (tmp_path / "loss.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines) + '{"step": 50')  # torn last line
    d = loss_series(tmp_path)
    assert d["n_steps"] == 5001 and len(d["step"]) <= MAX_POINTS and d["step"][-1] == 5000
    assert d["bucket_steps"] == 4 and d["step_first"][:2] == [0, 4] and d["last"]["step"] == 5000


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (Debian: apt-get install chromium)")
def test_page_draws_the_curves_in_a_browser(server, tmp_path):
    url, run = server
    recs = [json.loads(l) for l in (run / "loss.jsonl").read_text().splitlines()]
    n = sum(r.get("kind", "train") == "train" for r in recs)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=8000"]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", f"{url}/"], capture_output=True, text=True, timeout=90).stdout
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-rendered="1"' in body, body
    assert f'data-loss-points="{n}"' in body  # every logged step drawn
    assert 'data-samples="3"' in body
    assert f'data-eval-points="{sum(r.get("kind") == "eval" for r in recs)}"' in body
    assert "step 240/240 · loss" in dom and "tokens/s over the steps' wall time" in dom
    weights = int(re.search(r'data-weight-series="(\d+)"', body).group(1))
    assert weights >= 5  # one curve per source
    # the curriculum's walk on the simplex: one point per phase the trainer marked in loss.jsonl
    ph = phases(run / "loss.jsonl")
    assert ph["marks_phases"] and f'data-simplex-points="{len(ph["phases"])}"' in body
    assert "focus now: " in dom and "curriculum warm-up until step 60" in dom and "chat: hermes3-general, chat" in dom
    assert "Source weights (<span id=\"cmode\">curriculum mode bandit</span>)" in dom  # the run's mode, from plan.json
    shot = tmp_path / "dashboard.png"
    subprocess.run([CHROMIUM, *flags, "--window-size=1300,1000", f"--screenshot={shot}", f"{url}/"], capture_output=True, timeout=90)
    assert shot.exists() and shot.stat().st_size > 20_000  # a page with charts, not a blank one


def test_a_config_that_does_not_load_does_not_stop_the_dashboard(tmp_path, monkeypatch, capsys):
    """`andrea dashboard RUN_DIR` needs no config: one that is there but invalid is warned about,
    and the page is served without the ternary view's families; a valid one gives them."""
    import andrea.cli as cli
    import andrea.dashboard as dashboard

    served = []

    class Server:
        server_address = ("127.0.0.1", 1)

        def serve_forever(self):
            raise KeyboardInterrupt

    monkeypatch.setattr(dashboard, "make_server", lambda run_dir, host, port, families=None: served.append(families) or Server())
    (tmp_path / "run").mkdir()
    bad = tmp_path / "config.yaml"
    bad.write_text("results_dir: [not, a, path]\n")
    assert cli.main(["dashboard", str(tmp_path / "run"), "--config", str(bad)]) == 0
    err = capsys.readouterr().err
    assert served == [None] and f"{bad} does not load: the dashboard runs without it" in err and "results_dir" in err
    from conftest import REPO

    assert cli.main(["dashboard", str(tmp_path / "run"), "--config", str(REPO / "config" / "config.yaml")]) == 0
    assert served[1] and set(served[1]) == {"chat", "prose", "reference"}

