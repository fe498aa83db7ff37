"""What the configuration says, for people: config/README.md generated from the schema's
descriptions (`andrea config docs`), and a config's effective values with where each comes from
(`andrea config show`).

Apart from andrea.config because it reads from the layers above it: the training settings
(andrea.settings) and which of them continue a run (andrea.versions).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import yaml

from andrea.config import ConfigError, resolve_pointer, apply_defaults, load_schema, read_config_file, validate_config
from andrea.settings import TrainSettings
from andrea.versions import CONTINUE_KEYS, WATCH_KEYS, train_run_key

# ---------------------------------------------------------------------------- config/README.md
# The configuration reference is generated from the schema's descriptions (andrea config docs), so
# the two cannot drift apart: tests/test_config_docs.py regenerates it and compares.

DOCS_PATH = "config/README.md"
MAP_KEY_NAMES = {"sources": "<source>", "models": "<model>", "train": "<model>"}  # names of map entries


def _mirrored(sub: dict, schema: dict) -> str | None:
    """Where an override schema takes its keys from: the $ref prefix when every property is just
    a $ref to the same key of one other schema (train_override mirrors $defs/train_settings, and
    curriculum_override the curriculum section, without their defaults); else None."""
    props = sub.get("properties") or {}
    if not props or any(set(p) != {"$ref"} for p in props.values()):
        return None
    prefix = next(iter(props.values()))["$ref"].rpartition("/properties/")[0]
    return prefix if all(p["$ref"] == f"{prefix}/properties/{k}" for k, p in props.items()) else None


def _resolve(sub: dict, schema: dict, where: str = "") -> tuple[dict, str | None]:
    """A property's schema with its local $refs followed (the referring schema's own keys win), and
    the $defs name. An override documents as what it mirrors: train.<model> shares the table of
    train.defaults; a curriculum override is a row, "mapping: keys of `curriculum`", and so is a
    training override outside `train` (a study's `train`: "mapping: keys of `train.defaults`";
    `where`: the property's dotted path)."""
    name = None
    while "$ref" in sub:
        ref = sub["$ref"]
        if ref.startswith("#/$defs/") and "/" not in ref.removeprefix("#/$defs/"):
            name = ref.removeprefix("#/$defs/")
        sub = {**resolve_pointer(ref, schema), **{k: v for k, v in sub.items() if k != "$ref"}}
    mirror = _mirrored(sub, schema)
    if mirror == "#/$defs/train_settings" and where and where.split(".")[0] != "train":
        return {"type": "object", "description": sub.get("description"), "mirror": "train.defaults"}, None
    if mirror and mirror.startswith("#/$defs/"):
        name = mirror.removeprefix("#/$defs/")
        sub = {**resolve_pointer(mirror, schema), "description": sub.get("description")}
    elif mirror:
        sub = {"type": "object", "description": sub.get("description"),
               "mirror": ".".join(mirror.removeprefix("#/").split("/")[1::2])}
    extra = sub.get("additionalProperties")
    if isinstance(extra, dict) and "$ref" in extra:  # a map of overrides (geometry.per_model): one row
        entry, _ = _resolve(extra, schema)
        if "mirror" in entry:
            sub = {**sub, "additionalProperties": entry}
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
    return html.escape(" ".join((text or "").split()), quote=False).replace("|", "\\|")


def config_docs(schema: dict | None = None) -> str:
    """config/README.md: the configuration reference, a table per section of the schema (key, type,
    default, description). Training settings also say whether changing one continues a run or
    starts a new one (andrea.versions)."""
    schema = load_schema() if schema is None else schema
    sections: list[tuple[str, str, list[str]]] = []  # (title, description, table lines)

    def cell(value) -> str:
        return f"`{json.dumps(value, ensure_ascii=False)}`"

    def table(node: dict, def_name: str | None, path: str = "") -> list[str]:
        train = def_name == "train_settings"
        head = ["| key | type | default | description |", "|---|---|---|---|"]
        if train:
            head = ["| key | type | default | changing it | description |", "|---|---|---|---|---|"]
        rows = []
        for key, raw in node.get("properties", {}).items():
            sub, _ = _resolve(raw, schema, f"{path}.{key}" if path else key)
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
            sub, _ = _resolve(raw, schema, f"{path}.{key}" if path else key)
            if _is_section(sub):
                add(f"{path}.{key}" if path else key, raw, key)
            elif sub.get("type") == "array" and "properties" in sub.get("items", {}):
                add(f"{path}.{key}[]", sub["items"], None, f"Each item of `{key}`: {_prose(sub.get('description'))}")
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and _is_section(_resolve(extra, schema)[0]):
            add(f"{path}.{MAP_KEY_NAMES.get(path, '<name>')}", extra, None)
        rows = table(node, def_name, path)
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
