"""Pipeline configuration: load YAML, validate against the JSON schema, fill defaults.

The same schema serves Snakemake (`snakemake.utils.validate` in the Snakefile) and the `andrea`
commands, so a bad config fails the same way everywhere, naming the key.

The config modules, bottom up (tests/test_import_layers.py keeps imports running downwards):
andrea.config_schema (the schema file, ConfigError) < andrea.profiles (data profiles) < this module
(validate and load the whole) < andrea.settings (typed training settings) < andrea.versions (stage
versions, run keys) < andrea.config_docs (config/README.md and `andrea config show`).
"""

from __future__ import annotations

import copy
import difflib
import os
import re
import sys
from pathlib import Path

from andrea.config_schema import HERMES3_PARTS, SCHEMA_PATH, STATIC_MODES, ConfigError, load_schema  # noqa: F401 (re-exported)
from andrea.config_schema import BANDIT_KEYS, DEFAULT_MODE, MODE_KEYS
from andrea.hub import HUB_FORM, is_hub_location, parse_hub_location
from andrea.io import read_document
from andrea.profiles import (EMBEDDED, HERMES3_KEY, check_hermes3_location, check_profiles, profile_config, profile_entries,
                             profile_names, used_profiles)
from andrea.sources import ADAPTERS


# What people type for a boolean on a command line (snakemake --config force_train=true passes the
# string 'true'); YAML in the config file already gives real booleans.
BOOLEAN_WORDS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def _key_path(path) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def _filling_validator(schema: dict):
    """A schema validator that, as it meets each `properties` keyword, first sets every property
    the instance lacks to its default (a copy), then validates: jsonschema's documented extension
    pattern, the one Snakemake's validate(config, schema, set_default=True) uses too, so the
    workflow and the `andrea` commands fill the same defaults. It follows $ref, map entries
    (additionalProperties) and sections filled with a default of their own ({} and then its keys)."""
    # imported when a config is validated (here and in validate_config): ~0.15 s that the modules
    # reading an already validated config (a training rank's settings) need not pay
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
    check_curriculum_default_mode(config, source)  # on what the user wrote, before the defaults fill `mode`
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
    check_profiles(config, source)
    check_curriculum_sources(config, source, schema)
    check_studies(config, source)
    for name in profile_names(config):
        if name != EMBEDDED:  # the sources' own locations were checked above
            _check_locations(profile_config({**config, "data_profile": None}, name), source, f"profiles.{name}: ")
    return config


def _did_you_mean(key: str, allowed) -> str:
    """"; did you mean `x`" for the allowed key closest to a mistyped one, or ""."""
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


def resolve_pointer(ref: str, schema: dict) -> dict:
    """The schema a local $ref ("#/$defs/x", "#/properties/a/properties/b") points at."""
    node = schema
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def _resolve_ref(sub: dict, schema: dict) -> dict:
    """A schema with its local $ref followed (the referring schema's own keys win)."""
    while isinstance(sub, dict) and "$ref" in sub:
        sub = {**resolve_pointer(sub["$ref"], schema), **{k: v for k, v in sub.items() if k != "$ref"}}
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
        check_hermes3_location(config, source)
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
    key = f"sources.{name}.location"
    if s["location"] == "hub":
        raise ConfigError(f"{source} is invalid:\n  {key}: name the dataset: {HUB_FORM}")
    if not is_hub_location(s["location"]):
        return
    try:
        parse_hub_location(s["location"])
    except ValueError as e:
        raise ConfigError(f"{source} is invalid:\n  {key}: {e}") from None
    spec = ADAPTERS[s["adapter"]]
    if not spec.from_hub:
        raise ConfigError(f"{source} is invalid:\n  {key}: hub datasets are not supported here: {spec.not_from_hub}")


def missing_locations(config: dict, profiles: list[str] | None = None) -> tuple[list[str], list[str]]:
    """The local locations that do not exist, of every enabled source of each of `profiles` (default:
    the profiles the models train on) and of pull_hermes3's hermes3.location: (errors, warnings),
    one "key: path" each; a source marked `optional: true` is a warning (prep_megachat skips it).
    Hub datasets, `embedded`, `pull` and `stdlib` are not paths and are not looked at here. A
    relative path is read from the working directory, as the stages read it."""
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


def geometry_settings(config: dict, model: str) -> dict:
    """A model's effective geometry settings (design §10.6): the geometry section (its defaults
    filled in by load_config) with geometry.per_model.<model> over it, key by key (a key given there
    replaces the whole value: a families map is not merged)."""
    g = config.get("geometry")
    if g is None or "views" not in g:
        raise ConfigError("geometry settings are missing: load the config with andrea.config.load_config "
                          "(or validate_config), which fills the schema's defaults")
    out = {k: copy.deepcopy(v) for k, v in g.items() if k != "per_model"}
    out.update(copy.deepcopy(g.get("per_model", {}).get(model, {})))
    return out


def geometry_prompts(config: dict, g: dict) -> list[str]:
    """The attention maps' prompts for geometry settings `g`: its attention_prompts, else the audit's."""
    return list(g["attention_prompts"]) if g["attention_prompts"] is not None else [p["prompt"] for p in config["audit"]["prompts"]]


def deep_merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


# ---------------------------------------------------------------------------- studies
# A study (README, "Does the curriculum earn its keep?"; design §9.7) trains one model under several
# curriculum settings (arms) and seeds at one token budget. Each arm × seed is a training run of
# its own, with the config study_run_config makes: the model's settings under the study's
# `train` and `curriculum`, the arm's curriculum, floors and caps on top, the seed, and max_steps
# from the token budget.


def study_train_settings(config: dict, name: str) -> dict:
    """The training settings every run of a study shares: its model's, with the study's `train` over them."""
    st = config["studies"][name]
    return deep_merge(train_settings(config, st["model"]), st.get("train", {}))


def study_rule_name(name: str) -> str:
    """The Snakemake rule of a study, `study_<name>` with characters other than letters, digits and
    _ as _ (workflow/rules/study.smk)."""
    return "study_" + re.sub(r"[^A-Za-z0-9_]", "_", name)


def study_tokens_per_step(config: dict, name: str) -> int:
    """Training tokens per step of a study's runs: rows (batch_size × grad_accum × ranks) × T."""
    st = config["studies"][name]
    s = study_train_settings(config, name)
    return s["batch_size"] * s["grad_accum"] * s["ranks"] * (s["seq_len"] or config["models"][st["model"]]["context"])


def study_max_steps(config: dict, name: str) -> int:
    """Steps that train a study's token budget: rounded up to whole steps and up to a multiple of
    eval_every, so that every run ends on a validation (the figures the study compares)."""
    st = config["studies"][name]
    every = study_train_settings(config, name)["eval_every"]
    steps = -(-st["tokens"] // study_tokens_per_step(config, name))
    return -(-steps // every) * every if every > 0 else steps


def study_run_config(config: dict, name: str, arm: str, seed: int) -> dict:
    """The config of one run of a study: its model's train entry with the study's `train`, the
    study's then the arm's `curriculum`, `seed` and the budget's max_steps; the arm's floors and
    caps on the sources."""
    st = config["studies"][name]
    a = st["arms"][arm]
    out = copy.deepcopy(config)
    entry = deep_merge(out["train"].get(st["model"], {}), st.get("train", {}))
    entry["curriculum"] = deep_merge(deep_merge(entry.get("curriculum", {}), st.get("curriculum", {})), a.get("curriculum", {}))
    entry.update(seed=seed, max_steps=study_max_steps(config, name))
    out["train"][st["model"]] = entry
    for key, field in (("floors", "floor"), ("caps", "cap")):
        values = a.get(key, {})
        if not isinstance(values, dict):  # one number for every source
            values = dict.fromkeys(out["sources"], values)
        for src, value in values.items():
            out["sources"][src][field] = value
    return out


def study_arm_mode(config: dict, name: str, arm: str) -> str:
    """The curriculum.mode an arm of a study trains with."""
    st = config["studies"][name]
    return train_settings(study_run_config(config, name, arm, st["seeds"][0]), st["model"])["curriculum"]["mode"]


def study_baselines(config: dict, name: str) -> list[str]:
    """The arms a study's target comes from: `baselines`, else every arm of a static mode."""
    st = config["studies"][name]
    if st.get("baselines") is not None:
        return list(st["baselines"])
    return [a for a in st["arms"] if study_arm_mode(config, name, a) in STATIC_MODES]


def known_sources(config: dict) -> set[str]:
    """Every source name the config knows: its sources and every data profile's (a source that is
    disabled, or absent from one profile, is still a name a curriculum may weigh)."""
    names = set(config.get("sources", {}))
    for p in profile_names(config):
        names |= set(profile_entries(config, p))
    return names


def check_curriculum_default_mode(config: dict, source: str = "config") -> None:
    """A curriculum section that sets a setting of the bandit's, with no `mode` named in it or in
    what it overrides (the top level, train.defaults, the model's, the study's), is an error: it was
    written for the bandit when the bandit was the default, and under the default mode (proportional
    since issue 41's studies) it would silently change nothing. Where a mode is named, another mode's
    settings are allowed and ignored, as documented (README, "Does the curriculum earn its keep?")."""
    def cur(section) -> dict:
        return (section or {}).get("curriculum") or {} if isinstance(section, dict) else {}

    def check(where: str, c: dict, named: str | None) -> str | None:
        named = c.get("mode", named)
        if named is None:
            for key in c:
                # what the bandit read when it was the default and the default does not: another mode's
                # settings (weights, explore, ...) never did anything unnamed, and still may stand
                if key in BANDIT_KEYS and key not in MODE_KEYS[DEFAULT_MODE]:
                    readers = [m for m, keys in MODE_KEYS.items() if key in keys]
                    raise ConfigError(
                        f"{source} is invalid:\n  {where}.{key}: a setting of mode {' and '.join(readers)}, but no "
                        f"`mode` is named here or above, and the default mode, {DEFAULT_MODE}, does not read it "
                        f"(the default was the bandit before issue 41's studies). Add `mode: bandit` (or the mode you "
                        f"mean) to {where}, or remove the setting")
        return named

    top = check("curriculum", config.get("curriculum") or {}, None)
    train = config.get("train") or {}
    defaults = check("train.defaults.curriculum", cur(train.get("defaults")), top)
    per_model = {m: check(f"train.{m}.curriculum", cur(t), defaults) for m, t in train.items() if m != "defaults"}
    for name, st in (config.get("studies") or {}).items():
        if not isinstance(st, dict):
            continue
        named = check(f"studies.{name}.curriculum", cur(st), per_model.get(st.get("model"), defaults))
        for arm_name, arm in (st.get("arms") or {}).items():
            check(f"studies.{name}.arms.{arm_name}.curriculum", cur(arm), named)


def check_curriculum_sources(config: dict, source: str = "config", schema: dict | None = None) -> None:
    """`curriculum.weights` names sources that exist, wherever a curriculum section is (top level,
    train.<model>, a study and its arms): a misspelt name would otherwise be ignored (its source
    weighed by `weight`). So does `warmup_sources`, less the names of the schema's default list:
    configs trimmed to a few sources keep the shipped warm-up list, whose absent names the trainer
    leaves out; any other name must be a source (a misspelt one would silently drop it from the warm-up).
    `schema`: the loaded schema, where the caller has it (else it is read again)."""
    known = known_sources(config)
    shipped = set((load_schema() if schema is None else schema)["properties"]["curriculum"]["properties"]["warmup_sources"]["default"])
    sections = [("curriculum", config.get("curriculum") or {})]
    sections += [(f"train.{m}.curriculum", t["curriculum"]) for m, t in config.get("train", {}).items()
                 if isinstance(t, dict) and t.get("curriculum")]
    for name, st in config.get("studies", {}).items():
        sections.append((f"studies.{name}.curriculum", st.get("curriculum") or {}))
        sections += [(f"studies.{name}.arms.{a}.curriculum", arm.get("curriculum") or {}) for a, arm in st["arms"].items()]
    for where, c in sections:
        for key, names in (("weights", list(c.get("weights") or {})),
                           ("warmup_sources", [n for n in c.get("warmup_sources") or () if n not in shipped])):
            for src in names:
                if src not in known:
                    raise ConfigError(f"{source} is invalid:\n  {where}.{key}: no source {src!r} in sources or any data "
                                      f"profile{_did_you_mean(src, sorted(known))}")


def check_studies(config: dict, source: str = "config") -> None:
    """What the schema cannot say about `studies`: a model that exists, no seed or max_steps of
    its own in `train` (the seeds and the budget set them), floors and caps of sources that exist,
    baselines that are arms of a static mode, and validation (the figures a study compares)."""
    def fail(key: str, what: str):
        raise ConfigError(f"{source} is invalid:\n  studies.{key}: {what}")

    rules: dict[str, str] = {}
    for name in config.get("studies", {}):
        other = rules.setdefault(study_rule_name(name), name)
        if other != name:
            fail(name, f"its workflow target {study_rule_name(name)} is also study {other!r}'s "
                       f"(characters other than letters, digits and _ become _); rename one of them")
    for name, st in config.get("studies", {}).items():
        if st["model"] not in config["models"]:
            fail(f"{name}.model", f"no model {st['model']!r} in models ({', '.join(config['models'])})"
                                  f"{_did_you_mean(st['model'], config['models'])}")
        for key, why in (("seed", "seeds"), ("max_steps", "tokens")):
            if key in st.get("train", {}):
                fail(f"{name}.train.{key}", f"a study sets every run's {key} from its `{why}`; remove it here")
        for arm, a in st["arms"].items():
            for key in ("floors", "caps"):
                for src in a.get(key, {}) if isinstance(a.get(key), dict) else ():
                    if src not in config["sources"]:
                        fail(f"{name}.arms.{arm}.{key}.{src}", f"no source of that name{_did_you_mean(src, config['sources'])}")
        if study_train_settings(config, name)["eval_every"] <= 0:
            fail(f"{name}.train.eval_every", "a study compares validation curves: eval_every must be above 0")
        for arm in st.get("baselines") or []:
            if arm not in st["arms"]:
                fail(f"{name}.baselines", f"{arm!r} is not one of its arms ({', '.join(st['arms'])})")
            mode = study_arm_mode(config, name, arm)
            if mode not in STATIC_MODES:
                fail(f"{name}.baselines", f"arm {arm!r} trains with mode {mode}; a baseline is a static mode "
                                          f"({', '.join(STATIC_MODES)})")
