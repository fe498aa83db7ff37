"""Pipeline configuration: load YAML, validate against the JSON schema, fill defaults.

The same schema serves Snakemake (`snakemake.utils.validate` in the Snakefile) and the `andrea`
commands, so a bad config fails the same way everywhere, naming the key.
"""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path

import yaml

from andrea.io import read_document

SCHEMA_PATH = Path(str(resources.files("andrea") / "schemas" / "config.schema.yaml"))
HERMES3_PARTS = ("hermes3-general", "hermes3-creative", "hermes3-roleplay")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key. `details`: the validator's
    full account (the schema of each failing key), shown only on request (--debug, ANDREA_DEBUG=1)."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details


# What people type for a boolean on a command line (snakemake --config force_train=true passes the
# string 'true'); YAML in the config file already gives real booleans.
BOOLEAN_WORDS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text(encoding="utf-8"))


def _key_path(path) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def _filling_validator(schema: dict):
    """A schema validator that, as it meets each `properties` keyword, first sets every property
    the instance lacks to its default (a copy), then validates: jsonschema's documented extension
    pattern, the one Snakemake's validate(config, schema, set_default=True) uses too, so the
    workflow and the `andrea` commands fill the same defaults. It follows $ref, map entries
    (additionalProperties) and sections filled with a default of their own ({} and then its keys)."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    validate_properties = base.VALIDATORS["properties"]

    def fill_then_validate(validator, properties, instance, sch):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if key not in instance and "default" in sub:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, sch)

    return jsonschema.validators.extend(base, {"properties": fill_then_validate})(schema)


def apply_defaults(config: dict, schema: dict | None = None) -> dict:
    """Return a copy of a valid `config` with every schema default filled in, including inside
    map-valued sections (each source, each model) and train.defaults (the training settings'
    built-in defaults). A model's train entry and the curriculum overrides carry no defaults in the
    schema, so a key they leave out still comes from train.defaults and the curriculum section."""
    schema = load_schema() if schema is None else schema
    out = copy.deepcopy(config)
    for _ in _filling_validator(schema).iter_errors(out):
        pass  # the config was validated before; filling in defaults cannot make it invalid
    return out


def validate_config(config: dict, source: str = "config") -> dict:
    """Validate against the schema plus the checks a schema cannot express; return the config
    with defaults filled. Raises ConfigError naming the offending key."""
    import jsonschema

    schema = load_schema()
    config = coerce_config(config, schema)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [line for e in errors[:10] for line in _error_lines(e)]
        raise ConfigError(f"{source} is invalid:\n" + "\n".join(lines), details="\n\n".join(str(e) for e in errors[:10]))
    config = apply_defaults(config, schema)

    for name in config["train"]:
        if name != "defaults" and name not in config["models"]:
            raise ConfigError(
                f"{source} is invalid:\n  train.{name}: no model of that name in models "
                f"({', '.join(config['models'])}); a model's settings go under its name{_did_you_mean(name, config['models'])}"
            )
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


def _did_you_mean(key: str, allowed) -> str:
    """"; did you mean `x`" for the allowed key closest to a mistyped one, or ""."""
    import difflib

    close = difflib.get_close_matches(str(key), [str(a) for a in allowed], n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else ""


def _error_lines(e) -> list[str]:
    """One line per problem of a jsonschema error, naming the full key: an unknown key with the
    allowed key closest to it (a typo is the usual cause), a wrong type with what is accepted."""
    where = _key_path(e.absolute_path)
    if e.validator == "additionalProperties" and isinstance(e.instance, dict):
        allowed = e.schema.get("properties", {})
        unknown = [k for k in e.instance if k not in allowed]
        if unknown:
            prefix = f"{where}." if e.absolute_path else ""
            return [f"  {prefix}{k}: unknown key{_did_you_mean(k, allowed)}" for k in unknown]
    if e.validator == "type" and "boolean" in ([e.validator_value] if isinstance(e.validator_value, str) else e.validator_value):
        return [f"  {where}: {e.instance!r} is not a boolean (true or false; also yes/no, 1/0)"]
    return [f"  {where}: {e.message}"]


def _resolve_ref(sub: dict, schema: dict) -> dict:
    """A schema with its local $ref followed (the referring schema's own keys win)."""
    while isinstance(sub, dict) and "$ref" in sub:
        sub = {**_pointer(sub["$ref"], schema), **{k: v for k, v in sub.items() if k != "$ref"}}
    return sub if isinstance(sub, dict) else {}


def _coerce_value(value, sub: dict, schema: dict):
    """`value` as the schema `sub` wants it where it was typed as text: Snakemake's --config passes
    `force_train=true` as the string 'true' (and `=1` as the integer 1), and a number may come
    quoted. A string is converted only where the schema does not take a string there, so no
    string setting changes meaning."""
    sub = _resolve_ref(sub, schema)
    if isinstance(value, dict):
        props, extra = sub.get("properties", {}), sub.get("additionalProperties")
        return {k: _coerce_value(v, props.get(k, extra if isinstance(extra, dict) else {}), schema) for k, v in value.items()}
    if isinstance(value, list):
        items = sub.get("items")
        return [_coerce_value(v, items, schema) for v in value] if isinstance(items, dict) else value
    types = sub.get("type", [])
    types = [types] if isinstance(types, str) else types
    if isinstance(value, str) and "string" not in types:
        word = value.strip().lower()
        if "boolean" in types and word in BOOLEAN_WORDS:
            return BOOLEAN_WORDS[word]
        if "null" in types and word in ("null", "none", "~"):
            return None
        for kind, convert in (("integer", int), ("number", float)):
            if kind in types:
                try:
                    number = convert(word)
                except ValueError:
                    continue
                if number == number and abs(number) != float("inf"):  # not nan or inf
                    return number
    if type(value) is int and value in (0, 1) and "boolean" in types and not {"integer", "number"} & set(types):
        return bool(value)
    return value


def coerce_config(config: dict, schema: dict | None = None) -> dict:
    """A copy of `config` with booleans and numbers typed as text made what the schema wants
    (true/false/yes/no/1/0, case-insensitive; "600", "1e-3"), before validation: what a user types
    on the command line (snakemake --config force_train=true) is accepted as the file's YAML would be.
    Both the workflow and the `andrea` commands go through it (validate_config)."""
    schema = load_schema() if schema is None else schema
    return _coerce_value(config, schema, schema)


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


def missing_locations(config: dict, profiles: list[str] | None = None) -> tuple[list[str], list[str]]:
    """The local locations that do not exist, of every enabled source of each of `profiles` (default:
    the profiles the models train on) and of pull_hermes3's hermes3.location: (errors, warnings),
    one "key: path" each; a source marked `optional: true` is a warning (prep_megachat skips it).
    Hub datasets, `embedded`, `pull` and `stdlib` are not paths and are not looked at here. A
    relative path is read from the working directory, as the stages read it."""
    from andrea.hub import is_hub_location
    from andrea.profiles import EMBEDDED, HERMES3_KEY, profile_config, profile_entries, used_profiles

    errors: list[str] = []
    warnings: list[str] = []
    for profile in profiles if profiles is not None else used_profiles(config):
        pc = profile_config(config, profile)
        entries = profile_entries(config, profile)

        def key_of(name: str, section: str) -> str:  # where the location was written
            if profile != EMBEDDED and "location" in (entries.get(name) or {}):
                return f"profiles.{profile}.sources.{name}.location"
            return f"{section}.location"

        loc = pc["hermes3"]["location"]
        if loc not in ("embedded", "hub") and not Path(loc).exists():
            line = f"{key_of(HERMES3_KEY, 'hermes3')}: {loc} does not exist"
            if line not in errors:
                errors.append(line)
        for name, s in pc["sources"].items():
            loc = s["location"]
            if not s["enabled"] or loc in ("embedded", "pull", "stdlib") or is_hub_location(loc) or Path(loc).exists():
                continue
            line = f"{key_of(name, f'sources.{name}')}: {loc} does not exist"
            bucket = warnings if s["optional"] else errors
            if line not in bucket:
                bucket.append(line)
    return errors, warnings


def check_locations_exist(config: dict, source: str, profiles: list[str] | None = None) -> list[str]:
    """Refuse a config whose enabled sources read local files that are not there, before any stage
    runs (the prep stage would otherwise fail late, after the stages before it): one paragraph that
    names each key and path and what to do. Returns the warnings for optional sources' missing paths."""
    errors, warnings = missing_locations(config, profiles)
    if errors:
        raise ConfigError(
            f"{source}: {'; '.join(errors)}. Fix the path (a relative one is read from the working directory, "
            f"{Path.cwd()}), or leave the source out with `enabled: false`, or mark it `optional: true` to skip it "
            f"while its data is missing (under sources.<source>, or the profile's entry for it)."
        )
    return [f"{w}; the source is optional and will be skipped" for w in warnings]


def workflow_config(config: dict, source: str = "config/config.yaml") -> dict:
    """The Snakefile's config: validated, defaults filled, every local input location checked (for
    the data profiles the models train on), before Snakemake builds a job. A bad config ends the
    workflow with the same lines `andrea config validate` prints, not a traceback nor the schema:
    the validator's full account only with ANDREA_DEBUG=1 in the environment."""
    import os
    import sys

    debug = BOOLEAN_WORDS.get(os.environ.get("ANDREA_DEBUG", "").strip().lower(), False)
    try:
        config = validate_config(config, source=source)
        for warning in check_locations_exist(config, source):
            print(f"warning: {source}: {warning}", file=sys.stderr)
    except ConfigError as e:
        raise SystemExit(f"configuration error: {e}" + (f"\n\n{e.details}" if debug and e.details else "")) from None
    return config


def read_config_file(path: str | Path) -> dict:
    """The config file as written (no defaults), a mapping; ConfigError naming the file if not."""
    path = Path(path)
    raw = read_document(path, "config file", error=ConfigError, fmt="yaml")
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return raw


def load_config(path: str | Path, overrides: dict | None = None) -> dict:
    """Read, merge overrides (deep), validate, fill defaults."""
    raw = read_config_file(path)
    if overrides:
        raw = deep_merge(raw, overrides)
    return validate_config(raw, source=str(path))


def train_settings(config: dict, model: str) -> dict:
    """A model's effective training settings as a plain dict: train.defaults (the schema's defaults
    filled in by load_config) < train.<model>, with the top-level curriculum section under
    train.defaults.curriculum under train.<model>.curriculum. andrea.settings.TrainSettings is the
    typed view; the run key (andrea.versions) hashes this dict."""
    if "defaults" not in config.get("train", {}):
        raise ConfigError("train.defaults is missing: load the config with andrea.config.load_config "
                          "(or validate_config), which fills the schema's defaults")
    s = deep_merge(config["train"]["defaults"], config["train"].get(model, {}))
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


def _pointer(ref: str, schema: dict) -> dict:
    """The schema a local $ref ("#/$defs/x", "#/properties/a/properties/b") points at."""
    node = schema
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def _mirrored(sub: dict, schema: dict) -> str | None:
    """Where an override schema takes its keys from: the $ref prefix when every property is just
    a $ref to the same key of one other schema (train_override mirrors $defs/train_settings, and
    curriculum_override the curriculum section, without their defaults); else None."""
    props = sub.get("properties") or {}
    if not props or any(set(p) != {"$ref"} for p in props.values()):
        return None
    prefix = next(iter(props.values()))["$ref"].rpartition("/properties/")[0]
    return prefix if all(p["$ref"] == f"{prefix}/properties/{k}" for k, p in props.items()) else None


def _resolve(sub: dict, schema: dict) -> tuple[dict, str | None]:
    """A property's schema with its local $refs followed (the referring schema's own keys win), and
    the $defs name. An override documents as what it mirrors: train.<model> shares the table of
    train.defaults; a curriculum override is a row, "mapping: keys of `curriculum`"."""
    name = None
    while "$ref" in sub:
        ref = sub["$ref"]
        if ref.startswith("#/$defs/") and "/" not in ref.removeprefix("#/$defs/"):
            name = ref.removeprefix("#/$defs/")
        sub = {**_pointer(ref, schema), **{k: v for k, v in sub.items() if k != "$ref"}}
    mirror = _mirrored(sub, schema)
    if mirror and mirror.startswith("#/$defs/"):
        name = mirror.removeprefix("#/$defs/")
        sub = {**_pointer(mirror, schema), "description": sub.get("description")}
    elif mirror:
        sub = {"type": "object", "description": sub.get("description"),
               "mirror": ".".join(mirror.removeprefix("#/").split("/")[1::2])}
    return sub, name


def _is_section(sub: dict) -> bool:
    extra = sub.get("additionalProperties")
    return "properties" in sub or (isinstance(extra, dict) and ("properties" in extra or "$ref" in extra))


def _type_text(sub: dict) -> str:
    if "mirror" in sub:
        return f"mapping: keys of `{sub['mirror']}`"
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
    default, description). Training settings also say whether changing one continues a run or
    starts a new one (andrea.versions)."""
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
            if name and raw.get("description"):  # a $ref's own description
                note = f"`{key or title.rpartition('.')[2]}`: {_prose(raw['description'])}"
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


# ---------------------------------------------------------------------------- andrea config show
# The effective configuration as YAML, each value that the file does not set marked with where it
# came from: "# default" (the schema's default) or, in a model's view, the section of the file that
# set it ("# train.defaults", "# curriculum"). PyYAML writes no comments, so the lines are built here;
# every value is written by yaml.safe_dump (or as a JSON string), so the output reads back as YAML.


def _yaml_value(v) -> str:
    if isinstance(v, str):
        text = yaml.safe_dump(v, default_flow_style=True, width=1 << 30, allow_unicode=True)
        text = text.removesuffix("\n").removesuffix("\n...")
        return text if "\n" not in text else json.dumps(v, ensure_ascii=False)
    if isinstance(v, list) and any(isinstance(x, str) and "\n" in x for x in v):
        return "[" + ", ".join(_yaml_value(x) for x in v) + "]"
    text = yaml.safe_dump(v, default_flow_style=True, width=1 << 30, allow_unicode=True, sort_keys=False)
    return text.strip().removesuffix("\n...").removesuffix("...").strip()


def _yaml_lines(node: dict, origin, indent: int = 0, path: tuple = ()) -> list[str]:
    """`node` as block YAML, a comment on each leaf from origin(path) (None: no comment); a list
    of mappings one item a line."""
    pad = "  " * indent
    out = []
    for key, v in node.items():
        here = (*path, key)
        if isinstance(v, dict) and v:
            out.append(f"{pad}{key}:")
            out += _yaml_lines(v, origin, indent + 1, here)
            continue
        note = origin(here)
        comment = f"  # {note}" if note else ""
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            out.append(f"{pad}{key}:{comment}")
            out += [f"{pad}  - {_yaml_value(x)}" for x in v]
        else:
            out.append(f"{pad}{key}: {_yaml_value(v)}{comment}")
    return out


def _lookup(node, path: tuple):
    """(True, value) at `path` in nested mappings, or (False, None) where a key is absent."""
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False, None
        node = node[key]
    return True, node


def show_config(path: str | Path, model: str | None = None) -> str:
    """`andrea config show`: the effective configuration of the file at `path` as YAML, values the
    file leaves out marked "# default"; with `model`, that model's architecture and effective
    training settings (train.defaults < train.<model>, curriculum < its overrides), each value the
    model's own entry does not set marked with where it came from."""
    from andrea.settings import TrainSettings

    raw = read_config_file(path)
    config = validate_config(raw, source=str(path))
    filled = apply_defaults(raw)  # without validate_config's rewrites: a rewritten value is not a default

    if model is None:
        def origin(p):
            was_set, _ = _lookup(raw, p)
            return None if was_set or _lookup(filled, p) != _lookup(config, p) else "default"

        head = [f"# The effective configuration of {path}: \"# default\" marks a value the file leaves out",
                "# (the schema's default; config/README.md describes every key)."]
        return "\n".join(head + _yaml_lines(config, origin)) + "\n"

    if model not in config["models"]:
        raise ConfigError(f"unknown model {model!r}; models in {path}: {', '.join(config['models'])}")
    from andrea.versions import train_run_key

    def model_origin(p):
        return None if _lookup(raw, ("models", model, *p[1:]))[0] else "default"

    # where a training setting comes from, most specific first
    train_places = [(("train", model), None), (("train", "defaults"), "train.defaults")]
    curriculum_places = [(("train", model, "curriculum"), None), (("train", "defaults", "curriculum"), "train.defaults.curriculum"),
                         (("curriculum",), "curriculum")]

    def train_origin(p):
        places, key = (curriculum_places, p[-1]) if p[:-1] == ("train", "curriculum") else (train_places, p[-1])
        for where, note in places:
            if _lookup(raw, (*where, key))[0]:
                return note
        return "default"

    settings = TrainSettings.from_config(config, model).as_dict()
    head = [f"# {model}'s effective settings in {path}. A value without a comment is set in models.{model}",
            f"# or train.{model}; a comment says where any other comes from (\"default\": the schema's default).",
            f"# Its run directory: {config['results_dir']}/{model}/runs/{train_run_key(config, model)}"]
    return "\n".join(head + _yaml_lines({"model": config["models"][model]}, model_origin)
                     + _yaml_lines({"train": settings}, train_origin)) + "\n"
