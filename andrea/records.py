"""Reading raw records from local files in a streaming way, with malformed rows skipped and
counted by reason (or raised, in strict mode).

Text is read as UTF-8, strictly: a record holding bytes that are not UTF-8 (a Latin-1 `é`, a
truncated multi-byte character) is skipped and counted as `bad_encoding` with its file and line,
never decoded with replacement characters and never passed on to crash the Parquet writer.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterator

import pyarrow.parquet as pq

log = logging.getLogger("andrea.records")

RECORD_SUFFIXES = (".parquet", ".jsonl", ".json")
BAD_ENCODING = "bad_encoding"
FILTERED = {"too_short", "other_language"}  # records fine as such, left out by a setting: logged as info, not warnings
LOGGED_PER_REASON = 5  # skips of each reason logged one by one (and kept in the manifest), then only counted
KEPT_LOCATIONS = 100  # bad_encoding locations listed in the counts (the manifest)

# Undecodable bytes read with errors="surrogateescape" become U+DC80..U+DCFF.
ESCAPED_BYTE = re.compile("[\udc80-\udcff]")
# A JSON \u escape of a UTF-16 surrogate; alone (not in a pair) it is a string no file can hold.
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class MalformedRecord(ValueError):
    """A record that cannot be used, raised in strict mode. Names the file, the row and the reason."""


@dataclass
class Tally:
    """Counts of what happened to the records of one input: read, kept, skipped by reason."""

    read: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: dict = field(default_factory=dict)  # reason -> the first LOGGED_PER_REASON "where: detail"
    bad_encoding_at: list = field(default_factory=list)

    def skip(self, reason: str, where: str, strict: bool, detail: str = "") -> None:
        if strict:
            raise MalformedRecord(f"{where}: {reason}{': ' + detail if detail else ''} (strict mode)")
        self.skipped[reason] += 1
        n = self.skipped[reason]
        if reason == BAD_ENCODING and n <= KEPT_LOCATIONS:
            self.bad_encoding_at.append(where)
        # A skipped record is a problem of the input file the user can fix: the first few of every
        # reason are logged with their file, line and the whole message, not only counted.
        if n <= LOGGED_PER_REASON:
            self.examples.setdefault(reason, []).append(f"{where}{': ' + detail if detail else ''}")
            level = logging.INFO if reason in FILTERED else logging.WARNING
            log.log(level, "skipped %s: %s%s", where, reason, f": {detail}" if detail else "")
        elif n == LOGGED_PER_REASON + 1:
            log.log(logging.INFO if reason in FILTERED else logging.WARNING,
                    "further %s records are counted, not logged (the first %d are above)", reason, LOGGED_PER_REASON)

    def as_dict(self) -> dict:
        out = {
            "read": self.read,
            "kept": self.kept,
            "skipped": dict(sorted(self.skipped.items())),
            "skipped_total": sum(self.skipped.values()),
            "first_skipped_example": {r: ex[0] for r, ex in sorted(self.examples.items())},
            "skipped_examples": dict(sorted(self.examples.items())),  # the first LOGGED_PER_REASON of each reason
        }
        if self.bad_encoding_at:
            out["bad_encoding_at"] = list(self.bad_encoding_at)  # the first KEPT_LOCATIONS
        return out


@dataclass
class RawRow:
    """One row as read from a file: where it came from, and either its value or why it broke."""

    where: str  # "file:line" or "file:row"
    key: str  # stable id used when the row has none of its own
    value: Any = None
    broken: str | None = None  # reason when the row could not even be parsed (broken_json, bad_encoding)
    detail: str = ""  # what exactly was wrong, for the counts and the log


def undecodable(err: UnicodeDecodeError) -> str:
    """What a failed UTF-8 decode of one line found: the byte and its column (1-based, in bytes)."""
    return f"byte 0x{err.object[err.start]:02x} at column {err.start + 1} is not valid UTF-8"


def json_error(err: json.JSONDecodeError, line: str) -> str:
    """The whole message of a JSON line that does not parse, with its column: `err.msg` alone
    reads cut off ("Unterminated string starting at"), and the line's length shows a truncation."""
    msg, n = err.msg.removesuffix(" at"), len(line.rstrip("\r\n"))
    if err.pos >= n:  # the JSON is cut off: the newline (or the end) comes inside a string or object
        return f"the line ends unfinished after {n} characters ({msg} at column {err.colno})"
    return f"{msg} at column {err.colno} of a line of {n} characters"


def _escaped_bytes(value: Any) -> list[int]:
    """The undecodable bytes (kept by errors="surrogateescape") in a parsed JSON value's strings,
    in the order the file holds them."""
    if isinstance(value, str):
        return [ord(c) - 0xDC00 for c in ESCAPED_BYTE.findall(value)] if not value.isascii() else []
    if isinstance(value, dict):
        return [b for k, v in value.items() for b in _escaped_bytes(k) + _escaped_bytes(v)]
    if isinstance(value, list):
        return [b for v in value for b in _escaped_bytes(v)]
    return []


def escaped_byte_lines(text: str) -> Iterator[tuple[int, int]]:
    """(byte, line number) of every undecodable byte in a file decoded with surrogateescape."""
    line, last = 1, 0
    for m in ESCAPED_BYTE.finditer(text):
        line += text.count("\n", last, m.start())
        last = m.start()
        yield ord(m.group()) - 0xDC00, line


def holds_lone_surrogate(value: Any) -> bool:
    """Whether any string in a parsed JSON value (keys included) cannot be written as UTF-8:
    a lone surrogate from a \\u escape, or a byte kept by errors="surrogateescape"."""
    if isinstance(value, str):
        if value.isascii():
            return False
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(holds_lone_surrogate(k) or holds_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(holds_lone_surrogate(v) for v in value)
    return False


def embedded_location(source: str) -> Path:
    """The embedded corpus entry for a source: `andrea/corpus/<source>` as a directory or a file."""
    root = Path(str(resources.files("andrea") / "corpus"))
    if (root / source).is_dir():
        return root / source
    for p in sorted(root.glob(f"{source}.*")):
        return p
    raise FileNotFoundError(f"the embedded corpus has no entry for source {source!r} (looked in {root})")


def record_files(location: Path) -> list[Path]:
    """A file, or every Parquet/JSON/JSONL file under a directory in sorted order."""
    if location.is_file():
        return [location]
    if location.is_dir():
        files = sorted(p for p in location.rglob("*") if p.is_file() and p.suffix in RECORD_SUFFIXES)
        if not files:
            raise FileNotFoundError(
                f"{location} holds no {', '.join(RECORD_SUFFIXES)} files to read records from"
            )
        return files
    raise FileNotFoundError(f"{location} does not exist")


def iter_rows(location: str | Path, batch_rows: int = 4096) -> Iterator[RawRow]:
    """Rows of Parquet, JSON-lines or JSON-array files, one at a time, with bounded memory for
    Parquet and JSONL. A row that cannot be used at all becomes a RawRow with `broken` set: a JSONL
    line that does not parse (broken_json), or a row holding bytes that are not UTF-8
    (bad_encoding; the unit is the JSONL line, the JSON array item, the Parquet row)."""
    location = Path(location)
    files = record_files(location)
    for path in files:
        name = path.name if len(files) == 1 else path.relative_to(location).as_posix()
        if path.suffix == ".parquet":
            yield from _parquet_rows(path, name, batch_rows)
        elif path.suffix == ".jsonl":
            yield from _jsonl_rows(path, name)
        elif path.suffix == ".json":
            yield from _json_array_rows(path, name)


def _parquet_rows(path: Path, name: str, batch_rows: int) -> Iterator[RawRow]:
    # Parquet's writers are meant to store valid UTF-8 but pyarrow does not check it when reading:
    # a batch that fails to decode is retried row by row so that only the bad rows are skipped.
    i = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows):
        try:
            rows = batch.to_pylist()
        except UnicodeDecodeError:
            rows = None
        for j in range(batch.num_rows):
            where, key = f"{path}:row {i}", f"{name}:{i}"
            i += 1
            if rows is not None:
                yield RawRow(where=where, key=key, value=rows[j])
                continue
            try:
                (row,) = batch.slice(j, 1).to_pylist()
            except UnicodeDecodeError as e:
                yield RawRow(where=where, key=key, broken=BAD_ENCODING, detail=f"byte 0x{e.object[e.start]:02x} in a string is not valid UTF-8")
                continue
            yield RawRow(where=where, key=key, value=row)


def _jsonl_rows(path: Path, name: str) -> Iterator[RawRow]:
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where, key = f"{path}:line {lineno}", f"{name}:{lineno}"
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                yield RawRow(where=where, key=key, broken=BAD_ENCODING, detail=undecodable(e))
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                yield RawRow(where=where, key=key, broken="broken_json", detail=json_error(e, text))
                continue
            if SURROGATE_ESCAPE.search(line) and holds_lone_surrogate(value):
                yield RawRow(where=where, key=key, broken=BAD_ENCODING, detail="a \\u escape encodes half a UTF-16 surrogate pair")
                continue
            yield RawRow(where=where, key=key, value=value)


def _json_array_rows(path: Path, name: str) -> Iterator[RawRow]:
    # The whole file is one JSON text, so it is decoded whole; bytes that are not UTF-8 are kept
    # as escapes (surrogateescape) so that only the items whose strings hold them are skipped.
    data = path.read_bytes()
    try:
        text, bad_bytes = data.decode("utf-8"), False
    except UnicodeDecodeError:
        text, bad_bytes = data.decode("utf-8", "surrogateescape"), True
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise MalformedRecord(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if isinstance(doc, dict) and isinstance(doc.get("data"), list):
        doc = doc["data"]
    if not isinstance(doc, list):
        raise MalformedRecord(f"{path}: a .json input must hold a list of records")
    check = bad_bytes or SURROGATE_ESCAPE.search(data) is not None
    # Bad bytes can only sit inside strings (elsewhere the JSON would not parse), so the items'
    # escaped bytes, in order, are the file's: that gives each bad item the line of its first one.
    in_file = escaped_byte_lines(text) if bad_bytes else iter(())
    for i, value in enumerate(doc):
        where, key = f"{path}:item {i}", f"{name}:{i}"
        if check and holds_lone_surrogate(value):
            detail = "a \\u escape encodes half a UTF-16 surrogate pair"
            found = _escaped_bytes(value)
            if found:
                first = next(in_file, None)
                for _ in found[1:]:
                    next(in_file, None)
                detail = f"byte 0x{found[0]:02x}" + (f" on line {first[1]}" if first and first[0] == found[0] else "")
                detail += " is not valid UTF-8"
            yield RawRow(where=where, key=key, broken=BAD_ENCODING, detail=detail)
            continue
        yield RawRow(where=where, key=key, value=value)
