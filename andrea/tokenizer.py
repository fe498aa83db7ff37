"""Harris morpheme tokenizer (design §4): training by successor/predecessor variety, exact encoding.

Vocabulary: IDs 0–255 are raw UTF-8 bytes, 256 is BOS, 257… are the learned segments.

Training (Harris 1955; Hafer & Weiss 1974). Inside a word, the number of distinct letters that can
follow a prefix (its *successor variety*) falls as the prefix grows and jumps again at a morpheme
boundary: after "un" many letters follow, after "unbeliev" almost only "a", after "unbelievable"
the word may end or take a suffix. Predecessor variety is the same read right to left. Over the
word types of a sample we count both, cut each word where either variety peaks (peak-and-plateau,
above a noise floor), and collect the pieces with the frequency of the words they came from. A word that is cut but
frequent (`whole_word_min_count`) is also a candidate as a whole (decision: it raised held-out
bytes/token from 3.07 to 3.37 at N = 4096 in bench/tokenizer_compare.py).
Whitespace and punctuation runs (e.g. the "\\n\\n< " of a chat turn) are candidates too. The N
candidates that save the most bytes (frequency × (UTF-8 length − 1)) become the segments.

Encoding is greedy longest match from the left with single-byte fallback, so every string
round-trips: `decode(encode(s)) == s`, lone surrogates included (they are carried as their
"surrogatepass" bytes, deliberately). The longest match is found by one compiled regular
expression shaped like the segment trie (each trie node an alternation of its children, optional
where a segment ends): the regex engine's backtracking tries the deepest match first, so the
first match it returns at a position is the longest segment there, and positions where nothing
matches fall through to bytes. The scan runs in C; Python only maps matches to IDs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from andrea.io import Manifest, read_document, write_json_atomic
from andrea.megachat import iter_megachat, render_document

log = logging.getLogger("andrea.tokenizer")

N_BYTES = 256
BOS = 256
FIRST_SEGMENT = 257
SEGMENTS_FORMAT = "andrea-harris-segments/1"

# Pre-split used for counting candidates: words with their leading space, digit runs,
# punctuation runs with their trailing space, whitespace runs.
CHUNK = re.compile(r" ?[^\W\d_]+| ?\d{1,3}|[^\w\s]+ ?|\s+")
LETTERS = re.compile(r"[^\W\d_]+")


# --------------------------------------------------------------------------- encoding


def trie_pattern(segments: list[str], escape=re.escape) -> str:
    """A regex whose leftmost match at any position is the longest segment starting there (each
    trie node an alternation of its children, optional where a segment ends, so backtracking tries
    the deepest match first). `escape` quotes one character for the regex dialect: Python's `re`
    here, Oniguruma for the exported Hugging Face tokenizer (andrea/export.py)."""
    trie: dict = {}
    for s in segments:
        node = trie
        for ch in s:
            node = node.setdefault(ch, {})
        node[""] = True

    def build(node: dict) -> str:
        alts = [escape(ch) + build(child) for ch, child in sorted((k, v) for k, v in node.items() if k)]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{body})?" if "" in node else body

    return "|".join(re.escape(ch) + build(child) for ch, child in sorted(trie.items()))


class HarrisTokenizer:
    """Encoder/decoder for a list of segments (ID 257 + i is segments[i])."""

    def __init__(self, segments: list[str], vocab_size: int | None = None):
        self.segments = list(segments)
        if len(set(self.segments)) != len(self.segments):
            raise ValueError("segments must be distinct")
        for s in self.segments:
            if len(s.encode("utf-8", "surrogatepass")) < 2:
                raise ValueError(f"segment {s!r} is a single byte: bytes are tokens already")
        self.vocab_size = vocab_size if vocab_size is not None else FIRST_SEGMENT + len(self.segments)
        if self.vocab_size < FIRST_SEGMENT + len(self.segments):
            raise ValueError(f"vocab_size {self.vocab_size} is smaller than 257 + {len(self.segments)} segments")
        if self.vocab_size > 1 << 16:
            raise ValueError("vocab_size must fit uint16 token files")
        self._ids = {s: FIRST_SEGMENT + i for i, s in enumerate(self.segments)}
        self._bytes = [bytes([i]) for i in range(N_BYTES)] + [b""] + [s.encode("utf-8") for s in self.segments]
        self._bytes += [b""] * (self.vocab_size - len(self._bytes))  # unused IDs of an unsaturated vocabulary
        self._splitter = re.compile("(" + trie_pattern(self.segments) + ")") if self.segments else None

    @property
    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes each ID stands for (1 for a byte, 0 for BOS): bits-per-byte's denominator."""
        return np.array([len(b) for b in self._bytes], dtype=np.int64)

    @property
    def hash(self) -> str:
        """Identity of the vocabulary: changes whenever any ID would mean something else."""
        return tokenizer_hash(self.segments, self.vocab_size)

    def encode(self, text: str) -> np.ndarray:
        """Token IDs (uint16) of `text`, greedy longest match with byte fallback. No BOS."""
        if self._splitter is None:
            return np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8).astype(np.uint16)
        parts = self._splitter.split(text)  # [gap, segment, gap, segment, ..., gap]
        ids: list[int] = []
        extend, append, seg = ids.extend, ids.append, self._ids
        for gap, s in zip(parts[0::2], parts[1::2]):
            if gap:
                extend(gap.encode("utf-8", "surrogatepass"))
            append(seg[s])
        if parts[-1]:
            extend(parts[-1].encode("utf-8", "surrogatepass"))
        return np.array(ids, dtype=np.uint16)

    def encode_documents(self, texts: list[str]) -> np.ndarray:
        """Documents concatenated, each preceded by BOS."""
        pieces = []
        bos = np.array([BOS], dtype=np.uint16)
        for t in texts:
            pieces += [bos, self.encode(t)]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint16)

    def decode_bytes(self, ids) -> bytes:
        table = self._bytes
        return b"".join([table[i] for i in np.asarray(ids).tolist()])

    def decode(self, ids, errors: str = "surrogatepass") -> str:
        """Text of `ids`; BOS decodes to nothing. With the default `errors`, the exact inverse of
        encode(); use errors="replace" for model samples, whose bytes need not be valid UTF-8."""
        return self.decode_bytes(ids).decode("utf-8", errors)

    @classmethod
    def load(cls, path: str | Path) -> "HarrisTokenizer":
        data = load_segments_file(path)
        return cls([s["text"] for s in data["segments"]], vocab_size=data["vocab_size"])


def tokenizer_hash(segments: list[str], vocab_size: int) -> str:
    blob = json.dumps({"format": SEGMENTS_FORMAT, "vocab_size": vocab_size, "segments": segments}, ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def load_segments_file(path: str | Path) -> dict:
    path = Path(path)
    data = read_document(path, "segments file (run the train_tokenizer stage)")
    if data.get("format") != SEGMENTS_FORMAT:
        raise ValueError(f"{path}: format is {data.get('format')!r}, expected {SEGMENTS_FORMAT!r}")
    segs = [s["text"] for s in data["segments"]]
    if tokenizer_hash(segs, data["vocab_size"]) != data["tokenizer_hash"]:
        raise ValueError(f"{path}: tokenizer_hash does not match its segments (edited or corrupted file)")
    return data


# --------------------------------------------------------------------------- training


def doc_unit(content_hash: str) -> float:
    """A document's fixed pseudo-random number in [0, 1): sampling decisions depend on content
    only, so they are the same whatever the order or the machine."""
    return int(content_hash[:12], 16) / float(1 << 48)


@dataclass
class Sample:
    texts: list[str] = field(default_factory=list)
    heldout: list[str] = field(default_factory=list)
    per_source: dict = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        h = hashlib.sha256()
        for t in self.texts:
            h.update(t.encode("utf-8", "surrogatepass") + b"\x00")
        return h.hexdigest()


def curriculum_sample(megachat_path: str | Path, weights: dict[str, float], sample_chars: int, heldout_fraction: float, mcfg: dict) -> Sample:
    """Documents sampled so that each source's share of the sample's characters follows its
    curriculum weight (as far as the source has text). Two streaming passes: count characters per
    source, then keep each document with its source's inclusion probability.

    The held-out documents (a `heldout_fraction` slice by content hash, never sampled) are measured
    on at most about `sample_chars` characters: on a large corpus an evenly spread part of the slice,
    chosen by content hash too, so the stage's memory and time do not grow with the corpus."""
    totals: Counter = Counter()
    for row in iter_megachat(megachat_path):
        totals[row["source"]] += len(render_document(row["turns"], row["text"], mcfg))
    active = {s: w for s, w in weights.items() if w > 0 and totals.get(s)}
    wsum = sum(active.values()) or 1.0
    prob = {s: min(1.0, sample_chars * w / wsum / (totals[s] * (1 - heldout_fraction))) for s, w in active.items()}
    heldout_total = heldout_fraction * sum(totals[s] for s in active)
    measured = 1 - heldout_fraction * min(1.0, sample_chars / heldout_total) if heldout_total else 1.0
    sample = Sample()
    chars: Counter = Counter()
    for row in iter_megachat(megachat_path):
        src = row["source"]
        u = doc_unit(row["content_hash"])
        if u >= 1 - heldout_fraction:
            if src in active and u >= measured:  # the held-out slice's last (at most sample_chars) part
                sample.heldout.append(render_document(row["turns"], row["text"], mcfg))
            continue
        if src in prob and u < prob[src] * (1 - heldout_fraction):
            text = render_document(row["turns"], row["text"], mcfg)
            sample.texts.append(text)
            chars[src] += len(text)
    total = sum(chars.values()) or 1
    sample.per_source = {
        s: {"weight": weights.get(s, 0.0), "available_chars": totals[s], "sampled_chars": chars[s], "share": round(chars[s] / total, 4)}
        for s in sorted(totals)
    }
    return sample


def variety(types: list[str]) -> tuple[Counter, Counter]:
    """Successor variety of every prefix and predecessor variety of every suffix of `types`:
    the number of distinct letters that follow (precede) it, the end (start) of a word counting
    as one more. A prefix's distinct one-letter extensions are exactly the distinct prefixes one
    letter longer, so counting those needs no trie."""
    prefixes = {w[:i] for w in types for i in range(1, len(w) + 1)}
    suffixes = {w[i:] for w in types for i in range(len(w))}
    sv: Counter = Counter(p[:-1] for p in prefixes)
    pv: Counter = Counter(s[1:] for s in suffixes)
    sv.update(types)  # end of word
    pv.update(types)  # start of word
    return sv, pv


def _peaks(values: list[int], floor: int) -> set[int]:
    """Indexes that are a peak or the start of a plateau above `floor`."""
    out = set()
    for i in range(1, len(values) - 1):
        if values[i] >= floor and values[i] > values[i - 1] and values[i] >= values[i + 1]:
            out.add(i)
    return out


def cut_word(w: str, sv: Counter, pv: Counter, min_variety: int, min_piece: int) -> list[str]:
    """Cut a word at successor- or predecessor-variety peaks (boundary i sits before w[i])."""
    n = len(w)
    if n < 2 * min_piece:
        return [w]
    svs = [sv[w[:i]] for i in range(n + 1)]  # svs[i]: variety after the first i letters
    pvs = [pv[w[i:]] for i in range(n + 1)]  # pvs[i]: variety before the last n-i letters
    cuts = sorted(i for i in _peaks(svs, min_variety) | _peaks(pvs, min_variety) if min_piece <= i <= n - min_piece)
    pieces, start = [], 0
    for c in cuts:
        if c - start >= min_piece:
            pieces.append(w[start:c])
            start = c
    pieces.append(w[start:])
    return pieces


def learn_segments(texts: list[str], n_segments: int, tcfg: dict) -> tuple[list[tuple[str, int]], dict, set[str]]:
    """The N best segments of `texts` with their counts, statistics for the report, and which of
    the segments are whole words: a word of letters that the sample holds as a chunk of its own
    after a space (with the space, or without it where it also occurs so), not only as a piece of
    longer words."""
    chunks: Counter = Counter()
    for t in texts:
        chunks.update(CHUNK.findall(t))
    words: Counter = Counter()
    for c, n in chunks.items():
        if LETTERS.fullmatch(c.lstrip(" ")):
            words[c.lstrip(" ")] += n
    sv, pv = variety(list(words))
    cache: dict[str, list[str]] = {}
    candidates: Counter = Counter()
    whole_word_min = tcfg["whole_word_min_count"] or float("inf")
    n_cut = 0
    for c, n in chunks.items():
        core = c.lstrip(" ")
        if LETTERS.fullmatch(core):
            pieces = cache.get(core)
            if pieces is None:
                pieces = cache[core] = cut_word(core, sv, pv, tcfg["min_variety"], tcfg["min_piece_chars"])
                n_cut += len(pieces) > 1
            if c != core:
                pieces = [c[: len(c) - len(core)] + pieces[0], *pieces[1:]]
            for p in pieces:
                candidates[p] += n
            if len(pieces) > 1 and n >= whole_word_min:
                candidates[c] += n  # a frequent word is worth a segment of its own too
        else:
            candidates[c] += n
    useful = {
        s: n for s, n in candidates.items()
        if len(s.encode("utf-8")) >= 2 and len(s) <= tcfg["max_segment_chars"]
    }
    ranked = sorted(useful.items(), key=lambda kv: (-kv[1] * (len(kv[0].encode("utf-8")) - 1), kv[0]))
    stats = {
        "chunk_types": len(chunks),
        "word_types": len(words),
        "words_cut": n_cut,
        "candidates": len(useful),
    }
    ranked = ranked[:n_segments]
    # a word chunk led by a space, or one also seen so (a word at a line's start): "re" of "you're"
    # and "th" of "4th" are chunks of their own too, but never words after a space
    whole = {seg for seg, _ in ranked if seg in chunks and LETTERS.fullmatch(seg.lstrip(" "))
             and (seg.startswith(" ") or " " + seg in chunks)}
    return ranked, stats, whole


def measure(tok: HarrisTokenizer, texts: list[str]) -> dict:
    """Bytes per token and the share of bytes covered by segments (not byte fallback)."""
    n_bytes = n_tokens = seg_bytes = 0
    lengths = np.array([len(b) for b in tok._bytes])
    for t in texts:
        ids = tok.encode(t)
        n_bytes += len(t.encode("utf-8", "surrogatepass"))
        n_tokens += len(ids)
        seg = ids[ids >= FIRST_SEGMENT]
        seg_bytes += int(lengths[seg].sum())
    return {
        "bytes": n_bytes,
        "tokens": n_tokens,
        "bytes_per_token": round(n_bytes / max(1, n_tokens), 4),
        "segment_coverage": round(seg_bytes / max(1, n_bytes), 4),
        "byte_fallback_share": round(1 - seg_bytes / max(1, n_bytes), 4),
    }


def no_sample_reason(megachat_path: str | Path, weights: dict[str, float], sample: Sample) -> str:
    """Why the tokenizer's sample is empty, in terms of what the user can change: the weights,
    the shape filter (its report next to the corpus says what it removed), or the sources."""
    megachat_path = Path(megachat_path)
    have = {s: v["available_chars"] for s, v in sample.per_source.items() if v["available_chars"]}
    if have and not any(weights.get(s, 0) > 0 for s in have):
        return (
            f"{megachat_path}: no documents to learn segments from: the sources that have documents "
            f"({', '.join(sorted(have))}) all have weight 0 (sources.<name>.weight in the config)"
        )
    if have:
        return (
            f"{megachat_path}: no documents to learn segments from: the few documents of "
            f"{', '.join(sorted(have))} all fall in the held-out slice (tokenizer.heldout_fraction)"
        )
    report_path = megachat_path.parent / "report.json"
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
        per_source = {s: c for s, c in report["per_source"].items() if c["read"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"{megachat_path}: no documents to learn segments from: the corpus is empty"
    if not per_source:
        return (
            f"{megachat_path}: no documents to learn segments from: every source was empty before "
            f"the shape filter too ({report_path} counts nothing read); check the sources' locations"
        )
    lost = "; ".join(
        f"{s}: {c['read']} read, {c['dropped_shape']} system-prompt-shaped, {c['dropped_empty']} without a user and an assistant turn"
        for s, c in sorted(per_source.items())
    )
    return (
        f"{megachat_path}: no documents to learn segments from: filter_shape removed every document "
        f"({lost}). See {report_path} and removed_examples.jsonl beside it; raise "
        f"filter_shape.threshold (now {report.get('threshold')}) if it removes what it should keep."
    )


def train_tokenizer(megachat_path: str | Path, out_dir: str | Path, n_segments: int, config: dict, version: str) -> dict:
    """Run the stage: <out_dir>/harris_segments.json, saturation.json, manifest.json."""
    out_dir = Path(out_dir)
    tcfg = config["tokenizer"]
    weights = {name: s["weight"] for name, s in config["sources"].items() if s["enabled"]}
    params = {"n_segments": n_segments, "tokenizer": tcfg, "weights": weights, "megachat": config["megachat"]}
    manifest = Manifest("train_tokenizer", version, params)
    manifest.add_input(megachat_path)

    sample = curriculum_sample(megachat_path, weights, tcfg["sample_chars"], tcfg["heldout_fraction"], config["megachat"])
    if not sample.texts:
        raise ValueError(no_sample_reason(megachat_path, weights, sample))
    log.info("train_tokenizer: sample of %d documents, %d chars", len(sample.texts), sum(map(len, sample.texts)))
    ranked, stats, whole = learn_segments(sample.texts, n_segments, tcfg)
    vocab = FIRST_SEGMENT + n_segments
    tok = HarrisTokenizer([s for s, _ in ranked], vocab_size=vocab)
    on_sample = measure(tok, sample.texts)
    on_heldout = measure(tok, sample.heldout) if sample.heldout else None
    saturation = {
        "n_requested": n_segments,
        "n_candidates": stats["candidates"],
        "n_kept": len(ranked),
        "saturated": stats["candidates"] < n_segments,
        "unused_ids": n_segments - len(ranked),
        "candidate_ratio": round(stats["candidates"] / n_segments, 3),
        **stats,
        "sample": on_sample,
        "heldout": on_heldout,
        "per_source": sample.per_source,
    }
    doc = {
        "format": SEGMENTS_FORMAT,
        "n_segments": n_segments,
        "vocab_size": vocab,
        "bos_id": BOS,
        "first_segment_id": FIRST_SEGMENT,
        "tokenizer_hash": tok.hash,
        "parameters": params,
        "sample": {"sha256": sample.sha256, "documents": len(sample.texts), "chars": sum(map(len, sample.texts))},
        # word: the segment is a whole word of the sample (the geometry views colour tokens by it)
        "segments": [{"id": FIRST_SEGMENT + i, "text": s, "count": n, "word": s in whole} for i, (s, n) in enumerate(ranked)],
    }
    write_json_atomic(out_dir / "harris_segments.json", doc)
    write_json_atomic(out_dir / "saturation.json", saturation)
    manifest.add_output(out_dir / "harris_segments.json", segments=len(ranked))
    manifest.add_output(out_dir / "saturation.json")
    manifest.data["counts"] = {"segments": len(ranked), "candidates": stats["candidates"], "sample_documents": len(sample.texts)}
    manifest.write(out_dir / "manifest.json")
    log.info(
        "train_tokenizer: N=%d, %d candidates%s; sample %.3f bytes/token (%.1f%% in segments)%s",
        n_segments, stats["candidates"], " (SATURATED: fewer candidates than N)" if saturation["saturated"] else "",
        on_sample["bytes_per_token"], 100 * on_sample["segment_coverage"],
        f"; held-out {on_heldout['bytes_per_token']:.3f} bytes/token" if on_heldout else "",
    )
    return saturation
