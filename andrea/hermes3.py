"""pull_hermes3: load NousResearch/Hermes-3-Dataset (hub, local files or the embedded corpus),
validate its ShareGPT layout, split it into three sources, write versioned Parquet.

A record's part comes from its category column (hermes3.category_field) where it has a non-empty
one; otherwise, as for the hub's copy, which has no category (README, "Hermes-3's three parts"),
from the measured rule over the system prompt and first user turn in andrea/hermes3_parts.py
(hermes3.without_category: rule), or it goes to hermes3-general (without_category: general).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator

import pyarrow as pa

from andrea.config import HERMES3_PARTS
from andrea.hub import RECORD_DIR_READS, HubLocation, HubUnreachable, iter_hub_rows  # noqa: F401 (HubUnreachable: re-exported)
from andrea.io import AtomicParquetWriter, Manifest, progress
from andrea.records import RawRow, Tally, embedded_location, iter_rows

log = logging.getLogger("andrea.hermes3")

SHAREGPT_ROLES = ("system", "human", "gpt")

PULL_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("category", pa.string()),
        (
            "conversations",
            pa.list_(pa.struct([("from", pa.string()), ("value", pa.string())])),
        ),
    ]
)


def validate_sharegpt(row) -> tuple[list[dict] | None, str | None, str]:
    """Check one ShareGPT row. Returns (conversations, None, "") when usable, else
    (None, reason, detail). Turns keep only `from` and `value` (e.g. Hermes' `weight` is dropped)."""
    if not isinstance(row, dict):
        return None, "not_an_object", type(row).__name__
    if "conversations" not in row or row["conversations"] is None:
        return None, "missing_conversations", ""
    conv = row["conversations"]
    if not isinstance(conv, list):
        return None, "conversations_not_a_list", type(conv).__name__
    if not conv:
        return None, "empty_conversations", ""
    out = []
    for i, turn in enumerate(conv):
        if not isinstance(turn, dict):
            return None, "turn_not_an_object", f"turn {i}"
        if "from" not in turn or turn["from"] is None:
            return None, "missing_from", f"turn {i}"
        if "value" not in turn or turn["value"] is None:
            return None, "missing_value", f"turn {i}"
        if turn["from"] not in SHAREGPT_ROLES:
            return None, "unknown_role", f"turn {i}: {str(turn['from'])[:40]!r}"
        if not isinstance(turn["value"], str):
            return None, "non_string_value", f"turn {i}: {type(turn['value']).__name__}"
        if not turn["value"].strip():
            return None, "empty_value", f"turn {i}"
        out.append({"from": turn["from"], "value": turn["value"]})
    if not any(t["from"] == "human" for t in out) or not any(t["from"] == "gpt" for t in out):
        return None, "no_dialogue", "needs at least one human and one gpt turn"
    return out, None, ""


def part_of(category: str, categories: dict[str, list[str]]) -> str:
    """Which hermes3 part a category belongs to: the first part whose substrings match."""
    c = category.lower()
    for part, needles in categories.items():
        if any(n.lower() in c for n in needles):
            return part
    return "hermes3-general"


def hub_location(hcfg: dict) -> HubLocation:
    return HubLocation(hcfg["hub_id"], hcfg["hub_revision"], None, hcfg["hub_split"])


def source_rows(hcfg: dict, read: dict | None = None, hub_dir: str | Path | None = None) -> tuple[Iterator[RawRow], Path | None]:
    """The raw rows for the configured location, and the local path read (None for the hub;
    then `read` receives the commit and mirror that were read). `hub_dir`: the fetch folder."""
    loc = hcfg["location"]
    if loc == "hub":
        rows = iter_hub_rows(
            hub_location(hcfg), "hermes3.location", hcfg["hub_timeout_s"], RECORD_DIR_READS,
            "Or set it to `embedded` for the built-in demo corpus.", read, mirror_root=hub_dir,
        )
        return rows, None
    path = embedded_location("hermes3") if loc == "embedded" else Path(loc)
    return iter_rows(path), path


def pull_hermes3(hcfg: dict, out_dir: str | Path, version: str, strict: bool = False, hub_dir: str | Path | None = None) -> dict:
    """Run the stage: write <out_dir>/<part>.parquet for the three parts and manifest.json.
    Returns the manifest's counts. `hub_dir`: the fetch folder (andrea.fetch), read before the hub."""
    # imported here: andrea.hermes3_parts needs andrea.tokenizer, whose imports come back to this module
    from andrea.hermes3_parts import part_of_conversation
    from andrea.hermes3_parts import quality as part_rule_quality

    out_dir = Path(out_dir)
    hub_read = hub_location(hcfg).as_input() if hcfg["location"] == "hub" else None
    rows, local = source_rows(hcfg, hub_read, hub_dir)
    manifest = Manifest("pull_hermes3", version, {"hermes3": hcfg, "strict": strict})
    if local is not None:
        manifest.add_input(local)
    else:
        manifest.data["inputs"].append(hub_read)  # the commit and mirror are filled in as it is read

    tally = Tally()
    per_part = {p: 0 for p in HERMES3_PARTS}
    # how each record's part was decided: its category column, the rule, or neither (all general)
    decided_by = {how: {p: 0 for p in HERMES3_PARTS} for how in ("column", "rule", "default")}
    by_rule = hcfg.get("without_category", "rule") == "rule"  # .get: callers that build hcfg by hand (the schema's default)
    per_category: dict[str, int] = {}
    system_turns = 0
    field = hcfg["category_field"]
    writers = {p: AtomicParquetWriter(out_dir / f"{p}.parquet", PULL_SCHEMA) for p in HERMES3_PARTS}
    try:
        for raw in progress(rows, desc="pull_hermes3", unit=" rows"):
            tally.read += 1
            if raw.broken:
                tally.skip(raw.broken, raw.where, strict, raw.detail)
                continue
            conv, reason, detail = validate_sharegpt(raw.value)
            if conv is None:
                tally.skip(reason, raw.where, strict, detail)
                continue
            category = raw.value.get(field)
            category = str(category).strip() if category is not None else ""
            if category:
                part, how = part_of(category, hcfg["categories"]), "column"
            elif by_rule:
                part, how = part_of_conversation(conv), "rule"
            else:
                part, how = "hermes3-general", "default"
            decided_by[how][part] += 1
            doc_id = raw.value.get("id")
            doc_id = str(doc_id) if doc_id not in (None, "") else raw.key
            writers[part].write({"doc_id": doc_id, "category": category, "conversations": conv})
            per_part[part] += 1
            per_category[category or "(none)"] = per_category.get(category or "(none)", 0) + 1
            system_turns += sum(t["from"] == "system" for t in conv)
            tally.kept += 1
            if tally.read % 100_000 == 0:
                log.info("pull_hermes3: %d rows read, %d kept", tally.read, tally.kept)
            if hcfg["max_docs"] and tally.kept >= hcfg["max_docs"]:
                log.info("pull_hermes3: reached max_docs=%d", hcfg["max_docs"])
                break
    except BaseException as e:
        for w in writers.values():
            w.abort(e)
        raise
    for w in writers.values():
        w.close()
        manifest.add_output(w.path, rows=w.rows)

    counts = {
        **tally.as_dict(),
        "per_part": per_part,
        "decided_by": {how: n for how, n in decided_by.items() if any(n.values())},
        "per_category": dict(sorted(per_category.items(), key=lambda kv: -kv[1])[:50]),
        "system_turns": system_turns,
    }
    if any(decided_by["rule"].values()):
        # what the rule is and how well it does on its labelled set, where the user reads the counts
        counts["part_rule"] = part_rule_quality()
    manifest.data["counts"] = counts
    manifest.write(out_dir / "manifest.json")
    log.info(
        "pull_hermes3: read %d rows, kept %d (%s), skipped %d %s",
        tally.read,
        tally.kept,
        ", ".join(f"{k} {v}" for k, v in per_part.items()),
        counts["skipped_total"],
        counts["skipped"] or "",
    )
    deciders = {"column": f"the {field!r} column", "rule": "the part rule (andrea/hermes3_parts.py)",
                "default": "no category and without_category: general"}
    for how, n in counts["decided_by"].items():
        log.info("pull_hermes3: decided by %s: %s", deciders[how], ", ".join(f"{k} {v}" for k, v in n.items()))
    if "part_rule" in counts:
        cv = counts["part_rule"]["cross_validated"]
        log.info("pull_hermes3: part rule on its labelled set, held out: %s", ", ".join(
            f"{p} precision {cv[p]['precision']:.3f} recall {cv[p]['recall']:.3f}" for p in HERMES3_PARTS))
    return counts
