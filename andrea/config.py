"""Pipeline configuration: load YAML, validate against the JSON schema, fill defaults.

The same schema serves Snakemake (`snakemake.utils.validate` in the Snakefile) and the `andrea`
commands, so a bad config fails the same way everywhere, naming the key.
"""

from __future__ import annotations

import copy
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

SCHEMA_PATH = Path(str(resources.files("andrea") / "schemas" / "config.schema.yaml"))
HERMES3_PARTS = ("hermes3-general", "hermes3-creative", "hermes3-roleplay")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key."""


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text(encoding="utf-8"))


def _key_path(path) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def apply_defaults(config: dict, schema: dict | None = None) -> dict:
    """Return a copy of `config` with every schema default filled in, including inside
    map-valued sections (each source, each model)."""
    schema = load_schema() if schema is None else schema
    out = copy.deepcopy(config)

    def fill(node: Any, sch: dict) -> Any:
        if not isinstance(node, dict) or sch.get("type") not in (None, "object"):
            return node
        for key, sub in sch.get("properties", {}).items():
            if key not in node and "default" in sub:
                node[key] = copy.deepcopy(sub["default"])
            if key in node:
                node[key] = fill(node[key], sub)
        extra = sch.get("additionalProperties")
        if isinstance(extra, dict):
            for key in node:
                if key not in sch.get("properties", {}):
                    node[key] = fill(node[key], extra)
        return node

    return fill(out, schema)


def validate_config(config: dict, source: str = "config") -> dict:
    """Validate against the schema plus the checks a schema cannot express; return the config
    with defaults filled. Raises ConfigError naming the offending key."""
    import jsonschema

    schema = load_schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for e in errors[:10]:
            where = _key_path(e.absolute_path)
            if e.validator == "additionalProperties":
                lines.append(f"  {where}: {e.message} (unknown key)")
            else:
                lines.append(f"  {where}: {e.message}")
        raise ConfigError(f"{source} is invalid:\n" + "\n".join(lines))
    config = apply_defaults(config, schema)

    for name, m in config["models"].items():
        if m["d_model"] % m["n_head"]:
            raise ConfigError(
                f"{source} is invalid:\n  models.{name}.d_model: {m['d_model']} is not divisible "
                f"by n_head={m['n_head']}"
            )
    _check_hermes3_location(config, source)
    for name, s in config["sources"].items():
        _check_source_location(name, s, source)
        if s["adapter"] == "hermes3" and name not in HERMES3_PARTS:
            raise ConfigError(
                f"{source} is invalid:\n  sources.{name}.adapter: the hermes3 adapter serves only "
                f"{', '.join(HERMES3_PARTS)}"
            )
        if s["adapter"] == "hermes3" and s["location"] != "pull":
            raise ConfigError(
                f"{source} is invalid:\n  sources.{name}.location: hermes3 parts come from the "
                f"pull_hermes3 stage; set location: pull (point hermes3.location at your data)"
            )
    return config


def _check_source_location(name: str, s: dict, source: str) -> None:
    """A hub location must be well formed, and only record-reading adapters take one."""
    from andrea.hub import HUB_FORM, NOT_FROM_HUB, is_hub_location, parse_hub_location

    key = f"sources.{name}.location"
    if s["location"] == "hub":
        raise ConfigError(f"{source} is invalid:\n  {key}: name the dataset: {HUB_FORM}")
    if not is_hub_location(s["location"]):
        return
    try:
        parse_hub_location(s["location"])
    except ValueError as e:
        raise ConfigError(f"{source} is invalid:\n  {key}: {e}") from None
    if s["adapter"] in NOT_FROM_HUB:
        raise ConfigError(f"{source} is invalid:\n  {key}: hub datasets are not supported here: {NOT_FROM_HUB[s['adapter']]}")


def _check_hermes3_location(config: dict, source: str) -> None:
    """`hermes3.location: hub:ID[@REV][:SPLIT]` is the short form of `location: hub` with hub_id,
    hub_revision and hub_split; it is rewritten to that form (which pull_hermes3 and its version
    read). With `location: hub`, those three keys must make a valid hub location."""
    from andrea.hub import is_hub_location, parse_hub_location

    h = config["hermes3"]
    try:
        if is_hub_location(h["location"]):
            key = "hermes3.location"
            loc = parse_hub_location(h["location"])
            if loc.subset is not None:
                raise ValueError(f"{h['location']!r} names a subset; pull_hermes3 reads a dataset's default subset (hub:<id>[@<revision>][:<split>])")
            h.update(location="hub", hub_id=loc.dataset, hub_revision=loc.revision, hub_split=loc.split)
        elif h["location"] == "hub":
            key = "hermes3.hub_id, hub_revision, hub_split"
            rev = f"@{h['hub_revision']}" if h["hub_revision"] is not None else ""
            parse_hub_location(f"hub:{h['hub_id']}{rev}:{h['hub_split']}")
    except ValueError as e:
        raise ConfigError(f"{source} is invalid:\n  {key}: {e}") from None


def load_config(path: str | Path, overrides: dict | None = None) -> dict:
    """Read, merge overrides (deep), validate, fill defaults."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    if overrides:
        raw = deep_merge(raw, overrides)
    return validate_config(raw, source=str(path))


# Training settings (SPEC §3.3, §6): these defaults < config train.defaults < train.<model>.
TRAIN_DEFAULTS = {
    "backend": "auto",  # CuPy when a CUDA GPU is usable, else NumPy (andrea.engine.resolve_backend)
    "precision": "auto",  # bf16 on CuPy, fp32 on NumPy
    "batch_size": 8,
    "grad_accum": 1,
    "seq_len": None,  # the model's context
    "max_steps": 200_000,
    "lr": 3e-4,
    "min_lr_ratio": 0.1,
    "warmup_steps": 2000,
    "weight_decay": 0.1,
    "beta1": 0.9,
    "beta2": 0.999,
    "grad_clip": 1.0,
    "max_nonfinite": 5,
    "checkpoint_every": 100,
    "keep_checkpoints": 3,
    "sample_every": 100,
    "sample_tokens": 420,
    "sample_prompt": "> Tell me about the sea.\n\n< ",
    "sample_temperature": 0.8,
    "coherence_halt_below": 30,
    "coherence_patience": 5,
    "coherence_arm_score": 50,  # the gate counts low samples once one sample has scored this (0: from the start)
    "eval_every": 250,
    "eval_tokens": 16384,  # per source, from its held-out documents
    "prefetch": True,
    "record_batches": 0,
    "seed": 0,
    "max_cpu_hours": 12,
    "curriculum": {},
}


def train_settings(config: dict, model: str) -> dict:
    """A model's effective training settings: TRAIN_DEFAULTS < train.defaults < train.<model>, with
    the top-level curriculum section merged under the model's curriculum overrides."""
    tcfg = config.get("train", {})
    s = deep_merge(TRAIN_DEFAULTS, tcfg.get("defaults", {}))
    s = deep_merge(s, tcfg.get(model, {}))
    s["curriculum"] = deep_merge(config["curriculum"], s.get("curriculum", {}))
    return s


def deep_merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def vocab_size(model: dict) -> int:
    """256 byte tokens + N Harris segments + 1 BOS (SPEC §2)."""
    return 256 + model["n_segments"] + 1
