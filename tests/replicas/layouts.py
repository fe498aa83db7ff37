"""Replicas of the `real` profile's hub datasets, laid out as the hub lays them out.

Each `Layout` says what public evidence shows of one dataset repository (tests/replicas/EVIDENCE.md
gives the sources, and marks what is a guess): its files and folders, the README card's YAML
(`configs:` with every declared split, `dataset_info` features, licence), the columns and their
types (also the ones no adapter reads) and whether the hub gates it. `write_replica` writes the
repository as `hf download --repo-type dataset ID --local-dir DIR` leaves it: the files, and the
download metadata huggingface_hub keeps beside them (`.cache/huggingface/download/<file>.metadata`,
whose first line is the commit) and, for tests/fake_hub.py, the hub's side of the repository
(`.hub.json`: its commit, gating). The rows are ours: generated from a seed, or recombined from
natural text a caller supplies; only their columns and types follow the real datasets.

The writer streams: rows are made one at a time and written in batches, shard by shard, in the
real dataset's sharding (smoltalk's `all` train split in 9 Parquet files, Gutenberg's `en` split in
52, Hermes-3 in one JSONL), so a full-size replica does not sit in memory.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

BATCH_ROWS = 2048  # rows per Parquet write: memory stays bounded at any size
HUB_META = ".hub.json"  # the hub's side of a repository, for tests/fake_hub.py (never listed or served)
DEFAULT_ROWS = 6  # rows per split when the caller names no count (at least one per shard)

# ---------------------------------------------------------------- features (the card's YAML form)

STR = {"dtype": "string"}
MESSAGES = {"name": "messages", "list": [{"name": "content", "dtype": "string"}, {"name": "role", "dtype": "string"}]}
SHAREGPT = {"name": "conversations", "list": [{"name": "from", "dtype": "string"}, {"name": "value", "dtype": "string"}]}


def _yaml_type(spec: dict) -> pa.DataType:
    """The Arrow type `datasets` gives a feature written in the card's YAML form."""
    if "dtype" in spec:
        return {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(), "bool": pa.bool_(),
                "float64": pa.float64()}[spec["dtype"]]
    if "list" in spec:
        return pa.list_(pa.struct([(f["name"], _yaml_type(f)) for f in spec["list"]]))
    if "struct" in spec:
        return pa.struct([(f["name"], _yaml_type(f)) for f in spec["struct"]])
    if "sequence" in spec:  # a Sequence of a dict is a dict of lists
        seq = spec["sequence"]
        if isinstance(seq, list):
            return pa.struct([(f["name"], pa.list_(_yaml_type(f))) for f in seq])
        return pa.list_(_yaml_type({"dtype": seq} if isinstance(seq, str) else seq))
    raise ValueError(f"unknown feature form {spec}")


def arrow_schema(features: list[dict]) -> pa.Schema:
    return pa.schema([(f["name"], _yaml_type(f)) for f in features])


# ---------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Split:
    """One split of one config: its data files, `shards` of them, named by `pattern` with
    {k} (0-based shard) and {n} (shard count), and {h} where the hub's names carry a hash."""

    config: str
    split: str
    pattern: str
    shards: int = 1
    hashes: dict[int, str] = field(default_factory=dict)  # shard -> the hash in its real name, where known

    def paths(self) -> list[str]:
        out = []
        for k in range(self.shards):
            h = self.hashes.get(k) or hashlib.sha256(f"{self.pattern}:{k}".encode()).hexdigest()[:16]
            out.append(self.pattern.format(k=k, n=self.shards, h=h))
        return out


@dataclass(frozen=True)
class Layout:
    dataset: str
    fmt: str  # "parquet" or "jsonl"
    splits: tuple[Split, ...]
    card: dict | None  # the README's YAML front matter; None: a README without one
    features: dict[str, list[dict]]  # config -> columns in the card's YAML form (the Parquet schema)
    rows: Callable[[random.Random, "TextSource", str, str, int], dict]  # (rng, text, config, split, i) -> row
    gated: bool | None = None  # None: evidence does not say (EVIDENCE.md)
    licence: str | None = None
    commit: str | None = None  # the commit public evidence names for main (None: not known)
    extra_files: tuple[str, ...] = ()  # files beside the data (written small, by `_extra_file`)

    def split(self, config: str, split: str) -> Split:
        return next(s for s in self.splits if s.config == config and s.split == split)

    def declared(self) -> list[tuple[str, str]]:
        """(config, split) of every split the card declares (or `datasets` infers from the names)."""
        return [(s.config, s.split) for s in self.splits]


class TextSource:
    """Text for the rows: a caller's natural text, recombined in turn, or by default sentences made
    from a small vocabulary of our own, seeded. The caller's text is a sequence (cycled by index) or
    an iterator of passages, read once and lazily: when it runs out, the last TEXT_RING passages
    are cycled, so a stream of any length never sits in memory whole."""

    WORDS = ("river", "garden", "lamp", "window", "morning", "letter", "bridge", "harvest", "kettle", "island",
             "winter", "market", "violin", "candle", "orchard", "harbour", "compass", "meadow", "library", "engine")
    VERBS = ("holds", "watches", "follows", "mends", "carries", "remembers", "crosses", "lights", "keeps", "finds")
    TEXT_RING = 10_000

    def __init__(self, text: Iterable[str] | None, seed: int):
        self._rng = random.Random(seed)
        self._seq = text if isinstance(text, (list, tuple)) else None
        self._iter = iter(text) if text is not None and self._seq is None else None
        self._ring: list[str] = []
        self._i = 0

    def _next_text(self) -> str:
        if self._seq is not None:
            if not self._seq:
                raise ValueError("text: an empty sequence of passages")
            self._i += 1
            return self._seq[(self._i - 1) % len(self._seq)]
        if self._iter is not None:
            for passage in self._iter:
                if len(self._ring) < self.TEXT_RING:
                    self._ring.append(passage)
                else:
                    self._ring[self._i % self.TEXT_RING] = passage
                self._i += 1
                return passage
            self._iter = None  # exhausted: cycle what was kept
            if not self._ring:
                raise ValueError("text: the passages ran out before the first one")
        self._i += 1
        return self._ring[self._i % len(self._ring)]

    def sentence(self) -> str:
        if self._seq is not None or self._iter is not None or self._ring:
            return self._next_text().strip() or "…"
        r = self._rng
        return f"The {r.choice(self.WORDS)} {r.choice(self.VERBS)} the {r.choice(self.WORDS)} near the {r.choice(self.WORDS)}."

    def passage(self, sentences: int = 3) -> str:
        return " ".join(self.sentence() for _ in range(sentences))

    def topic(self) -> str:
        return self._rng.choice(self.WORDS)


# ---------------------------------------------------------------- rows (ours; the columns are the datasets')

# Hermes-3 has no category column (EVIDENCE.md), so its general, creative and roleplay parts are
# told apart by the conversation itself: rows of the three kinds, in turn.
HERMES_KINDS = ("general", "creative", "roleplay")


def hermes_row(rng: random.Random, text: TextSource, config: str, split: str, i: int) -> dict:
    kind = HERMES_KINDS[i % 3]
    topic = text.topic()
    if kind == "general":
        turns = [("human", f"Can you explain how a {topic} works? {text.sentence()}"), ("gpt", text.passage(4))]
        if i % 2:
            turns.insert(0, ("system", "You are a helpful assistant."))
    elif kind == "creative":
        turns = [("system", "You are a creative writing assistant."),
                 ("human", f"Write a short poem about a {topic}."), ("gpt", "\n".join(text.sentence() for _ in range(4)))]
    else:
        name = rng.choice(("Mara", "Tobin", "Ilse", "Corwin"))
        turns = [("system", f"You are {name}, a lighthouse keeper on a stormy coast. Stay in character and roleplay "
                            f"the scene with the user."),
                 ("human", f"*knocks on the door of the lighthouse* Hello? Is anyone there? {text.sentence()}"),
                 ("gpt", f"*opens the door, holding a {topic}* {text.passage(2)}")]
    return {"conversations": [{"from": f, "value": v} for f, v in turns]}


def sharegpt_vicuna_row(rng: random.Random, text: TextSource, config: str, split: str, i: int) -> dict:
    turns = []
    for _ in range(rng.choice((1, 2))):
        turns += [{"from": "human", "value": f"{text.sentence()} What do you think?"}, {"from": "gpt", "value": text.passage(3)}]
    return {"dataset": "sharegpt", "id": f"rep{i:07d}_{rng.randrange(4)}", "conversations": turns}


def messages_row(rng: random.Random, text: TextSource, config: str, split: str, i: int) -> list[dict]:
    msgs = [{"content": f"Tell me about the {text.topic()}. {text.sentence()}", "role": "user"},
            {"content": text.passage(3), "role": "assistant"}]
    if i % 3 == 1:
        msgs.insert(0, {"content": "You are a friendly assistant.", "role": "system"})
    if i % 3 == 2:
        msgs += [{"content": "Thanks! One more thing?", "role": "user"}, {"content": text.passage(2), "role": "assistant"}]
    return msgs


def smoltalk_row(rng: random.Random, text: TextSource, config: str, split: str, i: int) -> dict:
    return {"messages": messages_row(rng, text, config, split, i), "source": config if config != "all" else
            SMOLTALK_CONFIGS[1 + i % (len(SMOLTALK_CONFIGS) - 1)][0]}


def everyday_row(rng: random.Random, text: TextSource, config: str, split: str, i: int) -> dict:
    topic, sub, subsub = text.topic(), text.topic(), text.topic()
    msgs = [{"content": "Hi! " + text.sentence(), "role": "user"}, {"content": text.passage(2), "role": "assistant"},
            {"content": f"What about the {sub}?", "role": "user"}, {"content": text.passage(2), "role": "assistant"}]
    prompt = f"A short conversation about {topic}, {sub}, {subsub}."
    return {"topic": topic, "subtopic": sub, "subsubtopic": subsub, "full_topic": f"{topic}/{sub}/{subsub}", "prompt": prompt,
            "completion": "\n".join(m["content"] for m in msgs), "token_length": rng.randrange(80, 400), "messages": msgs}


OASST_LANGS = ("en", "en", "es", "de")  # mostly English, as the card's language list leads with it


def oasst_rows(rng: random.Random, text: TextSource, config: str, split: str, i: int) -> list[dict]:
    """One message tree per call, flattened: a prompt and two ranked replies (the rows of the
    Parquet files are single messages)."""
    tree = f"{i:08x}-0000-4000-8000-{rng.getrandbits(48):012x}"
    lang = OASST_LANGS[i % len(OASST_LANGS)]
    base = {"user_id": f"u{rng.randrange(10_000):05d}", "created_date": "2023-02-01T12:00:00.000000+00:00", "lang": lang,
            "review_count": 3, "review_result": True, "deleted": False, "synthetic": False, "model_name": None,
            "detoxify": {k: round(rng.random() / 100, 6) for k in ("toxicity", "severe_toxicity", "obscene", "identity_attack",
                                                                       "insult", "threat", "sexual_explicit")},
            "message_tree_id": tree, "tree_state": "ready_for_export",
            "emojis": {"name": ["+1"], "count": [rng.randrange(1, 5)]},
            "labels": {"name": ["spam", "quality"], "value": [0.0, round(rng.random(), 3)], "count": [3, 3]}}
    prompt = {**base, "message_id": tree, "parent_id": None, "text": f"How does a {text.topic()} work? {text.sentence()}",
              "role": "prompter", "rank": None}
    replies = [{**base, "message_id": f"{tree[:-4]}{k:04x}", "parent_id": tree, "text": text.passage(3), "role": "assistant",
                "rank": k} for k in (1, 2)]
    return [prompt] + replies


def gutenberg_row(rng: random.Random, text: TextSource, config: str, split: str, i: int) -> dict:
    title = f"The {text.topic().title()} of the {text.topic().title()}"
    body = "\n\n".join(text.passage(6) for _ in range(rng.randrange(4, 8)))
    book = (f"A replica book for tests.\n\n*** START OF THE PROJECT GUTENBERG EBOOK {title.upper()} ***\n\n{title}\n\n{body}\n\n"
            f"*** END OF THE PROJECT GUTENBERG EBOOK {title.upper()} ***\n\nThe end matter of the replica.")
    return {"id": f"{split}-{i}", "text": book}


# ---------------------------------------------------------------- the six datasets

SMOLTALK_CONFIGS = (  # (config, train shards): EVIDENCE.md; the test split is one file in each
    ("all", 9), ("apigen-80k", 1), ("everyday-conversations", 1), ("explore-instruct-rewriting", 1), ("longalign", 1),
    ("metamathqa-50k", 1), ("numina-cot-100k", 1), ("openhermes-100k", 1), ("self-oss-instruct", 1),
    ("smol-constraints", 1), ("smol-magpie-ultra", 6), ("smol-rewrite", 1), ("smol-summarize", 1), ("systemchats-30k", 1),
)
SMOLTALK_FEATURES = [MESSAGES, {"name": "source", **STR}]

OASST_FEATURES = [
    {"name": n, **STR} for n in ("message_id", "parent_id", "user_id", "created_date", "text", "role", "lang")
] + [
    {"name": "review_count", "dtype": "int32"}, {"name": "review_result", "dtype": "bool"}, {"name": "deleted", "dtype": "bool"},
    {"name": "rank", "dtype": "int32"}, {"name": "synthetic", "dtype": "bool"}, {"name": "model_name", **STR},
    {"name": "detoxify", "struct": [{"name": n, "dtype": "float64"} for n in (
        "toxicity", "severe_toxicity", "obscene", "identity_attack", "insult", "threat", "sexual_explicit")]},
    {"name": "message_tree_id", **STR}, {"name": "tree_state", **STR},
    {"name": "emojis", "sequence": [{"name": "name", **STR}, {"name": "count", "dtype": "int32"}]},
    {"name": "labels", "sequence": [{"name": "name", **STR}, {"name": "value", "dtype": "float64"},
                                    {"name": "count", "dtype": "int32"}]},
]

EVERYDAY_FEATURES = [{"name": n, **STR} for n in ("topic", "subtopic", "subsubtopic", "full_topic", "prompt", "completion")] + [
    {"name": "token_length", "dtype": "int64"}, MESSAGES]

GUTENBERG_SPLITS = (  # (split, shards, known hashes): de and en from the tree pages; the others are guesses
    ("de", 3, {0: "f8e581c008ccc7f2", 1: "44c9c3b458e2eef3", 2: "084edb3f286e612c"}),
    ("en", 52, {0: "7cda8f63c262acf8", 1: "5c2b3fd5e60f0124", 2: "835bd07d97f52cbd", 11: "6c9ae05ed451701f",
                15: "9a9fd49be8a70a6c", 20: "31ef1cece5305678", 27: "9d8bfd7843e9718f", 42: "94e90b865e11f015"}),
    ("es", 1, {}), ("fr", 1, {}), ("it", 1, {}), ("nl", 1, {}), ("pl", 1, {}), ("pt", 1, {}), ("ru", 1, {}), ("sv", 1, {}),
    ("zh", 1, {}),
)

LAYOUTS: dict[str, Layout] = {}


def _add(layout: Layout) -> None:
    LAYOUTS[layout.dataset] = layout


_add(Layout(
    dataset="NousResearch/Hermes-3-Dataset", fmt="jsonl",
    splits=(Split("default", "train", "hermes-3-dataset.jsonl"),),
    card={"license": "apache-2.0"}, features={}, rows=hermes_row, gated=None, licence="apache-2.0",
    commit="b1fddbdcae4e6714889365d1e6ce266a45289cc9",
))
_add(Layout(
    dataset="flydust/ShareGPT-Vicuna-unfiltered-axolotl", fmt="parquet",
    splits=(Split("default", "train", "data/train-{k:05d}-of-{n:05d}.parquet"),),
    card={"dataset_info": {"features": [{"name": "dataset", **STR}, {"name": "id", **STR}, SHAREGPT],
                           "splits": [{"name": "train", "num_bytes": 422521695.52684927, "num_examples": 111912}],
                           "download_size": 361222437, "dataset_size": 422521695.52684927},
          "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*"}]}]},
    features={"default": [{"name": "dataset", **STR}, {"name": "id", **STR}, SHAREGPT]}, rows=sharegpt_vicuna_row,
    gated=False, licence=None, commit="347510f7efa8d214adddb36ac104160edb1beabd",
))
_add(Layout(
    dataset="HuggingFaceTB/smoltalk", fmt="parquet",
    splits=tuple(s for c, n in SMOLTALK_CONFIGS for s in (
        Split(c, "train", f"data/{c}/train-{{k:05d}}-of-{{n:05d}}.parquet", n),
        Split(c, "test", f"data/{c}/test-{{k:05d}}-of-{{n:05d}}.parquet", 1))),
    card={"language": ["en"], "tags": ["synthetic"], "pretty_name": "SmolTalk", "size_categories": ["1M<n<10M"],
          "dataset_info": [{"config_name": c, "features": SMOLTALK_FEATURES} for c, _ in SMOLTALK_CONFIGS],
          "configs": [{"config_name": c, "data_files": [{"split": "train", "path": f"data/{c}/train-*"},
                                                        {"split": "test", "path": f"data/{c}/test-*"}]}
                      for c, _ in SMOLTALK_CONFIGS]},
    features={c: SMOLTALK_FEATURES for c, _ in SMOLTALK_CONFIGS}, rows=smoltalk_row, gated=False, licence=None,
    commit="5feaf2fd3ffca7c237fc38d1861bc30365d48ffa",
))
_add(Layout(
    dataset="OpenAssistant/oasst1", fmt="parquet",
    splits=(Split("default", "train", "data/train-{k:05d}-of-{n:05d}-{h}.parquet", 1, {0: "b42a775f407cee45"}),
            Split("default", "validation", "data/validation-{k:05d}-of-{n:05d}-{h}.parquet", 1, {0: "134b8fd0c89408b6"})),
    card={"license": "apache-2.0",
          "dataset_info": {"features": OASST_FEATURES,
                           "splits": [{"name": "train", "num_bytes": 100367999, "num_examples": 84437},
                                      {"name": "validation", "num_bytes": 5243405, "num_examples": 4401}],
                           "download_size": 41596430, "dataset_size": 105611404},
          "language": ["en", "es", "ru", "de"], "tags": ["human-feedback"], "size_categories": ["10K<n<100K"],
          "pretty_name": "OpenAssistant Conversations"},
    features={"default": OASST_FEATURES}, rows=oasst_rows, gated=False, licence="apache-2.0",
    commit="12c7304a3644c0420f4ec06bc0aa955196527da6",
    extra_files=tuple(f"2023-04-12_oasst_{k}.jsonl.gz" for k in (
        "all.messages", "all.trees", "prompts.messages", "ready.messages", "ready.trees", "spam.messages")) + ("LICENSE",),
))
_add(Layout(
    dataset="manu/project_gutenberg", fmt="parquet",
    splits=tuple(Split("default", s, f"data/{s}-{{k:05d}}-of-{{n:05d}}-{{h}}.parquet", n, h) for s, n, h in GUTENBERG_SPLITS),
    card={"dataset_info": {"features": [{"name": "id", **STR}, {"name": "text", **STR}],
                           "splits": [{"name": "de", "num_bytes": 1070196924, "num_examples": 3131}],
                           "download_size": 425506964, "dataset_size": 1070196924}},
    features={"default": [{"name": "id", **STR}, {"name": "text", **STR}]}, rows=gutenberg_row, gated=False, licence=None,
))
_add(Layout(
    dataset="HuggingFaceTB/everyday-conversations-llama3.1-2k", fmt="parquet",
    splits=(Split("default", "train_sft", "data/train_sft-{k:05d}-of-{n:05d}.parquet"),
            Split("default", "test_sft", "data/test_sft-{k:05d}-of-{n:05d}.parquet")),
    card={"dataset_info": {"features": EVERYDAY_FEATURES,
                           "splits": [{"name": "train_sft", "num_bytes": 5417450.844892812, "num_examples": 2260},
                                      {"name": "test_sft", "num_bytes": 285255.1551071879, "num_examples": 119}],
                           "download_size": 2174280, "dataset_size": 5702706},
          "configs": [{"config_name": "default", "data_files": [{"split": "train_sft", "path": "data/train_sft-*"},
                                                                {"split": "test_sft", "path": "data/test_sft-*"}]}],
          "license": "apache-2.0", "language": ["en"]},
    features={"default": EVERYDAY_FEATURES}, rows=everyday_row, gated=False, licence="apache-2.0",
    commit="d08d2b26157076344a9f09319c038a5664abe781",
))

REAL_PROFILE_DATASETS = tuple(LAYOUTS)

# Real row counts where public evidence gives them (EVIDENCE.md), as `rows_per_split` takes them,
# for a full-size rehearsal. OASST counts message trees here (the writer makes three messages per
# tree): 84,437 train messages / 3. Splits not listed (smoltalk's: no count was found) are not known.
REAL_ROWS: dict[str, dict[str, int]] = {
    "NousResearch/Hermes-3-Dataset": {"train": 958_788},  # a deduplicated fork's count; ~959K on viewers
    "flydust/ShareGPT-Vicuna-unfiltered-axolotl": {"train": 111_912},
    "OpenAssistant/oasst1": {"train": 84_437 // 3, "validation": 4_401 // 3},
    "manu/project_gutenberg": {"de": 3_131, "en": 61_340},
    "HuggingFaceTB/everyday-conversations-llama3.1-2k": {"train_sft": 2_260, "test_sft": 119},
}


# ---------------------------------------------------------------- the writer


def _rows_for(s: Split, rows_per_split: int | dict | None) -> int:
    """Rows (OASST: message trees) to write for a split: the caller's count, else a few, at least one per shard."""
    if isinstance(rows_per_split, int):
        return rows_per_split
    wanted = (rows_per_split or {}).get(f"{s.config}:{s.split}", (rows_per_split or {}).get(s.split))
    return wanted if wanted is not None else max(DEFAULT_ROWS, s.shards)


def _row_stream(layout: Layout, s: Split, n: int, text: TextSource, rng: random.Random) -> Iterator[dict]:
    """n rows of the split (OASST: n message trees, each several message rows)."""
    for i in range(n):
        row = layout.rows(rng, text, s.config, s.split, i)
        yield from row if isinstance(row, list) else [row]


def _write_parquet(path: Path, schema: pa.Schema, rows: Iterator[dict]) -> int:
    tmp = path.with_name(path.name + ".tmp")
    written = 0
    with pq.ParquetWriter(tmp, schema) as w:
        while True:
            batch = list(itertools.islice(rows, BATCH_ROWS))
            if not batch:
                break
            w.write_table(pa.Table.from_pylist(batch, schema=schema))
            written += len(batch)
    os.replace(tmp, path)
    return written


def _write_jsonl(path: Path, rows: Iterator[dict]) -> int:
    tmp = path.with_name(path.name + ".tmp")
    written = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            written += 1
    os.replace(tmp, path)
    return written


def _card_text(layout: Layout) -> str:
    head = "---\n" + yaml.safe_dump(layout.card, sort_keys=False, allow_unicode=True) + "---\n" if layout.card else ""
    return head + f"\n# {layout.dataset} (test replica)\n\nA replica of this dataset's layout; its rows are generated.\n"


def _extra_file(path: Path, rel: str, text: TextSource) -> None:
    """Files beside the data that no profile fetches, small but of the right kind."""
    if rel.endswith(".jsonl.gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            row = {"message_id": "m0", "parent_id": None, "text": text.sentence(), "role": "prompter", "lang": "en"}
            f.write(json.dumps(row) + "\n")
    else:
        path.write_text("Licence text of the replica (the real file holds the Apache License 2.0).\n", encoding="utf-8")


def replica_commit(dataset: str) -> str:
    """The commit a replica claims: the one public evidence names for the dataset where there is one
    (so a location pinned to it accepts the replica), else one derived from the id (the replica's own)."""
    layout = LAYOUTS[dataset]
    return layout.commit or hashlib.sha1(f"replica:{dataset}".encode()).hexdigest()


def write_replica(root: str | os.PathLike, dataset_id: str, rows_per_split: int | dict | None = None,
                  text: Iterable[str] | None = None, seed: int = 0, commit: str | None = None,
                  download_metadata: bool = True, hub_metadata: bool = True, gated: bool | str | None = None) -> Path:
    """Write `dataset_id`'s replica at root/<dataset_id> as `hf download --local-dir` leaves it.

    rows_per_split: None (a few rows per split, at least one per shard), an int for every split,
    or {split: n} / {"config:split": n} (splits not named get the default). OASST counts message
    trees (three message rows each). text: natural text to recombine into the rows (cycled);
    None for generated sentences. commit: what the download metadata names (replica_commit by
    default); download_metadata=False leaves the metadata out (a copy made by hand).
    hub_metadata: also write the hidden `.hub.json` tests/fake_hub.py serves the repository by
    (its commit; gated: `gated` when given, else the layout's, unknown counting as not gated).
    Returns the repository folder."""
    layout = LAYOUTS[dataset_id]
    repo = Path(root) / dataset_id
    repo.mkdir(parents=True, exist_ok=True)
    source = TextSource(text, seed)
    rng = random.Random(seed)
    written = ["README.md", ".gitattributes"]
    (repo / "README.md").write_text(_card_text(layout), encoding="utf-8")
    lfs = ("*.parquet", "*.jsonl", "*.gz")  # stored with LFS on the hub (tests/fake_hub.py reads this file)
    (repo / ".gitattributes").write_text("".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in lfs), encoding="utf-8")
    for s in layout.splits:
        n = _rows_for(s, rows_per_split)
        paths = s.paths()
        rows = _row_stream(layout, s, n, source, rng)
        for k, rel in enumerate(paths):
            share = n * (k + 1) // len(paths) - n * k // len(paths)  # contiguous blocks, as the hub shards
            if layout.dataset == "OpenAssistant/oasst1":
                shard_rows: Iterator[dict] = itertools.islice(rows, share * 3)
            else:
                shard_rows = itertools.islice(rows, share)
            path = repo / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if layout.fmt == "parquet":
                _write_parquet(path, arrow_schema(layout.features[s.config]), shard_rows)
            else:
                _write_jsonl(path, shard_rows)
            written.append(rel)
    for rel in layout.extra_files:
        _extra_file(repo / rel, rel, source)
        written.append(rel)
    if download_metadata:
        write_download_metadata(repo, written, commit or replica_commit(dataset_id))
    if hub_metadata:
        gate = gated if gated is not None else bool(layout.gated)
        meta = {"sha": commit or replica_commit(dataset_id), **({"gated": gate} if gate else {})}
        (repo / HUB_META).write_text(json.dumps(meta), encoding="utf-8")
    return repo


def write_download_metadata(repo: Path, files: Iterable[str], commit: str) -> None:
    """What huggingface_hub leaves beside a `--local-dir` download: per file, the commit, an etag
    and a timestamp, under .cache/huggingface/download/ (and a .gitignore of that folder)."""
    cache = repo / ".cache" / "huggingface"
    (cache / "download").mkdir(parents=True, exist_ok=True)
    (cache / ".gitignore").write_text("*\n", encoding="utf-8")
    for rel in files:
        meta = cache / "download" / f"{rel}.metadata"
        meta.parent.mkdir(parents=True, exist_ok=True)
        etag = hashlib.sha256((repo / rel).read_bytes()).hexdigest() if (repo / rel).stat().st_size < 1 << 24 else "0" * 64
        meta.write_text(f"{commit}\n{etag}\n{time.time()}\n", encoding="utf-8")


def write_real_profile(root: str | os.PathLike, **kwargs) -> dict[str, Path]:
    """Every hub dataset of the `real` profile, replicated under root (a mirror folder)."""
    return {d: write_replica(root, d, **kwargs) for d in REAL_PROFILE_DATASETS}
