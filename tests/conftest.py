import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _gemm_tuning_file(tmp_path_factory):
    """GPU tests (and the runs they start) record cuBLASLt's timed algorithms in a file of their own,
    not in the user's ~/.cache/andrea/cublaslt-tuning.json."""
    saved = os.environ.get("ANDREA_GEMM_TUNING")
    os.environ["ANDREA_GEMM_TUNING"] = str(tmp_path_factory.mktemp("gemm-tuning") / "cublaslt-tuning.json")
    yield
    if saved is None:
        os.environ.pop("ANDREA_GEMM_TUNING", None)
    else:
        os.environ["ANDREA_GEMM_TUNING"] = saved


@pytest.fixture
def config(tmp_path):
    """The shipped config with results under tmp_path and the git source pointed at nothing."""
    from andrea.config import load_config

    cfg = load_config(REPO / "config" / "config.yaml", overrides={"results_dir": str(tmp_path / "results")})
    return cfg


def write_jsonl(path: Path, rows) -> Path:
    """Rows may be dicts (serialised) or raw strings (written as-is, for broken lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def with_sources(config: dict, sources: dict, **top) -> dict:
    """A validated config that reads only `sources` (plus top-level overrides such as strict)."""
    from andrea.config import validate_config

    raw = {k: v for k, v in config.items() if k != "sources"}
    raw["sources"] = sources
    raw.update(top)
    return validate_config(raw)


def run_prep(cfg: dict, out: Path):
    """prep_megachat into `out`: its counts, the megachat rows and the manifest."""
    import pyarrow.parquet as pq

    from andrea.megachat import prep_megachat

    counts = prep_megachat(cfg, out, "v1")
    rows = pq.read_table(out / "megachat.parquet").to_pylist()
    return counts, rows, json.loads((out / "manifest.json").read_text())


def sharegpt(*turns, **extra):
    return {"conversations": [{"from": f, "value": v} for f, v in turns], **extra}


@pytest.fixture
def workflow_dir(tmp_path):
    """A working directory with the shipped config, for running the Snakefile of this checkout."""
    (tmp_path / "config").mkdir()
    shutil.copy(REPO / "config" / "config.yaml", tmp_path / "config" / "config.yaml")
    return tmp_path


def snakemake(workdir: Path, *args, check=True, timeout=300):
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir), "--cores", "1", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="session")
def embedded_megachat(tmp_path_factory):
    from andrea.config import load_config
    from andrea.filter import filter_shape
    from andrea.hermes3 import pull_hermes3
    from andrea.megachat import prep_megachat

    tmp = tmp_path_factory.mktemp("embedded")
    cfg = load_config(REPO / "config" / "config.yaml", overrides={"results_dir": str(tmp)})
    cfg["sources"]["repo-docstrings"]["max_docs"] = 400
    pull_hermes3(cfg["hermes3"], tmp / "pull", "v")
    prep_megachat(cfg, tmp / "prep", "v", pull_dir=tmp / "pull")
    filter_shape(tmp / "prep" / "megachat.parquet", tmp / "filter", cfg["filter_shape"], "v")
    return cfg, tmp / "filter" / "megachat.parquet"


def model_shards(embedded_megachat, tmp: Path, model: str, n_segments: int) -> Path:
    """A model's shards of the embedded corpus, as the workflow's tokenizer, encode and shards stages
    make them (a tokenizer of `n_segments`), under tmp; returns its shards.json."""
    from andrea.shards import encode_shards, write_model_shards
    from andrea.tokenizer import train_tokenizer
    from andrea.versions import enabled_sources

    cfg, megachat = embedded_megachat
    train_tokenizer(megachat, tmp / "tok", n_segments, cfg, "v")
    encode_shards(megachat, tmp / "tok" / "harris_segments.json", tmp / "enc", enabled_sources(cfg), cfg["megachat"], "v")
    write_model_shards(model, tmp / "enc" / "manifest.json", tmp / "shards.json")
    return tmp / "shards.json"


def wait_for_checkpoint(runs: Path, proc, timeout: float = 240) -> None:
    """Poll until a training run under `runs` has written a checkpoint, failing if `proc` ends."""
    import time

    t0 = time.time()
    while not list(runs.glob("*/checkpoints/step_*.bin")):
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() - t0 < timeout, "no checkpoint appeared"
        time.sleep(0.2)
