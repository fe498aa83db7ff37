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

from andrea.config_schema import HERMES3_PARTS
from andrea.hermes3_parts import part_of_conversation
from andrea.hermes3_parts import quality as part_rule_quality
from andrea.hub import RECORD_DIR_READS, HubLocation, HubUnreachable, iter_hub_rows  # noqa: F401 (HubUnreachable: re-exported)
from andrea.io import AtomicTableWriter, Manifest, progress
from andrea.parallel import ordered_map
from andrea.records import RawRow, Tally, embedded_location, iter_rows
from andrea.sources import validate_sharegpt

log = logging.getLogger("andrea.hermes3")

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


CHUNK_ROWS = 512  # rows a worker decides at a time: a few tens of milliseconds of work against one hand-over


def decide_rows(job: tuple[list[RawRow], str, dict, bool]) -> tuple[list[tuple], dict[str, pa.Table]]:
    """Validate a chunk of rows and decide each one's part (the per-row work, done in a worker
    process when there are several). Returns one outcome per row, in order: (None, reason, where,
    detail) for a row skipped, (part, how, category, system turns) for one kept; and each part's kept
    rows as a table, in order."""
    rows, field, categories, by_rule = job
    outcomes: list[tuple] = []
    docs: dict[str, list[dict]] = {p: [] for p in HERMES3_PARTS}
    for raw in rows:
        if raw.broken:
            outcomes.append((None, raw.broken, raw.where, raw.detail))
            continue
        conv, reason, detail = validate_sharegpt(raw.value)
        if conv is None:
            outcomes.append((None, reason, raw.where, detail))
            continue
        category = raw.value.get(field)
        category = str(category).strip() if category is not None else ""
        if category:
            part, how = part_of(category, categories), "column"
        elif by_rule:
            part, how = part_of_conversation(conv), "rule"
        else:
            part, how = "hermes3-general", "default"
        doc_id = raw.value.get("id")
        doc_id = str(doc_id) if doc_id not in (None, "") else raw.key
        docs[part].append({"doc_id": doc_id, "category": category, "conversations": conv})
        outcomes.append((part, how, category, sum(t["from"] == "system" for t in conv)))
    return outcomes, {p: pa.Table.from_pylist(d, schema=PULL_SCHEMA) for p, d in docs.items() if d}


def _chunks(rows: Iterator[RawRow], size: int, ended: dict) -> Iterator[list[RawRow]]:
    """The rows in lists of `size`. An error reading them ends the lists (the rows read before it
    are still given) and is left in ended["error"], for the stage to raise after deciding those
    rows, where the serial stage raised it."""
    chunk: list[RawRow] = []
    try:
        for raw in rows:
            chunk.append(raw)
            if len(chunk) == size:
                yield chunk
                chunk = []
    except Exception as e:  # noqa: BLE001 (raised by the stage, after the rows before it)
        ended["error"] = e
    if chunk:
        yield chunk


def pull_hermes3(hcfg: dict, out_dir: str | Path, version: str, strict: bool = False, hub_dir: str | Path | None = None,
                 workers: int = 1) -> dict:
    """Run the stage: write <out_dir>/<part>.parquet for the three parts and manifest.json.
    Returns the manifest's counts. `hub_dir`: the fetch folder (andrea.fetch), read before the hub.
    The rows are read here and decided in `workers` processes, chunk by chunk, their results taken
    in the input's order: the output is the same whatever the number of workers (one: no pool)."""
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
    ended: dict = {}
    jobs = ((chunk, field, hcfg["categories"], by_rule)
            for chunk in _chunks(progress(rows, desc="pull_hermes3", unit=" rows"), CHUNK_ROWS, ended))
    writers = {p: AtomicTableWriter(out_dir / f"{p}.parquet", PULL_SCHEMA) for p in HERMES3_PARTS}
    try:
        for outcomes, tables in ordered_map(decide_rows, jobs, workers):
            taken = {p: 0 for p in HERMES3_PARTS}
            full = False
            for part, a, b, c in outcomes:
                tally.read += 1
                if part is None:
                    tally.skip(a, b, strict, c)
                    continue
                how, category, n_system = a, b, c
                decided_by[how][part] += 1
                taken[part] += 1
                per_part[part] += 1
                per_category[category or "(none)"] = per_category.get(category or "(none)", 0) + 1
                system_turns += n_system
                tally.kept += 1
                if tally.read % 100_000 == 0:
                    log.info("pull_hermes3: %d rows read, %d kept", tally.read, tally.kept)
                if hcfg["max_docs"] and tally.kept >= hcfg["max_docs"]:
                    log.info("pull_hermes3: reached max_docs=%d", hcfg["max_docs"])
                    full = True
                    break
            for part, table in tables.items():
                writers[part].write(table.slice(0, taken[part]))
            if full:
                break
        else:
            if "error" in ended:
                raise ended["error"]
    except BaseException as e:
        for w in writers.values():
            w.close(e)
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
