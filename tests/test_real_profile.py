"""The `real` profile on replicas of its hub datasets (tests/replicas: layouts from public
evidence, EVIDENCE.md; rows of our own).

Each replica is read through `datasets` as its card declares it; then the profile is fetched from
the replicas and its data stages (pull_hermes3, prep_megachat, filter_shape) run on the fetched
copy with offline mode on, through the same code a user's first run goes through. Three tests
pin the failures issue 40 found on first contact: a partial copy of smoltalk whose card declares
a test split; Hermes-3 with no category column; synthetic-chat's `messages` rows read as ShareGPT.
"""

import json

import datasets
import pyarrow.parquet as pq
import pytest

from andrea.fetch import MANIFEST, fetch_profile
from andrea.hub import FULL_COMMIT, parse_hub_location
from andrea.profiles import hub_inputs, profile_config
from replicas.layouts import LAYOUTS, REAL_PROFILE_DATASETS, replica_commit, write_replica
from conftest import REPO
from fake_hub import serve_hub, use_hub
from test_hub_sources import offline  # noqa: F401 (autouse: offline mode, a cache of each test's own)

ROWS = 6  # rows (OASST: message trees) per split, at least one per shard where a split has more shards


def real_profile(config) -> dict:
    """The real profile's config, with the two sources that read this machine kept small."""
    pc = profile_config(config, "real")
    for key in ("repo-docstrings", "repo-commits"):
        pc["sources"][key]["max_docs"] = 20
    return pc


def profile_commits(config) -> dict[str, str]:
    """The commit each replica claims: the one the profile pins, where it pins one (the replica
    stands for that commit), else the one public evidence names for main."""
    out = {}
    for _, location, _ in hub_inputs(profile_config(config, "real")):
        loc = parse_hub_location(location)
        out[loc.dataset] = loc.revision if FULL_COMMIT.match(loc.revision or "") else replica_commit(loc.dataset)
    return out


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """Every hub dataset of the real profile, replicated as `hf download --local-dir` leaves it
    (written once for the module: the tests only read it)."""
    from andrea.config import load_config

    root = tmp_path_factory.mktemp("replicas") / "mirror"
    commits = profile_commits(load_config(REPO / "config" / "config.yaml"))
    for dataset in REAL_PROFILE_DATASETS:
        write_replica(root, dataset, rows_per_split=None, commit=commits[dataset])
    return root


@pytest.fixture(scope="module")
def fetched(mirror, tmp_path_factory):
    """The real profile fetched from the replicas as `andrea data fetch --profile real` fetches it:
    through huggingface_hub, from a server that answers as the hub does (tests/fake_hub.py). Once
    for the module; the tests then read it with offline mode on (the autouse `offline`), as the
    data stages read a fetched copy."""
    from andrea.config import load_config

    tmp = tmp_path_factory.mktemp("fetched")
    dest = tmp / "hub"
    with serve_hub(mirror) as url, pytest.MonkeyPatch.context() as mp:
        use_hub(mp, url, home=tmp / "hf-home")
        fetch_profile(load_config(REPO / "config" / "config.yaml"), "real", dest=dest)
        assert url.gets(), "the fetch went through the hub's HTTP API"
    return dest


def rows_in(path) -> int:
    return pq.ParquetFile(path).metadata.num_rows


# ---------------------------------------------------------------- the replicas themselves


def _yaml_features(layout, config_name):
    card = layout.card or {}
    info = card.get("dataset_info")
    if isinstance(info, list):
        info = next((i for i in info if i.get("config_name") == config_name), None)
    return datasets.Features._from_yaml_list(info["features"]) if info and "features" in info else None


@pytest.mark.parametrize("dataset", REAL_PROFILE_DATASETS)
def test_each_replica_reads_through_datasets_as_its_card_declares(tmp_path, dataset):
    layout = LAYOUTS[dataset]
    repo = write_replica(tmp_path, dataset)
    assert (repo / "README.md").is_file() and (repo / ".cache" / "huggingface" / "download").is_dir()
    for config_name, split in layout.declared():
        s = layout.split(config_name, split)
        for rel in s.paths():
            assert (repo / rel).is_file(), rel
        ds = datasets.load_dataset(str(repo), name=None if config_name == "default" else config_name, split=split, streaming=True)
        rows = list(ds)
        per_item = 3 if dataset == "OpenAssistant/oasst1" else 1  # OASST: a prompt and two replies per tree
        assert len(rows) == max(ROWS, s.shards) * per_item, (config_name, split)
        declared = _yaml_features(layout, config_name)
        if declared is not None:
            assert ds.features == declared, (config_name, split)
        else:  # Hermes-3: a JSONL file, no features on the card; `datasets` infers them
            assert set(rows[0]) == {"conversations"} and set(rows[0]["conversations"][0]) == {"from", "value"}


def test_a_full_size_replica_streams_in_the_real_sharding(tmp_path):
    """The writer the full-size rehearsal uses: a row count split into the real shards in order,
    natural text supplied by the caller recombined into the rows."""
    passages = ["A first passage of natural text.", "A second one, different.", "And a third."]
    repo = write_replica(tmp_path, "HuggingFaceTB/smoltalk", rows_per_split={"all:train": 40, "test": 2}, text=passages)
    counts = [rows_in(repo / rel) for rel in LAYOUTS["HuggingFaceTB/smoltalk"].split("all", "train").paths()]
    assert len(counts) == 9 and sum(counts) == 40 and max(counts) - min(counts) <= 1
    row = pq.read_table(repo / "data/all/train-00000-of-00009.parquet").to_pylist()[0]
    assert any(p in row["messages"][-1]["content"] for p in passages)


# ---------------------------------------------------------------- fetch and the data stages


def test_the_fetch_takes_the_files_each_profile_entry_names(fetched):
    manifest = json.loads((fetched / MANIFEST).read_text())["datasets"]
    assert set(manifest) == set(REAL_PROFILE_DATASETS)
    smol = set(manifest["HuggingFaceTB/smoltalk"]["files"])
    assert smol == {"README.md"} | {f"data/all/train-{k:05d}-of-00009.parquet" for k in range(9)}  # not the test split
    assert set(manifest["OpenAssistant/oasst1"]["files"]) == {"README.md", "data/train-00000-of-00001-b42a775f407cee45.parquet"}
    gut = sorted(manifest["manu/project_gutenberg"]["files"])
    assert gut[0] == "README.md" and [p[:22] for p in gut[1:]] == [f"data/en-{k:05d}-of-00052" for k in range(5)]
    assert "hermes-3-dataset.jsonl" in manifest["NousResearch/Hermes-3-Dataset"]["files"]


def test_every_enabled_source_of_the_real_profile_yields_documents(config, fetched, tmp_path):
    """fetch → pull_hermes3 → prep_megachat → filter_shape on the replicas, offline: every
    enabled source of the real profile, each Hermes-3 part included, reaches the filtered corpus."""
    from andrea.filter import filter_shape
    from andrea.hermes3 import pull_hermes3
    from andrea.megachat import prep_megachat

    pc = real_profile(config)
    pull_hermes3(pc["hermes3"], tmp_path / "pull", "v", hub_dir=fetched)
    prep = prep_megachat(pc, tmp_path / "prep", "v", pull_dir=tmp_path / "pull", hub_dir=fetched)
    report = filter_shape(tmp_path / "prep" / "megachat.parquet", tmp_path / "filter", pc["filter_shape"], "v")
    enabled = [k for k, s in pc["sources"].items() if s["enabled"]]
    assert {"hermes3-general", "hermes3-creative", "hermes3-roleplay", "chat", "smoltalk", "oasst", "gutenberg",
            "synthetic-chat"} <= set(enabled)
    empty = [k for k in enabled if prep["per_source"].get(k, {}).get("kept", 0) == 0]
    assert not empty, f"sources with no document after prep_megachat: {empty} ({prep['per_source']})"
    kept = {r["source"] for r in pq.read_table(tmp_path / "filter" / "megachat.parquet", columns=["source"]).to_pylist()}
    assert set(enabled) <= kept, f"sources with no document after filter_shape: {set(enabled) - kept} ({report})"


def test_a_fetched_smoltalk_whose_card_declares_a_test_split_reads(config, fetched, tmp_path):
    """The profile fetches only data/all/train-*; the card's configs also name data/all/test-*,
    as the hub's card for the `all` folder does. The train split must read from its own files."""
    from andrea.megachat import prep_megachat

    pc = real_profile(config)
    pc["sources"] = {"smoltalk": pc["sources"]["smoltalk"]}
    counts = prep_megachat(pc, tmp_path / "prep", "v", hub_dir=fetched)
    train = sum(rows_in(p) for p in (fetched / "HuggingFaceTB/smoltalk/data/all").glob("train-*.parquet"))
    assert counts["per_source"]["smoltalk"]["kept"] == train == 9


def test_hermes3_without_a_category_column_fills_its_three_parts(config, fetched, tmp_path):
    """Hermes-3's public copy has no category column: the general, creative and roleplay parts
    must still each receive conversations (the replica holds two of each kind)."""
    from andrea.hermes3 import pull_hermes3

    first = json.loads((fetched / "NousResearch/Hermes-3-Dataset/hermes-3-dataset.jsonl").read_text().splitlines()[0])
    assert set(first) == {"conversations"}  # no category column, as the public copy
    counts = pull_hermes3(real_profile(config)["hermes3"], tmp_path / "pull", "v", hub_dir=fetched)
    assert counts["kept"] == ROWS
    assert all(n > 0 for n in counts["per_part"].values()), counts["per_part"]


def test_synthetic_chat_reads_its_messages_rows_in_the_real_profile(config, fetched, tmp_path):
    """everyday-conversations-llama3.1-2k's rows are `messages[{content, role}]`: every one of
    them must become a document, none be skipped as a ShareGPT row without `conversations`."""
    from andrea.megachat import prep_megachat

    pc = real_profile(config)
    pc["sources"] = {"synthetic-chat": pc["sources"]["synthetic-chat"]}
    try:
        counts = prep_megachat(pc, tmp_path / "prep", "v", hub_dir=fetched)
    except ValueError as e:  # today's message when every row was skipped; a clear error is not enough either
        pytest.fail(f"synthetic-chat yielded no document: {e}")
    assert counts["per_source"]["synthetic-chat"]["kept"] == ROWS
