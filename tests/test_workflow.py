"""The Snakemake workflow end to end on the embedded corpus (slow: a few seconds per run)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, snakemake, wait_for_checkpoint

pytestmark = pytest.mark.slow


def set_config(workdir, changes: dict):
    """Edit the workflow's config file: keys are dotted paths like 'filter_shape.threshold'."""
    path = workdir / "config" / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    for dotted, value in changes.items():
        node = cfg
        *parents, last = dotted.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))


def cfg_value(workdir, dotted):
    node = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    for p in dotted.split("."):
        node = node[p]
    return node


def stage_dirs(workdir, stage):
    return sorted(p.name for p in (workdir / "results" / "data" / stage).iterdir())


QUICK_TRAIN = {
    "sources.repo-docstrings.max_docs": 200,
    "train.ANDREA-tiny.max_steps": 20,
    "train.ANDREA-tiny.sample_every": 20,
    "train.ANDREA-tiny.sample_tokens": 20,
    "audit.max_new_tokens": 20,
    "audit.samples_per_prompt": 1,
    "geometry.per_model.ANDREA-tiny.surface_grid": 5,  # the quickstart's geometry, smaller: it re-runs with training
}


def test_pipeline_runs_and_reruns_only_what_changed(workflow_dir):
    set_config(workflow_dir, QUICK_TRAIN)

    done = snakemake(workflow_dir)
    res = workflow_dir / "results"
    # the closing lines say where the model, its report and the logs are
    for line in ("ANDREA-tiny:", "  checkpoint       results/ANDREA-tiny/ckpt/", "  audit report     results/ANDREA-tiny/audit/report.html",
                 "  geometry         results/ANDREA-tiny/geometry/geometry.html", "logs: results/logs/"):
        assert any(printed.startswith(line) for printed in done.stdout.splitlines()), (line, done.stdout)
    for stage, files in {
        "pull_hermes3": ["hermes3-general.parquet", "hermes3-creative.parquet", "hermes3-roleplay.parquet", "manifest.json"],
        "prep_megachat": ["megachat.parquet", "preview.txt", "manifest.json"],
        "filter_shape": ["megachat.parquet", "report.json", "removed_examples.jsonl", "manifest.json"],
    }.items():
        (version,) = stage_dirs(workflow_dir, stage)
        for f in files:
            assert (res / "data" / stage / version / f).exists(), (stage, f)
        assert (res / "logs" / stage / f"{version}.log").stat().st_size > 0
        assert (res / "benchmarks" / stage / f"{version}.tsv").exists()
    report = json.loads(next((res / "data" / "filter_shape").glob("*/report.json")).read_text())
    assert report["totals"]["dropped_shape"] >= 1 and report["totals"]["kept"] > 100

    summary = json.loads((res / "ANDREA-tiny" / "audit" / "summary.json").read_text())
    assert summary["samples"] == 8 and "not run" in summary["external_judge"]
    assert (res / "ANDREA-tiny" / "audit" / "report.html").exists()
    run = json.loads((res / "ANDREA-tiny" / "ckpt" / "run.json").read_text())
    assert run["step"] == 20 and (res / "ANDREA-tiny" / "ckpt" / "final.bin").stat().st_size > 0
    shards = json.loads((res / "ANDREA-tiny" / "shards.json").read_text())
    assert shards["sources"]["dictionary"]["n_docs"] > 50
    (tok_version,) = stage_dirs(workflow_dir, "train_tokenizer")
    assert tok_version.startswith(f"N{cfg_value(workflow_dir, 'models.ANDREA-tiny.n_segments')}-")
    assert (res / "data" / "train_tokenizer" / tok_version / "saturation.json").exists()
    # the geometry is part of the quickstart: its page, plots, numbers, log and benchmark
    geo = json.loads((res / "ANDREA-tiny" / "geometry" / "geometry.json").read_text())
    assert geo["step"] == 20 and geo["views"] == ["embedding", "attention", "surface", "simplex"]
    assert len(geo["surface"]["alpha"]) == 5 and geo["interpolation"]["nodes"][0]["difference"] == 0
    assert len(list((res / "ANDREA-tiny" / "geometry" / "plots").glob("attention_*.png"))) == 8 + 1  # 8 prompts, the heads
    assert (res / "logs" / "geometry" / "ANDREA-tiny.log").stat().st_size > 0 and (res / "benchmarks" / "geometry" / "ANDREA-tiny.tsv").exists()

    # nothing changed: nothing runs
    again = snakemake(workflow_dir)
    assert "Nothing to be done" in again.stdout + again.stderr

    # the audit's prompt set changed: the audit alone re-runs, nothing is retrained
    set_config(workflow_dir, {"audit.prompts": [{"domain": "biology", "prompt": "What is a cell?"}]})
    plan = snakemake(workflow_dir, "--dry-run")
    text = plan.stdout + plan.stderr
    assert "rule audit" in text and "rule train:" not in text and "rule encode" not in text
    assert "rule geometry" in text  # the attention maps' prompts are the audit's
    snakemake(workflow_dir)
    assert json.loads((res / "ANDREA-tiny" / "audit" / "summary.json").read_text())["samples"] == 1

    # the vocabulary size changed: tokenizer and encode (and the model's shard list) re-run only
    set_config(workflow_dir, {"models.ANDREA-tiny.n_segments": 300})
    plan = snakemake(workflow_dir, "--dry-run")
    text = plan.stdout + plan.stderr
    assert "rule train_tokenizer" in text and "rule encode" in text and "rule shards" in text and "rule train:" in text and "rule audit" in text
    assert "rule filter_shape" not in text and "rule prep_megachat" not in text and "rule pull_hermes3" not in text
    snakemake(workflow_dir)
    assert len(stage_dirs(workflow_dir, "train_tokenizer")) == 2

    # one filter parameter changed: filter_shape alone re-runs, into a new version
    pull_before = stage_dirs(workflow_dir, "pull_hermes3")
    prep_manifest = next((res / "data" / "prep_megachat").glob("*/manifest.json"))
    mtime = prep_manifest.stat().st_mtime_ns
    set_config(workflow_dir, {"filter_shape.threshold": 0.7})
    plan = snakemake(workflow_dir, "--dry-run")
    text = plan.stdout + plan.stderr
    assert "rule filter_shape" in text and "rule prep_megachat" not in text and "rule pull_hermes3" not in text
    snakemake(workflow_dir)
    assert len(stage_dirs(workflow_dir, "filter_shape")) == 2  # the old version stays readable
    assert stage_dirs(workflow_dir, "pull_hermes3") == pull_before
    assert prep_manifest.stat().st_mtime_ns == mtime

    # a source parameter changed: prep and filter re-run, pull does not
    set_config(workflow_dir, {"sources.dictionary.max_docs": 10})
    plan = snakemake(workflow_dir, "--dry-run")
    text = plan.stdout + plan.stderr
    assert "rule prep_megachat" in text and "rule filter_shape" in text and "rule pull_hermes3" not in text

    # --forcerun re-runs a stage whose inputs have not changed
    plan = snakemake(workflow_dir, "--dry-run", "--forcerun", "pull_hermes3")
    assert "rule pull_hermes3" in plan.stdout + plan.stderr


def test_killed_training_resumes_through_snakemake(workflow_dir):
    set_config(workflow_dir, {**QUICK_TRAIN, "train.ANDREA-tiny.max_steps": 400, "train.ANDREA-tiny.checkpoint_every": 20,
                              "train.ANDREA-tiny.sample_every": 1000})
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workflow_dir), "--cores", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    runs = workflow_dir / "results" / "ANDREA-tiny" / "runs"
    wait_for_checkpoint(runs, proc)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C on the terminal: Snakemake and its job get SIGINT
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, out[-2000:]
    assert not (workflow_dir / "results" / "ANDREA-tiny" / "ckpt").exists()
    (run_dir,) = runs.iterdir()
    stopped = json.loads((run_dir / "state.json").read_text())["step"]
    assert 0 < stopped < 400
    # the job's log says what happened and what to do, not only "Error in rule train"
    stop_log = (workflow_dir / "results" / "logs" / "train" / "ANDREA-tiny.log").read_text()
    assert f"stopped at step {stopped}, checkpoint written" in stop_log and "run the workflow again to resume" in stop_log
    snakemake(workflow_dir)
    log = (workflow_dir / "results" / "logs" / "train" / "ANDREA-tiny.log").read_text()
    assert f"resumed ANDREA-tiny at step {stopped}" in log
    recs = [json.loads(l) for l in (run_dir / "loss.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in recs if r.get("kind", "train") == "train"]
    assert steps == list(range(400))  # continuous: nothing duplicated, nothing missing
    evals = [r["step"] for r in recs if r.get("kind") == "eval"]
    assert evals == list(range(0, 401, cfg_value(workflow_dir, "train.ANDREA-tiny.eval_every")))
    assert json.loads((workflow_dir / "results" / "ANDREA-tiny" / "ckpt" / "run.json").read_text())["step"] == 400


def test_full_size_plan(workflow_dir):
    """The real ANDREA-120M DAG plans (200K steps, batch 8, context 1024, 20K warm-up)."""
    plan = snakemake(workflow_dir, "-n", "results/ANDREA-120M/audit")
    text = plan.stdout + plan.stderr
    # on its data profile, real: fetched first, then the real profile's data stages
    for rule in ("fetch_data", "pull_hermes3_real", "prep_megachat_real", "filter_shape_real", "train_tokenizer", "encode",
                 "shards", "train", "audit"):
        assert f"rule {rule}:" in text, rule
    from andrea.config import load_config
    from andrea.trainer import train_settings

    s = train_settings(load_config(workflow_dir / "config" / "config.yaml"), "ANDREA-120M")
    assert (s["max_steps"], s["batch_size"], s["curriculum"]["warmup_steps"]) == (200_000, 8, 20_000)
    assert len(s["curriculum"]["warmup_sources"]) == 7


def test_a_refused_training_says_why_in_one_paragraph(workflow_dir):
    """ANDREA-120M on a machine without a GPU: the train job refuses with the estimate and what
    to do, in its log, without a traceback."""
    set_config(workflow_dir, {"sources.repo-docstrings.max_docs": 200, "data_profile": "embedded"})  # no network here
    proc = snakemake(workflow_dir, "results/ANDREA-120M/ckpt", check=False)
    assert proc.returncode != 0
    log = (workflow_dir / "results" / "logs" / "train" / "ANDREA-120M.log").read_text()
    assert "refusing to train: ANDREA-120M" in log and "ANDREA-tiny" in log and "force_train=true" in log
    assert "Traceback" not in log
    assert not (workflow_dir / "results" / "ANDREA-120M" / "ckpt").exists()


def test_a_failed_job_leaves_no_artifact(workflow_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}\n{broken\n')
    set_config(workflow_dir, {"strict": True, "sources.chat.location": str(bad)})
    proc = snakemake(workflow_dir, check=False)
    assert proc.returncode != 0
    prep = workflow_dir / "results" / "data" / "prep_megachat"
    assert not list(prep.glob("*/megachat.parquet")) and not list(prep.glob("*/manifest.json"))
    log = next((workflow_dir / "results" / "logs" / "prep_megachat").glob("*.log")).read_text()
    assert "bad.jsonl:line 2" in log


def test_the_config_is_checked_before_any_job_in_plain_words(workflow_dir, tmp_path):
    """Through Snakemake's own --config: what the README recommends (force_train=true) is accepted;
    a mistyped key is two lines with the nearest key (the schema only with ANDREA_DEBUG=1); a
    missing input file stops the workflow before any job, saying what to do."""
    plan = snakemake(workflow_dir, "-n", "--config", "force_train=true", "strict=Yes", "data_profile=embedded")
    assert "rule train:" in plan.stdout

    set_config(workflow_dir, {"train.defaults.max_stpes": 600})
    proc = snakemake(workflow_dir, "-n", check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == ["configuration error: config/config.yaml is invalid:",
                                                "  train.defaults.max_stpes: unknown key; did you mean `max_steps`?"]
    # a typo in an overlay (--configfile): the error names the files the config came from
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("strict: false\n", encoding="utf-8")
    proc = snakemake(workflow_dir, "-n", "--configfile", str(overlay), check=False)
    assert proc.stderr.strip().splitlines()[0] == f"configuration error: config/config.yaml with {overlay} is invalid:"
    debug = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workflow_dir),
                            "--cores", "1", "-n"], capture_output=True, text=True, timeout=120, env={**os.environ, "ANDREA_DEBUG": "1"})
    assert debug.returncode != 0 and "did you mean `max_steps`" in debug.stderr and "Failed validating" in debug.stderr

    cfg = yaml.safe_load((workflow_dir / "config" / "config.yaml").read_text())
    del cfg["train"]["defaults"]["max_stpes"]
    cfg["sources"]["chat"]["location"] = str(tmp_path / "missing" / "chat.jsonl")
    (workflow_dir / "config" / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    proc = snakemake(workflow_dir, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"sources.chat.location: {tmp_path}/missing/chat.jsonl does not exist" in line
    assert "enabled: false" in line and "optional: true" in line
    assert not (workflow_dir / "results").exists()  # no job ran
    set_config(workflow_dir, {"sources.chat.optional": True})  # optional: a warning, and the plan goes on
    plan = snakemake(workflow_dir, "-n")
    assert "sources.chat.location" in plan.stderr and "rule prep_megachat:" in plan.stdout


def test_a_dry_run_names_the_setting_that_changed(workflow_dir, monkeypatch):
    """After a build (its folders and version records), a changed setting is named before the DAG:
    Snakemake itself shows only the new version's hash."""
    from andrea.config import load_config
    from andrea.versions import record_versions, stage_versions, train_version

    old = load_config(workflow_dir / "config" / "config.yaml")
    monkeypatch.chdir(workflow_dir)  # results_dir is relative to the working directory
    record_versions(old, ["embedded"])
    for stage, v in stage_versions(old).items():
        n = f"N{old['models']['ANDREA-tiny']['n_segments']}-" if stage in ("train_tokenizer", "encode") else ""
        (workflow_dir / "results" / "data" / stage / f"{n}{v}").mkdir(parents=True)
    ckpt = workflow_dir / "results" / "ANDREA-tiny" / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "run.json").write_text(json.dumps({"train_version": train_version(old, "ANDREA-tiny")}))
    steps = cfg_value(workflow_dir, "train.ANDREA-tiny.max_steps")
    set_config(workflow_dir, {"filter_shape.threshold": 0.7, "train.ANDREA-tiny.max_steps": steps + 200})
    text = snakemake(workflow_dir, "-n", "results/ANDREA-tiny/ckpt").stderr
    assert "changed since the last build: filter_shape (data profile embedded): filter_shape.threshold 0.5 → 0.7" in text
    assert f"max_steps {steps} → {steps + 200}" in text


def test_lint_and_format_are_clean():
    lint = subprocess.run([sys.executable, "-m", "snakemake", "--lint", "-s", str(REPO / "Snakefile"), "--directory", str(REPO)],
                          capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0 and "Lints for" not in lint.stdout + lint.stderr, lint.stdout + lint.stderr
    snakefmt = shutil.which("snakefmt", path=str(Path(sys.executable).parent)) or shutil.which("snakefmt")
    fmt = subprocess.run([snakefmt, "--check", str(REPO / "Snakefile"), str(REPO / "workflow")], capture_output=True, text=True, timeout=120)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def run_dirs(workdir, model="ANDREA-tiny"):
    return sorted(p.name for p in (workdir / "results" / model / "runs").iterdir())


def train_steps(run_dir):
    return [json.loads(l)["step"] for l in (run_dir / "loss.jsonl").read_text().splitlines()
            if json.loads(l).get("kind", "train") == "train"]


def test_training_follows_the_config(workflow_dir):
    """results/<model>/ckpt and /audit always describe the current config: raising max_steps
    continues the run from its newest checkpoint; any other change to what the weights depend on
    re-runs train (and audit) into a new run directory; a change to how the run is watched re-runs
    train, which continues the same run."""
    set_config(workflow_dir, {**QUICK_TRAIN, "train.ANDREA-tiny.max_steps": 12, "train.ANDREA-tiny.checkpoint_every": 4,
                              "train.ANDREA-tiny.eval_every": 6})
    res = workflow_dir / "results" / "ANDREA-tiny"
    snakemake(workflow_dir, "results/ANDREA-tiny/audit")
    (first,) = run_dirs(workflow_dir)
    assert json.loads((res / "ckpt" / "run.json").read_text())["run_key"] == first

    def planned():
        text = (lambda p: p.stdout + p.stderr)(snakemake(workflow_dir, "--dry-run", "results/ANDREA-tiny/audit"))
        return {r for r in ("pull_hermes3", "encode", "train", "audit") if f"rule {r}:" in text}

    assert planned() == set()
    # more steps: the same run goes on from step 12; the schedule is recomputed for the new end
    set_config(workflow_dir, {"train.ANDREA-tiny.max_steps": 18})
    assert planned() == {"train", "audit"}
    snakemake(workflow_dir, "results/ANDREA-tiny/audit")
    assert run_dirs(workflow_dir) == [first]
    assert train_steps(res / "runs" / first) == list(range(18))
    assert "resumed ANDREA-tiny at step 12" in (res / "runs" / first / "train.log").read_text()
    run = json.loads((res / "ckpt" / "run.json").read_text())
    assert run["step"] == 18 and run["train"]["max_steps"] == 18
    assert json.loads((res / "audit" / "summary.json").read_text())["step"] == 18
    # a watch setting: train re-runs and finds the run complete; nothing is trained again
    set_config(workflow_dir, {"train.ANDREA-tiny.checkpoint_every": 6})
    assert planned() == {"train", "audit"}
    snakemake(workflow_dir, "results/ANDREA-tiny/ckpt")
    assert run_dirs(workflow_dir) == [first] and train_steps(res / "runs" / first) == list(range(18))
    # a setting of another curriculum mode than the run's (the default, proportional, named: unnamed, a
    # bandit setting is a config error, tests/test_config.py): no training, only the audit, which is
    # behind the checkpoint the watch setting's train re-wrote (its target was ckpt)
    set_config(workflow_dir, {"curriculum.mode": "proportional", "curriculum.background_weight": 0.2})
    assert planned() == {"audit"}
    # what the weights depend on: each is a new run from step 0 (the last, the bandit, reads background_weight)
    seen = {first}
    for change in ({"train.ANDREA-tiny.lr": 1.0e-3}, {"train.ANDREA-tiny.seed": 7}, {"models.ANDREA-tiny.d_model": 96},
                   {"curriculum.mode": "bandit"}):
        set_config(workflow_dir, change)
        assert planned() == {"train", "audit"}, change
        snakemake(workflow_dir, "results/ANDREA-tiny/audit")
        new = set(run_dirs(workflow_dir)) - seen
        assert len(new) == 1, change
        (key,) = new
        seen.add(key)
        assert train_steps(res / "runs" / key) == list(range(18))
        run = json.loads((res / "ckpt" / "run.json").read_text())
        assert run["run_key"] == key and run["step"] == 18
        assert json.loads((res / "audit" / "summary.json").read_text())["step"] == 18
    assert run["model_config"]["d_model"] == 96 and run["train"]["seed"] == 7 and run["train"]["lr"] == 1.0e-3
    assert run["train"]["curriculum"]["mode"] == "bandit" and run["train"]["curriculum"]["background_weight"] == 0.2
