"""prep_megachat: every source in one schema, exact duplicates removed, rendered to training text.

Schema (one row per document):
    source        string   the source (bandit arm) name
    doc_id        string   the document's id within its source
    turns         list<struct<role: string, text: string>>   conversations (null for text)
    text          string   plain-text documents (null for conversations)
    content_hash  string   128-bit hex digest of the content alone (source and id excluded)
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from andrea.hub import HubUnreachable, is_hub_location, parse_hub_location
from andrea.io import AtomicParquetWriter, Manifest, progress, write_text_atomic
from andrea.profiles import EMBEDDED
from andrea.records import MalformedRecord, Tally
from andrea.sources import ADAPTERS, Context, Skip, resolve_location

log = logging.getLogger("andrea.megachat")


class EmptySource(ValueError):
    """An enabled, required source that yielded no document: its data is not what its adapter
    reads, or not there at all. A corpus missing one of its sources would train without that bandit
    arm and say nothing; the stage stops instead and says which source and why."""


TURN = pa.struct([("role", pa.string()), ("text", pa.string())])
MEGACHAT_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("doc_id", pa.string()),
        ("turns", pa.list_(TURN)),
        ("text", pa.string()),
        ("content_hash", pa.string()),
    ]
)


def content_hash(turns: list[dict] | None, text: str | None) -> str:
    """Digest of what a document says: identical conversations or texts hash alike whatever
    their source or id."""
    if turns is not None:
        blob = json.dumps([[t["role"], t["text"]] for t in turns], ensure_ascii=False, separators=(",", ":"))
    else:
        blob = "\x00text\x00" + (text or "")
    return hashlib.blake2b(blob.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def render_document(turns: list[dict] | None, text: str | None, mcfg: dict | None = None) -> str:
    """Training text of one document (design §8.5): user turns behind `> `, assistant turns behind
    `< `, turns separated by a blank line; system turns are never rendered. Documents are
    separated by BOS when encoded, not here."""
    mcfg = mcfg or {}
    if turns is None:
        return text or ""
    prefix = {"user": mcfg.get("user_prefix", "> "), "assistant": mcfg.get("assistant_prefix", "< ")}
    sep = mcfg.get("turn_separator", "\n\n")
    return sep.join(prefix[t["role"]] + t["text"].strip() for t in turns if t["role"] in prefix)


def iter_megachat(path: str | Path, batch_rows: int = 4096, source: str | None = None) -> Iterable[dict]:
    """Rows of a megachat Parquet file (optionally of one source only), streamed."""
    if source is None:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows):
            yield from batch.to_pylist()
        return
    import pyarrow.dataset as ds

    for batch in ds.dataset(path, format="parquet").to_batches(filter=ds.field("source") == source, batch_size=batch_rows):
        yield from batch.to_pylist()


def source_key(config: dict, name: str) -> str:
    """Where a user changes a source of the config's data profile: its entry in that profile, or
    its own `sources.<name>` for the embedded profile (the sources' own locations)."""
    profile = config.get("data_profile")
    return f"profiles.{profile}.sources.{name}" if profile not in (None, EMBEDDED) else f"sources.{name}"


def _skips(tally: Tally) -> str:
    """`n skipped: reason n (first: where: detail); ...`, the reasons most frequent first."""
    if not tally.skipped:
        return "none skipped"
    parts = [f"{reason} {n} (first: {tally.examples[reason][0]})" for reason, n in tally.skipped.most_common()]
    return f"{sum(tally.skipped.values())} skipped: " + "; ".join(parts)


def _pull_counts(pull_dir: Path | None) -> str:
    """What pull_hermes3 wrote to each part and the categories it read, from its manifest."""
    path = pull_dir / "manifest.json" if pull_dir else None
    try:
        counts = json.loads(path.read_text(encoding="utf-8"))["counts"]
        per_part = ", ".join(f"{p} {n}" for p, n in counts["per_part"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"the pull_hermes3 manifest ({path}) could not be read"
    categories = ", ".join(f"{c} {n}" for c, n in list(counts.get("per_category", {}).items())[:8]) or "none"
    return (f"the pull_hermes3 manifest ({path}) counts {counts.get('read', '?')} rows read, "
            f"{counts.get('kept', '?')} kept, per part: {per_part}; categories read: {categories}")


def empty_source_message(config: dict, name: str, tally: Tally, pull_dir: Path | None = None) -> str:
    """The paragraph for a source that yielded no document: the source, its location and adapter,
    records read and skipped by reason (with the first of each), and the ways out."""
    scfg = config["sources"][name]
    key = source_key(config, name)
    head = (f"{key} (location {scfg['location']}, adapter {scfg['adapter']}) yielded no document: "
            f"{tally.read} records read, {_skips(tally)}.")
    if scfg["adapter"] == "hermes3":
        h = config["hermes3"]
        where = h["location"] if h["location"] != "hub" else f"hub:{h['hub_id']}@{h['hub_revision'] or 'main'}:{h['hub_split']}"
        limit = f" hermes3.max_docs ({h['max_docs']}) stopped the pull early." if h.get("max_docs") else ""
        return (
            f"{head} This part is what pull_hermes3 wrote from hermes3.location {where}: {_pull_counts(pull_dir)}."
            f"{limit} Hermes-3 is split into hermes3-general, hermes3-creative and hermes3-roleplay by category "
            f"(hermes3.category_field `{h['category_field']}`, matched against hermes3.categories): a copy whose "
            f"categories match none of this part's words puts nothing in it. Point hermes3.location at a copy that has "
            f"the categories, or change hermes3.categories, or leave the part out with `enabled: false` at {key}, "
            f"or set `optional: true` there to skip it with a warning."
        )
    if tally.read:
        cause = (f"none of its records is what the {scfg['adapter']} adapter reads (README, \"Sources and adapters\"): "
                 f"fix the location or the adapter ({key}.adapter)")
    else:
        cause = f"its location holds no records: fix {key}.location"
    return (f"{head} {cause[0].upper()}{cause[1:]}, or leave the source out with `enabled: false` at {key}, "
            f"or set `optional: true` there to skip it with a warning.")


def prep_megachat(
    config: dict,
    out_dir: str | Path,
    version: str,
    pull_dir: str | Path | None = None,
    hub_dir: str | Path | None = None,
) -> dict:
    """Run the stage: <out_dir>/megachat.parquet, preview.txt, manifest.json. Returns counts.
    `hub_dir`: the fetch folder, where hub datasets are read when fetched (andrea.fetch). An enabled
    source that yields no document fails the stage (EmptySource) unless it is optional; one whose
    every document duplicates earlier sources' is warned about."""
    out_dir = Path(out_dir)
    strict = config["strict"]
    sources = {k: v for k, v in config["sources"].items() if v["enabled"]}
    ctx = Context(pull_dir=Path(pull_dir) if pull_dir else None, hub_dir=Path(hub_dir) if hub_dir else None)
    manifest = Manifest(
        "prep_megachat",
        version,
        {"sources": sources, "megachat": config["megachat"], "strict": strict},
    )
    # content hash -> the index of the source that kept it, so that a source whose every document
    # duplicates others' can say whose
    seen: dict[bytes, int] = {}
    names = list(sources)
    counts: dict[str, dict] = {}
    preview: list[str] = []

    with AtomicParquetWriter(out_dir / "megachat.parquet", MEGACHAT_SCHEMA) as writer:
        for index, (name, scfg) in enumerate(sources.items()):
            fn = ADAPTERS[scfg["adapter"]]
            tally, dupes, kinds = Tally(), 0, {"turns": 0, "text": 0}
            duplicates_of: Counter = Counter()
            shown, n_inputs = 0, len(manifest.data["inputs"])
            try:
                if scfg["location"] == "pull":
                    if ctx.pull_dir is None:
                        raise ValueError(f"sources.{name}: location 'pull' needs the pull_hermes3 output (--pull-dir)")
                    manifest.add_input(ctx.pull_dir / f"{name}.parquet", source=name)
                elif is_hub_location(scfg["location"]):
                    # filled with the commit (and mirror) read as the rows stream in
                    ctx.hub_reads[name] = {"source": name, **parse_hub_location(scfg["location"]).as_input(), "adapter": scfg["adapter"]}
                    manifest.data["inputs"].append(ctx.hub_reads[name])
                else:
                    loc = resolve_location(name, scfg)
                    if not loc.exists():
                        raise FileNotFoundError(f"{loc} does not exist")
                    manifest.data["inputs"].append({"source": name, "path": str(loc), "adapter": scfg["adapter"]})
                for item in progress(fn(name, scfg, ctx), desc=f"prep {name}", unit=" docs"):
                    tally.read += 1
                    if isinstance(item, Skip):
                        tally.skip(item.reason, item.where, strict, item.detail)
                        continue
                    h = content_hash(item.turns, item.text)
                    key = bytes.fromhex(h)
                    owner = seen.get(key)
                    if owner is not None:
                        dupes += 1
                        duplicates_of[owner] += 1
                        continue
                    seen[key] = index
                    writer.write(
                        {"source": name, "doc_id": item.doc_id, "turns": item.turns, "text": item.text, "content_hash": h}
                    )
                    kinds["turns" if item.turns is not None else "text"] += 1
                    tally.kept += 1
                    if shown < 2:
                        preview.append(f"=== {name} / {item.doc_id}\n{render_document(item.turns, item.text, config['megachat'])}\n")
                        shown += 1
                    if scfg["max_docs"] and tally.kept >= scfg["max_docs"]:
                        break
            except (FileNotFoundError, HubUnreachable) as e:
                # An optional source that is not there is skipped, and so is its manifest input; a
                # hub dataset only while none of its rows was read (a half-read source is an error).
                if scfg["optional"] and not (isinstance(e, HubUnreachable) and tally.read):
                    log.warning("prep_megachat: source %s skipped (optional): %s", name, e)
                    counts[name] = {"skipped_source": str(e)}
                    del manifest.data["inputs"][n_inputs:]
                    continue
                if isinstance(e, HubUnreachable):
                    raise
                raise FileNotFoundError(f"sources.{name}.location: {e}") from None
            except MalformedRecord as e:
                raise MalformedRecord(f"source {name}: {e}") from None
            counts[name] = {**tally.as_dict(), "duplicates": dupes, **kinds}
            if tally.kept == 0 and dupes:
                # Every usable document is already in the corpus under an earlier source (the same data
                # configured twice, or a dataset another one includes): nothing is lost to training, so
                # this is no error, but the source is no bandit arm of its own and its weight, floor and
                # cap are moot. Said loudly, naming whose documents they are.
                whose = ", ".join(f"{names[i]} {n}" for i, n in duplicates_of.most_common())
                log.warning(
                    "prep_megachat: %s (location %s, adapter %s) adds no document: all %d of its documents are exact "
                    "duplicates of earlier sources' (%s)%s; it will have no shard and no bandit arm of its own. If that "
                    "is not meant, point %s.location at other data, or leave the source out with `enabled: false`.",
                    source_key(config, name), scfg["location"], scfg["adapter"], dupes, whose,
                    f", and {_skips(tally)}" if tally.skipped else "", source_key(config, name),
                )
                counts[name]["duplicates_of"] = {names[i]: n for i, n in duplicates_of.most_common()}
            elif tally.kept == 0:
                # A required source that yields nothing would leave the corpus without it and the model
                # without that bandit arm, silently (the run would "work"): the stage stops, saying why.
                # In strict mode too (an empty location has no malformed record to stop at).
                message = empty_source_message(config, name, tally, ctx.pull_dir)
                if not scfg["optional"]:
                    raise EmptySource(message)
                log.warning("prep_megachat: source %s skipped (optional): %s", name, message)
                counts[name]["skipped_source"] = message
            log.info(
                "prep_megachat: %-18s read %7d kept %7d duplicates %6d skipped %6d %s",
                name, tally.read, tally.kept, dupes, sum(tally.skipped.values()), dict(tally.skipped) or "",
            )
    total = writer.rows
    if total == 0:
        raise ValueError("prep_megachat produced no documents: every source was empty, skipped or malformed")
    write_text_atomic(out_dir / "preview.txt", "\n".join(preview))
    manifest.add_output(out_dir / "megachat.parquet", rows=total)
    manifest.data["counts"] = {"documents": total, "per_source": counts}
    manifest.write(out_dir / "manifest.json")
    return manifest.data["counts"]
