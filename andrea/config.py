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
    _check_locations(config, source)
    from andrea.profiles import EMBEDDED, check_profiles, profile_config, profile_names

    check_profiles(config, source)
    for name in profile_names(config):
        if name != EMBEDDED:  # the sources' own locations were checked above
            _check_locations(profile_config({**config, "data_profile": None}, name), source, f"profiles.{name}: ")
    return config


def _check_locations(config: dict, source: str, where: str = "") -> None:
    """Every location of a config (or of a profile's config: `where` names the profile) is usable
    by its adapter."""
    try:
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
    except ConfigError as e:
        if not where:
            raise
        head, _, detail = str(e).partition("\n  ")
        raise ConfigError(f"{head}\n  {where}{detail}") from None


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


# ---------------------------------------------------------------------------- config/README.md
# The configuration reference is generated from the schema's descriptions (andrea config docs), so
# the two cannot drift apart: tests/test_config_docs.py regenerates it and compares.

DOCS_PATH = "config/README.md"
MAP_KEY_NAMES = {"sources": "<source>", "models": "<model>", "train": "<model>"}  # names of map entries


def _resolve(sub: dict, schema: dict) -> tuple[dict, str | None]:
    """A property's schema with a local $ref followed (its own keys win), and the $defs name."""
    ref = sub.get("$ref")
    if not ref:
        return sub, None
    name = ref.removeprefix("#/$defs/")
    return {**schema["$defs"][name], **{k: v for k, v in sub.items() if k != "$ref"}}, name


def _is_section(sub: dict) -> bool:
    extra = sub.get("additionalProperties")
    return "properties" in sub or (isinstance(extra, dict) and ("properties" in extra or "$ref" in extra))


def _type_text(sub: dict) -> str:
    if "enum" in sub:
        return "one of " + ", ".join(f"`{v}`" for v in sub["enum"])
    names = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean", "null": "null",
             "array": "list", "object": "mapping"}
    types = sub.get("type", "object")
    text = " or ".join(names[t] for t in (types if isinstance(types, list) else [types]))
    if types == "array" and "items" in sub:
        noun, _, rest = _type_text(sub["items"]).partition(" ")
        text = f"list of {noun}s" + (f" {rest}" if rest else "")
    if types == "object" and isinstance(sub.get("additionalProperties"), dict):
        text = f"mapping of name to {_type_text(sub['additionalProperties'])}"
    lo = f"[{sub['minimum']}" if "minimum" in sub else f"({sub['exclusiveMinimum']}" if "exclusiveMinimum" in sub else None
    hi = f"{sub['maximum']}]" if "maximum" in sub else f"{sub['exclusiveMaximum']})" if "exclusiveMaximum" in sub else None
    if lo and hi:
        text += f" in {lo}, {hi}"
    elif lo:
        text += f" ≥ {lo[1:]}" if lo[0] == "[" else f" > {lo[1:]}"
    elif hi:
        text += f" ≤ {hi[:-1]}" if hi[-1] == "]" else f" < {hi[:-1]}"
    if sub.get("minLength") or sub.get("minItems"):
        text = "non-empty " + text
    return text


def _prose(text: str | None) -> str:
    """A description as one line of a Markdown table cell: HTML-special characters escaped (an
    unescaped <model> would vanish as an unknown tag), pipes escaped."""
    import html

    return html.escape(" ".join((text or "").split()), quote=False).replace("|", "\\|")


def config_docs(schema: dict | None = None) -> str:
    """config/README.md: the configuration reference, a table per section of the schema (key, type,
    default, description). Training settings take their defaults from TRAIN_DEFAULTS and say
    whether changing one continues a run or starts a new one (andrea.versions)."""
    import json

    from andrea.versions import CONTINUE_KEYS, WATCH_KEYS

    schema = load_schema() if schema is None else schema
    sections: list[tuple[str, str, list[str]]] = []  # (title, description, table lines)

    def cell(value) -> str:
        return f"`{json.dumps(value, ensure_ascii=False)}`"

    def table(node: dict, def_name: str | None) -> list[str]:
        train = def_name == "train_settings"
        head = ["| key | type | default | description |", "|---|---|---|---|"]
        if train:
            head = ["| key | type | default | changing it | description |", "|---|---|---|---|---|"]
        rows = []
        for key, raw in node.get("properties", {}).items():
            sub, _ = _resolve(raw, schema)
            if _is_section(sub):
                continue
            if key in node.get("required", ()):
                default = "required"
            elif "default" in sub:
                default = cell(sub["default"])
            elif train and key in TRAIN_DEFAULTS:
                default = cell(TRAIN_DEFAULTS[key])
            else:
                default = "—"
            cols = [f"`{key}`", _prose(_type_text(sub)), default]
            if train:
                cols.append("continues the run" if key in WATCH_KEYS + CONTINUE_KEYS else "starts a new run")
            rows.append("| " + " | ".join(cols + [_prose(sub.get("description"))]) + " |")
        return head + rows if rows else []

    def sentences(*parts: str) -> str:
        parts = [p[0].upper() + p[1:] for p in parts if p]
        return " ".join(p if p.endswith(".") else p + "." for p in parts)

    def walk(path: str, node: dict, def_name: str | None, intro: str = "") -> None:
        description = sentences(intro, _prose(node.get("description")))
        if def_name == "train_settings":
            description = sentences(description, "Changing a setting marked *continues the run* re-runs train, which goes on "
                                    "with the same run from its newest checkpoint; any other change starts a new run "
                                    "directory (results/&lt;model&gt;/runs/&lt;key&gt;, andrea.versions.train_run_key)")
        # the nested sections: [title, schema, $defs name, notes]; entries of one $ref share one
        children: list[list] = []

        def add(title: str, raw: dict, key: str | None, note: str = "") -> None:
            sub, name = _resolve(raw, schema)
            if name and key and raw.get("description"):  # a $ref's own description
                note = f"`{key}`: {_prose(raw['description'])}"
            same = next((c for c in children if name and c[2] == name), None)
            if same:
                same[0] += f"` and `{title}"
                same[3].append(note)
            else:
                children.append([title, schema["$defs"][name] if name else sub, name, [note]])

        for key, raw in node.get("properties", {}).items():
            sub, _ = _resolve(raw, schema)
            if _is_section(sub):
                add(f"{path}.{key}" if path else key, raw, key)
            elif sub.get("type") == "array" and "properties" in sub.get("items", {}):
                add(f"{path}.{key}[]", sub["items"], None, f"Each item of `{key}`: {_prose(sub.get('description'))}")
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and _is_section(_resolve(extra, schema)[0]):
            add(f"{path}.{MAP_KEY_NAMES.get(path, '<name>')}", extra, None)
        rows = table(node, def_name)
        if not rows and len(children) == 1 and path:  # a map of sections: one section for its entries
            title, sub, name, notes = children[0]
            walk(title, sub, name, sentences(description, *notes))
            return
        sections.append((path, description, rows))
        for title, sub, name, notes in children:
            walk(title, sub, name, sentences(*notes))

    walk("", schema, None)
    out = ["# Configuration reference", "",
           "Every key of `config/config.yaml`, section by section. The file is validated against",
           "`andrea/schemas/config.schema.yaml` when the workflow starts and by every `andrea` command: an",
           "unknown key or a wrong type fails before any job runs, naming the key. A key left out takes",
           "the default shown.", "",
           "This page is generated from the schema's descriptions: edit those, then run",
           "`andrea config docs --output config/README.md` (tests/test_config_docs.py fails while the two differ).",
           ""]
    for title, description, rows in sections:
        out += [f"## {'`' + title + '`' if title else 'Top level'}", ""]
        if description:
            out += [description, ""]
        if rows:
            out += rows + [""]
    return "\n".join(out)
