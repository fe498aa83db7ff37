"""Versioned artifacts: each stage's output directory is named by a hash of its own parameters
and of the versions upstream of it.

Changing a parameter of one stage therefore changes that stage's version and every version
downstream of it, so Snakemake re-runs exactly those stages and nothing upstream; artifacts of
earlier versions stay where they were, readable.
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


def stage_params(config: dict, stage: str) -> dict:
    """The configuration a stage's output depends on (defaults already filled)."""
    if stage == "pull_hermes3":
        return {"hermes3": config["hermes3"], "strict": config["strict"]}
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
    versions: dict[str, str] = {}
    upstream = None
    for stage in STAGES:
        versions[stage] = _digest({"stage": stage, "params": stage_params(config, stage), "up": upstream})
        upstream = versions[stage]
    return versions


def enabled_sources(config: dict) -> list[str]:
    return [k for k, v in config["sources"].items() if v["enabled"]]


def stage_dir(config: dict, stage: str, n_segments: int | None = None) -> Path:
    """Where a stage writes. The tokenizer and encode stages exist once per vocabulary size N."""
    version = stage_versions(config)[stage]
    if stage in ("train_tokenizer", "encode"):
        if n_segments is None:
            raise ValueError(f"stage {stage} needs n_segments (its directory is N<n>-<version>)")
        version = f"N{n_segments}-{version}"
    return Path(config["results_dir"]) / "data" / stage / version
