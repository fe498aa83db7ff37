"""Token shards (the original's `.btok`): per source a flat uint16 token file plus document
offsets, and a memory-mapped reader the trainer draws windows from.

Layout of one source:
    <source>.tokens.bin    uint16, little-endian: BOS doc0 BOS doc1 ... (each document led by BOS)
    <source>.offsets.bin   uint64, little-endian, n_docs + 1 entries: offsets[i] is the index of
                           document i's BOS, offsets[n_docs] the total token count
    <source>.shard.json    source, tokenizer hash, n_docs, n_tokens, sizes and SHA-256 of both files
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from andrea.io import Manifest, atomic_path, progress, sha256_file, write_json_atomic
from andrea.megachat import render_document
from andrea.parallel import ordered_map
from andrea.tokenizer import BOS, HarrisTokenizer, load_segments_file

log = logging.getLogger("andrea.shards")

SHARD_FORMAT = "andrea-shard/1"


class ShardError(ValueError):
    """A shard that does not match its manifest (truncated, edited, or from another tokenizer)."""


def shard_paths(directory: str | Path, source: str) -> dict[str, Path]:
    d = Path(directory)
    return {"tokens": d / f"{source}.tokens.bin", "offsets": d / f"{source}.offsets.bin", "manifest": d / f"{source}.shard.json"}


class Shard:
    """A source's tokens, memory-mapped. Opening checks both files against the shard manifest:
    their sizes always, their SHA-256 unless `verify_hash=False`."""

    def __init__(self, directory: str | Path, source: str, verify_hash: bool = True, tokenizer_hash: str | None = None):
        self.paths = shard_paths(directory, source)
        try:
            self.meta = json.loads(self.paths["manifest"].read_text())
        except FileNotFoundError:
            raise ShardError(f"{self.paths['manifest']}: missing shard manifest (run the encode stage)") from None
        if self.meta.get("format") != SHARD_FORMAT:
            raise ShardError(f"{self.paths['manifest']}: format {self.meta.get('format')!r}, expected {SHARD_FORMAT!r}")
        if tokenizer_hash and self.meta["tokenizer_hash"] != tokenizer_hash:
            raise ShardError(
                f"{self.paths['tokens']}: encoded with tokenizer {self.meta['tokenizer_hash'][:12]}, "
                f"not {tokenizer_hash[:12]}; re-run encode for this tokenizer"
            )
        for kind, itemsize, count in (("tokens", 2, self.meta["n_tokens"]), ("offsets", 8, self.meta["n_docs"] + 1)):
            p = self.paths[kind]
            if not p.exists():
                raise ShardError(f"{p}: missing (the manifest {self.paths['manifest'].name} expects it)")
            size = p.stat().st_size
            if size != itemsize * count:
                raise ShardError(f"{p}: {size} bytes, but its manifest says {itemsize * count} ({count} entries); truncated or overwritten")
            if verify_hash and sha256_file(p) != self.meta[f"{kind}_sha256"]:
                raise ShardError(f"{p}: SHA-256 differs from its manifest; the file was modified")
        self.source = source
        self.n_docs = self.meta["n_docs"]
        self.n_tokens = self.meta["n_tokens"]
        self.tokens = np.memmap(self.paths["tokens"], dtype="<u2", mode="r") if self.n_tokens else np.zeros(0, "<u2")
        self.offsets = np.fromfile(self.paths["offsets"], dtype="<u8")

    def doc(self, i: int) -> np.ndarray:
        """Tokens of document i, without its BOS."""
        if not 0 <= i < self.n_docs:
            raise IndexError(f"{self.source}: document {i} out of range 0..{self.n_docs - 1}")
        return self.tokens[self.offsets[i] + 1 : self.offsets[i + 1]]

    def window(self, i: int, T: int, heldout_every: int = 0) -> tuple[np.ndarray, int]:
        """T + 1 tokens starting at document i's BOS (inputs are [:T], targets [1:]), running on
        into the following documents and wrapping round to the shard's start; with the doc index.
        With `heldout_every`, the held-out documents (andrea.curriculum.is_heldout) are stepped
        over: a training row never reads a token of one."""
        if not 0 <= i < self.n_docs:
            raise IndexError(f"{self.source}: document {i} out of range 0..{self.n_docs - 1}")
        every = heldout_every if heldout_every > 0 and self.n_docs >= heldout_every else 0
        need = T + 1
        out = np.empty(need, dtype=np.uint16)
        got, d, lap = 0, i, 0
        while got < need:
            # documents d .. end-1 are contiguous training text (up to the next held-out one, or the end)
            end = self.n_docs if not every else min(self.n_docs, d + (every - 1 - d % every))
            a, b = int(self.offsets[d]), int(self.offsets[end])
            take = min(need - got, b - a)
            out[got : got + take] = self.tokens[a : a + take]
            got += take
            d = end + 1 if every and end < self.n_docs else end  # step over the held-out document
            if d >= self.n_docs:  # round to the shard's start
                d, lap = 0, lap + 1
                if lap > 1 and got == 0:
                    raise ValueError(f"{self.source}: no training text outside the held-out documents")
        return out, i


# --------------------------------------------------------------------------- encoding stage

_worker_tok: HarrisTokenizer | None = None


def _init_worker(segments: list[str], vocab_size: int) -> None:
    global _worker_tok
    _worker_tok = HarrisTokenizer(segments, vocab_size)


def _encode_batch(job: tuple[str, list[str]]) -> tuple[str, np.ndarray, np.ndarray]:
    """Tokens of a batch of one source's documents (each led by BOS) and each one's length."""
    source, texts = job
    parts = [_worker_tok.encode(t) for t in texts]
    lengths = np.array([len(p) + 1 for p in parts], dtype=np.uint64)
    bos = np.array([BOS], dtype=np.uint16)
    flat = np.concatenate([x for p in parts for x in (bos, p)]) if parts else np.zeros(0, np.uint16)
    return source, flat, lengths


def _source_rows(megachat_path, source: str, batch_rows: int = 4096):
    """Rows of one source, streamed: the row groups whose `source` statistics cannot hold it are
    skipped (prep writes the sources one after another), the others read a batch at a time. Not
    pyarrow.dataset's filtered scan: its read-ahead held ~1 GB at a quarter of the real profile."""
    pf = pq.ParquetFile(megachat_path)
    col = pf.schema_arrow.get_field_index("source")
    for i in range(pf.metadata.num_row_groups):
        stats = pf.metadata.row_group(i).column(col).statistics
        if stats is not None and stats.has_min_max and not (stats.min <= source <= stats.max):
            continue
        for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[i]):
            yield from batch.filter(pc.equal(batch.column("source"), source)).to_pylist()


def _batches(megachat_path, sources: list[str], mcfg: dict, size: int = 256):
    for source in sources:
        batch = []
        for row in _source_rows(megachat_path, source):
            batch.append(render_document(row["turns"], row["text"], mcfg))
            if len(batch) == size:
                yield source, batch
                batch = []
        if batch:
            yield source, batch


class _ShardWriter:
    """Writes one source's two files under temporary names; `close` renames them into place and
    writes the shard manifest last, so a shard with a manifest is always complete."""

    def __init__(self, out_dir: Path, source: str, tok_hash: str, vocab_size: int):
        self.paths = shard_paths(out_dir, source)
        self.source, self.tok_hash, self.vocab_size = source, tok_hash, vocab_size
        self._stack = contextlib.ExitStack()
        self._tmp_tok = self._stack.enter_context(atomic_path(self.paths["tokens"]))
        self._tmp_off = self._stack.enter_context(atomic_path(self.paths["offsets"]))
        self._ft = open(self._tmp_tok, "wb")
        self._fo = open(self._tmp_off, "wb")
        self.n_docs = self.n_tokens = 0

    def write(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        starts = self.n_tokens + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.uint64)
        self._fo.write(starts.astype("<u8").tobytes())
        self._ft.write(flat.astype("<u2").tobytes())
        self.n_tokens += int(lengths.sum())
        self.n_docs += len(lengths)

    def close(self) -> dict:
        self._fo.write(np.array([self.n_tokens], dtype="<u8").tobytes())
        self._ft.close()
        self._fo.close()
        self._stack.close()  # renames both files into place
        meta = {
            "format": SHARD_FORMAT,
            "source": self.source,
            "tokenizer_hash": self.tok_hash,
            "vocab_size": self.vocab_size,
            "n_docs": self.n_docs,
            "n_tokens": self.n_tokens,
            "tokens_sha256": sha256_file(self.paths["tokens"]),
            "offsets_sha256": sha256_file(self.paths["offsets"]),
        }
        write_json_atomic(self.paths["manifest"], meta)
        return meta

    def abort(self) -> None:
        self._ft.close()
        self._fo.close()
        self._stack.__exit__(RuntimeError, RuntimeError("aborted"), None)


def encode_shards(
    megachat_path: str | Path,
    segments_path: str | Path,
    out_dir: str | Path,
    sources: list[str],
    mcfg: dict,
    version: str,
    workers: int = 1,
) -> dict:
    """Run the stage: one shard per source (an empty one for a source with no documents) and
    manifest.json. Documents are rendered as in training and encoded in `workers` processes;
    the files are the same whatever their number."""
    out_dir = Path(out_dir)
    seg = load_segments_file(segments_path)
    segments = [s["text"] for s in seg["segments"]]
    tok_hash = seg["tokenizer_hash"]
    manifest = Manifest("encode", version, {"sources": sources, "megachat": mcfg, "tokenizer_hash": tok_hash})
    manifest.add_input(megachat_path)
    manifest.add_input(segments_path)
    counts = {}
    writer: _ShardWriter | None = None

    def finish(w: _ShardWriter) -> None:
        meta = w.close()
        counts[w.source] = {"n_docs": meta["n_docs"], "n_tokens": meta["n_tokens"]}
        manifest.add_output(w.paths["tokens"], n_tokens=meta["n_tokens"])
        manifest.add_output(w.paths["offsets"], n_docs=meta["n_docs"])
        log.info("encode: %-18s %8d documents %11d tokens", w.source, meta["n_docs"], meta["n_tokens"])

    results = ordered_map(_encode_batch, _batches(megachat_path, sources, mcfg), workers, _init_worker, (segments, seg["vocab_size"]))
    try:
        for source, flat, lengths in progress(results, desc="encode", unit=" batches"):
            if writer is None or writer.source != source:
                if writer is not None:
                    finish(writer)
                writer = _ShardWriter(out_dir, source, tok_hash, seg["vocab_size"])
            writer.write(flat, lengths)
        if writer is not None:
            finish(writer)
            writer = None
    finally:
        if writer is not None:
            writer.abort()
    for source in sources:  # sources with no documents still get an (empty) shard
        if source not in counts:
            finish(_ShardWriter(out_dir, source, tok_hash, seg["vocab_size"]))
    counts = {s: counts[s] for s in sources}
    manifest.data["counts"] = {"per_source": counts, "n_tokens": sum(c["n_tokens"] for c in counts.values())}
    manifest.write(out_dir / "manifest.json")
    return counts


def write_model_shards(model: str, encode_manifest: str | Path, out: str | Path) -> dict:
    """results/<model>/shards.json: the shard directory, tokenizer and per-source counts a
    model trains on (what the trainer reads to find its data)."""
    m = json.loads(Path(encode_manifest).read_text())
    doc = {
        "model": model,
        "shard_dir": str(Path(encode_manifest).parent),
        "tokenizer_hash": m["params"]["tokenizer_hash"],
        "segments": next(i["path"] for i in m["inputs"] if i["path"].endswith("harris_segments.json")),
        "sources": m["counts"]["per_source"],
    }
    write_json_atomic(out, doc)
    return doc
