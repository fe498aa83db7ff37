import os
import re
import sys
from pathlib import Path

from andrea.config import (
    HERMES3_PARTS,
    geometry_prompts,
    geometry_settings,
    study_max_steps,
    study_rule_name,
    study_run_config,
    train_settings,
)
from andrea.fetch import wanted
from andrea.profiles import model_profile, profile_config, used_profiles
from andrea.records import embedded_location
from andrea.versions import (
    STAGES,
    enabled_sources,
    stage_versions,
    train_needs_gpu,
    train_run_key,
    train_version,
    version_changes,
)

RESULTS = config["results_dir"]
# The data stages run once per data profile the models train on (andrea.profiles); the version
# in a stage's directory name says which profile it is of (the profile is part of it).
PROFILES = used_profiles(config)
PCONFIG = {p: profile_config(config, p) for p in PROFILES}
PVERSIONS = {p: stage_versions(PCONFIG[p]) for p in PROFILES}
VERSION_PROFILE = {s: {PVERSIONS[p][s]: p for p in PROFILES} for s in STAGES}
# profiles with hub datasets: fetched once into fetch_dir (by fetch_data) before their data stages
FETCH_DIR = config["fetch_dir"]
HUB_PROFILES = [p for p in PROFILES if wanted(PCONFIG[p])]


def versions(stage):
    """The versions of a stage in this workflow: its {version} wildcard takes only these."""
    return "|".join(VERSION_PROFILE[stage])


def profile_of(stage, wildcards):
    return VERSION_PROFILE[stage][wildcards.version]


def stage_path(stage, profile, n=None):
    """A stage's directory for a profile (train_tokenizer and encode: for vocabulary size n)."""
    v = PVERSIONS[profile][stage]
    return f"{RESULTS}/data/{stage}/{v if n is None else f'N{n}-{v}'}"


TOKENIZER_DIR = f"{RESULTS}/data/train_tokenizer/N{{n}}-{{version}}"
ENCODE_DIR = f"{RESULTS}/data/encode/N{{n}}-{{version}}"


def stage_config(stage, profile):
    """The part of a profile's config a stage reads, and no more: a job's params are compared
    between runs, so a setting the stage does not read (the audit's, a floor) must not be in them.
    """
    pc = PCONFIG[profile]
    drop = ("floor", "cap", "weight") if stage == "prep_megachat" else ("floor", "cap")
    sources = {
        k: {f: x for f, x in v.items() if f not in drop}
        for k, v in pc["sources"].items()
    }
    # prep_megachat: data_profile and hermes3 name the key to fix and the Hermes-3 copy in the
    # empty-source error (andrea.megachat.empty_source_message)
    keys = {
        "prep_megachat": ("megachat", "strict", "data_profile", "hermes3"),
        "train_tokenizer": ("megachat", "tokenizer"),
    }[stage]
    return {"sources": sources, **{k: pc[k] for k in keys}}


def hub_dir(input):
    """The fetch folder of a job whose inputs hold its profile's fetch marker (None: no hub data)."""
    marker = [f for f in input if f.startswith(f"{FETCH_DIR}/profiles/")]
    return str(Path(marker[0]).parents[1]) if marker else None


def fetched(profile):
    """The fetch_data marker of a profile with hub datasets (none for the others)."""
    return [f"{FETCH_DIR}/profiles/{profile}.json"] if profile in HUB_PROFILES else []


def stage_rule(stage, profile):
    """What a data stage is called for a profile: its own name for the default profile, else
    <stage>_<profile> (snakemake filter_shape_real)."""
    default = config.get("data_profile") or "embedded"
    return (
        stage
        if profile == default
        else f"{stage}_{re.sub(r'[^A-Za-z0-9_]', '_', profile)}"
    )


def log_path(stage, profile):
    return f"{RESULTS}/logs/{stage}/{PVERSIONS[profile][stage]}.log"


def benchmark_path(stage, profile):
    return f"{RESULTS}/benchmarks/{stage}/{PVERSIONS[profile][stage]}.tsv"


def in_workdir(path):
    """A path inside the working directory, relative to it: Snakemake records a job's input
    paths, so an absolute one would make a moved or copied checkout re-run the stage."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def hermes3_input(profile):
    """What a profile's pull_hermes3 reads, so that a change re-runs it: the local file (the
    embedded corpus lives in the checkout: relative when that is the working directory; a
    configured location is used as written), or, for a hub dataset, the profile's fetch marker.
    """
    loc = PCONFIG[profile]["hermes3"]["location"]
    if loc == "hub":
        return fetched(profile)
    return [in_workdir(embedded_location("hermes3"))] if loc == "embedded" else [loc]


def model_n_segments(model):
    try:
        return config["models"][model]["n_segments"]
    except KeyError:
        raise ValueError(
            f"unknown model {model!r}; models in config/config.yaml: {', '.join(config['models'])}"
        ) from None


def model_encode_manifest(wildcards):
    n = model_n_segments(wildcards.model)
    return f"{stage_path('encode', model_profile(config, wildcards.model), n)}/manifest.json"


def train_ranks(wildcards):
    """Data-parallel ranks of a model's train job (train.<model>.ranks): its SLURM tasks. The job
    script runs as one task of that allocation and starts the ranks inside it (andrea/launch.py:
    srun --overlap for GPU ranks, mpirun for CPU ranks)."""
    return train_settings(config, wildcards.model)["ranks"]


def train_resources(wildcards):
    """GPU count for a model's train job: one per rank for cupy, none for numpy; auto asks for
    them when the run would be too long for a CPU (andrea.versions.train_needs_gpu)."""
    return train_ranks(wildcards) if train_needs_gpu(config, wildcards.model) else 0


def partition(kind):
    """SLURM partition for CPU or GPU jobs: the environment, else config (ignored locally)."""
    env = "ANDREA_SLURM_GPU_PARTITION" if kind == "gpu" else "ANDREA_SLURM_PARTITION"
    return os.environ.get(env) or config["cluster"][f"{kind}_partition"]


def train_partition(wildcards):
    return partition("gpu" if train_resources(wildcards) else "cpu")


# Curriculum studies (config `studies:`, workflow/rules/study.smk)
STUDIES = config["studies"]


def study_pattern(names):
    return "|".join(re.escape(n) for n in names) or "(?!)"


def study_run(wildcards):
    """The config and model of one run of a study (andrea.config.study_run_config)."""
    st = STUDIES[wildcards.study]
    return (
        study_run_config(config, wildcards.study, wildcards.arm, int(wildcards.seed)),
        st["model"],
    )


def study_train_version(wildcards):
    """What the run's result depends on (andrea.versions.train_version of its config): any change
    re-runs it, into a run directory of that version."""
    return train_version(*study_run(wildcards))


def study_gpu(wildcards):
    return 1 if train_needs_gpu(*study_run(wildcards)) else 0


def study_ckpts(wildcards):
    st = STUDIES[wildcards.study]
    return [
        f"{RESULTS}/studies/{wildcards.study}/runs/{arm}/seed{seed}/ckpt"
        for arm in st["arms"]
        for seed in st["seeds"]
    ]


# Which settings made a stage's version new since the last build (andrea.versions.version_changes):
# Snakemake itself can only show the two hashes. Said once, by the main process (a job on a
# cluster node parses this file again).
if workflow.is_main_process:
    for _line in version_changes(config, PROFILES):
        print(f"changed since the last build: {_line}", file=sys.stderr)
