"""Versioned artifacts: each stage's output directory is named by a hash of its own parameters
and of the versions upstream of it.

Changing a parameter of one stage therefore changes that stage's version and every version
downstream of it, so Snakemake re-runs exactly those stages and nothing upstream; artifacts of
earlier versions stay where they were, readable.

The data stages are versioned per data profile (andrea.profiles): a config is first made its
profile's (its `data_profile`, else `embedded`), whose name and locations are part of the first
stage's parameters, so each profile's artifacts have versions of their own.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

POLICY_KEYS = ("floor", "cap", "weight")
STAGES = ("pull_hermes3", "prep_megachat", "filter_shape", "train_tokenizer", "encode")


def _digest(obj) -> str:
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def as_profile(config: dict) -> dict:
    """The config of the data profile it names (`data_profile`, else embedded); a profile's config
    is returned as it is."""
    from andrea.profiles import default_profile, profile_config

    return profile_config(config, default_profile(config))


def stage_params(config: dict, stage: str) -> dict:
    """The configuration a stage's output depends on (defaults already filled), for a profile's
    config (as_profile)."""
    config = as_profile(config)
    if stage == "pull_hermes3":
        # the profile: every later stage's version covers it through this one
        return {"hermes3": config["hermes3"], "strict": config["strict"], "profile": config["data_profile"]}
    if stage == "prep_megachat":
        # the bandit's floors/caps and the diet weight do not change the corpus
        enabled = {k: {f: x for f, x in v.items() if f not in POLICY_KEYS} for k, v in config["sources"].items() if v["enabled"]}
        return {"sources": enabled, "megachat": config["megachat"], "strict": config["strict"]}
    if stage == "filter_shape":
        return {"filter_shape": config["filter_shape"]}
    if stage == "train_tokenizer":  # N is not here: it names the directory (N<n>-<version>)
        weights = {k: v["weight"] for k, v in config["sources"].items() if v["enabled"]}
        return {"tokenizer": config["tokenizer"], "weights": weights}
    if stage == "encode":
        return {"sources": enabled_sources(config)}
    raise KeyError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")


def stage_versions(config: dict) -> dict[str, str]:
    """Each data stage's version for the config's data profile (as_profile)."""
    config = as_profile(config)
    versions: dict[str, str] = {}
    upstream = None
    for stage in STAGES:
        versions[stage] = _digest({"stage": stage, "params": stage_params(config, stage), "up": upstream})
        upstream = versions[stage]
    return versions


# Training settings that change how a run is watched and saved, not the weights it computes, and
# the ones a run may change between a stop and a resume: editing them continues the same run.
WATCH_KEYS = ("checkpoint_every", "keep_checkpoints", "sample_every", "sample_tokens", "sample_prompt",
              "sample_temperature", "coherence_halt_below", "coherence_patience", "coherence_arm_score", "eval_every",
              "eval_tokens", "prefetch", "record_batches", "max_cpu_hours", "ranks", "reduce_bucket_mb",
              "reduce_dtype")
CONTINUE_KEYS = ("max_steps",)  # raising it continues the run from its newest checkpoint
# watch settings that cannot change what a finished run's outputs hold: not in the rule's version,
# so editing them never re-runs a finished train (a running or resumed one reads them as it goes)
# ranks and reduce_dtype: a run continues on another number of ranks or reduction type, and a
# finished one stands (decision)
OUTPUT_NEUTRAL_KEYS = ("prefetch", "max_cpu_hours", "keep_checkpoints", "record_batches", "ranks", "reduce_bucket_mb",
                       "reduce_dtype")


def train_run_key(config: dict, model: str) -> str:
    """Name of a model's run directory (results/<model>/runs/<key>): a hash of everything the
    trained weights depend on — the architecture, the data (the encode stage's version, which
    covers the sources, filter and tokenizer), the training and curriculum settings and the seed —
    except `max_steps` and the bandit's floors and caps, so that raising max_steps, or changing the
    policy between a stop and a resume (the "polish pivot"), continues the same run."""
    from andrea.config import train_settings

    s = train_settings(config, model)
    for k in WATCH_KEYS + CONTINUE_KEYS:
        s.pop(k, None)
    return _digest({"model": config["models"][model], "data": stage_versions(model_config(config, model))["encode"], "train": s})


def model_config(config: dict, model: str) -> dict:
    """The config of the data profile a model trains on (andrea.profiles.model_profile)."""
    from andrea.profiles import model_profile, profile_config

    if model not in config["models"]:
        raise KeyError(f"unknown model {model!r}; models in the config: {', '.join(config['models'])}")
    return profile_config(config, model_profile(config, model))


def train_version(config: dict, model: str) -> str:
    """What Snakemake compares to decide whether `train` must run again: the run key plus the
    settings a run may change on resume (max_steps, floors, caps, how it is watched). Any change
    re-runs the rule; the trainer then continues or starts the run its key names."""
    from andrea.config import train_settings

    s = train_settings(config, model)
    sources = model_config(config, model)["sources"]
    policy = {k: {f: v.get(f) for f in ("floor", "cap")} for k, v in sources.items() if v["enabled"]}
    watched = {k: s[k] for k in WATCH_KEYS + CONTINUE_KEYS if k in s and k not in OUTPUT_NEUTRAL_KEYS}
    return _digest({"run": train_run_key(config, model), "policy": policy, "watched": watched})


NOMINAL_CPU_FLOPS = 5e10  # a workstation's sustained float32 matrix rate through NumPy


def train_needs_gpu(config: dict, model: str) -> bool:
    """Whether a model's train job should ask the scheduler for a GPU. `backend: cupy` always does,
    `numpy` never; `auto` does when the whole run would take longer than max_cpu_hours on a CPU at
    a nominal rate (ANDREA-tiny: seconds, so the quickstart stays on the CPU partition; ANDREA-12M
    and up: days)."""
    from andrea.config import train_settings
    from andrea.model import ModelConfig, flops_per_token

    s = train_settings(config, model)
    if s["backend"] != "auto":
        return s["backend"] == "cupy"
    cfg = ModelConfig.from_config(config["models"][model])
    tokens = s["batch_size"] * s["grad_accum"] * (s["seq_len"] or cfg.context) * s["max_steps"]
    return flops_per_token(cfg) * tokens / NOMINAL_CPU_FLOPS > s["max_cpu_hours"] * 3600


def enabled_sources(config: dict) -> list[str]:
    """The sources the config's data profile reads (as_profile)."""
    return [k for k, v in as_profile(config)["sources"].items() if v["enabled"]]


def stage_dir(config: dict, stage: str, n_segments: int | None = None) -> Path:
    """Where a stage writes. The tokenizer and encode stages exist once per vocabulary size N."""
    version = stage_versions(config)[stage]
    if stage in ("train_tokenizer", "encode"):
        if n_segments is None:
            raise ValueError(f"stage {stage} needs n_segments (its directory is N<n>-<version>)")
        version = f"N{n_segments}-{version}"
    return Path(config["results_dir"]) / "data" / stage / version
