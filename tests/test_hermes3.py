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

from andrea.hermes3 import pull_hermes3
from andrea.records import MalformedRecord
from conftest import REPO, sharegpt, write_jsonl

GOOD = sharegpt(("human", "What is a cell?"), ("gpt", "The smallest unit of life."), category="general")


def hcfg(config, location, **extra):
    return {**config["hermes3"], "location": str(location), **extra}


def read_parts(out: Path) -> dict:
    return {p: pq.read_table(out / f"{p}.parquet").to_pylist() for p in ("hermes3-general", "hermes3-creative", "hermes3-roleplay")}


def test_malformed_rows_are_skipped_and_counted_per_reason(config, tmp_path):
    rows = [
        GOOD,
        '{"conversations": [{"from": "human", "value": "broken',  # broken JSON line
        {"id": 7},  # missing conversations
        {"conversations": "hello"},  # not a list
        {"conversations": []},
        {"conversations": ["just a string"]},
        {"conversations": [{"value": "no role"}, {"from": "gpt", "value": "x"}]},
        {"conversations": [{"from": "human"}, {"from": "gpt", "value": "x"}]},
        {"conversations": [{"from": "narrator", "value": "hi"}, {"from": "gpt", "value": "x"}]},
        {"conversations": [{"from": "human", "value": 42}, {"from": "gpt", "value": "x"}]},
        {"conversations": [{"from": "human", "value": "   "}, {"from": "gpt", "value": "x"}]},
        {"conversations": [{"from": "system", "value": "only a system turn"}]},
        [1, 2, 3],
        sharegpt(("system", "You are helpful."), ("human", "Write a poem"), ("gpt", "Roses..."), category="creative_writing"),
    ]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out"
    counts = pull_hermes3(hcfg(config, src), out, "v1")
    assert counts["read"] == 14
    assert counts["kept"] == 2
    assert counts["skipped"] == {
        "broken_json": 1,
        "missing_conversations": 1,
        "conversations_not_a_list": 1,
        "empty_conversations": 1,
        "turn_not_an_object": 1,
        "missing_from": 1,
        "missing_value": 1,
        "unknown_role": 1,
        "non_string_value": 1,
        "empty_value": 1,
        "no_dialogue": 1,
        "not_an_object": 1,
    }
    # the first example of each reason names the file and line
    assert counts["first_skipped_example"]["broken_json"].startswith(f"{src}:line 2")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["skipped_total"] == 12
    assert manifest["inputs"][0]["sha256"]
    assert {o["path"].split("/")[-1]: o["rows"] for o in manifest["outputs"]} == {
        "hermes3-general.parquet": 1,
        "hermes3-creative.parquet": 1,
        "hermes3-roleplay.parquet": 0,
    }
    parts = read_parts(out)
    assert parts["hermes3-creative"][0]["conversations"][0] == {"from": "system", "value": "You are helpful."}
    assert parts["hermes3-general"][0]["doc_id"] == "in.jsonl:1"


def test_strict_mode_fails_naming_file_and_line_and_leaves_no_artifact(config, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [GOOD, {"conversations": [{"from": "bot", "value": "x"}]}])
    out = tmp_path / "out"
    with pytest.raises(MalformedRecord, match=r"in\.jsonl:line 2: unknown_role"):
        pull_hermes3(hcfg(config, src), out, "v1", strict=True)
    assert not any(p.suffix in (".parquet", ".json") for p in out.glob("*")), list(out.glob("*"))
    assert not list(out.glob(".*.tmp"))


def test_category_split_parquet_json_and_directory_inputs(config, tmp_path):
    rows = [
        sharegpt(("human", "a"), ("gpt", "b"), category="Roleplay", id="r1"),
        sharegpt(("human", "c"), ("gpt", "d"), category="creative"),
        sharegpt(("human", "e"), ("gpt", "f"), category="coding"),
        sharegpt(("human", "g"), ("gpt", "h")),  # no category at all → general
    ]
    d = tmp_path / "data"
    d.mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:2]), d / "a.parquet")
    (d / "b.json").write_text(json.dumps(rows[2:]))
    out = tmp_path / "out"
    counts = pull_hermes3(hcfg(config, d), out, "v1")
    assert counts["per_part"] == {"hermes3-general": 2, "hermes3-creative": 1, "hermes3-roleplay": 1}
    parts = read_parts(out)
    assert parts["hermes3-roleplay"][0]["doc_id"] == "r1"
    assert parts["hermes3-general"][0]["doc_id"] == "b.json:0"


def test_max_docs_limits_kept_rows(config, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [GOOD] * 10)
    counts = pull_hermes3(hcfg(config, src, max_docs=3), tmp_path / "out", "v1")
    assert counts["kept"] == 3


def test_embedded_corpus_has_all_three_parts(config, tmp_path):
    counts = pull_hermes3(config["hermes3"], tmp_path / "out", "v1")
    assert counts["skipped_total"] == 0
    assert all(n > 0 for n in counts["per_part"].values())


def test_missing_local_path_is_a_clear_error(config, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        pull_hermes3(hcfg(config, tmp_path / "nowhere.jsonl"), tmp_path / "out", "v1")


HUB_SCRIPT = textwrap.dedent(
    """
    import sys
    from andrea.hermes3 import HubUnreachable, pull_hermes3
    cfg = {"location": "hub", "hub_id": "NousResearch/Hermes-3-Dataset", "hub_split": "train",
           "hub_revision": None, "hub_timeout_s": float(sys.argv[2]), "max_docs": None,
           "category_field": "category", "categories": {}}
    try:
        pull_hermes3(cfg, sys.argv[1], "v1")
    except HubUnreachable as e:
        print("UNREACHABLE:", e)
        sys.exit(3)
    """
)


def run_hub(tmp_path, endpoint, timeout_s):
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", HUB_SCRIPT, str(tmp_path / "out"), str(timeout_s)],
        capture_output=True, text=True, env=env, timeout=60, cwd=REPO,
    )
    return proc, time.monotonic() - t0


def test_unreachable_hub_fails_fast_with_advice(tmp_path):
    with socket.socket() as s:  # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc, took = run_hub(tmp_path, f"http://127.0.0.1:{port}", 5)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "hermes3.location" in proc.stdout and "embedded" in proc.stdout
    assert took < 30
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_silent_hub_times_out_instead_of_hanging(tmp_path):
    with socket.socket() as server:  # accepts connections, never answers
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        port = server.getsockname()[1]
        proc, took = run_hub(tmp_path, f"http://127.0.0.1:{port}", 2)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "did not answer" in proc.stdout or "Timeout" in proc.stdout or "timed out" in proc.stdout.lower()
    assert took < 30


def test_hub_location_streams_through_datasets_from_a_mirror(config, tmp_path, monkeypatch):
    """`hermes3.location: hub:<id>@<commit>` runs `datasets.load_dataset(..., streaming=True)`; with
    ANDREA_HUB_MIRROR holding a copy of the repository it reads that copy instead of the hub
    (offline mode on: nothing may reach the network)."""
    import datasets.config
    import huggingface_hub.constants

    from andrea.config import validate_config

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("ANDREA_HUB_MIRROR", str(tmp_path / "mirror"))
    repo = tmp_path / "mirror" / "NousResearch" / "Hermes-3-Dataset"
    write_jsonl(repo / "data" / "train.jsonl", [GOOD, sharegpt(("human", "hi"), ("gpt", "yo"), category="roleplay")])
    commit = "0123456789abcdef0123456789abcdef01234567"
    meta = repo / ".cache" / "huggingface" / "download" / "data" / "train.jsonl.metadata"
    meta.parent.mkdir(parents=True)
    meta.write_text(f"{commit}\n{'0' * 40}\n{time.time() + 60}\n")
    raw = {**config, "hermes3": {**config["hermes3"], "location": f"hub:NousResearch/Hermes-3-Dataset@{commit}"}}
    counts = pull_hermes3(validate_config(raw)["hermes3"], tmp_path / "out", "v1")
    assert counts["kept"] == 2
    assert counts["per_part"]["hermes3-roleplay"] == 1
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["inputs"] == [{"hub": "NousResearch/Hermes-3-Dataset", "revision": commit, "subset": None, "split": "train",
                                   "commit": commit, "mirror": str(repo)}]


# Conversations as the hub's copy of Hermes-3 holds them: `conversations` only, no category.
HUB_LIKE = [
    sharegpt(("human", "What is the boiling point of water in Fahrenheit?"), ("gpt", "212 degrees.")),
    sharegpt(("system", "You are a helpful assistant."), ("human", "Write a Python function that reverses a list."), ("gpt", "def r(x): ...")),
    sharegpt(("human", "Write a poem about the moon over a quiet harbour."), ("gpt", "Silver on the water...")),
    sharegpt(("human", "Tell me a story about a fox who learns to sing."), ("gpt", "Once...")),
    sharegpt(("system", "You are Brannoc, a dwarven smith. Stay in character."),
             ("human", "*pushes open the forge door* Brannoc, can you mend my axe before nightfall?"), ("gpt", "*grunts* Aye.")),
    sharegpt(("human", "Let's roleplay. You're a ship's cook and I'm a new deckhand. *I stumble into the galley*"), ("gpt", "Oi!")),
]


def test_records_without_a_category_are_split_by_the_rule_and_the_manifest_says_so(config, tmp_path):
    """The hub's layout: one JSONL at the repository root, `conversations[{from, value}]` and no
    category column. Before the rule, creative and roleplay came out empty."""
    src = write_jsonl(tmp_path / "hermes-3-dataset.jsonl", HUB_LIKE)
    out = tmp_path / "out"
    counts = pull_hermes3(hcfg(config, src), out, "v1")
    assert counts["per_part"] == {"hermes3-general": 2, "hermes3-creative": 2, "hermes3-roleplay": 2}
    assert counts["decided_by"] == {"rule": counts["per_part"]}
    manifest = json.loads((out / "manifest.json").read_text())
    rule = manifest["counts"]["part_rule"]
    assert rule["labelled_set"]["n"] >= 300
    for part in ("hermes3-general", "hermes3-creative", "hermes3-roleplay"):
        assert rule["cross_validated"][part]["precision"] >= 0.9 and rule["cross_validated"][part]["recall"] >= 0.9
        assert part in rule["in_sample"]
    parts = read_parts(out)
    assert parts["hermes3-roleplay"][0]["conversations"][1]["value"].startswith("*pushes open")
    assert all(r["category"] == "" for rows in parts.values() for r in rows)


def test_a_category_column_wins_over_the_rule(config, tmp_path):
    rows = [
        # roleplay by its content, general by its column: the column decides
        sharegpt(("human", "*draws my sword* Stand aside, troll!"), ("gpt", "*roars*"), category="general"),
        sharegpt(("human", "What is 2 + 2?"), ("gpt", "4"), category="roleplay"),
        # an empty or blank value is no category: the rule decides
        sharegpt(("human", "Write a haiku about frost."), ("gpt", "..."), category=""),
        sharegpt(("human", "Write a limerick about a goat."), ("gpt", "..."), category="  "),
    ]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    counts = pull_hermes3(hcfg(config, src), tmp_path / "out", "v1")
    assert counts["per_part"] == {"hermes3-general": 1, "hermes3-creative": 2, "hermes3-roleplay": 1}
    assert counts["decided_by"] == {
        "column": {"hermes3-general": 1, "hermes3-creative": 0, "hermes3-roleplay": 1},
        "rule": {"hermes3-general": 0, "hermes3-creative": 2, "hermes3-roleplay": 0},
    }


def test_without_category_general_turns_the_rule_off(config, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", HUB_LIKE)
    counts = pull_hermes3(hcfg(config, src, without_category="general"), tmp_path / "out", "v1")
    assert counts["per_part"] == {"hermes3-general": 6, "hermes3-creative": 0, "hermes3-roleplay": 0}
    assert counts["decided_by"] == {"default": counts["per_part"]}
    assert "part_rule" not in counts


def test_the_embedded_corpus_is_split_by_its_column(config, tmp_path):
    counts = pull_hermes3(config["hermes3"], tmp_path / "out", "v1")
    assert set(counts["decided_by"]) == {"column"}
    assert counts["decided_by"]["column"] == counts["per_part"]


# ---------------------------------------------------------------- worker processes


def mixed_rows(n: int) -> list:
    """n rows of every kind the stage meets: categories of each part, none (the rule decides), ids
    and none, and malformed rows of several reasons."""
    rows = []
    for i in range(n):
        k = i % 11
        if k == 3:
            rows.append('{"conversations": [{"from": "human", "value": "cut')  # broken JSON
        elif k == 7:
            rows.append({"conversations": [{"from": "narrator", "value": f"x{i}"}, {"from": "gpt", "value": "y"}]})
        elif k == 9:
            rows.append({"id": i})
        elif k % 3 == 0:
            rows.append(sharegpt(("system", "You are a pirate."), ("human", f"Stay in character {i}"), ("gpt", "Arr")))
        elif k % 3 == 1:
            rows.append(sharegpt(("human", f"write a poem {i}"), ("gpt", "roses"), category=["creative", "roleplay", "coding"][i % 3]))
        else:
            rows.append(sharegpt(("human", f"what is {i}?"), ("gpt", f"{i} is a number"), id=f"r{i}" if i % 2 else ""))
    return rows


def without_times(manifest: dict) -> dict:
    """A manifest without its timings, its outputs by file name (the same bytes: sha256)."""
    outputs = [{**o, "path": Path(o["path"]).name} for o in manifest["outputs"]]
    return {**{k: v for k, v in manifest.items() if k != "timings"}, "outputs": outputs}


def test_workers_write_the_rows_counts_and_manifest_of_one_process(config, tmp_path):
    """Rows decided in worker processes are written in the input's order: the same parts, counts,
    skips (with their first examples) and manifest as the in-process run; max_docs stops alike."""
    src = write_jsonl(tmp_path / "in.jsonl", mixed_rows(2000))
    runs = {}
    for workers in (1, 3):
        out = tmp_path / f"w{workers}"
        counts = pull_hermes3(hcfg(config, src), out, "v1", workers=workers)
        runs[workers] = (counts, read_parts(out), without_times(json.loads((out / "manifest.json").read_text())))
    assert runs[1] == runs[3]
    counts, parts, _ = runs[1]
    assert counts["read"] == 2000 and counts["skipped"] == {"broken_json": 182, "unknown_role": 182, "missing_conversations": 181}
    assert all(parts.values()) and counts["decided_by"].keys() == {"column", "rule"}
    assert {"in.jsonl:1", "r5"} <= {d["doc_id"] for p in parts.values() for d in p}  # no id: its line
    for workers in (1, 3):
        counts = pull_hermes3(hcfg(config, src, max_docs=789), tmp_path / f"m{workers}", "v1", workers=workers)
        runs[workers] = (counts, read_parts(tmp_path / f"m{workers}"))
    assert runs[1] == runs[3] and runs[1][0]["kept"] == 789 == sum(len(p) for p in runs[1][1].values())


def test_strict_mode_with_workers_names_the_first_bad_row(config, tmp_path):
    rows = [GOOD] * 2000
    rows[1500] = {"conversations": [{"from": "bot", "value": "x"}]}
    rows[1900] = "{broken"
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out"
    with pytest.raises(MalformedRecord, match=r"in\.jsonl:line 1501: unknown_role"):
        pull_hermes3(hcfg(config, src), out, "v1", strict=True, workers=2)
    assert not list(out.glob("*.parquet")) and not list(out.glob(".*.tmp"))
