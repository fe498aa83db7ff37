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


def test_audit_refuses_an_out_that_is_not_an_audit(trained, tmp_path):
    """`andrea audit --out results/<model>/ckpt` would have replaced the checkpoint: refused before
    any work, the directory left as it was."""
    cfg, ckpt, shards = trained  # noqa: F811
    before = sorted(p.name for p in ckpt.iterdir())
    with pytest.raises(FileExistsError, match="ckpt: exists and is a directory without summary.json"):
        run_audit(ckpt, shards, audit_cfg(cfg), cfg["curriculum"]["heldout_every"], ckpt)
    assert sorted(p.name for p in ckpt.iterdir()) == before
    # and `andrea train --out` at a directory that is not a ckpt directory, before any step
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="notes: exists and is a directory without run.json"):
        Trainer(cfg, "micro", shards, tmp_path / "run").run(out_dir=tmp_path / "notes")
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me" and not (tmp_path / "run" / "loss.jsonl").exists()


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
    # every source's coverage is in the report, the ones without a figure with the reason
    assert set(held["coverage"]) == {s for s, c in shard_meta.items() if c["n_docs"]}
    assert sum(v["tokens"] for v in held["per_source"].values()) == held["overall"]["tokens"]
    for v in held["per_source"].values():  # bits per byte and perplexity agree with the loss
        assert v["perplexity"] == pytest.approx(math.exp(v["loss"]), rel=1e-3)
        assert 0 < v["bpb"] < 20
    md = (out / "report.md").read_text()
    assert "external judge | not run" in md and "![Training loss](plots/loss.png)" in md
    assert "| mean judge score | not scored: no external judge configured |" in md and "None" not in md
    assert summary["mean_judge_score"] == "not scored: no external judge configured"
    for column in ("coh_gate", "coh_bigram", "coh_trigram", "coh_chars", "english_rate", "distinct_2", "repetition"):
        assert f"- **{column}**: " in md, column  # every column has its caption
    assert f"{len(held['per_source'])} of {len(held['coverage'])} sources have a held-out figure" in summary["heldout_sources"]
    for s in held["without_heldout"]:
        assert f"| {s} | " in md and s in summary["heldout_sources"]
    # the shipped prompts are not in the training documents; the report says so
    contamination = json.loads((out / "contamination.json").read_text())
    assert [p["contaminated"] for p in contamination["prompts"]] == [False] * 3
    assert summary["contaminated_prompts"].startswith("none: no prompt (3 checked) is in the ")
    assert "## Prompts and the training data" in md and "## All samples" in md
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


# ---------------------------------------------------------------- contamination


def test_contamination_finds_verbatim_whole_and_long_ngram_overlap(monkeypatch):
    from andrea import contamination
    from andrea.contamination import check_prompts

    long_prompt = "Please explain in plain words how the tides of the ocean follow the moon"  # 14 words
    docs = [
        ("a", 0, "Nothing to see here."),
        ("a", 1, "> What does the Nyquist rate mean?\n\n< Twice the highest frequency."),
        ("b", 0, "we say: WHAT does the nyquist-rate mean... nobody knows"),  # whole, by words
        ("b", 3, "Teacher: in plain words how the tides of a sea"),  # 7 words in a row: no 8-gram
        ("c", 5, "so, how the tides of the ocean follow the moon, is the question"),  # 9 words in a row: two 8-grams
        ("c", 6, "define resonances and more"),  # a longer word is not the prompt's word
    ]
    prompts = ["What does the Nyquist rate mean?", long_prompt, "define resonance", "Why is the sky blue?"]
    for batch_chars in (10**6, 1):  # one batch, and a batch per document: the same findings
        monkeypatch.setattr(contamination, "BATCH_CHARS", batch_chars)
        nyquist, tides, define, sky = check_prompts(prompts, iter(docs))
        assert (nyquist.kind, nyquist.source, nyquist.doc, nyquist.documents) == ("verbatim", "a", 1, 2)
        assert "What does the Nyquist rate mean?" in nyquist.excerpt
        assert nyquist.describe() == "IN TRAINING DATA (verbatim): a document 1 and 1 more"
        assert (tides.kind, tides.source, tides.doc, tides.documents) == ("8-gram", "c", 5, 1)
        assert tides.describe() == "IN TRAINING DATA (2 of its 7 8-grams): c document 5"
        assert "how the tides of the ocean follow the moon" in tides.excerpt
        assert not define.contaminated and not sky.contaminated and sky.describe() == "not in the training documents"


def test_contamination_reads_the_training_documents_of_the_shards():
    """The documents as trained on, decoded from the token shards, the held-out ones left out."""
    from types import SimpleNamespace

    import numpy as np

    from andrea.contamination import shard_documents
    from andrea.tokenizer import HarrisTokenizer

    tok = HarrisTokenizer(["the ", "ing", "é!"])
    texts = [f"document {i}: the thing é! {'x' * i}" for i in range(7)]
    tokens = tok.encode_documents(texts)
    starts = [0] + list(np.cumsum([1 + len(tok.encode(t)) for t in texts]))
    shard = SimpleNamespace(n_docs=len(texts), tokens=tokens, offsets=np.array(starts, dtype=np.uint64))
    table = [tok.decode_bytes([i]) for i in range(tok.vocab_size)]
    for chunk in (1, 5, 10**6):  # a document longer than a chunk is read whole
        got = list(shard_documents({"s": shard}, table, heldout_every=3, chunk_tokens=chunk))
        assert got == [("s", i, t) for i, t in enumerate(texts) if i % 3 != 2]


def test_the_shipped_prompts_are_not_in_the_shipped_corpus(config, tmp_path):
    """The audit's prompts, word for word or by a run of 8 words, are in no document of the
    embedded corpus as the quickstart trains on it (rendered as training text), nor in its files."""
    from andrea.contamination import check_prompts
    from andrea.hermes3 import pull_hermes3
    from andrea.megachat import iter_megachat, prep_megachat, render_document

    pull_hermes3(config["hermes3"], tmp_path / "pull", "v")
    prep_megachat(config, tmp_path / "prep", "v", pull_dir=tmp_path / "pull")
    docs = [(r["source"], i, render_document(r["turns"], r["text"], config["megachat"]))
            for i, r in enumerate(iter_megachat(tmp_path / "prep" / "megachat.parquet"))]
    corpus = REPO / "andrea" / "corpus"
    docs += [(p.name, 0, p.read_text(encoding="utf-8")) for p in sorted(corpus.rglob("*")) if p.is_file()]
    assert len(docs) > 1000
    prompts = [p["prompt"] for p in config["audit"]["prompts"]]
    found = [c.describe() + f" {c.prompt!r}" for c in check_prompts(prompts, docs) if c.contaminated]
    assert found == []
    # the check does find a prompt that is there: one of the corpus's own questions
    (hit,) = check_prompts(["What does the Nyquist rate mean?"], docs)
    assert hit.contaminated and hit.source == "hermes3-general"


def test_a_prompt_in_the_training_documents_is_marked_in_the_report(trained, tmp_path, monkeypatch):
    cfg, ckpt, shards = trained  # noqa: F811
    for var in ("ANDREA_JUDGE_BASE_URL", "ANDREA_JUDGE_MODEL"):
        monkeypatch.delenv(var, raising=False)
    a = audit_cfg(cfg)
    a["prompts"] = [{"domain": "general", "prompt": "What causes the seasons on Earth?"}, a["prompts"][0]]
    a["samples_per_prompt"], a["max_new_tokens"] = 1, 8
    summary = run_audit(ckpt, shards, a, cfg["curriculum"]["heldout_every"], tmp_path / "audit")
    out = tmp_path / "audit"
    assert summary["contaminated_prompts"].startswith("1 of 2: 'What causes the seasons on Earth?' (hermes3-general document ")
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["contaminated"] for r in rows] == [True, False]
    assert rows[0]["contamination"].startswith("IN TRAINING DATA (verbatim): hermes3-general document ")
    md = (out / "report.md").read_text()
    assert "| general | What causes the seasons on Earth? | IN TRAINING DATA (verbatim): hermes3-general document" in md
    assert "| YES |" in md  # the samples table
    assert "IN TRAINING DATA" in (out / "report.html").read_text()
    assert summary["mean_coherence_uncontaminated"] == rows[1]["coherence"]


# ---------------------------------------------------------------- held-out coverage


def test_trainer_and_audit_agree_on_a_source_too_short_for_a_window(trained):
    """A source whose held-out text is shorter than a validation window: training's validation
    leaves it out and says the audit scores it whole; the audit does, and says which have none."""
    from types import SimpleNamespace

    import numpy as np

    from andrea.evaluation import build_eval_set, heldout_coverage, heldout_report
    from andrea.sampling import load_model

    _, ckpt, _ = trained
    lm = load_model(ckpt, backend="numpy")

    def shard(doc_lengths):
        offsets = np.concatenate([[0], np.cumsum(doc_lengths)]).astype(np.uint64)
        tokens = np.random.default_rng(0).integers(1, 256, int(offsets[-1])).astype(np.uint16)
        tokens[offsets[:-1].astype(np.int64)] = 256  # each document led by BOS
        return SimpleNamespace(n_docs=len(doc_lengths), tokens=tokens, offsets=offsets)

    shards = {"big": shard([40] * 8), "short": shard([10] * 4), "few": shard([50] * 2)}  # heldout_every 2 below
    T = 48
    cov = heldout_coverage(shards, 2, T)
    es = build_eval_set(shards, 2, T, 256, lm.tokenizer.token_bytes)
    assert es.sources == ["big", "few"] and set(es.skipped) == {"short"} and es.skipped["short"] == cov["short"]["why"]
    assert cov["short"]["heldout_tokens"] == 20 and cov["short"]["audit"] == "whole"
    assert "the audit scores it whole" in es.skipped["short"]
    assert cov["few"]["heldout_documents"] == 1 and cov["few"]["validation"]  # 50 tokens: one window of 49
    rep = heldout_report(lm.cfg, lm.weights, lm.tokenizer.token_bytes, {"big": shards["big"], "short": shards["short"]},
                         2, T, 256, backend="numpy")
    assert rep["per_source"]["short"]["method"] == "whole" and rep["per_source"]["short"]["tokens"] == 19  # 2 docs of 10 end to end
    assert rep["without_heldout"] == {}
    none = heldout_coverage({"tiny": shard([5])}, 2, T)["tiny"]
    assert not none["validation"] and none["audit"] is None and "only 1 document," in none["why"]
