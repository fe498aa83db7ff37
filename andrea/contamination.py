"""Whether the audit's prompts were in the model's training documents (contamination).

A prompt the model trained on, word for word, is answered from memory: its samples say how well
the model recalls, not how well it answers, and they flatter it. Every prompt is checked against
every training document (every document of the shards except the held-out ones), three ways:

    verbatim      the prompt as written occurs in a document
    whole prompt  its words, lower-cased and without punctuation, occur in a document in a row
    N-gram        a run of NGRAM of its words occurs in a document (prompts of NGRAM words or more)

NGRAM is 8 words. The 13-gram of the GPT-3 paper's check would test none of the shipped prompts
(2 to 12 words), and a run of 8 words is long enough that a shared one is copied text, not common
phrasing ("what is the difference between a" is 6 words). A prompt shorter than NGRAM words is
checked whole, as those checks did for items shorter than their n.

The documents are streamed in batches: a batch is joined into one string and every needle is found
with str.find, so the scan runs at the speed of C over millions of documents and holds one batch
in memory.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np

from andrea.curriculum import is_heldout

NGRAM = 8
BATCH_CHARS = 8_000_000  # characters of documents searched at once
EXCERPT_CHARS = 60  # of a document, either side of the first match, for the report

WORD = re.compile(r"\w+")
_NON_WORD = re.compile(r"[^\w\0]+")
_DOC_MARK = re.compile("\0")


def words(text: str) -> list[str]:
    """The text's words, lower-cased, without punctuation: what two texts must share in a row."""
    return WORD.findall(text.lower())


def ngrams(ws: list[str], n: int = NGRAM) -> list[str]:
    """The distinct word n-grams of `ws` in order, each as its words joined by spaces; a text of
    fewer than n words is one 'n-gram', itself whole."""
    if len(ws) < n:
        return [" ".join(ws)] if ws else []
    return list(dict.fromkeys(" ".join(ws[i : i + n]) for i in range(len(ws) - n + 1)))


@dataclass
class PromptCheck:
    """What the scan found for one prompt."""

    prompt: str
    ngrams: list[str]
    kind: str | None = None  # "verbatim", "whole prompt" or f"{NGRAM}-gram"; None: not found
    source: str | None = None  # of the first document found
    doc: int | None = None  # its index in the source's shard
    excerpt: str | None = None  # the first document's text around the match
    documents: int = 0  # training documents that hold the prompt or one of its n-grams
    ngrams_found: set = field(default_factory=set)

    @property
    def contaminated(self) -> bool:
        return self.kind is not None

    def as_dict(self) -> dict:
        return {"prompt": self.prompt, "contaminated": self.contaminated, "kind": self.kind, "source": self.source,
                "doc": self.doc, "documents": self.documents,
                "ngrams_found": len(self.ngrams_found), "ngrams": len(self.ngrams), "excerpt": self.excerpt}

    def describe(self) -> str:
        """One line for the report: where the prompt was found, or that it was not."""
        if not self.contaminated:
            return "not in the training documents"
        what = self.kind if self.kind in _RANK else f"{len(self.ngrams_found)} of its {len(self.ngrams)} {self.kind}s"
        more = f" and {self.documents - 1} more" if self.documents > 1 else ""
        return f"IN TRAINING DATA ({what}): {self.source} document {self.doc}{more}"


_RANK = {"verbatim": 0, "whole prompt": 1}


def check_prompts(prompts: list[str], documents: Iterable[tuple[str, int, str]], n: int = NGRAM) -> list[PromptCheck]:
    """Check every prompt against the documents (source, index, text), streamed; see the module
    docstring. The first document recorded for a prompt is the first of its strongest kind."""
    checks = [PromptCheck(p, ngrams(words(p), n)) for p in prompts]
    whole = [" ".join(words(p)) for p in prompts]
    for batch in _batches(documents):
        raw = "\0".join(t.replace("\0", " ") for _, _, t in batch)
        raw_starts = _starts(len(t) for _, _, t in batch)
        # the batch's words lower-cased, one space between them, a document's words between " \0 "
        # marks: what words() gives each document, made for the whole batch at once
        norm = " " + _NON_WORD.sub(" ", raw.lower()).replace("\0", " \0 ") + " "
        norm_starts = [0] + [m.start() + 1 for m in _DOC_MARK.finditer(norm)]
        for c, w in zip(checks, whole):
            hits: dict[int, tuple[str, str]] = {}  # batch document -> (kind, what was found) of its strongest hit
            for i, _ in _find_all(raw, c.prompt, raw_starts, whole_words=True):
                hits.setdefault(i, ("verbatim", c.prompt))
            for i, _ in _find_all(norm, f" {w} ", norm_starts):
                hits.setdefault(i, ("whole prompt", w))
            for g in c.ngrams:
                for i, _ in _find_all(norm, f" {g} ", norm_starts):
                    if g != w:
                        c.ngrams_found.add(g)
                        hits.setdefault(i, (f"{n}-gram", g))
            if not hits:
                continue
            c.documents += len(hits)
            i, (kind, found) = min(hits.items(), key=lambda kv: (_RANK.get(kv[1][0], 2), kv[0]))
            if c.kind is None or _RANK.get(kind, 2) < _RANK.get(c.kind, 2):
                source, doc, text = batch[i]
                c.kind, c.source, c.doc, c.excerpt = kind, source, int(doc), _excerpt(text, found)
    return checks


def _batches(documents: Iterable[tuple[str, int, str]]) -> Iterator[list[tuple[str, int, str]]]:
    batch, size = [], 0
    for d in documents:
        batch.append(d)
        size += len(d[2])
        if size >= BATCH_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _starts(lengths: Iterable[int]) -> list[int]:
    """Start of each document in the joined string (documents joined by one separator character)."""
    out, at = [], 0
    for n in lengths:
        out.append(at)
        at += n + 1
    return out


def _find_all(haystack: str, needle: str, starts: list[int], whole_words: bool = False) -> Iterator[tuple[int, int]]:
    """(document, position within it) of every occurrence of `needle`; with `whole_words`, only
    where it does not start or end inside a word ("define resonance" is not in "resonances")."""
    if not needle.strip():
        return
    at = haystack.find(needle)
    while at >= 0:
        end = at + len(needle)
        if not whole_words or not (
                (at > 0 and _is_word(haystack[at - 1]) and _is_word(needle[0]))
                or (end < len(haystack) and _is_word(haystack[end]) and _is_word(needle[-1]))):
            i = bisect.bisect_right(starts, at) - 1
            yield i, at - starts[i]
        at = haystack.find(needle, at + 1)


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _excerpt(text: str, found: str) -> str:
    """The document's text around the first occurrence of `found` (the prompt, or words of it)."""
    m = re.search(r"\W+".join(re.escape(w) for w in found.split()), text, re.IGNORECASE) if found.strip() else None
    pos, end = (m.start(), m.end()) if m else (0, 0)
    a, b = max(0, pos - EXCERPT_CHARS), min(len(text), end + EXCERPT_CHARS)
    return ("…" if a else "") + " ".join(text[a:b].split()) + ("…" if b < len(text) else "")


def shard_documents(shards: dict, token_bytes_table: list[bytes], heldout_every: int,
                    chunk_tokens: int = 1 << 20) -> Iterator[tuple[str, int, str]]:
    """(source, document index, text) of every training document of the shards (the held-out
    documents, which the model never trained on, left out), decoded a chunk of documents at a time.
    `token_bytes_table`: the bytes each token ID stands for (a BOS stands for none)."""
    lengths = np.array([len(b) for b in token_bytes_table], dtype=np.int64)
    flat = np.frombuffer(b"".join(token_bytes_table), dtype=np.uint8)  # every ID's bytes end to end
    first = np.cumsum(lengths) - lengths  # where each ID's bytes start in `flat`
    for name in sorted(shards):
        sh = shards[name]
        offsets = np.asarray(sh.offsets, dtype=np.int64)
        d = 0
        while d < sh.n_docs:
            e = int(np.searchsorted(offsets, offsets[d] + chunk_tokens, side="right")) - 1
            e = min(max(e, d + 1), sh.n_docs)  # at least one document, however long
            ids = np.asarray(sh.tokens[offsets[d] : offsets[e]]).astype(np.int64)
            n = lengths[ids]
            at = np.cumsum(n) - n  # where each token's bytes go in the chunk's text
            # decoded by one gather: byte j of the chunk is flat[first[id] + j - at[token]]
            data = flat[np.arange(int(n.sum())) + np.repeat(first[ids] - at, n)].tobytes()
            ends = np.concatenate([[0], np.cumsum(n)])[offsets[d : e + 1] - offsets[d]]
            for k in range(d, e):
                if not is_heldout(k, heldout_every):
                    yield name, k, data[ends[k - d] : ends[k - d + 1]].decode("utf-8", "replace")
            d = e
