import os
from pathlib import Path

from andrea.config import HERMES3_PARTS, train_settings
from andrea.records import embedded_location
from andrea.versions import (
    stage_dir,
    stage_versions,
    train_needs_gpu,
    train_run_key,
    train_version,
)

VERSIONS = stage_versions(config)
RESULTS = config["results_dir"]
PULL_DIR = str(stage_dir(config, "pull_hermes3"))
PREP_DIR = str(stage_dir(config, "prep_megachat"))
FILTER_DIR = str(stage_dir(config, "filter_shape"))


def log_path(stage):
    return f"{RESULTS}/logs/{stage}/{VERSIONS[stage]}.log"


def benchmark_path(stage):
    return f"{RESULTS}/benchmarks/{stage}/{VERSIONS[stage]}.tsv"


def in_workdir(path):
    """A path inside the working directory, relative to it: Snakemake records a job's input
    paths, so an absolute one would make a moved or copied checkout re-run the stage."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def hermes3_input(wildcards):
    """The local file pull_hermes3 reads (none for the hub), so editing it re-runs the stage.
    The embedded corpus lives in the checkout: relative when that is the working directory. A
    location the user configures is used as written, absolute or relative."""
    loc = config["hermes3"]["location"]
    if loc == "hub":
        return []
    return [in_workdir(embedded_location("hermes3"))] if loc == "embedded" else [loc]


from andrea.versions import enabled_sources

SOURCES = enabled_sources(config)
TOKENIZER_DIR = f"{RESULTS}/data/train_tokenizer/N{{n}}-{VERSIONS['train_tokenizer']}"
ENCODE_DIR = f"{RESULTS}/data/encode/N{{n}}-{VERSIONS['encode']}"


def model_n_segments(model):
    try:
        return config["models"][model]["n_segments"]
    except KeyError:
        raise ValueError(
            f"unknown model {model!r}; models in config/config.yaml: {', '.join(config['models'])}"
        ) from None


def model_encode_manifest(wildcards):
    return rules.encode.output.manifest.format(n=model_n_segments(wildcards.model))


def train_resources(wildcards):
    """GPU count for a model's train job: cupy needs one, numpy none; auto asks for one when the
    run would be too long for a CPU (andrea.versions.train_needs_gpu)."""
    return 1 if train_needs_gpu(config, wildcards.model) else 0


def partition(kind):
    """SLURM partition for CPU or GPU jobs: the environment, else config (ignored locally)."""
    env = "ANDREA_SLURM_GPU_PARTITION" if kind == "gpu" else "ANDREA_SLURM_PARTITION"
    return os.environ.get(env) or config["cluster"][f"{kind}_partition"]


def train_partition(wildcards):
    return partition("gpu" if train_resources(wildcards) else "cpu")
