"""Reading raw records from local files in a streaming way, with malformed rows skipped and
counted by reason (or raised, in strict mode)."""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterator

import pyarrow.parquet as pq

log = logging.getLogger("andrea.records")

RECORD_SUFFIXES = (".parquet", ".jsonl", ".json")


class MalformedRecord(ValueError):
    """A record that cannot be used, raised in strict mode. Names the file, the row and the reason."""


@dataclass
class Tally:
    """Counts of what happened to the records of one input: read, kept, skipped by reason."""

    read: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: dict = field(default_factory=dict)

    def skip(self, reason: str, where: str, strict: bool, detail: str = "") -> None:
        if strict:
            raise MalformedRecord(f"{where}: {reason}{': ' + detail if detail else ''} (strict mode)")
        self.skipped[reason] += 1
        self.examples.setdefault(reason, f"{where}{': ' + detail if detail else ''}")

    def as_dict(self) -> dict:
        return {
            "read": self.read,
            "kept": self.kept,
            "skipped": dict(sorted(self.skipped.items())),
            "skipped_total": sum(self.skipped.values()),
            "first_skipped_example": dict(sorted(self.examples.items())),
        }


@dataclass
class RawRow:
    """One row as read from a file: where it came from, and either its value or why it broke."""

    where: str  # "file:line" or "file:row"
    key: str  # stable id used when the row has none of its own
    value: Any = None
    broken: str | None = None  # reason when the row could not even be parsed


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
    Parquet and JSONL. A JSONL line that does not parse becomes a RawRow with `broken` set."""
    location = Path(location)
    files = record_files(location)
    for path in files:
        name = path.name if len(files) == 1 else path.relative_to(location).as_posix()
        if path.suffix == ".parquet":
            pf = pq.ParquetFile(path)
            i = 0
            for batch in pf.iter_batches(batch_size=batch_rows):
                for row in batch.to_pylist():
                    yield RawRow(where=f"{path}:row {i}", key=f"{name}:{i}", value=row)
                    i += 1
        elif path.suffix == ".jsonl":
            with open(path, encoding="utf-8", errors="surrogateescape") as fh:
                for lineno, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        value = json.loads(line)
                    except json.JSONDecodeError as e:
                        yield RawRow(where=f"{path}:line {lineno}", key=f"{name}:{lineno}", broken=f"broken_json ({e.msg})")
                        continue
                    yield RawRow(where=f"{path}:line {lineno}", key=f"{name}:{lineno}", value=value)
        elif path.suffix == ".json":
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise MalformedRecord(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
            if isinstance(data, dict) and isinstance(data.get("data"), list):
                data = data["data"]
            if not isinstance(data, list):
                raise MalformedRecord(f"{path}: a .json input must hold a list of records")
            for i, value in enumerate(data):
                yield RawRow(where=f"{path}:item {i}", key=f"{name}:{i}", value=value)
