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
import multiprocessing
import pickle
import secrets
import shutil
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from andrea.hub import HubUnreachable, is_hub_location, mirror_dir, parse_hub_location
from andrea.io import AtomicTableWriter, Manifest, progress, write_text_atomic
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


def iter_megachat(path: str | Path, batch_rows: int = 4096) -> Iterable[dict]:
    """Rows of a megachat Parquet file, streamed row group by row group: one iter_batches over the
    whole file held ~1.7 GB by the end of a 2.5 GB megachat (half the real profile), 0.3 GB this way.
    (One source's rows: andrea.shards reads them the same way, skipping row groups by statistics.)"""
    for batch in row_group_batches(path, batch_rows):
        yield from batch.to_pylist()


def row_group_batches(path: str | Path, batch_rows: int) -> Iterable[pa.RecordBatch]:
    """A Parquet file's record batches, row group by row group: one iter_batches over the whole file
    holds memory to the file's end (iter_megachat's readers, and the merge of prep_megachat's
    readers' events, which reached 2.8 GB on the real profile's Gutenberg)."""
    pf = pq.ParquetFile(path)
    for i in range(pf.metadata.num_row_groups):
        yield from pf.iter_batches(batch_size=batch_rows, row_groups=[i])


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


def _pull_counts(pull_dir: Path | None) -> tuple[str, dict]:
    """What pull_hermes3 wrote to each part and the categories it read, from its manifest, and its
    `decided_by` counts (how each part was decided: by the category column, the part rule, ...)."""
    path = pull_dir / "manifest.json" if pull_dir else None
    try:
        counts = json.loads(path.read_text(encoding="utf-8"))["counts"]
        per_part = ", ".join(f"{p} {n}" for p, n in counts["per_part"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"the pull_hermes3 manifest ({path}) could not be read", {}
    categories = ", ".join(f"{c} {n}" for c, n in list(counts.get("per_category", {}).items())[:8]) or "none"
    return (f"the pull_hermes3 manifest ({path}) counts {counts.get('read', '?')} rows read, "
            f"{counts.get('kept', '?')} kept, per part: {per_part}; categories read: {categories}"), counts.get("decided_by") or {}


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
        pulled, decided_by = _pull_counts(pull_dir)
        if "rule" in decided_by or h.get("without_category", "rule") == "rule":
            how = (f"Hermes-3 is split into hermes3-general, hermes3-creative and hermes3-roleplay by its category "
                   f"column (hermes3.category_field `{h['category_field']}`, matched against hermes3.categories) where a "
                   f"record has one, else by the part rule over the system prompt and first user turn "
                   f"(hermes3.without_category: rule, andrea/hermes3_parts.py): the copy read has no conversation this "
                   f"part's words or the rule place here. Check that hermes3.location is the Hermes-3 data, ")
        else:
            how = (f"Hermes-3 is split by category (hermes3.category_field `{h['category_field']}`, matched against "
                   f"hermes3.categories), and records without one go to hermes3-general (hermes3.without_category: "
                   f"general): set without_category: rule to split them by the part rule, or change hermes3.categories, ")
        return (
            f"{head} This part is what pull_hermes3 wrote from hermes3.location {where}: {pulled}.{limit} {how}"
            f"or leave the part out with `enabled: false` at {key}, or set `optional: true` there to skip it with a warning."
        )
    if tally.read:
        cause = (f"none of its records is what the {scfg['adapter']} adapter reads (README, \"Sources and adapters\"): "
                 f"fix the location or the adapter ({key}.adapter)")
    else:
        cause = f"its location holds no records: fix {key}.location"
    return (f"{head} {cause[0].upper()}{cause[1:]}, or leave the source out with `enabled: false` at {key}, "
            f"or set `optional: true` there to skip it with a warning.")


# What a source's reader writes to its temporary file, in the order the adapter yields it: a document
# (skip null, content_hash set) or a skipped record (skip = the reason). The merge replays these events
# exactly as the one-process stage handled the adapter's items, so its counts, logs and strict-mode stop
# are the same whichever process read the source.
EVENT_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("turns", pa.list_(TURN)),
        ("text", pa.string()),
        ("content_hash", pa.string()),
        ("skip", pa.string()),
        ("where", pa.string()),
        ("detail", pa.string()),
    ]
)
EVENT_BATCH = 4096
KEPT_LOG_RECORDS = 1000  # log records a reader process hands back to be logged by the stage (bounded)


class _KeptLogs(logging.Handler):
    """Keeps a reader process's log records (their messages formatted, so that they pickle) for the
    stage to log in its own log file."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.records) < KEPT_LOG_RECORDS:
            record.msg, record.args, record.exc_info, record.exc_text = record.getMessage(), None, None, None
            self.records.append(record)


def _picklable(e: Exception) -> Exception:
    """The exception itself when it can travel back from a reader process, else a RuntimeError
    with its type and message (what the stage reports either way)."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def read_source(job: dict) -> dict:
    """Read one source with its adapter into a temporary Parquet file of events (EVENT_SCHEMA):
    documents with their content hashes, and skipped records. Runs in a worker process (or in the
    stage's own when it has one worker). Stops after the first skip in strict mode, and after
    `max_docs` documents distinct within the source when job["limit"] (no more can be kept: the merge
    also drops duplicates of earlier sources, so it may ask for the rest, see _source_batches). An
    error the adapter raises ends the events and is returned, for the merge to raise where the serial
    stage would have."""
    name, scfg = job["name"], job["scfg"]
    ctx = Context(pull_dir=job["pull_dir"], hub_dir=job["hub_dir"])
    if job["hub_read"] is not None:
        ctx.hub_reads[name] = dict(job["hub_read"])
    kept_logs = _KeptLogs() if job["keep_logs"] else None
    root = logging.getLogger()
    old_level = root.level
    if kept_logs:
        root.addHandler(kept_logs)
        root.setLevel(logging.INFO)
    limit = scfg["max_docs"] if job["limit"] else None
    distinct: set[str] = set()
    events, truncated, error = 0, False, None
    pending: list[dict] = []
    writer = pq.ParquetWriter(job["path"], EVENT_SCHEMA, compression="lz4")
    try:
        items = ADAPTERS[scfg["adapter"]](name, scfg, ctx)
        if job["progress"]:
            items = progress(items, desc=f"prep {name}", unit=" docs")
        for item in items:
            events += 1
            if isinstance(item, Skip):
                pending.append({"skip": item.reason, "where": item.where, "detail": item.detail})
                if job["strict"]:
                    break
            else:
                h = content_hash(item.turns, item.text)
                pending.append({"doc_id": item.doc_id, "turns": item.turns, "text": item.text, "content_hash": h})
                if limit and h not in distinct:
                    distinct.add(h)
                    if len(distinct) >= limit:
                        truncated = True
                        break
            if len(pending) >= EVENT_BATCH:
                writer.write_table(pa.Table.from_pylist(pending, schema=EVENT_SCHEMA))
                pending = []
    except Exception as e:  # noqa: BLE001 (handed back whole: the merge raises it after the events read before it)
        error = _picklable(e)
    finally:
        try:
            if pending:
                writer.write_table(pa.Table.from_pylist(pending, schema=EVENT_SCHEMA))
        finally:
            writer.close()
            if kept_logs:
                root.removeHandler(kept_logs)
                root.setLevel(old_level)
    return {"path": job["path"], "events": events, "truncated": truncated, "error": error,
            "hub_read": ctx.hub_reads.get(name), "logs": kept_logs.records if kept_logs else []}


# Sources read at once, whatever the threads: a reader's peak is set by its source (on the real profile
# at full size: Gutenberg's 2.3 GB, its row groups of ~340 MB of books decoded whole by `datasets`;
# ShareGPT 1.3 GB, smoltalk 1.1 GB, OASST 0.7 GB, the others under 0.5 GB), so ten at once on 16
# cores peaked at 8.5 GB; four keep the stage under the 8 GB a job asks for, and the largest sources
# are started first, so the stage takes about as long as its longest reader still.
MAX_READERS = 4


def _input_bytes(job: dict) -> int:
    """The bytes a source's reader will read, as far as the disk says (0 where it cannot): the order
    the readers start in, largest first."""
    try:
        scfg = job["scfg"]
        if scfg["location"] == "pull":
            paths = [Path(job["pull_dir"]) / f"{job['name']}.parquet"]
        elif job["hub_read"] is not None:
            paths = [mirror_dir(parse_hub_location(scfg["location"]), job["hub_dir"])]
        else:
            paths = [resolve_location(job["name"], scfg)]
        total = 0
        for p in paths:
            if p is None or not p.exists():
                continue
            total += p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        return total
    except Exception:  # noqa: BLE001 - an order hint only: the reader itself says what is wrong
        return 0


class _Readers:
    """The sources' readers: submitted at once, largest input first, to min(workers, MAX_READERS)
    processes, or (one worker) each run in this process when the merge asks for it, so that a stage
    that stops early reads no more."""

    def __init__(self, jobs: list[dict], workers: int):
        self.jobs = jobs
        self.pool = None
        workers = min(workers, MAX_READERS, len(jobs))
        if workers > 1:
            # spawn, as andrea.parallel: fork + pyarrow's threads can deadlock
            self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
            order = sorted(range(len(jobs)), key=lambda i: -_input_bytes(jobs[i]))
            self.futures = [None] * len(jobs)
            for i in order:
                self.futures[i] = self.pool.submit(read_source, jobs[i])

    def result(self, index: int) -> dict:
        if self.pool is None:
            return read_source(self.jobs[index])
        return self.futures[index].result()

    def close(self, failed: bool) -> None:
        if self.pool is None:
            return
        if failed:
            # the stage stops now: the sources still being read are not waited for
            for f in self.futures:
                f.cancel()
            for proc in list((getattr(self.pool, "_processes", None) or {}).values()):
                proc.terminate()
        self.pool.shutdown(wait=True, cancel_futures=True)


def _source_batches(result: dict, job: dict, on_result) -> Iterable[pa.RecordBatch]:
    """The events of one source, batch by batch, then its reader's error raised (if any). A reader
    stopped at max_docs distinct documents is run again in this process without the limit, and its
    events after those already given are given too, when the merge wants more (some of the
    documents were duplicates of earlier sources')."""
    yield from row_group_batches(result["path"], EVENT_BATCH)
    if result["truncated"]:
        given = result["events"]
        path = Path(job["path"])
        result = read_source({**job, "path": str(path.with_name(f"{path.stem}.all.parquet")), "limit": False,
                              "keep_logs": False, "progress": True})
        on_result(result)
        for batch in row_group_batches(result["path"], EVENT_BATCH):
            if given >= batch.num_rows:
                given -= batch.num_rows
                continue
            yield batch.slice(given)
            given = 0
    if result["error"] is not None:
        raise result["error"]




def prep_megachat(
    config: dict,
    out_dir: str | Path,
    version: str,
    pull_dir: str | Path | None = None,
    hub_dir: str | Path | None = None,
    workers: int = 1,
) -> dict:
    """Run the stage: <out_dir>/megachat.parquet, preview.txt, manifest.json. Returns counts.
    `hub_dir`: the fetch folder, where hub datasets are read when fetched (andrea.fetch). An enabled
    source that yields no document fails the stage (EmptySource) unless it is optional; one whose
    every document duplicates earlier sources' is warned about.

    The sources are read in `workers` processes at once, each into a temporary file under out_dir;
    this process merges them in the configured order, so that the output is the same whatever the
    number of workers (one: everything in this process, each source read when its turn comes)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    strict = config["strict"]
    sources = {k: v for k, v in config["sources"].items() if v["enabled"]}
    ctx = Context(pull_dir=Path(pull_dir) if pull_dir else None, hub_dir=Path(hub_dir) if hub_dir else None)
    manifest = Manifest(
        "prep_megachat",
        version,
        {"sources": sources, "megachat": config["megachat"], "strict": strict},
    )
    # a hidden folder no output is named like, unique to this run, removed however the stage ends;
    # one a killed run left (SIGKILL, out of memory, a SLURM time limit) is removed first
    for stale in out_dir.glob(".prep_megachat.*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp_dir = out_dir / f".prep_megachat.{secrets.token_hex(6)}.tmp"
    tmp_dir.mkdir()
    pool = workers > 1 and len(sources) > 1
    jobs = [
        {
            "name": name, "scfg": scfg, "pull_dir": ctx.pull_dir, "hub_dir": ctx.hub_dir, "strict": strict,
            "hub_read": ({"source": name, **parse_hub_location(scfg["location"]).as_input(), "adapter": scfg["adapter"]}
                         if is_hub_location(scfg["location"]) else None),
            "path": str(tmp_dir / f"{index:04d}.parquet"), "limit": True, "keep_logs": pool, "progress": not pool,
        }
        for index, (name, scfg) in enumerate(sources.items())
    ]
    readers = _Readers(jobs, workers)
    failed = True
    try:
        counts, total, preview = _merge(config, sources, jobs, readers, ctx, manifest, out_dir)
        failed = False
    finally:
        readers.close(failed)
        shutil.rmtree(tmp_dir, ignore_errors=True)
    if total == 0:
        raise ValueError("prep_megachat produced no documents: every source was empty, skipped or malformed")
    write_text_atomic(out_dir / "preview.txt", "\n".join(preview))
    manifest.add_output(out_dir / "megachat.parquet", rows=total)
    manifest.data["counts"] = {"documents": total, "per_source": counts}
    manifest.write(out_dir / "manifest.json")
    return manifest.data["counts"]


def _drop_events(job: dict) -> None:
    """Remove a source's temporary event files once merged (the source's rows, and its re-read):
    the copy of the corpus on disk then holds the sources not yet merged, not all of them."""
    path = Path(job["path"])
    for f in path.parent.glob(f"{path.stem}*.parquet"):
        f.unlink(missing_ok=True)


def _merge(config: dict, sources: dict, jobs: list[dict], readers: _Readers, ctx: Context, manifest: Manifest,
           out_dir: Path) -> tuple[dict, int, list[str]]:
    """Replay every source's events in the configured order into megachat.parquet: counts, skips
    (logged, or raised in strict mode), exact duplicates of documents kept before dropped (the first
    source in the configured order keeps a document), max_docs, the preview. Returns the per-source
    counts, the documents written and the preview."""
    strict = config["strict"]
    # content hash -> the index of the source that kept it, so that a source whose every document
    # duplicates others' can say whose
    seen: dict[bytes, int] = {}
    names = list(sources)
    counts: dict[str, dict] = {}
    preview: list[str] = []
    writer = AtomicTableWriter(out_dir / "megachat.parquet", MEGACHAT_SCHEMA)
    try:
        for index, (name, scfg) in enumerate(progress(sources.items(), desc="prep_megachat", unit=" sources")):
            tally, dupes, kinds = Tally(), 0, {"turns": 0, "text": 0}
            duplicates_of: Counter = Counter()
            shown, n_inputs = 0, len(manifest.data["inputs"])
            try:
                if scfg["location"] == "pull":
                    if ctx.pull_dir is None:
                        raise ValueError(f"sources.{name}: location 'pull' needs the pull_hermes3 output (--pull-dir)")
                    manifest.add_input(ctx.pull_dir / f"{name}.parquet", source=name)
                elif is_hub_location(scfg["location"]):
                    # filled with the commit (and mirror) read, from the reader's copy
                    ctx.hub_reads[name] = dict(jobs[index]["hub_read"])
                    manifest.data["inputs"].append(ctx.hub_reads[name])
                else:
                    loc = resolve_location(name, scfg)
                    if not loc.exists():
                        raise FileNotFoundError(f"{loc} does not exist")
                    manifest.data["inputs"].append({"source": name, "path": str(loc), "adapter": scfg["adapter"]})
                result = readers.result(index)
                for record in result["logs"]:
                    logger = logging.getLogger(record.name)
                    if logger.isEnabledFor(record.levelno):
                        logger.handle(record)

                def took(result: dict, name: str = name) -> None:
                    if result["hub_read"] is not None and name in ctx.hub_reads:
                        ctx.hub_reads[name].update(result["hub_read"])

                took(result)
                for batch in _source_batches(result, jobs[index], took):
                    skips, hashes = batch.column("skip").to_pylist(), batch.column("content_hash").to_pylist()
                    keep = [False] * batch.num_rows
                    full = False
                    for j, reason in enumerate(skips):
                        tally.read += 1
                        if reason is not None:
                            tally.skip(reason, batch.column("where")[j].as_py(), strict, batch.column("detail")[j].as_py())
                            continue
                        key = bytes.fromhex(hashes[j])
                        owner = seen.get(key)
                        if owner is not None:
                            dupes += 1
                            duplicates_of[owner] += 1
                            continue
                        seen[key] = index
                        keep[j] = True
                        tally.kept += 1
                        if shown < 2:
                            (doc,) = batch.slice(j, 1).to_pylist()
                            preview.append(f"=== {name} / {doc['doc_id']}\n{render_document(doc['turns'], doc['text'], config['megachat'])}\n")
                            shown += 1
                        if scfg["max_docs"] and tally.kept >= scfg["max_docs"]:
                            full = True
                            break
                    if any(keep):
                        docs = batch.filter(pa.array(keep)).select(["doc_id", "turns", "text", "content_hash"])
                        kinds["text"] += docs.column("turns").null_count
                        kinds["turns"] += docs.num_rows - docs.column("turns").null_count
                        writer.write(pa.Table.from_batches([docs]).add_column(
                            0, "source", pa.array([name] * docs.num_rows, pa.string())))
                    if full:
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
            _drop_events(jobs[index])  # merged: its copy of the source need not wait for the others
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
    except BaseException as e:
        writer.close(e)
        raise
    writer.close(None)
    return counts, writer.rows, preview
