import json

import numpy as np
import pytest

from andrea.io import AtomicParquetWriter
from andrea.megachat import MEGACHAT_SCHEMA, content_hash, render_document
from andrea.shards import Shard, ShardError, encode_shards, shard_paths
from andrea.tokenizer import BOS, HarrisTokenizer, SEGMENTS_FORMAT, tokenizer_hash

SEGS = [" the", "ing", "\n\n", "> ", "< ", " is", "er"]


@pytest.fixture
def setup(tmp_path):
    docs = [
        {"source": "chat", "doc_id": "c1", "turns": [{"role": "user", "text": "What is the time?"}, {"role": "assistant", "text": "Evening."}], "text": None},
        {"source": "books", "doc_id": "b1", "turns": None, "text": "The miller is walking."},
        {"source": "chat", "doc_id": "c2", "turns": [{"role": "user", "text": "Sing?"}, {"role": "assistant", "text": "La la 😀"}], "text": None},
        {"source": "books", "doc_id": "b2", "turns": None, "text": "Another book, longer than the first one."},
    ]
    for d in docs:
        d["content_hash"] = content_hash(d["turns"], d["text"])
    mc = tmp_path / "megachat.parquet"
    with AtomicParquetWriter(mc, MEGACHAT_SCHEMA) as w:
        for d in docs:
            w.write(d)
    seg_path = tmp_path / "harris_segments.json"
    vocab = 257 + 16
    seg_path.write_text(json.dumps({
        "format": SEGMENTS_FORMAT, "vocab_size": vocab, "tokenizer_hash": tokenizer_hash(SEGS, vocab),
        "segments": [{"id": 257 + i, "text": s, "count": 1} for i, s in enumerate(SEGS)],
    }))
    return mc, seg_path, docs


def test_shards_round_trip_and_windows(setup, tmp_path):
    mc, seg_path, docs = setup
    counts = encode_shards(mc, seg_path, tmp_path / "out", ["chat", "books", "empty"], {}, "v", workers=1)
    assert counts["chat"]["n_docs"] == 2 and counts["books"]["n_docs"] == 2 and counts["empty"] == {"n_docs": 0, "n_tokens": 0}
    tok = HarrisTokenizer.load(seg_path)
    chat = Shard(tmp_path / "out", "chat", tokenizer_hash=tok.hash)
    for i, d in enumerate(d for d in docs if d["source"] == "chat"):
        assert tok.decode(chat.doc(i)) == render_document(d["turns"], d["text"])
    assert chat.tokens[chat.offsets[0]] == BOS and chat.tokens[chat.offsets[1]] == BOS
    assert chat.offsets[-1] == chat.n_tokens
    # a window starts at the document's BOS, runs into the next document and wraps round
    w, i = chat.window(1, 2 * chat.n_tokens)
    assert i == 1 and len(w) == 2 * chat.n_tokens + 1 and w[0] == BOS
    assert w[: chat.n_tokens - chat.offsets[1]].tolist() == chat.tokens[chat.offsets[1]:].tolist()
    assert w[chat.n_tokens - chat.offsets[1]] == BOS  # wrapped to document 0
    with pytest.raises(IndexError, match="out of range"):
        chat.doc(2)
    assert Shard(tmp_path / "out", "empty").n_docs == 0


def test_encoding_is_deterministic_across_worker_counts(setup, tmp_path):
    mc, seg_path, _ = setup
    encode_shards(mc, seg_path, tmp_path / "one", ["chat", "books"], {}, "v", workers=1)
    encode_shards(mc, seg_path, tmp_path / "two", ["chat", "books"], {}, "v", workers=2)
    for src in ("chat", "books"):
        for kind in ("tokens", "offsets", "manifest"):
            assert shard_paths(tmp_path / "one", src)[kind].read_bytes() == shard_paths(tmp_path / "two", src)[kind].read_bytes()


@pytest.mark.parametrize("damage, message", [
    (lambda p: p["tokens"].write_bytes(p["tokens"].read_bytes()[:-2]), "truncated or overwritten"),
    (lambda p: p["offsets"].write_bytes(p["offsets"].read_bytes() + b"\0" * 8), "truncated or overwritten"),
    (lambda p: p["tokens"].write_bytes(b"\x01\x01" + p["tokens"].read_bytes()[2:]), "SHA-256 differs"),
    (lambda p: p["tokens"].unlink(), "missing"),
    (lambda p: p["manifest"].unlink(), "missing shard manifest"),
])
def test_damaged_shards_are_refused(setup, tmp_path, damage, message):
    mc, seg_path, _ = setup
    encode_shards(mc, seg_path, tmp_path / "out", ["chat"], {}, "v")
    damage(shard_paths(tmp_path / "out", "chat"))
    with pytest.raises(ShardError, match=message):
        Shard(tmp_path / "out", "chat")


def test_shard_from_another_tokenizer_is_refused(setup, tmp_path):
    mc, seg_path, _ = setup
    encode_shards(mc, seg_path, tmp_path / "out", ["chat"], {}, "v")
    with pytest.raises(ShardError, match="re-run encode"):
        Shard(tmp_path / "out", "chat", tokenizer_hash="0" * 64)


def test_training_windows_never_read_a_held_out_document():
    """A row runs on from its document into the next ones, and wraps round the shard; with
    heldout_every it steps over the held-out documents, so validation never scores trained text."""
    from andrea.shards import Shard

    class Synthetic(Shard):  # document d's tokens are all d (no files needed)
        def __init__(self, lengths):
            self.source, self.n_docs = "s", len(lengths)
            self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint64)
            self.tokens = np.repeat(np.arange(len(lengths), dtype=np.uint16), lengths)
            self.n_tokens = len(self.tokens)

    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(500):
        n, every, T = int(rng.integers(1, 90)), int(rng.integers(0, 8)), int(rng.integers(1, 300))
        lengths = rng.integers(1, 25, n)
        held = lambda d: every > 0 and n >= every and d % every == every - 1  # noqa: E731
        i = int(rng.integers(0, n))
        if held(i):
            continue
        want, order = [], list(range(i, n))  # by hand: the training documents from i on, round and round
        while len(want) < T + 1:
            want += [d for d in order if not held(d) for _ in range(int(lengths[d]))]
            order = list(range(n))
        window, doc = Synthetic(lengths).window(i, T, every)
        assert doc == i and window.tolist() == want[: T + 1], (n, every, T, i)
        assert not any(held(int(t)) for t in window)
        checked += 1
    assert checked > 300
