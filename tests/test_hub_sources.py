"""Sources from the Hugging Face hub (`location: hub:<id>[@revision][:split]`), without network.

The seam is ANDREA_HUB_MIRROR: a folder laid out as `hf download --local-dir` leaves a dataset
repository (data files plus a README.md whose YAML `configs:` name the subsets and splits). The
code under test is the one a hub location runs: the location is parsed, the mirror replaces only
the reachability probe and the dataset id handed to `datasets.load_dataset`, which resolves the
subset and split from the README exactly as for the hub, and streams the rows to the adapters.
Offline mode is forced for every test here, so any request to the hub fails at once instead of
hanging.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from andrea.config import ConfigError, validate_config
from andrea.hub import MIRROR_ENV, HubDatasetError, HubUnreachable
from conftest import REPO, run_prep, sharegpt, with_sources

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """Offline mode for huggingface_hub and datasets (read at their import, so patched too) and a
    cache of this test's own: nothing here may reach the network."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.delenv(MIRROR_ENV, raising=False)


def write_rows(path: Path, rows: list, schema: pa.Schema | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def hub_dataset(mirror: Path, repo_id: str, subsets: dict, fmt: str = "parquet", commit: str | None = None, schema=None) -> Path:
    """A dataset repository as `hf download --local-dir` leaves it: data/<subset>/<split>-*.<fmt>,
    a README.md with `configs:` metadata (the first subset is the default), and, with `commit`,
    the download metadata huggingface_hub writes beside the files."""
    root = mirror / repo_id
    card = ["---", "configs:"]
    for n, (subset, splits) in enumerate(subsets.items()):
        card += [f"- config_name: {subset}"] + (["  default: true"] if n == 0 else []) + ["  data_files:"]
        for split, files in splits.items():
            files = files if files and isinstance(files[0], (list, str)) else [files]  # one file or several
            for k, rows in enumerate(files):
                rel = f"data/{subset}/{split}-{k:05d}-of-{len(files):05d}.{fmt}"
                if isinstance(rows, str):  # raw text: a deliberately broken file
                    (root / rel).parent.mkdir(parents=True, exist_ok=True)
                    (root / rel).write_text(rows)
                else:
                    write_rows(root / rel, rows, schema)
                if commit:
                    meta = root / ".cache" / "huggingface" / "download" / f"{rel}.metadata"
                    meta.parent.mkdir(parents=True, exist_ok=True)
                    meta.write_text(f"{commit}\n{'0' * 40}\n{time.time() + 60}\n")
            card += [f"  - split: {split}", f"    path: data/{subset}/{split}-*.{fmt}"]
    (root / "README.md").write_text("\n".join(card + ["---", f"# {repo_id}", ""]), encoding="utf-8")
    return root


def msgs(*pairs, **extra):
    return {"messages": [{"role": r, "content": c} for r, c in pairs], **extra}


def prep(cfg, tmp_path):
    return run_prep(cfg, tmp_path / "prep")


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "adapter, location, says",
    [
        ("sharegpt", "hub:", "names no dataset"),
        ("sharegpt", "hub:@main", "names no dataset"),
        ("messages", "hub:HuggingFaceTB/smoltalk@", "no revision"),
        ("messages", "hub:HuggingFaceTB/smoltalk:all:train:x", "too many"),
        ("messages", "hub:Hugging Face/smoltalk", "not a hub dataset id"),
        ("messages", "hub:HuggingFaceTB/smoltalk:all:train[:10%]", "use max_docs"),
        ("messages", "hub:HuggingFaceTB/smoltalk:all:tr-ain", "not a split name"),
        ("messages", "hub", "name the dataset"),
        ("git_log", "hub:someone/repo", "clone it"),
        ("docstrings", "hub:someone/code", "not supported"),
    ],
)
def test_a_malformed_or_unsupported_hub_location_names_the_key(config, adapter, location, says):
    with pytest.raises(ConfigError) as e:
        with_sources(config, {"src": {"adapter": adapter, "location": location}})
    assert "sources.src.location" in str(e.value)
    assert says in str(e.value)


def test_hermes3_short_form_becomes_hub_id_revision_and_split(config):
    raw = {**config, "hermes3": {**config["hermes3"], "location": f"hub:NousResearch/Hermes-3-Dataset@{COMMIT}:train"}}
    h = validate_config(raw)["hermes3"]
    assert (h["location"], h["hub_id"], h["hub_revision"], h["hub_split"]) == ("hub", "NousResearch/Hermes-3-Dataset", COMMIT, "train")
    for bad, key in [("hub:", "hermes3.location"), ("hub:a/b:sub:train", "hermes3.location")]:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            validate_config({**config, "hermes3": {**config["hermes3"], "location": bad}})
    with pytest.raises(ConfigError, match=r"hermes3\.hub_id"):
        validate_config({**config, "hermes3": {**config["hermes3"], "location": "hub", "hub_id": "not an id"}})


def test_hub_id_revision_subset_and_split_are_part_of_the_prep_version(config, tmp_path, monkeypatch):
    from andrea.versions import stage_versions

    def version(location, hermes3="embedded"):
        raw = {**config, "hermes3": {**config["hermes3"], "location": hermes3}}
        return stage_versions(with_sources(raw, {"smoltalk": {"adapter": "messages", "location": location}}))

    base = version("hub:HuggingFaceTB/smoltalk:all:train")
    prep_versions = {
        version(loc)["prep_megachat"]
        for loc in [
            "hub:HuggingFaceTB/smoltalk:all:train",
            "hub:HuggingFaceTB/smoltalk@" + COMMIT + ":all:train",
            "hub:HuggingFaceTB/smoltalk@" + OTHER_COMMIT + ":all:train",
            "hub:HuggingFaceTB/smoltalk:smol-magpie-ultra:train",
            "hub:HuggingFaceTB/smoltalk:all:test",
            "hub:HuggingFaceTB/smol-smoltalk:all:train",
        ]
    }
    assert len(prep_versions) == 6
    # a mirror is where the same data is read from, not other data: the version stays
    monkeypatch.setenv(MIRROR_ENV, str(tmp_path))
    assert version("hub:HuggingFaceTB/smoltalk:all:train") == base
    # hermes3's revision reaches pull_hermes3's version, and everything downstream of it
    hub = version("hub:HuggingFaceTB/smoltalk:all:train", "hub:NousResearch/Hermes-3-Dataset")
    pinned = version("hub:HuggingFaceTB/smoltalk:all:train", f"hub:NousResearch/Hermes-3-Dataset@{COMMIT}")
    assert len({base["pull_hermes3"], hub["pull_hermes3"], pinned["pull_hermes3"]}) == 3
    assert pinned["prep_megachat"] != hub["prep_megachat"]


# ---------------------------------------------------------------- reading through datasets


def test_every_record_adapter_reads_its_hub_dataset(config, tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    monkeypatch.setenv(MIRROR_ENV, str(mirror))
    hub_dataset(mirror, "org/chat", {"default": {"train": [
        sharegpt(("system", "Be brief."), ("human", "What is rain?"), ("gpt", "Water falling from clouds."), id="c1"),
        sharegpt(("human", "only a question")),  # no answer: skipped as no_dialogue
    ]}}, fmt="jsonl")
    hub_dataset(mirror, "org/smoltalk", {
        "all": {"train": [msgs(("user", "Name a colour."), ("assistant", "Blue."), source="x")],
                "test": [msgs(("user", "held out"), ("assistant", "not read"))]},
        "everyday": {"train": [msgs(("user", "another subset"), ("assistant", "not read"))]},
    })
    oasst_rows = [  # the flat layout of OpenAssistant/oasst1
        {"message_id": "m1", "parent_id": None, "role": "prompter", "text": "How do tides work?", "rank": None,
         "deleted": False, "message_tree_id": "m1", "lang": "en"},
        {"message_id": "m2", "parent_id": "m1", "role": "assistant", "text": "The Moon pulls the sea.", "rank": 1,
         "deleted": False, "message_tree_id": "m1", "lang": "en"},
        {"message_id": "m3", "parent_id": "m1", "role": "assistant", "text": "Gravity of the Moon and Sun.", "rank": 0,
         "deleted": False, "message_tree_id": "m1", "lang": "en"},
    ]
    oasst_schema = pa.schema([("message_id", pa.string()), ("parent_id", pa.string()), ("role", pa.string()), ("text", pa.string()),
                              ("rank", pa.int32()), ("deleted", pa.bool_()), ("message_tree_id", pa.string()), ("lang", pa.string())])
    hub_dataset(mirror, "org/oasst", {"default": {"train": [oasst_rows[0]], "validation": oasst_rows}}, schema=oasst_schema)
    hub_dataset(mirror, "org/dictionary", {"default": {"train": [
        {"word": "harbour", "definition": "a sheltered place for ships", "pos": "noun"},
        {"word": "", "definition": "no word"},
    ]}})
    book = "*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\n" + "\n\n".join(f"Paragraph {i} of a long book, told slowly." for i in range(40)) + "\n\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nlicence"
    hub_dataset(mirror, "org/gutenberg", {"default": {"en": [{"id": "pg11", "text": book}, {"id": "pg12"}], "de": [{"id": "d", "text": "nicht gelesen " * 20}]}})
    hub_dataset(mirror, "org/docs", {"default": {"train": [{"text": "# Install\n\nRun the installer, then restart the shell to pick up the path."}]}}, fmt="jsonl")
    hub_dataset(mirror, "org/irc", {"default": {"train": [{"id": "chan", "text": "[10:00] <ann> is the build green?\n[10:01] -!- bob joined\n[10:02] <bob> yes, since this morning\nnot a message"}]}})

    cfg = with_sources(config, {
        "chat": {"adapter": "sharegpt", "location": "hub:org/chat"},
        "smoltalk": {"adapter": "messages", "location": "hub:org/smoltalk:all:train"},
        "oasst": {"adapter": "oasst", "location": "hub:org/oasst:validation"},
        "dictionary": {"adapter": "dictionary", "location": "hub:org/dictionary@main"},
        "gutenberg": {"adapter": "plaintext", "location": "hub:org/gutenberg:en", "chunk_chars": 400},
        "repo-docs": {"adapter": "markdown", "location": "hub:org/docs"},
        "irc": {"adapter": "irc", "location": "hub:org/irc", "min_chars": 10},
    })
    counts, rows, manifest = prep(cfg, tmp_path)
    per = counts["per_source"]
    by = {}
    for r in rows:
        by.setdefault(r["source"], []).append(r)

    assert per["chat"]["kept"] == 1 and per["chat"]["skipped"] == {"no_dialogue": 1}
    assert by["chat"][0]["doc_id"] == "c1"
    assert [t["role"] for t in by["chat"][0]["turns"]] == ["system", "user", "assistant"]
    assert per["chat"]["first_skipped_example"]["no_dialogue"] .startswith(f"hub:org/chat:train (mirror {mirror / 'org/chat'}) row 1:")

    assert [r["turns"][0]["text"] for r in by["smoltalk"]] == ["Name a colour."]  # subset all, split train only

    assert [t["text"] for t in by["oasst"][0]["turns"]] == ["How do tides work?", "Gravity of the Moon and Sun."]

    assert by["dictionary"][0]["turns"][1]["text"] == "harbour is a sheltered place for ships"
    assert per["dictionary"]["skipped"] == {"missing_word": 1}

    chunks = by["gutenberg"]
    assert len(chunks) > 1 and all(c["doc_id"].startswith("pg11#") for c in chunks)
    assert "START OF" not in chunks[0]["text"] and "licence" not in chunks[-1]["text"]
    assert per["gutenberg"]["skipped"] == {"missing_text": 1}
    assert not any("nicht" in c["text"] for c in chunks)  # split en only

    assert by["repo-docs"][0]["text"].startswith("# Install")
    assert by["irc"][0]["text"] == "<ann> is the build green?\n<bob> yes, since this morning"
    assert by["irc"][0]["doc_id"] == "chan#0" and per["irc"]["skipped"] == {"unparsed_line": 1}

    inputs = {i["source"]: i for i in manifest["inputs"]}
    assert inputs["smoltalk"] == {"source": "smoltalk", "hub": "org/smoltalk", "revision": None, "subset": "all", "split": "train",
                                  "adapter": "messages", "commit": None, "mirror": str(mirror / "org/smoltalk")}
    assert inputs["dictionary"]["revision"] == "main"


def test_max_docs_stops_reading_the_stream(config, tmp_path, monkeypatch):
    """The second data file is not even JSON: reading it would fail, so a stage that stops after
    max_docs rows of the first file proves the stream is read lazily."""
    mirror = tmp_path / "mirror"
    monkeypatch.setenv(MIRROR_ENV, str(mirror))
    first = [msgs(("user", f"question {i}"), ("assistant", f"answer {i}")) for i in range(5)]
    hub_dataset(mirror, "org/big", {"default": {"train": [first, "{not json\n"]}}, fmt="jsonl")
    cfg = with_sources(config, {"smoltalk": {"adapter": "messages", "location": "hub:org/big", "max_docs": 3}})
    counts, rows, _ = prep(cfg, tmp_path)
    assert counts["per_source"]["smoltalk"]["kept"] == 3 and len(rows) == 3
    cfg["sources"]["smoltalk"]["max_docs"] = None  # the whole split does reach the broken file
    with pytest.raises(HubDatasetError, match=r"sources\.smoltalk\.location: hub:org/big:train .* row 5: cannot be read"):
        prep(cfg, tmp_path / "again")


def test_a_pinned_commit_must_match_the_mirror_copy(config, tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    monkeypatch.setenv(MIRROR_ENV, str(mirror))
    hub_dataset(mirror, "org/chat", {"default": {"train": [sharegpt(("human", "hi"), ("gpt", "hello"))]}}, commit=COMMIT)
    cfg = with_sources(config, {"chat": {"adapter": "sharegpt", "location": f"hub:org/chat@{COMMIT}"}})
    counts, _, manifest = prep(cfg, tmp_path)
    assert counts["per_source"]["chat"]["kept"] == 1
    assert manifest["inputs"][0]["commit"] == COMMIT and manifest["inputs"][0]["revision"] == COMMIT
    cfg = with_sources(config, {"chat": {"adapter": "sharegpt", "location": f"hub:org/chat@{OTHER_COMMIT}"}})
    with pytest.raises(HubDatasetError, match=rf"sources\.chat\.location: .* is commit {COMMIT}, but the location pins {OTHER_COMMIT}"):
        prep(cfg, tmp_path / "other")


def test_an_unknown_split_or_subset_is_a_clear_error(config, tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    monkeypatch.setenv(MIRROR_ENV, str(mirror))
    hub_dataset(mirror, "org/smoltalk", {"all": {"train": [msgs(("user", "a"), ("assistant", "b"))]}, "x": {"train": [msgs(("user", "c"), ("assistant", "d"))]}})
    for location, missing in [("hub:org/smoltalk:all:validation", "validation"), ("hub:org/smoltalk:nosuch:train", "nosuch")]:
        cfg = with_sources(config, {"smoltalk": {"adapter": "messages", "location": location}})
        with pytest.raises(HubDatasetError) as e:
            prep(cfg, tmp_path / missing)
        assert "sources.smoltalk.location" in str(e.value) and missing in str(e.value)


def test_bytes_that_are_not_utf8_stop_the_stream_naming_the_row(config, tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    monkeypatch.setenv(MIRROR_ENV, str(mirror))
    root = mirror / "org/books"
    (root / "data").mkdir(parents=True)
    text = pa.array([b"A good first book, long enough to keep.", b"bad \xff byte"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"text": text}), root / "data" / "train-0.parquet")
    cfg = with_sources(config, {"gutenberg": {"adapter": "plaintext", "location": "hub:org/books"}})
    with pytest.raises(HubDatasetError, match=r"sources\.gutenberg\.location: hub:org/books:train .* row 1: .*not valid UTF-8"):
        prep(cfg, tmp_path)


# ---------------------------------------------------------------- without the hub


def test_offline_without_a_mirror_fails_at_once_naming_the_fix(config, tmp_path):
    cfg = with_sources(config, {"smoltalk": {"adapter": "messages", "location": "hub:HuggingFaceTB/smoltalk@main:all:train"}})
    t0 = time.monotonic()
    with pytest.raises(HubUnreachable) as e:
        prep(cfg, tmp_path)
    assert time.monotonic() - t0 < 30
    msg = str(e.value)
    assert msg.startswith("sources.smoltalk.location: HuggingFaceTB/smoltalk is on the Hugging Face hub and offline mode is on")
    assert "`hf download --repo-type dataset HuggingFaceTB/smoltalk --revision main --local-dir DIR`" in msg
    assert "set sources.smoltalk.location to DIR" in msg and f"{MIRROR_ENV}=M with the copy at M/HuggingFaceTB/smoltalk" in msg
    assert not (tmp_path / "prep" / "megachat.parquet").exists()


def test_plaintext_from_the_hub_offers_only_the_mirror(config, tmp_path):
    cfg = with_sources(config, {"gutenberg": {"adapter": "plaintext", "location": "hub:manu/project_gutenberg:en"}})
    with pytest.raises(HubUnreachable) as e:
        prep(cfg, tmp_path)
    assert "set sources.gutenberg.location to DIR" not in str(e.value)  # it reads .txt files, not Parquet
    assert f"{MIRROR_ENV}=M with the copy at M/manu/project_gutenberg" in str(e.value)


def test_an_optional_hub_source_out_of_reach_is_skipped(config, tmp_path):
    local = tmp_path / "chat.jsonl"
    local.write_text(json.dumps(sharegpt(("human", "hi"), ("gpt", "hello"))) + "\n")
    cfg = with_sources(config, {
        "chat": {"adapter": "sharegpt", "location": str(local)},
        "smoltalk": {"adapter": "messages", "location": "hub:HuggingFaceTB/smoltalk:all:train", "optional": True},
    })
    counts, rows, manifest = prep(cfg, tmp_path)
    assert "offline mode" in counts["per_source"]["smoltalk"]["skipped_source"]
    assert [r["source"] for r in rows] == ["chat"]
    assert [i["source"] for i in manifest["inputs"]] == ["chat"]


HUB_SOURCE_SCRIPT = textwrap.dedent(
    """
    import sys
    from andrea.hub import HubUnreachable
    from andrea.sources import ADAPTERS, Context
    cfg = {"adapter": "messages", "location": "hub:HuggingFaceTB/smoltalk:all:train"}
    try:
        next(ADAPTERS["messages"]("smoltalk", cfg, Context()))
    except HubUnreachable as e:
        print("UNREACHABLE:", e)
        sys.exit(3)
    """
)


def test_an_unreachable_hub_fails_fast_for_a_source(tmp_path):
    """Offline mode off, the hub's address refusing connections: the probe's answer, not a hang."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", MIRROR_ENV):
        env.pop(k, None)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", HUB_SOURCE_SCRIPT], capture_output=True, text=True, env=env, timeout=60, cwd=REPO)
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "sources.smoltalk.location: could not reach the Hugging Face hub for HuggingFaceTB/smoltalk" in proc.stdout
    assert "hf download --repo-type dataset HuggingFaceTB/smoltalk --local-dir DIR" in proc.stdout


SMOLTALK_CARD = """---
dataset_info:
- config_name: all
  features:
  - name: messages
    list:
    - name: content
      dtype: string
    - name: role
      dtype: string
  - name: source
    dtype: string
  splits:
  - name: train
    num_examples: 3
  - name: test
    num_examples: 1
configs:
- config_name: all
  data_files:
  - split: train
    path: data/all/train-*
  - split: test
    path: data/all/test-*
- config_name: smol-magpie-ultra
  data_files:
  - split: train
    path: data/smol-magpie-ultra/train-*
  - split: test
    path: data/smol-magpie-ultra/test-*
---
# SmolTalk
"""


def smoltalk_copy(mirror: Path) -> Path:
    """A fetched copy laid out as HuggingFaceTB/smoltalk: the card declares train and test for each
    subset; only `all`'s train files were fetched (the real profile's `files`)."""
    root = mirror / "org/smoltalk"
    rows = [msgs(("user", f"q{i}"), ("assistant", f"a{i}"), source="s") for i in range(3)]
    write_rows(root / "data/all/train-00000-of-00002.parquet", rows[:2])
    write_rows(root / "data/all/train-00001-of-00002.parquet", rows[2:])
    (root / "README.md").write_text(SMOLTALK_CARD, encoding="utf-8")
    return root


def test_a_copy_holding_only_the_asked_split_reads(config, tmp_path, monkeypatch):
    """datasets 5.2 refuses the whole subset when a split its card declares has no file here
    ("Couldn't infer the same data file format for all splits"): the split is read from its own files."""
    mirror = tmp_path / "mirror"
    monkeypatch.setenv(MIRROR_ENV, str(mirror))
    smoltalk_copy(mirror)
    cfg = with_sources(config, {"smoltalk": {"adapter": "messages", "location": "hub:org/smoltalk:all:train"}})
    counts, rows, _ = prep(cfg, tmp_path)
    assert counts["per_source"]["smoltalk"]["kept"] == 3
    assert sorted(r["turns"][0]["text"] for r in rows) == ["q0", "q1", "q2"]


def test_a_split_with_no_file_in_the_copy_names_its_patterns_and_the_files_there(config, tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    monkeypatch.setenv(MIRROR_ENV, str(mirror))
    smoltalk_copy(mirror)
    for location, says in [("hub:org/smoltalk:all:test", "no file of split 'test' (subset all): its patterns ['data/all/test-*']"),
                           ("hub:org/smoltalk:smol-magpie-ultra:train", "no file of split 'train' (subset smol-magpie-ultra)"),
                           ("hub:org/smoltalk:all:validation", "no split 'validation' in subset all (splits: train, test")]:
        cfg = with_sources(config, {"smoltalk": {"adapter": "messages", "location": location}})
        with pytest.raises(HubDatasetError) as e:
            prep(cfg, tmp_path / location.rsplit(":", 2)[1])
        msg = str(e.value)
        assert msg.startswith(f"sources.smoltalk.location: {location}") and says in msg, msg
        assert "data/all/train-00000-of-00002.parquet" in msg  # what the copy does hold
