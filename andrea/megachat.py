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
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from andrea.hub import HubUnreachable, is_hub_location, parse_hub_location
from andrea.io import AtomicParquetWriter, Manifest, progress, write_text_atomic
from andrea.records import MalformedRecord, Tally
from andrea.sources import ADAPTERS, Context, Skip, resolve_location

log = logging.getLogger("andrea.megachat")

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
    """Training text of one document (SPEC §8): user turns behind `> `, assistant turns behind
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
        # row group by row group: one iter_batches over the whole file held ~1.7 GB by the end of a
        # 2.5 GB megachat (half the real profile), 0.3 GB this way
        pf = pq.ParquetFile(path)
        for i in range(pf.metadata.num_row_groups):
            for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[i]):
                yield from batch.to_pylist()
        return
    import pyarrow.dataset as ds

    for batch in ds.dataset(path, format="parquet").to_batches(filter=ds.field("source") == source, batch_size=batch_rows):
        yield from batch.to_pylist()


def prep_megachat(
    config: dict,
    out_dir: str | Path,
    version: str,
    pull_dir: str | Path | None = None,
    hub_dir: str | Path | None = None,
) -> dict:
    """Run the stage: <out_dir>/megachat.parquet, preview.txt, manifest.json. Returns counts.
    `hub_dir`: the fetch folder, where hub datasets are read when fetched (andrea.fetch)."""
    out_dir = Path(out_dir)
    strict = config["strict"]
    sources = {k: v for k, v in config["sources"].items() if v["enabled"]}
    ctx = Context(pull_dir=Path(pull_dir) if pull_dir else None, hub_dir=Path(hub_dir) if hub_dir else None)
    manifest = Manifest(
        "prep_megachat",
        version,
        {"sources": sources, "megachat": config["megachat"], "strict": strict},
    )
    seen: set[bytes] = set()
    counts: dict[str, dict] = {}
    preview: list[str] = []

    with AtomicParquetWriter(out_dir / "megachat.parquet", MEGACHAT_SCHEMA) as writer:
        for name, scfg in sources.items():
            fn = ADAPTERS[scfg["adapter"]]
            tally, dupes, kinds = Tally(), 0, {"turns": 0, "text": 0}
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
                    if key in seen:
                        dupes += 1
                        continue
                    seen.add(key)
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
