"""The audit stage on a model trained here: samples, judges, perplexity, report."""

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from andrea.audit import run_audit
from andrea.config import load_config
from andrea.trainer import Trainer
from conftest import REPO
from test_judges import KEY, FakeEndpoint, debug_logging_everywhere, leaks
from test_trainer import MODEL, TRAIN, shards  # noqa: F401  (fixture)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def trained(shards, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("trained")
    cfg = load_config(REPO / "config" / "config.yaml")
    cfg["models"]["micro"] = MODEL
    cfg["train"]["micro"] = {**TRAIN, "max_steps": 60, "sample_every": 20}
    Trainer(cfg, "micro", shards, tmp / "run").run(out_dir=tmp / "ckpt")
    return cfg, tmp / "ckpt", shards


def audit_cfg(cfg, **judge):
    a = json.loads(json.dumps(cfg["audit"]))
    a["prompts"] = a["prompts"][:3]
    a["max_new_tokens"] = 24
    a["heldout_tokens"] = 256
    a["judge"].update(judge)
    return a


def test_audit_without_an_endpoint_runs_the_builtin_judges_and_says_so(trained, tmp_path, monkeypatch):
    cfg, ckpt, shards = trained  # noqa: F811
    for var in ("ANDREA_JUDGE_BASE_URL", "ANDREA_JUDGE_MODEL"):
        monkeypatch.delenv(var, raising=False)
    summary = run_audit(ckpt, shards, audit_cfg(cfg), cfg["curriculum"]["heldout_every"], tmp_path / "audit")
    out = tmp_path / "audit"
    assert summary["samples"] == 6 and summary["step"] == 60
    assert summary["external_judge"].startswith("not run: no endpoint configured")
    df = pd.read_parquet(out / "scores.parquet")
    # prompts[:3] are general, general, biology; samples_per_prompt 2, prompt by prompt
    assert df["domain"].tolist() == ["general"] * 4 + ["biology"] * 2
    assert df["sample"].tolist() == [0, 1] * 3
    assert {"coherence", "coh_gate", "coh_bigram", "coh_trigram", "coh_chars", "distinct_1", "distinct_2", "distinct_3",
            "repetition", "english_rate"} <= set(df.columns)
    assert (df["coherence"] <= 100 * df["coh_gate"] + 1e-6).all()  # the gate caps the score
    assert df["judge_score"].isna().all()
    held = json.loads((out / "heldout.json").read_text())
    assert held["overall"]["perplexity"] > 1 and held["overall"]["tokens"] > 0
    # every source with held-out documents is scored; the others are named with the reason
    shard_meta = json.loads(Path(shards).read_text())["sources"]
    every = cfg["curriculum"]["heldout_every"]
    with_heldout = {s for s, c in shard_meta.items() if c["n_docs"] >= every}
    assert set(held["per_source"]) == with_heldout
    assert set(held["without_heldout"]) == {s for s, c in shard_meta.items() if 0 < c["n_docs"] < every}
    for v in held["per_source"].values():  # bits per byte and perplexity agree with the loss
        assert v["perplexity"] == pytest.approx(math.exp(v["loss"]), rel=1e-3)
        assert 0 < v["bpb"] < 20
    md = (out / "report.md").read_text()
    assert "external judge | not run" in md and "![Training loss](plots/loss.png)" in md
    assert sorted(p.name for p in (out / "plots").glob("*.png")) == [
        "coherence_training.png", "loss.png", "scores_by_domain.png", "validation.png"]
    assert "| **all** |" in md and "![Validation bits per byte](plots/validation.png)" in md
    # the same seed gives the same samples
    again = run_audit(ckpt, shards, audit_cfg(cfg), cfg["curriculum"]["heldout_every"], tmp_path / "again")
    assert (tmp_path / "again" / "samples.jsonl").read_text() == (out / "samples.jsonl").read_text()
    assert again == summary


def test_audit_with_an_endpoint_records_scores_and_failures(trained, tmp_path):
    cfg, ckpt, shards = trained  # noqa: F811
    e = FakeEndpoint(["ok", "500", "500", "ok", "400"])  # sample 2 retried; sample 3 unscored
    try:
        a = audit_cfg(cfg, base_url=e.url, model="judge-model", retries=2, backoff_s=0.01, timeout_s=5)
        summary = run_audit(ckpt, shards, a, cfg["curriculum"]["heldout_every"], tmp_path / "audit")
    finally:
        e.close()
    df = pd.read_parquet(tmp_path / "audit" / "scores.parquet")
    # sample 0: "ok" (score 7); sample 1: "500", "500", then "ok" on its third attempt (retries=2);
    # sample 2: "400", not retried; samples 3-5: the script has run out and the endpoint answers "ok"
    assert df["judge_score"].fillna(-1.0).tolist() == [7.0, 7.0, -1.0, 7.0, 7.0, 7.0]
    assert df["judge_attempts"].tolist() == [1, 3, 1, 1, 1, 1] and len(e.requests) == 8
    assert df.loc[2, "judge_error"] == "HTTP 400"
    assert "judge-model" in summary["external_judge"] and "1 unscored" in summary["external_judge"]


def test_the_api_key_reaches_the_endpoint_and_no_log_or_audit_file(trained, tmp_path, monkeypatch, caplog):
    cfg, ckpt, shards = trained  # noqa: F811
    monkeypatch.setenv("ANDREA_JUDGE_API_KEY", KEY)
    debug_logging_everywhere(caplog)
    # sample 1: refused with the key quoted; 2: a reason quoting it; 3: unscored, the last reply quoting it
    e = FakeEndpoint(["401", "500", "echo", "malformed", "echo_prose", "echo_prose"])
    try:
        a = audit_cfg(cfg, base_url=e.url, model="judge-model", retries=2, backoff_s=0.01, timeout_s=5)
        run_audit(ckpt, shards, a, cfg["curriculum"]["heldout_every"], tmp_path / "audit")
    finally:
        e.close()
    assert [r["auth"] for r in e.requests] == [f"Bearer {KEY}"] * 9
    out = tmp_path / "audit"
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert {"samples.jsonl", "scores.parquet", "summary.json", "report.md", "report.html"} <= set(written)
    assert [f for f in written if KEY.encode() in (out / f).read_bytes()] == []
    df = pd.read_parquet(out / "scores.parquet")  # compressed on disk: look at the values too
    assert not df.astype(str).apply(lambda c: c.str.contains(KEY, regex=False)).any().any()
    assert df.loc[0, "judge_error"] == "HTTP 401: Incorrect API key provided: Bearer [redacted]"
    assert df.loc[1, "judge_reason"] == "graded for Bearer [redacted]" and df.loc[1, "judge_score"] == 5.0
    assert df.loc[2, "judge_error"] == "unparseable reply: no score 0-10 in the reply: 'I will not grade this for Bearer [redacted].'"
    assert df["judge_score"].notna().sum() == 4
    assert leaks(caplog) == []


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (Debian: apt-get install chromium)")
def test_report_renders_in_a_browser(trained, tmp_path):
    cfg, ckpt, shards = trained  # noqa: F811
    run_audit(ckpt, shards, audit_cfg(cfg), cfg["curriculum"]["heldout_every"], tmp_path / "audit")
    page = (tmp_path / "audit" / "report.html").as_uri()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'p'}"]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", page], capture_output=True, text=True, timeout=90).stdout
    assert "<h1>Audit of micro at step 60</h1>" in dom
    assert len(re.findall(r"<img class=\"plot\"[^>]*src=\"data:image/png;base64,", dom)) == 4  # loss, validation, coherence, scores
    shot = tmp_path / "report.png"
    subprocess.run([CHROMIUM, *flags, "--window-size=1000,2400", f"--screenshot={shot}", page], capture_output=True, timeout=90)
    assert shot.exists() and shot.stat().st_size > 30_000


def test_sample_command_prints_several_continuations_decoded_together(trained):
    """`andrea sample --samples 3`: three continuations, each the one its own generator gives."""
    import sys

    import numpy as np

    from andrea.sampling import chat_prompt, generate, load_model
    from andrea.tokenizer import BOS

    _, ckpt, _ = trained
    cmd = [sys.executable, "-m", "andrea.cli", "sample", "--ckpt", str(ckpt), "--prompt", "Why is the sky blue?",
           "--max-tokens", "12", "--seed", "5", "--backend", "numpy"]
    p = subprocess.run([*cmd, "--samples", "3"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.returncode == 0, p.stderr
    parts = re.split(r"^--- sample \d of 3\n", p.stdout, flags=re.M)
    assert parts[0] == "" and len(parts) == 4
    lm = load_model(ckpt, backend="numpy")
    ids = [BOS, *lm.tokenizer.encode(chat_prompt("Why is the sky blue?")).tolist()]
    want = [lm.tokenizer.decode(generate(lm.model, ids, 12, np.random.default_rng([5, k])), errors="replace") for k in range(3)]
    assert [t.removesuffix("\n") for t in parts[1:]] == want and len(set(want)) == 3
    # one sample is printed as it comes: the same text
    one = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert one.returncode == 0, one.stderr
    assert one.stdout == lm.tokenizer.decode(generate(lm.model, ids, 12, np.random.default_rng(5)), errors="replace") + "\n"
    bad = subprocess.run([*cmd, "--samples", "0"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert bad.returncode != 0 and "--samples 0: at least 1" in bad.stderr
