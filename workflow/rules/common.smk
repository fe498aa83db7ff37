from andrea.config import HERMES3_PARTS
from andrea.hermes3 import embedded_path
from andrea.versions import stage_dir, stage_versions

VERSIONS = stage_versions(config)
RESULTS = config["results_dir"]
PULL_DIR = str(stage_dir(config, "pull_hermes3"))
PREP_DIR = str(stage_dir(config, "prep_megachat"))
FILTER_DIR = str(stage_dir(config, "filter_shape"))


def log_path(stage):
    return f"{RESULTS}/logs/{stage}/{VERSIONS[stage]}.log"


def benchmark_path(stage):
    return f"{RESULTS}/benchmarks/{stage}/{VERSIONS[stage]}.tsv"


def hermes3_input(wildcards):
    """The local file pull_hermes3 reads (none for the hub), so editing it re-runs the stage."""
    loc = config["hermes3"]["location"]
    if loc == "hub":
        return []
    return [str(embedded_path("hermes3.jsonl"))] if loc == "embedded" else [loc]
