"""Convert downloaded registry packages into a real corpus in the layouts ANDREA's adapters read.

Called by bench/real_corpus.sh after it has downloaded and unpacked the packages below into
CACHE (`debs/`, `wheels/`, `unpacked/<package>/`). Writes under OUT:

    hermes3/chitchat.jsonl         ShareGPT rows (human/gpt), read by pull_hermes3
    chat/chatterbot-corpus/*.jsonl ShareGPT rows                      -> source chat (sharegpt)
    gutenberg/<package>/*.txt      books                              -> source gutenberg (plaintext)
    dictionary/<package>.tsv       word<TAB>definition                -> source dictionary
    repo-docs/<package>/**/*.rst   reStructuredText documentation     -> source repo-docs (markdown)
    real-corpus.yaml               config overlay (snakemake --configfile config/config.yaml OUT/real-corpus.yaml)
    MANIFEST.json                  packages, versions, licences, bytes, documents, sha256 per file

Paths in real-corpus.yaml are relative to ROOT (the directory snakemake runs in), so OUT can be
moved to another machine together with its place relative to the checkout.

    python bench/real_corpus.py --cache CACHE --out OUT [--root ROOT]
"""

from __future__ import annotations

import argparse
import gzip
import html
import json
import os
import re
import struct
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from andrea.config import apply_defaults  # noqa: E402
from andrea.io import sha256_file, write_json_atomic, write_text_atomic  # noqa: E402
from andrea.sources import ADAPTERS, Context, Doc  # noqa: E402

# Every package the corpus is built from: registry, pinned version (PyPI only: Debian serves one
# version per release, recorded as downloaded), licence of the text used, and what it becomes.
# bench/real_corpus.sh reads the first three columns (`python bench/real_corpus.py --list`).
PACKAGES = [
    # name, registry, pin, licence, source, what
    ("r-cran-janeaustenr", "apt", "", "public domain (novels); MIT (R package)", "gutenberg",
     "Jane Austen's six completed novels"),
    ("r-cran-tokenizers", "apt", "", "public domain (Project Gutenberg etext); MIT (R package)", "gutenberg",
     "Herman Melville, Moby Dick (the package's `mobydick` data set)"),
    ("sword-text-web", "apt", "", "public domain", "gutenberg",
     "World English Bible with Deuterocanon (SWORD zText module, OSIS markup stripped)"),
    ("wordnet-base", "apt", "", "WordNet 3.0 licence (Princeton, permissive)", "dictionary",
     "WordNet 3.0 glosses with examples: one-word lower-case lemmas, their most frequent senses"),
    ("dict-devil", "apt", "", "public domain", "dictionary",
     "Ambrose Bierce, The Devil's Dictionary (dictd database)"),
    ("python3.11-doc", "apt", "", "PSF-2.0 (Python documentation licence)", "repo-docs",
     "Python 3.11 documentation, reStructuredText sources (html/_sources)"),
    ("chitchat-dataset", "pypi", "0.9.0", "MIT", "hermes3",
     "BYU PCC lab Chit-Chat Challenge: human-human open-domain conversations"),
    ("chatterbot-corpus", "pypi", "1.2.0", "BSD-3-Clause", "chat",
     "ChatterBot dialog corpus, English question/answer conversations"),
]

# Size budget (decision): ~30-35 MB of text in all, so that `tar cJf` of OUT stays near 10 MB.
# The chit-chat corpus holds 4018 two-speaker conversations (12 MB): the first
# CHITCHAT_MAX_CONVERSATIONS of them by id are kept. WordNet in full would be 22 MB: only
# lower-case one-word lemmas (no names, no phrases), with their most frequent senses.
CHITCHAT_MAX_CONVERSATIONS = 2000
WORDNET_MAX_SENSES = 2  # per lemma and part of speech, most frequent first (WordNet's order)
PYTHON_DOCS_LEFT_OUT = ("whatsnew/", "c-api/", "distutils/")  # release notes, the C API, a removed module


def log(msg: str) -> None:
    print(f"[real_corpus] {msg}", flush=True)


# ---------------------------------------------------------------- package access


class Package:
    """One downloaded package: its file in the cache, version, and (for .deb) unpacked tree."""

    def __init__(self, cache: Path, name: str, registry: str, pin: str):
        self.name, self.registry = name, registry
        if registry == "apt":
            files = sorted((cache / "debs").glob(f"{name}_*.deb"))
            if not files:
                raise FileNotFoundError(f"{cache}/debs has no {name}_*.deb: run bench/real_corpus.sh first")
            self.file = files[-1]
            self.version = subprocess.run(
                ["dpkg-deb", "-f", str(self.file), "Version"], capture_output=True, text=True, check=True
            ).stdout.strip()
            self.root = cache / "unpacked" / name
            if not self.root.is_dir():
                raise FileNotFoundError(f"{self.root} is missing: run bench/real_corpus.sh first")
        else:
            stem = name.replace("-", "_")
            files = sorted((cache / "wheels").glob(f"{stem}-{pin}-*.whl"))
            if not files:
                raise FileNotFoundError(f"{cache}/wheels has no {stem}-{pin}-*.whl: run bench/real_corpus.sh first")
            self.file, self.version, self.root = files[-1], pin, None
        self.input_bytes = 0  # bytes of the package's files that were read

    def read(self, rel: str) -> bytes:
        """A file of the package (a path in the .deb tree, or a member of the wheel)."""
        if self.root is not None:
            data = (self.root / rel).read_bytes()
        else:
            with zipfile.ZipFile(self.file) as zf:
                data = zf.read(rel)
        self.input_bytes += len(data)
        return data

    def members(self, prefix: str) -> list[str]:
        if self.root is not None:
            base = self.root / prefix
            return sorted(p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file())
        with zipfile.ZipFile(self.file) as zf:
            return sorted(n for n in zf.namelist() if n.startswith(prefix))


# ---------------------------------------------------------------- R lazy-load data (janeaustenr, tokenizers)


class RList(list):
    """An R vector read back, with its attributes (names, class, ...)."""

    attrs: dict = {}


class RUnserializer:
    """Reads R's XDR serialization (format 2/3) far enough for data sets of character, numeric
    and list vectors: what R packages' lazy-load databases (data/Rdata.rdb) hold."""

    NIL_LIKE = {254, 253, 252, 251, 250, 242}  # NILVALUE, GLOBALENV, UNBOUND, MISSINGARG, BASENAMESPACE, EMPTYENV

    def __init__(self, data: bytes):
        if data[:2] != b"X\n":
            raise ValueError("not R's XDR serialization format")
        self.b, self.i, self.refs = data, 2, []
        version = self.int()
        self.int(), self.int()  # R version that wrote it, minimal R version to read it
        if version == 3:
            n = self.int()  # then the native encoding's name
            self.i += n

    def int(self) -> int:
        (v,) = struct.unpack_from(">i", self.b, self.i)
        self.i += 4
        return v

    def length(self) -> int:
        n = self.int()
        return (self.int() << 32) + self.int() if n == -1 else n

    def item(self):
        flags = self.int()
        kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind in self.NIL_LIKE:
            return None
        if kind == 255:  # reference to an earlier symbol
            return self.refs[(flags >> 8 or self.int()) - 1]
        if kind == 1:  # symbol
            name = self.item()
            self.refs.append(name)
            return name
        if kind == 9:  # one string
            n = self.int()
            if n == -1:
                return None  # NA_character_
            raw = self.b[self.i : self.i + n]
            self.i += n
            return raw.decode("latin-1" if (flags >> 12) & 4 else "utf-8")
        if kind in (2, 6, 17):  # pairlist: [(tag, value), ...]
            if has_attr:
                self.item()
            tag = self.item() if has_tag else None
            car = self.item()
            return [(tag, car)] + (self.item() or [])
        if kind in (16, 19, 20):  # character vector, list, expression
            out = RList(self.item() for _ in range(self.length()))
        elif kind in (10, 13):  # logical, integer
            n = self.length()
            out = RList(struct.unpack_from(f">{n}i", self.b, self.i))
            self.i += 4 * n
        elif kind == 14:  # double
            n = self.length()
            out = RList(struct.unpack_from(f">{n}d", self.b, self.i))
            self.i += 8 * n
        else:
            raise ValueError(f"R object type {kind} is not supported by this reader")
        out.attrs = dict(self.item()) if has_attr else {}
        return out


def r_lazyload(pkg: Package, data_dir: str) -> dict:
    """Every object of an R package's lazy-load data base (`Rdata.rdx` index, `Rdata.rdb` blobs)."""
    index = RUnserializer(gzip.decompress(pkg.read(f"{data_dir}/Rdata.rdx"))).item()
    variables = index[0]
    blob = pkg.read(f"{data_dir}/Rdata.rdb")
    out = {}
    for name, (offset, size) in zip(variables.attrs["names"], variables):
        chunk = blob[offset : offset + size]
        out[name] = RUnserializer(zlib.decompress(chunk[4:])).item()  # 4 bytes: uncompressed length
    return out


# ---------------------------------------------------------------- converters: each returns {relpath: text}


AUSTEN_TITLES = {
    "sensesensibility": "sense-and-sensibility",
    "prideprejudice": "pride-and-prejudice",
    "mansfieldpark": "mansfield-park",
    "emma": "emma",
    "northangerabbey": "northanger-abbey",
    "persuasion": "persuasion",
}


def austen(pkg: Package) -> dict[str, str]:
    data = r_lazyload(pkg, "usr/lib/R/site-library/janeaustenr/data")
    return {f"{AUSTEN_TITLES[k]}.txt": "\n".join(line or "" for line in v).strip() + "\n" for k, v in data.items()}


def moby_dick(pkg: Package) -> dict[str, str]:
    (text,) = r_lazyload(pkg, "usr/lib/R/site-library/tokenizers/data")["mobydick"]
    # a Project Gutenberg etext with its licence header/footer: the plaintext adapter strips those
    return {"moby-dick.txt": text.lstrip("\ufeff").replace("\r\n", "\n")}


OSIS_NOTE = re.compile(r"<note\b.*?</note>", re.S)
OSIS_BOOK = re.compile(r'<div\b[^>]*\bosisID="([^"]+)"[^>]*\bsID="[^"]+"[^>]*type="book"[^>]*/>')
OSIS_CHAPTER = re.compile(r'<chapter\b[^>]*\bn="(\d+)"[^>]*\bsID="[^"]+"[^>]*/>')


def _osis_to_text(markup: str) -> str:
    """OSIS verse markup as plain text: notes dropped, titles and chapters as their own
    paragraphs, paragraph breaks kept, a poem's lines one per line, every other tag removed."""
    s = re.sub(r"<[^<>]*(?=<|$)", "", markup)  # a tag cut off by the module's verse boundaries ("<d")
    s = OSIS_NOTE.sub("\x00", s)  # a footnote may stand between two words with no space
    s = re.sub(r"<milestone\b[^>]*/>", "", s)
    s = OSIS_CHAPTER.sub(lambda m: f"\n\nChapter {m.group(1)}\n\n", s)
    s = re.sub(r"<title\b[^>]*>(.*?)</title>", r"\n\n\1\n\n", s, flags=re.S)
    s = re.sub(r'<div\b[^>]*\bsID="[^"]*"[^>]*type="x-p"[^>]*/>|<lg\b[^>]*/>|<lb\b[^>]*type="x-p"[^>]*/>', "\n\n", s)
    s = re.sub(r'<l\b[^>]*\bsID="[^"]*"[^>]*/>|<lb\b[^>]*/>', "\n", s)  # a poem line starts
    s = html.unescape(re.sub(r"<[^>]+>", "", s))
    s = re.sub(r"(?<=\w)\x00(?=\w)", " ", s).replace("\x00", "")
    lines = [re.sub(r"[ \t]+", " ", line).strip() for line in s.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def world_english_bible(pkg: Package) -> dict[str, str]:
    """A SWORD zText module: `.bzs` (block offsets), `.bzz` (zlib blocks), `.bzv` (per verse:
    block, offset, size), in canonical order. One file per book; the translators' preface and
    the glossary (outside the books) are left out."""
    base = "usr/share/sword/modules/texts/ztext/engWEB2015eb"
    verses = []
    for testament in ("ot", "nt"):
        bzs, bzz, bzv = (pkg.read(f"{base}/{testament}.{ext}") for ext in ("bzs", "bzz", "bzv"))
        blocks = []
        for i in range(0, len(bzs), 12):
            offset, size, _ = struct.unpack_from("<III", bzs, i)
            blocks.append(zlib.decompress(bzz[offset : offset + size]))
        for i in range(0, len(bzv), 10):
            block, offset, size = struct.unpack_from("<IIH", bzv, i)
            if size:
                verses.append(blocks[block][offset : offset + size].decode("utf-8"))
    markup = " ".join(verses)
    # (where the book starts, where its text starts, book): its opening milestone, or else (Hosea,
    # whose milestone the module lost) its first chapter
    starts = [(m.start(), m.end(), m.group(1)) for m in OSIS_BOOK.finditer(markup)]
    known = {book for _, _, book in starts}
    for m in re.finditer(r'<chapter\b[^>]*\bosisID="([^".]+)\.1"[^>]*\bsID="[^"]+"[^>]*/>', markup):
        if m.group(1) not in known:
            starts.append((m.start(), m.start(), m.group(1)))
            known.add(m.group(1))
    starts.sort()
    out = {}
    for k, (_, begin, book) in enumerate(starts):
        stop = starts[k + 1][0] if k + 1 < len(starts) else len(markup)
        # the book's closing milestone, where there is one: what follows it before the next book
        # is not the book's text (the glossary after Revelation)
        end = re.compile(rf'<div\b[^>]*\beID="[^"]+"[^>]*\bosisID="{re.escape(book)}"[^>]*type="book"[^>]*/>').search(markup, begin, stop)
        out[f"{k + 1:02d}-{book}.txt"] = _osis_to_text(markup[begin : end.start() if end else stop])
    return out


def wordnet(pkg: Package) -> dict[str, str]:
    """One `lemma<TAB>definition` line per one-word lemma: its senses per part of speech, most
    frequent first (the order of WordNet's index files), each gloss with its example sentences.
    Lemmas that WordNet spells with a capital in their first sense (names) are left out."""
    base = "usr/share/wordnet"
    pos_name = {"noun": "noun", "verb": "verb", "adj": "adjective", "adv": "adverb"}
    lemmas: dict[str, dict[str, list[str]]] = {}
    display: dict[str, str] = {}
    for pos in ("noun", "verb", "adj", "adv"):
        glosses, words = {}, {}
        for line in pkg.read(f"{base}/data.{pos}").decode("utf-8").splitlines():
            if line.startswith("  "):  # the licence header
                continue
            head, _, gloss = line.partition(" | ")
            fields = head.split()
            n_words = int(fields[3], 16)
            glosses[fields[0]] = gloss.strip()
            words[fields[0]] = [re.sub(r"\(\w+\)$", "", w) for w in fields[4 : 4 + 2 * n_words : 2]]
        for line in pkg.read(f"{base}/index.{pos}").decode("utf-8").splitlines():
            if line.startswith("  "):
                continue
            fields = line.split()
            lemma, n_senses = fields[0], int(fields[2])
            if "_" in lemma or not lemma.isalpha():  # phrases, numbers, abbreviations like 'hood
                continue
            offsets = fields[-n_senses:]
            senses = [glosses[o] for o in offsets[:WORDNET_MAX_SENSES] if glosses.get(o)]
            if senses:
                lemmas.setdefault(lemma, {})[pos_name[pos]] = senses
                spelled = [w for w in words[offsets[0]] if w.lower() == lemma]
                display.setdefault(lemma, spelled[0] if spelled else lemma)
    lines = []
    for lemma in sorted(lemmas):
        word = display[lemma]
        if word != lemma:
            continue
        parts = []
        for pos, senses in lemmas[lemma].items():
            numbered = " ".join(f"{i}. {g}." if not g.endswith((".", '"', "?", "!")) else f"{i}. {g}" for i, g in enumerate(senses, 1))
            parts.append(f"{word} ({pos}): {numbered}" if not parts else f"({pos}): {numbered}")
        lines.append(f"{word}\t{' '.join(parts)}")
    return {"wordnet.tsv": "\n".join(lines) + "\n"}


DICT_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _dict_number(s: str) -> int:
    n = 0
    for c in s:
        n = n * 64 + DICT_B64.index(c)
    return n


def devils_dictionary(pkg: Package) -> dict[str, str]:
    """A dictd database (`.index`: headword, base-64 offset and length into the gzip `.dict.dz`)."""
    base = "usr/share/dictd/devil"
    body = gzip.decompress(pkg.read(f"{base}.dict.dz"))
    lines = []
    for row in pkg.read(f"{base}.index").decode("utf-8").splitlines():
        word, offset, size = row.split("\t")
        if word.startswith("00database"):
            continue
        entry = body[_dict_number(offset) : _dict_number(offset) + _dict_number(size)].decode("utf-8")
        text = re.sub(r"\s+", " ", entry).strip()  # one line: the TSV layout has no line breaks
        if text:
            lines.append(f"{word}\t{text}")
    return {"devils-dictionary.tsv": "\n".join(lines) + "\n"}


def python_docs(pkg: Package) -> dict[str, str]:
    """The reST sources Sphinx keeps beside the HTML (`_sources/**/*.rst.txt`), as `.rst`."""
    prefix = "usr/share/doc/python3.11/html/_sources/"
    return {
        rel[len(prefix) : -len(".txt")]: pkg.read(rel).decode("utf-8")
        for rel in pkg.members(prefix)
        if rel.endswith(".rst.txt") and not rel[len(prefix) :].startswith(PYTHON_DOCS_LEFT_OUT)
    }


def chitchat(pkg: Package) -> dict[str, str]:
    """Human-human conversations to ShareGPT rows: the first speaker is `human`, the other
    `gpt`; consecutive messages of one speaker form one turn (lines joined by newlines)."""
    data = json.loads(pkg.read("chitchat_dataset/dataset.json"))
    rows, skipped = [], 0
    for conv_id in sorted(data):
        if len(rows) == CHITCHAT_MAX_CONVERSATIONS:
            break
        turns: list[list] = []  # [sender, [lines]]
        for group in data[conv_id]["messages"]:
            for msg in group:
                text = (msg.get("text") or "").strip()
                if not text:
                    continue
                if turns and turns[-1][0] == msg["sender"]:
                    turns[-1][1].append(text)
                else:
                    turns.append([msg["sender"], [text]])
        speakers = list(dict.fromkeys(s for s, _ in turns))
        if len(speakers) != 2:
            skipped += 1
            continue
        role = {speakers[0]: "human", speakers[1]: "gpt"}
        conversations = [{"from": role[s], "value": "\n".join(lines)} for s, lines in turns]
        rows.append({"id": conv_id, "category": "chitchat", "conversations": conversations})
    if skipped:  # nobody answered (one speaker), or a third person joined
        log(f"chitchat: {skipped} conversations without exactly two speakers left out")
    return {"chitchat.jsonl": "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)}


def chatterbot(pkg: Package) -> dict[str, str]:
    """The English YAML files: each conversation a list of alternating human/bot lines."""
    out = {}
    for rel in pkg.members("chatterbot_corpus/data/english/"):
        doc = yaml.safe_load(pkg.read(rel).decode("utf-8"))
        topic = Path(rel).stem
        rows = []
        for k, conv in enumerate(doc.get("conversations") or []):
            lines = [str(x).strip() for x in conv if x is not None and str(x).strip()]
            if len(lines) < 2:
                continue
            turns = [{"from": "human" if i % 2 == 0 else "gpt", "value": t} for i, t in enumerate(lines)]
            rows.append({"id": f"{topic}-{k}", "conversations": turns})
        out[f"{topic}.jsonl"] = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    return out


# (package, converter, directory under OUT, subdirectory per package)
CONVERSIONS = [
    ("r-cran-janeaustenr", austen, "gutenberg/jane-austen"),
    ("r-cran-tokenizers", moby_dick, "gutenberg/melville"),
    ("sword-text-web", world_english_bible, "gutenberg/world-english-bible"),
    ("wordnet-base", wordnet, "dictionary"),
    ("dict-devil", devils_dictionary, "dictionary"),
    ("python3.11-doc", python_docs, "repo-docs/python3.11"),
    ("chitchat-dataset", chitchat, "hermes3"),
    ("chatterbot-corpus", chatterbot, "chat/chatterbot-corpus"),
]
OWNED_DIRS = ("hermes3", "chat", "gutenberg", "dictionary", "repo-docs")


# ---------------------------------------------------------------- documents as the pipeline sees them


def text_bytes(rel: str, text: str) -> int:
    """UTF-8 bytes of the text itself, without the file layout (JSON keys, TSV tabs)."""
    if rel.endswith(".jsonl"):
        return sum(len(t["value"].encode()) for line in text.splitlines() for t in json.loads(line)["conversations"])
    if rel.endswith(".tsv"):
        return sum(len(line.encode()) - 1 for line in text.splitlines())
    return len(text.encode())


def adapter_documents(adapter: str, paths: list[Path]) -> int:
    """Documents the source's own adapter yields for these files (before deduplication and the
    shape filter), with the schema's default chunk_chars/min_chars."""
    defaults = apply_defaults({"sources": {"x": {"adapter": adapter}}})["sources"]["x"]
    n = 0
    for path in paths:
        cfg = {**defaults, "location": str(path)}
        n += sum(isinstance(d, Doc) for d in ADAPTERS[adapter]("x", cfg, Context()))
    return n


SOURCE_ADAPTER = {"gutenberg": "plaintext", "dictionary": "dictionary", "repo-docs": "markdown", "chat": "sharegpt",
                  "hermes3": "sharegpt"}  # hermes3 rows are validated as ShareGPT by pull_hermes3 as well


# ---------------------------------------------------------------- the overlay


PROFILE = "real-corpus"  # the data profile the overlay defines and puts every model on


def overlay_yaml(out: Path, root: Path) -> str:
    rel = lambda p: os.path.relpath(out / p, root)  # noqa: E731
    q = json.dumps  # a JSON string is a valid YAML scalar, whatever the path holds
    return f"""\
# Real-corpus overlay written by bench/real_corpus.sh ({time.strftime('%Y-%m-%d')}); MANIFEST.json beside it
# lists every package, version, licence and file. Use it on top of the repository config:
#
#   snakemake --cores 2 --configfile config/config.yaml {q(rel('real-corpus.yaml'))} ...
#
# Paths are relative to {q(str(root))}, the directory snakemake runs in (written with
# --root); moving this directory keeps working as long as it keeps its place relative to that one.

# every model trains on this corpus (ANDREA-12M/120M/480M's own profile, `real`, reads the hub;
# `--config data_profile=` (empty) puts each model back on its own profile, with the top-level
# changes below still in place)
data_profile: {PROFILE}

profiles:
  {PROFILE}:
    description: "bench/real_corpus.sh: ~37 MB from Debian and PyPI packages (MANIFEST.json)"
    sources:
      # the BYU Chit-Chat corpus (human-human chat) stands in for Hermes-3, which needs the hub
      hermes3: {{location: {q(rel('hermes3/chitchat.jsonl'))}}}
      chat: {{location: {q(rel('chat'))}}}
      gutenberg: {{location: {q(rel('gutenberg'))}}}
      dictionary: {{location: {q(rel('dictionary'))}}}
      repo-docs: {{location: {q(rel('repo-docs'))}}}
      # no real counterpart in the registries: the embedded demo texts (written for the project,
      # a few KB each) are left out rather than mixed, tiny and over-sampled, into real data
      smoltalk: {{enabled: false}}
      oasst: {{enabled: false}}
      irc: {{enabled: false}}
      synthetic-chat: {{enabled: false}}
      # repo-docstrings (the running Python's standard library) and repo-commits (this checkout's
      # history) are real text already and stay as config/config.yaml has them

sources:
  # chitchat has no creative-writing or roleplay category: those parts would be empty
  hermes3-creative: {{enabled: false}}
  hermes3-roleplay: {{enabled: false}}
  # ChatterBot's English corpus is ~50 KB of text: at the embedded chat's floor of 0.8 the bandit would
  # repeat it thousands of times, so it gets a small weight and no floor
  chat: {{weight: 0.1, floor: 0.0}}

curriculum:
  warmup_sources: [hermes3-general, chat, gutenberg]
"""


# ---------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print `name registry pin` per package and exit")
    ap.add_argument("--cache", type=Path, help="where bench/real_corpus.sh downloaded and unpacked the packages")
    ap.add_argument("--out", type=Path, help="output directory")
    ap.add_argument("--root", type=Path, default=REPO, help="directory the yaml paths are relative to (default: the repository)")
    args = ap.parse_args(argv)
    if args.list:
        for name, registry, pin, *_ in PACKAGES:
            print(name, registry, pin or "-")
        return 0
    if args.cache is None or args.out is None:
        ap.error("--cache and --out are required")
    out, root = args.out.resolve(), args.root.resolve()
    if out.exists() and any(out.iterdir()) and not (out / "MANIFEST.json").exists():
        sys.exit(f"{out} is not empty and holds no MANIFEST.json: not a real-corpus directory, refusing to write into it")

    meta = {name: (registry, pin, licence, source, what) for name, registry, pin, licence, source, what in PACKAGES}
    written: dict[str, tuple[str, str]] = {}  # relpath under out -> (package, source)
    packages = []
    for k, (name, convert, subdir) in enumerate(CONVERSIONS, 1):
        registry, pin, licence, source, what = meta[name]
        t0 = time.time()
        pkg = Package(args.cache, name, registry, pin)
        files = convert(pkg)
        out_bytes = txt_bytes = 0
        for rel, text in sorted(files.items()):
            path = f"{subdir}/{rel}"
            data = text.encode("utf-8")
            target = out / path
            if not (target.is_file() and target.read_bytes() == data):  # unchanged files keep their mtime
                write_text_atomic(target, text)
            written[path] = (name, source)
            out_bytes += len(data)
            txt_bytes += text_bytes(rel, text)
        docs = adapter_documents(SOURCE_ADAPTER[source], [out / f"{subdir}/{rel}" for rel in sorted(files)])
        packages.append({
            "name": name,
            "registry": registry,
            "version": pkg.version,
            "file": pkg.file.name,
            "file_sha256": sha256_file(pkg.file),
            "licence": licence,
            "content": what,
            "source": source,
            "input_bytes": pkg.input_bytes,
            "output_bytes": out_bytes,
            "text_bytes": txt_bytes,
            "files": len(files),
            "documents": docs,
        })
        log(f"[{k}/{len(CONVERSIONS)}] {name} {pkg.version}: {len(files)} files, {out_bytes / 1e6:.2f} MB ({txt_bytes / 1e6:.2f} MB of text), "
            f"{docs} documents -> {source} ({time.time() - t0:.1f}s)")

    # files left from an earlier run with another layout would be read by the adapters: remove them
    for d in OWNED_DIRS:
        for p in sorted((out / d).rglob("*")) if (out / d).is_dir() else []:
            if p.is_file() and p.relative_to(out).as_posix() not in written:
                log(f"removing stale {p}")
                p.unlink()
        for p in sorted((out / d).rglob("*"), reverse=True) if (out / d).is_dir() else []:
            if p.is_dir() and not any(p.iterdir()):
                p.rmdir()

    write_text_atomic(out / "real-corpus.yaml", overlay_yaml(out, root))
    if not out.is_relative_to(root):
        log(f"note: {out} is outside {root}: the overlay's paths climb out of it (../), so they hold only "
            f"where this directory keeps that place relative to {root}")
    per_source: dict[str, dict] = {}
    for p in packages:
        s = per_source.setdefault(p["source"], {"packages": [], "bytes": 0, "text_bytes": 0, "documents": 0})
        s["packages"].append(p["name"])
        s["bytes"] += p["output_bytes"]
        s["text_bytes"] += p["text_bytes"]
        s["documents"] += p["documents"]
    manifest = {
        "generated_by": "bench/real_corpus.sh",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "root": str(root),
        "overlay": "real-corpus.yaml",
        "documents_note": "documents the source's adapter yields (default chunk_chars 4000), before deduplication and the shape filter",
        "bytes_note": "bytes: the files as written; text_bytes: the text in them without the JSONL/TSV layout",
        "total_bytes": sum(p["output_bytes"] for p in packages),
        "total_text_bytes": sum(p["text_bytes"] for p in packages),
        "total_documents": sum(p["documents"] for p in packages),
        "per_source": per_source,
        "packages": packages,
        "files": [
            {"path": path, "package": pkg, "source": src, "bytes": (out / path).stat().st_size, "sha256": sha256_file(out / path)}
            for path, (pkg, src) in sorted(written.items())
        ],
    }
    write_json_atomic(out / "MANIFEST.json", manifest)
    log(f"{manifest['total_bytes'] / 1e6:.1f} MB in {len(written)} files ({manifest['total_text_bytes'] / 1e6:.1f} MB of text), "
        f"{manifest['total_documents']} documents: " + ", ".join(f"{s} {v['bytes'] / 1e6:.1f} MB" for s, v in per_source.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
