"""Data profiles: where every source's data comes from, named once per model.

The `sources:` section holds each source's adapter, policy and its own `location` (the embedded
demo corpus by default): that is the `embedded` profile. Another profile (`profiles.<name>`)
names, per source, what replaces it: a location (a hub dataset, a local folder), the adapter that
reads it when its records are laid out otherwise than the source's own, `enabled: false` for a
source with no data of that kind, and adapter options; `hermes3` stands for the pull_hermes3
stage's `hermes3.location` (a hermes3 part takes only `enabled` and `optional`). Each model trains on its profile (`models.<m>.data`);
`data_profile`, when set, puts every model on one profile (`--config data_profile=embedded`).

A profile's config (`profile_config`) is the whole configuration with those replacements made and
`data_profile` set to the profile: the data stages and their versions read it, so the profile is
part of every data version and two profiles' artifacts live side by side.
"""

from __future__ import annotations

import copy

from andrea.config_schema import HERMES3_PARTS, ConfigError
from andrea.hub import HUB_PREFIX, HubLocation, is_hub_location, parse_hub_location

EMBEDDED = "embedded"
HERMES3_KEY = "hermes3"  # a profile's entry for the pull_hermes3 stage
# What an entry says about its data for people (the README's table), not how it is read: not
# part of any stage version, and not copied into the source's config.
DOC_KEYS = ("licence", "size", "note")
HERMES3_ENTRY_KEYS = ("location", "max_docs", "files")  # what an entry may set of the hermes3 section
# What an entry may set of a hermes3 part: whether the profile has it. Its data is the pull_hermes3
# output, named by the profile's `hermes3` entry; a part empty in that data (no conversation of its
# categories) is left out or made optional here, as prep_megachat's error says.
HERMES3_PART_ENTRY_KEYS = ("enabled", "optional")


def profile_names(config: dict) -> list[str]:
    return [EMBEDDED] + [p for p in config.get("profiles", {}) if p != EMBEDDED]


def model_profile(config: dict, model: str) -> str:
    """The profile a model trains on: `data_profile` when set, else `models.<model>.data`."""
    return config.get("data_profile") or config["models"][model].get("data", EMBEDDED)


def default_profile(config: dict) -> str:
    """The profile of a data command that names no model or profile."""
    return config.get("data_profile") or EMBEDDED


def used_profiles(config: dict) -> list[str]:
    """The profiles the configured models train on, in the order the models are listed."""
    out: list[str] = []
    for model in config["models"]:
        p = model_profile(config, model)
        if p not in out:
            out.append(p)
    return out


def profile_entries(config: dict, name: str) -> dict[str, dict]:
    """A profile's entries by source key ({} for `embedded` unless the config gives it some)."""
    if name != EMBEDDED and name not in config.get("profiles", {}):
        raise ConfigError(f"no data profile {name!r}; the profiles are {', '.join(profile_names(config))}")
    return (config.get("profiles", {}).get(name) or {}).get("sources") or {}


def profile_config(config: dict, name: str) -> dict:
    """The configuration with profile `name`'s locations and options in place, `data_profile` set
    to it. A config that is already a profile's is returned as it is when that profile is asked
    for again; asking it for another one is an error (its own locations are gone)."""
    current = config.get("data_profile")
    if current not in (None, name):
        raise ConfigError(
            f"data_profile is {current!r}, so every model trains on it; profile {name!r} cannot be used with it "
            f"(remove data_profile, or set it to {name!r})"
        )
    entries = profile_entries(config, name)
    out = copy.deepcopy(config)
    out["data_profile"] = name
    for key, entry in entries.items():
        entry = {k: v for k, v in entry.items() if k not in DOC_KEYS}
        if key != HERMES3_KEY and key not in out["sources"]:
            continue  # a source this configuration does not have (removed from sources:)
        if key == HERMES3_KEY:
            h = out["hermes3"]
            for k in HERMES3_ENTRY_KEYS:
                if k in entry:
                    h[k] = copy.deepcopy(entry[k])
            if "location" in entry:  # a new location: its own revision and split, not the old ones
                h.update(hub_revision=None, hub_split="train")
            continue
        out["sources"][key].update(copy.deepcopy(entry))
    check_hermes3_location(out, f"data profile {name}")  # hub:<id>@<rev>:<split> -> hub_id, hub_revision, hub_split
    return out


def check_hermes3_location(config: dict, source: str) -> None:
    """`hermes3.location: hub:ID[@REV][:SPLIT]` is the short form of `location: hub` with hub_id,
    hub_revision and hub_split; it is rewritten to that form (which pull_hermes3 and its version
    read). With `location: hub`, those three keys must make a valid hub location."""
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


def check_profiles(config: dict, source: str) -> None:
    """What the schema cannot say: every hub dataset a profile names has a revision and a licence,
    each model's profile exists. The locations themselves are checked by validate_config on each
    profile's config. An entry for a source that `sources:` does not have is ignored: removing a
    source from sources: removes it from every profile."""
    names = profile_names(config)
    for name, prof in (config.get("profiles") or {}).items():
        for key, entry in ((prof or {}).get("sources") or {}).items():
            where = f"profiles.{name}.sources.{key}"
            if key in HERMES3_PARTS and set(entry) - set(HERMES3_PART_ENTRY_KEYS) - set(DOC_KEYS):
                extra = sorted(set(entry) - set(HERMES3_PART_ENTRY_KEYS) - set(DOC_KEYS))
                raise ConfigError(f"{source} is invalid:\n  {where}: {', '.join(extra)} cannot be set for the hermes3 parts: "
                                  f"they read the pull_hermes3 output; name the Hermes-3 data as "
                                  f"profiles.{name}.sources.{HERMES3_KEY} (a part takes {', '.join(HERMES3_PART_ENTRY_KEYS)})")
            if key == HERMES3_KEY and set(entry) - set(HERMES3_ENTRY_KEYS) - set(DOC_KEYS):
                extra = sorted(set(entry) - set(HERMES3_ENTRY_KEYS) - set(DOC_KEYS))
                raise ConfigError(f"{source} is invalid:\n  {where}: {', '.join(extra)} cannot be set for hermes3 "
                                  f"(it takes {', '.join(HERMES3_ENTRY_KEYS + DOC_KEYS)})")
            loc = entry.get("location")
            if isinstance(loc, str) and loc.startswith("hub:") and entry.get("enabled", True):
                try:
                    parsed = parse_hub_location(loc)
                except ValueError as e:
                    raise ConfigError(f"{source} is invalid:\n  {where}.location: {e}") from None
                if parsed.revision is None:
                    raise ConfigError(f"{source} is invalid:\n  {where}.location: {loc} names no revision; add "
                                      "@<commit> to pin one, or @main to pin the commit the first fetch finds")
                if not entry.get("licence"):
                    raise ConfigError(f"{source} is invalid:\n  {where}: a hub dataset needs its `licence` "
                                      "(as its dataset card states it, or `unknown`)")
    for model, m in config["models"].items():
        if m.get("data", EMBEDDED) not in names:
            raise ConfigError(f"{source} is invalid:\n  models.{model}.data: no data profile {m['data']!r} "
                              f"(profiles are {', '.join(names)})")
    if config.get("data_profile") and config["data_profile"] not in names:
        raise ConfigError(f"{source} is invalid:\n  data_profile: no data profile {config['data_profile']!r} "
                          f"(profiles are {', '.join(names)})")


def hub_inputs(pconfig: dict) -> list[tuple[str, str, dict]]:
    """(source key, hub location, its config) of every enabled hub dataset a profile's config reads:
    `hermes3` for the pull_hermes3 stage, then the sources. What `andrea data fetch` downloads."""
    out = []
    h = pconfig["hermes3"]
    if h["location"] == "hub":
        out.append((HERMES3_KEY, str(HubLocation(h["hub_id"], h["hub_revision"], None, h["hub_split"])), h))
    elif is_hub_location(h["location"]):  # not yet rewritten (a profile config of an unvalidated config)
        out.append((HERMES3_KEY, h["location"], h))
    for name, s in pconfig["sources"].items():
        if s.get("enabled", True) and str(s.get("location", "")).startswith(HUB_PREFIX):
            out.append((name, s["location"], s))
    return out
