"""File helpers every stage shares: atomic writes, content hashes, manifests, stage logging.

Every artifact is written under a temporary name in the same directory and renamed into place,
so a crash never leaves a half-written file under a real name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from andrea import __version__

PARQUET_ROW_GROUP = 10_000  # rows a Parquet row group holds, as the stages write them

log = logging.getLogger("andrea")


def _new_temp_file(path: Path) -> Path:
    """Create an empty, uniquely named file beside `path` with the mode a plain open(path, "w")
    would give it: 0o666 less the umask (and a directory's default ACL). tempfile.mkstemp would
    make it 0o600, and the rename would carry that private mode onto the artifact, unreadable to
    the colleagues a shared cluster's umask means to let in."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return tmp
    raise FileExistsError(f"could not create a temporary file beside {path}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it over `path` only if the block succeeds.
    The file and any directories made for it get the modes the umask gives."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_temp_file(path)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, marker: str) -> Iterator[Path]:
    """Yield a fresh temporary directory beside `path`; when the block succeeds it replaces
    `path` whole (a directory output is then either the old one or the complete new one).

    `marker` is a file every output of this writer holds (the geometry's geometry.json, the
    audit's summary.json): an existing `path` is replaced only when it is empty or holds it, so an
    output directory given by mistake (`--out results/<model>` or a checkpoint directory) is
    refused before any work, not deleted."""
    import shutil

    path = Path(path)
    check_replaceable(path, marker)
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        check_replaceable(path, marker)  # again: something may have been put there meanwhile
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_replaceable(path: str | os.PathLike, marker: str) -> None:
    """Raise FileExistsError unless `path` is absent, an empty directory, or a directory holding
    `marker` (a previous output of the writer that means to replace it)."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    if path.is_dir() and not path.is_symlink() and (not any(path.iterdir()) or (path / marker).is_file()):
        return
    what = "a file" if not path.is_dir() or path.is_symlink() else f"a directory without {marker}"
    raise FileExistsError(f"{path}: exists and is {what}, so it is not a previous output of this command; it would be "
                          f"replaced whole: give a new or empty directory, or remove it yourself")


def link_or_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """`dst` becomes the same bytes as `src`, atomically: a hard link where the file system allows
    it (a 1 GB checkpoint costs nothing), else a copy."""
    import shutil

    src, dst = Path(src), Path(dst)
    with atomic_path(dst) as tmp:
        tmp.unlink()
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n")


def write_jsonl_atomic(path: str | os.PathLike, rows: list[dict]) -> None:
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


class AtomicTableWriter:
    """A Parquet file written from Arrow tables in row groups of `row_group` rows (the groups
    AtomicParquetWriter makes from rows, so that a stage fed tables by worker processes writes what
    it wrote row by row), under a temporary name until closed without error."""

    def __init__(self, path: str | Path, schema: pa.Schema, row_group: int = PARQUET_ROW_GROUP):
        self.path = Path(path)
        self.row_group = row_group
        self._ctx = atomic_path(self.path)
        tmp = self._ctx.__enter__()
        try:
            self._writer = pq.ParquetWriter(tmp, schema, compression="zstd")
        except BaseException as e:  # the temporary file goes with it
            self._ctx.__exit__(type(e), e, e.__traceback__)
            raise
        self._pending: list[pa.Table] = []
        self._n_pending = 0
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        if table.num_rows:
            self._pending.append(table)
            self._n_pending += table.num_rows
        while self._n_pending >= self.row_group:
            self._flush(self.row_group)

    def _flush(self, n: int) -> None:
        table = pa.concat_tables(self._pending).combine_chunks()
        self._writer.write_table(table.slice(0, n))
        rest = table.slice(n)
        self._pending, self._n_pending = ([rest] if rest.num_rows else []), rest.num_rows
        self.rows += n

    def close(self, exc: BaseException | None = None) -> None:
        """Commit the file, or (given the exception that stopped the stage) remove it."""
        if exc is None:
            try:
                if self._n_pending:
                    self._flush(self._n_pending)
                self._writer.close()
            except BaseException as e:
                self.close(e)
                raise
            self._ctx.__exit__(None, None, None)
            return
        with contextlib.suppress(Exception):
            self._writer.close()
        self._ctx.__exit__(type(exc), exc, exc.__traceback__)


class AtomicParquetWriter:
    """Stream record batches into a Parquet file that appears under its real name only when closed
    without error. Memory stays bounded by one batch."""

    def __init__(self, path: str | os.PathLike, schema: pa.Schema, batch_rows: int = PARQUET_ROW_GROUP):
        self.path = Path(path)
        self.schema = schema
        self.batch_rows = batch_rows
        self.rows = 0
        self._pending: list[dict] = []
        self._ctx = atomic_path(self.path)
        self._tmp = self._ctx.__enter__()
        self._writer = pq.ParquetWriter(self._tmp, schema, compression="zstd")

    def write(self, row: dict) -> None:
        self._pending.append(row)
        if len(self._pending) >= self.batch_rows:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            table = pa.Table.from_pylist(self._pending, schema=self.schema)
            self._writer.write_table(table)
            self.rows += len(self._pending)
            self._pending = []

    def close(self) -> None:
        self._flush()
        self._writer.close()
        self._ctx.__exit__(None, None, None)

    def abort(self, exc: BaseException) -> None:
        with contextlib.suppress(Exception):
            self._writer.close()
        self._ctx.__exit__(type(exc), exc, exc.__traceback__)

    def __enter__(self) -> "AtomicParquetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None:
            self.close()
        else:
            self.abort(exc)
        return False


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Records of a JSON-lines file that another process may be appending to: stops at a torn
    last line instead of failing. A missing file reads as empty."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def read_run_log(path: str | os.PathLike) -> tuple[list[dict], list[dict]]:
    """A run's loss.jsonl as (training records, validation records): one line per step, each with
    its weights, focus and mix shares whether the file wrote them on every line or only where they
    changed, and the validation records marked `"kind": "eval"` (andrea/runlog.py has the format,
    and a reader that does not hold a long run's records in memory)."""
    from andrea.runlog import read_run_log as read  # numpy and Arrow's JSON reader: loaded when needed

    return read(path)


def read_document(path: str | os.PathLike, what: str = "file", error: type[Exception] | None = None, fmt: str = "json") -> Any:
    """The value a JSON (fmt="yaml": YAML) file holds. A missing file raises FileNotFoundError
    "PATH: no such WHAT" (`what` may carry a hint: which stage writes it); one that does not parse
    raises ValueError naming the path and the fault. `error`, a caller's own exception class, is
    raised for both instead."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise (error or FileNotFoundError)(f"{path}: no such {what}") from None
    try:
        return yaml.safe_load(text) if fmt == "yaml" else json.loads(text)
    except json.JSONDecodeError as e:
        raise (error or ValueError)(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    except yaml.YAMLError as e:
        raise (error or ValueError)(f"{path}: not valid YAML ({e})") from None


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def describe_input(path: str | os.PathLike) -> dict:
    """Path, size and content hash of a file, or a tree hash of a directory's files."""
    p = Path(path)
    if p.is_file():
        return {"path": str(p), "bytes": p.stat().st_size, "sha256": sha256_file(p)}
    if p.is_dir():
        h = hashlib.sha256()
        total = 0
        n = 0
        for f in sorted(q for q in p.rglob("*") if q.is_file()):
            rel = f.relative_to(p).as_posix()
            h.update(rel.encode() + b"\0" + sha256_file(f).encode() + b"\n")
            total += f.stat().st_size
            n += 1
        return {"path": str(p), "files": n, "bytes": total, "sha256": h.hexdigest()}
    return {"path": str(p), "missing": True}


def code_version() -> str:
    """Package version plus the git commit of the checkout, when there is one."""
    here = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{__version__}+g{commit}" if commit else __version__


class Manifest:
    """What a stage read, how it was configured, what it wrote and how long it took."""

    def __init__(self, stage: str, version: str, params: dict):
        self.data: dict[str, Any] = {
            "stage": stage,
            "version": version,
            "code_version": code_version(),
            "python": platform.python_version(),
            "params": params,
            "inputs": [],
            "outputs": [],
            "counts": {},
        }
        self._t0 = time.time()

    def add_input(self, path: str | os.PathLike, **extra: Any) -> None:
        self.data["inputs"].append({**describe_input(path), **extra})

    def add_output(self, path: str | os.PathLike, **extra: Any) -> None:
        self.data["outputs"].append({**describe_input(path), **extra})

    def write(self, path: str | os.PathLike) -> None:
        t1 = time.time()
        self.data["timings"] = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._t0)),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t1)),
            "seconds": round(t1 - self._t0, 3),
        }
        write_json_atomic(path, self.data)


def _users_to_fix(exc_type, tb) -> bool:
    """An error of the kinds the CLI explains in one paragraph (andrea.cli._explain), raised by this
    package's own code (not a library's, which may be a bug)."""
    import traceback

    if not issubclass(exc_type, (OSError, ValueError, RuntimeError, KeyError)):
        return False
    frames = traceback.extract_tb(tb)
    return bool(frames) and frames[-1].filename.startswith(str(Path(__file__).parent))


def setup_logging(log_file: str | os.PathLike | None = None, level: int = logging.INFO) -> None:
    """Log to stderr and, when given, to a stage log file (Snakemake's `log:`)."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file, mode="w", encoding="utf-8"))
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=handlers,
        force=True,
    )

    def log_uncaught(exc_type, exc, tb):
        # A stage that dies says why in its own log file, not only on the terminal. An error the
        # package raised about the user's input or config (a malformed record in strict mode, an
        # empty source, a missing file) is one paragraph there, as `andrea` prints it; its traceback
        # goes to the log file only (ANDREA_DEBUG=1: to the terminal too). Anything else is a bug
        # and keeps its traceback everywhere.
        log = logging.getLogger("andrea")
        if not _users_to_fix(exc_type, tb) or os.environ.get("ANDREA_DEBUG"):
            log.critical("stage failed: %s: %s", exc_type.__name__, exc, exc_info=(exc_type, exc, tb))
            return
        log.critical("stage failed: %s", exc)
        record = log.makeRecord(log.name, logging.CRITICAL, __file__, 0, "where it was raised:", (), (exc_type, exc, tb))
        for h in logging.getLogger().handlers:
            if isinstance(h, logging.FileHandler):
                h.handle(record)

    if log_file:
        sys.excepthook = log_uncaught


def progress(iterable=None, **kwargs):
    """A tqdm progress bar that stays quiet when stderr is not a terminal (logs stay readable)."""
    from tqdm.auto import tqdm

    kwargs.setdefault("disable", None)  # None: disable on non-TTY
    kwargs.setdefault("mininterval", 1.0)
    return tqdm(iterable, **kwargs)
