"""Source adapters: each turns one kind of input into megachat documents.

An adapter is a generator `adapter(name, cfg, ctx)` yielding `Doc` for usable documents and
`Skip` for records it could not use (with a reason, counted by the stage). Documents are either
a conversation (`turns`: role/text pairs, roles system|user|assistant) or plain `text`.

Inputs are local files, the embedded corpus, or (for the adapters whose input is records) a
dataset on the Hugging Face hub, `location: hub:<dataset id>[@revision][:split]` (andrea.hub),
whose records hold the columns the adapter's docstring names (README, "Sources from the Hugging
Face hub", has the table).
"""

from __future__ import annotations

import ast
import io
import logging
import re
import subprocess
import sysconfig
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pyarrow.parquet as pq

from andrea.hub import RECORD_DIR_READS, is_hub_location, iter_hub_rows, parse_hub_location
from andrea.records import BAD_ENCODING, ESCAPED_BYTE, RawRow, embedded_location, escaped_byte_lines, iter_rows, undecodable

log = logging.getLogger("andrea.sources")

SHAREGPT_ROLES = ("system", "human", "gpt")
SHAREGPT_TO_ROLE = {"system": "system", "human": "user", "gpt": "assistant"}


@dataclass
class Doc:
    doc_id: str
    turns: list[dict] | None = None
    text: str | None = None


@dataclass
class Skip:
    reason: str
    where: str
    detail: str = ""


@dataclass
class Context:
    """What adapters may need besides their own config."""

    pull_dir: Path | None = None  # pull_hermes3 output, for the hermes3 parts
    hub_reads: dict = field(default_factory=dict)  # source -> its manifest input, filled as a hub dataset is read
    hub_dir: Path | None = None  # the fetch folder (config fetch_dir): hub datasets are read from there when fetched


Adapter = Callable[[str, dict, Context], Iterator["Doc | Skip"]]


@dataclass(frozen=True)
class AdapterSpec:
    """A registered adapter and what it takes as a location: the one place that says so (the config
    validation, the hub reader's advice and tests/test_profiles.py read it; the schema's adapter enum
    is checked against it)."""

    name: str
    read: Adapter
    from_hub: bool  # a `hub:` location is accepted: the adapter reads records
    not_from_hub: str = ""  # why not, and what to do instead (the config error says it)
    # what `location: DIR` reads after `hf download ... --local-dir DIR`; None: the adapter reads other
    # files from a folder, so a downloaded dataset is read through ANDREA_HUB_MIRROR instead
    local_dir_reads: str | None = None

    def __call__(self, name: str, cfg: dict, ctx: Context) -> Iterator[Doc | Skip]:
        return self.read(name, cfg, ctx)


ADAPTERS: dict[str, AdapterSpec] = {}


def adapter(name: str, *, from_hub: bool, not_from_hub: str = "", local_dir_reads: str | None = None):
    """Register an adapter under `name` (the config's `adapter:`). One that takes no hub location
    says why in `not_from_hub`."""
    if from_hub == bool(not_from_hub) or (local_dir_reads and not from_hub):
        raise ValueError(f"adapter {name!r}: not_from_hub (the reason) is given exactly when from_hub is false, "
                         "and local_dir_reads only with from_hub")

    def register(fn: Adapter) -> Adapter:
        ADAPTERS[name] = AdapterSpec(name, fn, from_hub, not_from_hub, local_dir_reads)
        return fn

    return register


def resolve_location(source: str, cfg: dict) -> Path | None:
    """The local path an adapter reads, or None when the location is not a path (pull)."""
    loc = cfg["location"]
    if loc == "pull":
        return None
    if is_hub_location(loc):
        spec = ADAPTERS.get(cfg["adapter"])
        why = spec.not_from_hub if spec and spec.not_from_hub else "this adapter reads local files"
        raise ValueError(f"sources.{source}.location: {loc} is a hub dataset, not a path; {why}")
    if loc == "embedded":
        return embedded_location(source)
    if loc == "stdlib":
        return Path(sysconfig.get_paths()["stdlib"])
    return Path(loc)


def hub_rows(source: str, cfg: dict, ctx: Context) -> Iterator[RawRow]:
    """Rows of the source's hub dataset (its location is `hub:...`)."""
    loc = parse_hub_location(cfg["location"])
    return iter_hub_rows(
        loc, f"sources.{source}.location", local_dir_reads=ADAPTERS[cfg["adapter"]].local_dir_reads, read=ctx.hub_reads.get(source),
        mirror_root=ctx.hub_dir,
    )


def _rows(source: str, cfg: dict, ctx: Context) -> Iterator[RawRow]:
    """The source's records: from its hub dataset, or its local files."""
    if is_hub_location(cfg["location"]):
        return hub_rows(source, cfg, ctx)
    return iter_rows(resolve_location(source, cfg))


def _hub_texts(source: str, cfg: dict, ctx: Context) -> Iterator[tuple[str, str, str] | Skip]:
    """(document key, where, text) of each record of a hub dataset's `text` column."""
    for raw in hub_rows(source, cfg, ctx):
        row = raw.value
        text = row.get("text") if isinstance(row, dict) else None
        if not isinstance(text, str):
            yield Skip("missing_text", raw.where, "needs a `text` column" if not isinstance(row, dict) or "text" not in row else type(text).__name__)
            continue
        rid = row.get("id")
        yield (str(rid) if rid not in (None, "") else raw.key), raw.where, text


def _files(location: Path, suffixes: tuple[str, ...]) -> list[Path]:
    if location.is_file():
        return [location]
    if location.is_dir():
        return sorted(p for p in location.rglob("*") if p.is_file() and p.suffix.lower() in suffixes)
    raise FileNotFoundError(f"{location} does not exist")


def _text_lines(path: Path) -> Iterator[tuple[int, str | UnicodeDecodeError]]:
    """(line number, line without its end) of a UTF-8 text file; a line holding bytes that are
    not UTF-8 comes as its decode error instead, so the caller skips that line alone."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                yield lineno, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                yield lineno, e


# ---------------------------------------------------------------- conversations


@adapter("hermes3", from_hub=False,
         not_from_hub="the hermes3 parts come from the pull_hermes3 stage (set hermes3.location: hub:<id> instead)")
def hermes3_parts(name: str, cfg: dict, ctx: Context) -> Iterator[Doc | Skip]:
    """A part written by pull_hermes3 (already validated there)."""
    path = ctx.pull_dir / f"{name}.parquet"
    for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            turns = [{"role": SHAREGPT_TO_ROLE[t["from"]], "text": t["value"]} for t in row["conversations"]]
            yield Doc(doc_id=row["doc_id"], turns=turns)


def _conversations(name: str, cfg: dict, ctx: Context, to_turns) -> Iterator[Doc | Skip]:
    """One conversation per record: `to_turns(record)` gives (turns, None, "") for a usable record,
    else (None, reason, detail). The record's `id` (when set) names the document, else its key."""
    for raw in _rows(name, cfg, ctx):
        if raw.broken:
            yield Skip(raw.broken, raw.where, raw.detail)
            continue
        turns, reason, detail = to_turns(raw.value)
        if turns is None:
            yield Skip(reason, raw.where, detail)
            continue
        doc_id = raw.value.get("id")
        yield Doc(doc_id=str(doc_id) if doc_id not in (None, "") else raw.key, turns=turns)


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


def _sharegpt_turns(row) -> tuple[list[dict] | None, str | None, str]:
    conv, reason, detail = validate_sharegpt(row)
    if conv is None:
        return None, reason, detail
    return [{"role": SHAREGPT_TO_ROLE[t["from"]], "text": t["value"]} for t in conv], None, ""


@adapter("sharegpt", from_hub=True, local_dir_reads=RECORD_DIR_READS)
def sharegpt(name: str, cfg: dict, ctx: Context) -> Iterator[Doc | Skip]:
    """`conversations`: list of {from: system|human|gpt, value} (chat, synthetic-chat, ...)."""
    return _conversations(name, cfg, ctx, _sharegpt_turns)


MESSAGE_ROLES = {"system": "system", "user": "user", "assistant": "assistant"}


def _message_turns(row) -> tuple[list[dict] | None, str | None, str]:
    msgs = row.get("messages") if isinstance(row, dict) else None
    if not isinstance(msgs, list) or not msgs:
        return None, "missing_messages", ""
    turns = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in MESSAGE_ROLES:
            return None, "unknown_role", f"message {i}"
        if not isinstance(m.get("content"), str) or not m["content"].strip():
            return None, "empty_value", f"message {i}"
        turns.append({"role": MESSAGE_ROLES[m["role"]], "text": m["content"]})
    if not any(t["role"] == "user" for t in turns) or not any(t["role"] == "assistant" for t in turns):
        return None, "no_dialogue", ""
    return turns, None, ""


@adapter("messages", from_hub=True, local_dir_reads=RECORD_DIR_READS)
def messages(name: str, cfg: dict, ctx: Context) -> Iterator[Doc | Skip]:
    """`messages`: list of {role: system|user|assistant, content} (smoltalk and the OpenAI layout)."""
    return _conversations(name, cfg, ctx, _message_turns)


OASST_ROLE = {"prompter": "user", "assistant": "assistant"}


def _oasst_threads(node: dict, mode: str) -> list[list[dict]]:
    """Root-to-leaf threads of an OASST message tree: the best-ranked reply at each level
    (`rank` 0 is best; unranked replies after ranked ones), or every leaf."""
    here = [{"role": OASST_ROLE.get(node.get("role"), "?"), "text": node.get("text") or ""}]
    replies = [r for r in node.get("replies") or [] if isinstance(r, dict) and not r.get("deleted")]
    if not replies:
        return [here]
    replies.sort(key=lambda r: (r.get("rank") is None, r.get("rank") or 0))
    chosen = replies[:1] if mode == "best" else replies
    return [here + tail for r in chosen for tail in _oasst_threads(r, mode)]


def _oasst_tree_from_flat(messages: list[dict]) -> list[dict]:
    by_id = {m["message_id"]: {**m, "replies": []} for m in messages}
    roots = []
    for m in by_id.values():
        parent = by_id.get(m.get("parent_id"))
        (parent["replies"] if parent else roots).append(m)
    return roots


@adapter("oasst", from_hub=True, local_dir_reads=RECORD_DIR_READS)
def oasst(name: str, cfg: dict, ctx: Context) -> Iterator[Doc | Skip]:
    """OpenAssistant: message trees (`prompt` with nested `replies`, as in *.trees.jsonl) or flat
    messages (`message_id`, `parent_id`, `role`, `text`), turned into threads. Flat messages are
    all read before their trees are built (a message may come before its parent). With
    `languages`, a message (a tree: its prompt) whose `lang` is not one of them is skipped."""
    flat: list[dict] = []
    languages = set(cfg.get("languages") or ())
    for raw in _rows(name, cfg, ctx):
        if raw.broken:
            yield Skip(raw.broken, raw.where, raw.detail)
            continue
        row = raw.value
        if not isinstance(row, dict):
            yield Skip("not_an_object", raw.where)
            continue
        lang = (row["prompt"] if isinstance(row.get("prompt"), dict) else row).get("lang")
        if languages and lang not in languages:
            yield Skip("other_language", raw.where, str(lang))
            continue
        if isinstance(row.get("prompt"), dict):
            tree_id = str(row.get("message_tree_id") or raw.key)
            yield from _oasst_docs(tree_id, row["prompt"], cfg, raw.where)
        elif "message_id" in row and "text" in row:
            flat.append(row)
        else:
            yield Skip("not_an_oasst_record", raw.where)
    for root in _oasst_tree_from_flat(flat):
        yield from _oasst_docs(str(root.get("message_tree_id") or root["message_id"]), root, cfg, "flat messages")


def _oasst_docs(tree_id: str, root: dict, cfg: dict, where: str) -> Iterator[Doc | Skip]:
    for k, thread in enumerate(_oasst_threads(root, cfg["oasst_threads"])):
        if any(t["role"] == "?" or not t["text"].strip() for t in thread):
            yield Skip("bad_message", where, f"tree {tree_id}")
        elif len(thread) < 2:
            yield Skip("no_dialogue", where, f"tree {tree_id}")
        else:
            yield Doc(doc_id=f"{tree_id}#{k}", turns=thread)


@adapter("dictionary", from_hub=True, local_dir_reads="its .tsv/.txt lines and Parquet/JSON/JSONL records are read")
def dictionary(name: str, cfg: dict, ctx: Context) -> Iterator[Doc | Skip]:
    """Word definitions as `> define X` / `< X is ...` exchanges. Input: records with `word` and
    `definition`, or `.tsv`/`.txt` lines `word<TAB>definition`."""
    if is_hub_location(cfg["location"]):
        for raw in hub_rows(name, cfg, ctx):
            yield _definition_record(raw)
        return
    loc = resolve_location(name, cfg)
    files = _files(loc, (".tsv", ".txt", ".jsonl", ".json", ".parquet"))
    for path in files:
        if path.suffix.lower() in (".tsv", ".txt"):
            for lineno, line in _text_lines(path):
                where = f"{path}:line {lineno}"
                if isinstance(line, UnicodeDecodeError):
                    yield Skip(BAD_ENCODING, where, undecodable(line))
                elif line.strip() and not line.startswith("#"):
                    word, sep, definition = line.partition("\t")
                    yield _definition(word, definition if sep else "", where, f"{path.name}:{lineno}")
        else:
            for raw in iter_rows(path):
                yield _definition_record(raw)


def _definition_record(raw: RawRow) -> Doc | Skip:
    if raw.broken:
        return Skip(raw.broken, raw.where, raw.detail)
    if not isinstance(raw.value, dict):
        return Skip("not_an_object", raw.where)
    return _definition(raw.value.get("word"), raw.value.get("definition"), raw.where, raw.key)


def _definition(word, definition, where: str, key: str) -> Doc | Skip:
    if not isinstance(word, str) or not word.strip():
        return Skip("missing_word", where)
    if not isinstance(definition, str) or not definition.strip():
        return Skip("missing_definition", where)
    word, definition = word.strip(), definition.strip()
    answer = definition if definition.lower().startswith(word.lower()) else f"{word} is {definition}"
    return Doc(doc_id=f"{word}@{key}", turns=[{"role": "user", "text": f"define {word}"}, {"role": "assistant", "text": answer}])


# ---------------------------------------------------------------- plain text

GUTENBERG_START = re.compile(r"^\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)
GUTENBERG_END = re.compile(r"^\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)


def strip_gutenberg(text: str) -> str:
    """Drop the Project Gutenberg licence header and footer when present."""
    m = GUTENBERG_START.search(text)
    if m:
        text = text[m.end() :]
    m = GUTENBERG_END.search(text)
    if m:
        text = text[: m.start()]
    return text.strip()


def chunk_paragraphs(text: str, limit: int) -> list[str]:
    """Cut text into chunks of at most ~`limit` characters at blank-line paragraph boundaries
    (a single paragraph longer than the limit becomes its own chunk)."""
    paras = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    chunks, cur, size = [], [], 0
    for p in paras:
        if cur and size + len(p) + 2 > limit:
            chunks.append("\n\n".join(cur))
            cur, size = [], 0
        cur.append(p)
        size += len(p) + 2
    if cur:
        chunks.append("\n\n".join(cur))
    return chunks


def _text_chunks(name: str, cfg: dict, ctx: Context, suffixes: tuple[str, ...], clean) -> Iterator[Doc | Skip]:
    """Whole files cut into chunks. Bytes that are not UTF-8 cost the chunk (the document) that
    holds them, not the file: a book with one stray Latin-1 byte keeps its other chunks. The bytes
    are kept as escapes (surrogateescape) through cleaning and chunking, which only cut text and
    strip whitespace, so a chunk holding one is found, and its line in the file named. From the hub,
    each record's `text` is what a file would be."""
    if is_hub_location(cfg["location"]):
        yield from _hub_text_chunks(name, cfg, ctx, clean)
        return
    loc = resolve_location(name, cfg)
    for path in _files(loc, suffixes):
        rel = path.name if loc.is_file() else path.relative_to(loc).as_posix()
        data = path.read_bytes()
        try:
            text, bad_lines = data.decode("utf-8"), None
        except UnicodeDecodeError:
            text = data.decode("utf-8", "surrogateescape")
            bad_lines = escaped_byte_lines(text)
        cleaned = clean(text)
        if bad_lines is not None:
            # bytes in what clean() cut off (a Gutenberg header) come first in the file: pass them
            start = text.find(cleaned) if cleaned else 0
            for _ in ESCAPED_BYTE.finditer(text, 0, max(start, 0)):
                next(bad_lines, None)
        for k, chunk in enumerate(chunk_paragraphs(cleaned, cfg["chunk_chars"])):
            n_bad = len(ESCAPED_BYTE.findall(chunk)) if bad_lines is not None else 0
            if n_bad:
                first = next(bad_lines, None)
                for _ in range(n_bad - 1):
                    next(bad_lines, None)
                where = f"{path} chunk {k}" + (f" (line {first[1]})" if first else "")
                yield Skip(BAD_ENCODING, where, f"byte 0x{first[0]:02x} is not valid UTF-8" if first else "")
            elif len(chunk) < cfg["min_chars"]:
                yield Skip("too_short", f"{path} chunk {k}")
            else:
                yield Doc(doc_id=f"{rel}#{k}", text=chunk)


def _hub_text_chunks(name: str, cfg: dict, ctx: Context, clean) -> Iterator[Doc | Skip]:
    for item in _hub_texts(name, cfg, ctx):
        if isinstance(item, Skip):
            yield item
            continue
        key, where, text = item
        for k, chunk in enumerate(chunk_paragraphs(clean(text), cfg["chunk_chars"])):
            if len(chunk) < cfg["min_chars"]:
                yield Skip("too_short", f"{where} chunk {k}")
            else:
                yield Doc(doc_id=f"{key}#{k}", text=chunk)


@adapter("plaintext", from_hub=True)
def plaintext(name: str, cfg: dict, ctx: Context) -> Iterator[Doc | Skip]:
    """Books and other prose: `.txt` files (from the hub: records' `text`), Gutenberg boilerplate
    removed, cut into chunks."""
    yield from _text_chunks(name, cfg, ctx, (".txt",), strip_gutenberg)


@adapter("markdown", from_hub=True)
def markdown(name: str, cfg: dict, ctx: Context) -> Iterator[Doc | Skip]:
    """Repository documentation: Markdown / reStructuredText files of a directory (from the hub:
    records' `text`), in chunks."""
    yield from _text_chunks(name, cfg, ctx, (".md", ".markdown", ".rst"), lambda t: t.strip())


IRC_MESSAGE = re.compile(r"^\[?(?:\d{4}-\d\d-\d\d[ T])?\d{1,2}:\d{2}(?::\d{2})?\]?\s+<[@+%~&]?([^>\s]+)>\s?(.*)$")
IRC_ACTION = re.compile(r"^\[?(?:\d{4}-\d\d-\d\d[ T])?\d{1,2}:\d{2}(?::\d{2})?\]?\s+\*\s+(\S+)\s+(.*)$")
IRC_EVENT = re.compile(r"^\[?(?:\d{4}-\d\d-\d\d[ T])?\d{1,2}:\d{2}(?::\d{2})?\]?\s+(?:-!-|\*\*\*|--[>< ]|<--|-->)")


@adapter("irc", from_hub=True)
def irc(name: str, cfg: dict, ctx: Context) -> Iterator[Doc | Skip]:
    """IRC logs (irssi/weechat-like `[HH:MM] <nick> text` lines; from the hub: one log per record's
    `text`). Joins, parts and mode changes are dropped; consecutive messages are grouped into
    documents of about `chunk_chars`."""
    if is_hub_location(cfg["location"]):
        for item in _hub_texts(name, cfg, ctx):
            if isinstance(item, Skip):
                yield item
            else:
                key, where, text = item
                yield from _irc_docs(key, where, enumerate(text.splitlines(), 1), cfg)
        return
    loc = resolve_location(name, cfg)
    for path in _files(loc, (".log", ".txt")):
        rel = path.name if loc.is_file() else path.relative_to(loc).as_posix()
        yield from _irc_docs(rel, str(path), _text_lines(path), cfg)


def _irc_docs(rel: str, where: str, lines, cfg: dict) -> Iterator[Doc | Skip]:
    """Documents of one log: `lines` gives (line number, line or its decode error)."""
    chunk: list[str] = []
    k = 0
    size = 0
    for lineno, line in lines:
        if isinstance(line, UnicodeDecodeError):  # the line alone is lost, as an unparsed one is
            yield Skip(BAD_ENCODING, f"{where}:line {lineno}", undecodable(line))
            continue
        if not line.strip() or IRC_EVENT.match(line):
            continue
        m = IRC_MESSAGE.match(line)
        if m:
            msg = f"<{m.group(1)}> {m.group(2)}".rstrip()
        elif (m := IRC_ACTION.match(line)) is not None:
            msg = f"* {m.group(1)} {m.group(2)}".rstrip()
        else:
            yield Skip("unparsed_line", f"{where}:line {lineno}", line[:60])
            continue
        chunk.append(msg)
        size += len(msg) + 1
        if size >= cfg["chunk_chars"]:
            yield Doc(doc_id=f"{rel}#{k}", text="\n".join(chunk))
            chunk, size, k = [], 0, k + 1
    if chunk:
        text = "\n".join(chunk)
        if len(text) >= cfg["min_chars"]:
            yield Doc(doc_id=f"{rel}#{k}", text=text)
        else:
            yield Skip("too_short", f"{where} chunk {k}")


# ---------------------------------------------------------------- code repositories

SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test", "lib2to3"}


@adapter("docstrings", from_hub=False,
         not_from_hub="the docstrings adapter parses Python source trees with `ast`; download the package or "
         "repository and set the location to its folder")
def docstrings(name: str, cfg: dict, ctx: Context) -> Iterator[Doc | Skip]:
    """Python docstrings (modules, classes, functions) extracted with `ast` from a source tree;
    by default the running Python's standard library, which is real text available offline."""
    loc = resolve_location(name, cfg)
    files = [loc] if loc.is_file() else sorted(
        p for p in loc.rglob("*.py") if not (set(p.relative_to(loc).parts[:-1]) & SKIP_DIRS)
    )
    for path in files:
        rel = path.name if loc.is_file() else path.relative_to(loc).as_posix()
        # The unit is the file: `ast` parses a module whole, and a file with bytes that are not in
        # its declared encoding (UTF-8 unless a coding line says otherwise) is not valid Python,
        # which the interpreter would refuse to import too.
        data = path.read_bytes()
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
            source = data.decode(encoding)
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            yield Skip(BAD_ENCODING, f"{path}:line {line}", f"byte 0x{data[e.start]:02x} is not valid {encoding}; file skipped")
            continue
        except (SyntaxError, LookupError) as e:  # an unknown or contradictory coding line
            yield Skip("unparsable_python", str(path), type(e).__name__)
            continue
        try:
            tree = ast.parse(source, filename=str(path))
        except (SyntaxError, ValueError) as e:
            yield Skip("unparsable_python", str(path), type(e).__name__)
            continue
        module = rel[:-3].replace("/", ".")
        for qualname, node in _docstring_nodes(tree, module):
            doc = ast.get_docstring(node, clean=True)
            if not doc:
                continue
            if len(doc) < cfg["min_chars"]:
                yield Skip("too_short", f"{path}:{qualname}")
                continue
            yield Doc(doc_id=f"{rel}:{qualname}", text=f"{qualname}\n\n{doc}")


def _docstring_nodes(tree: ast.Module, module: str):
    yield module, tree
    stack = [(module, n) for n in reversed(tree.body)]
    while stack:
        prefix, node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            q = f"{prefix}.{node.name}"
            yield q, node
            if isinstance(node, ast.ClassDef):
                stack.extend((q, n) for n in reversed(node.body))


@adapter("git_log", from_hub=False,
         not_from_hub="the git_log adapter reads a git repository's history; clone it and set the location to the clone")
def git_log(name: str, cfg: dict, ctx: Context) -> Iterator[Doc | Skip]:
    """Commit messages of a git repository (merges excluded), newest first."""
    loc = resolve_location(name, cfg)
    if not loc.exists():
        raise FileNotFoundError(f"{loc} does not exist")
    proc = subprocess.run(
        ["git", "-C", str(loc), "log", "--no-merges", "--format=%H%x00%B%x1e"],
        capture_output=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise FileNotFoundError(f"{loc} is not a readable git repository: {proc.stderr.decode(errors='replace').strip()}")
    # Git stores commit messages as bytes; git log re-encodes those that declare an encoding to
    # UTF-8, so a message that still is not UTF-8 is skipped (the commit is the unit), not guessed.
    for entry in proc.stdout.split(b"\x1e"):
        entry = entry.strip(b"\n")
        if not entry:
            continue
        sha_bytes, _, raw_message = entry.partition(b"\x00")
        sha = sha_bytes.decode("ascii")
        try:
            message = raw_message.decode("utf-8").strip()
        except UnicodeDecodeError as e:
            line = raw_message.count(b"\n", 0, e.start) + 1
            yield Skip(BAD_ENCODING, f"{loc} commit {sha[:12]}", f"byte 0x{raw_message[e.start]:02x} on line {line} of the message is not valid UTF-8")
            continue
        if len(message) < cfg["min_chars"]:
            yield Skip("too_short", f"commit {sha[:12]}")
        else:
            yield Doc(doc_id=sha, text=message)
