"""Data profiles and `andrea data fetch`, without network.

A folder laid out as the hub's repositories (`hf download --local-dir` copies with their README
`configs:`) stands in for the hub through ANDREA_HUB_MIRROR: the fetch copies from it file by
file (the hub transport is the only part not run), and the data stages then read the fetched
copy with offline mode on, through the same `datasets` call a hub location runs.
"""

import json
import time

import pytest

from andrea.config import ConfigError, validate_config
from andrea.fetch import MANIFEST, DataNotFetched, FetchError, MirrorTransport, fetch_profile
from andrea.hub import MIRROR_ENV, parse_hub_location
from andrea.io import sha256_file
from andrea.profiles import model_profile, profile_config
from andrea.sources import ADAPTERS
from andrea.versions import STAGES, stage_versions, train_run_key
from conftest import REPO, sharegpt
from test_hub_sources import COMMIT, OTHER_COMMIT, hub_dataset, msgs, offline  # noqa: F401 (offline: autouse)

# ---------------------------------------------------------------- the shipped profiles


def test_the_shipped_real_profile_names_every_source_with_revision_and_licence(config):
    real = config["profiles"]["real"]["sources"]
    named = set(real)
    assert named == {"hermes3"} | {s for s, c in config["sources"].items() if c["adapter"] != "hermes3"}
    for key, entry in real.items():
        assert entry.get("licence"), f"{key}: no licence"
        if entry.get("enabled", True) is False:
            assert entry.get("note"), f"{key}: left out without saying why"
            continue
        adapter = "hermes3" if key == "hermes3" else config["sources"][key]["adapter"]
        assert adapter in ADAPTERS
        loc = entry["location"]
        if loc.startswith("hub:"):
            assert ADAPTERS[adapter].from_hub or adapter == "hermes3"
            assert parse_hub_location(loc).revision, f"{key}: no revision"
            assert entry.get("size"), f"{key}: no size"
        else:
            assert loc in ("stdlib", "."), f"{key}: a real source reads the hub, the standard library or this repository"
    pc = profile_config(config, "real")
    assert pc["hermes3"]["location"] == "hub" and pc["hermes3"]["hub_id"] == "NousResearch/Hermes-3-Dataset"
    assert not any(c["location"] == "embedded" for c in pc["sources"].values() if c["enabled"]), "real data only"


def test_each_model_names_its_profile(config):
    assert {m: model_profile(config, m) for m in config["models"]} == {
        "ANDREA-tiny": "embedded", "ANDREA-12M": "real", "ANDREA-120M": "real", "ANDREA-480M": "real"}
    forced = {**config, "data_profile": "embedded"}
    assert all(model_profile(forced, m) == "embedded" for m in config["models"])


def test_switching_profile_changes_every_data_version_and_the_run(config):
    emb, real = stage_versions(profile_config(config, "embedded")), stage_versions(profile_config(config, "real"))
    assert emb == stage_versions(config)  # a config names the embedded profile unless told otherwise
    assert all(emb[s] != real[s] for s in STAGES)
    assert train_run_key(config, "ANDREA-120M") != train_run_key({**config, "data_profile": "embedded"}, "ANDREA-120M")
    # the name is part of the version: a copy of a profile under another name has its own artifacts
    copy = validate_config({**config, "profiles": {**config["profiles"], "copy": {"sources": {}}}})
    assert stage_versions(profile_config(copy, "copy"))["pull_hermes3"] != emb["pull_hermes3"]
    with pytest.raises(ConfigError, match="data_profile is 'embedded'"):
        profile_config({**config, "data_profile": "embedded"}, "real")


@pytest.mark.parametrize("change, says", [
    ({"profiles": {"p": {"sources": {"hermes3-general": {"location": "x"}}}}}, "hermes3 parts"),
    ({"profiles": {"p": {"sources": {"chat": {"location": "hub:a/b@main", "size": "1"}}}}}, "needs its `licence`"),
    ({"profiles": {"p": {"sources": {"chat": {"location": "hub:a/b", "licence": "mit"}}}}}, "names no revision"),
    ({"profiles": {"p": {"sources": {"repo-commits": {"location": "hub:a/b@main", "licence": "mit"}}}}},
     "profiles.p: sources.repo-commits.location"),
    ({"models": {"m": {"d_model": 8, "n_head": 1, "n_layer": 1, "context": 8, "n_segments": 4, "data": "nope"}}},
     "models.m.data: no data profile 'nope'"),
    ({"data_profile": "nope"}, "data_profile: no data profile"),
])
def test_a_bad_profile_names_the_key(config, change, says):
    if "profiles" in change:  # beside the shipped ones
        change = {"profiles": {**config["profiles"], **change["profiles"]}}
    if "models" in change:  # settings of the shipped models would name models no longer there
        change["train"] = {k: v for k, v in config.get("train", {}).items() if k not in config["models"]}
    with pytest.raises(ConfigError) as e:
        validate_config({**config, **change})
    assert says in str(e.value)


# ---------------------------------------------------------------- fetch


@pytest.fixture
def mini(config, tmp_path, monkeypatch):
    """A profile `mini` of three hub datasets (one pinned to a commit, two @main) served by a mirror."""
    mirror = tmp_path / "mirror"
    hub_dataset(mirror, "test/hermes", {"default": {"train": [[sharegpt(("human", f"q{i}"), ("gpt", f"a{i}"), category="general")
                                                              for i in range(5)]]}}, fmt="jsonl", commit=COMMIT)
    hub_dataset(mirror, "test/chat", {"default": {"train": [[sharegpt(("human", "hi"), ("gpt", "hello"))],
                                                            [sharegpt(("human", "yo"), ("gpt", "hey"))]]}}, commit=COMMIT)
    hub_dataset(mirror, "test/smol", {"all": {"train": [[msgs(("user", f"u{i}"), ("assistant", f"a{i}")) for i in range(3)]]},
                                      "other": {"train": [[msgs(("user", "x"), ("assistant", "y"))]]}}, commit=COMMIT)
    profile = {"sources": {
        "hermes3": {"location": "hub:test/hermes@main:train", "licence": "apache-2.0"},
        "chat": {"location": f"hub:test/chat@{COMMIT}:train", "licence": "mit"},
        "smoltalk": {"location": "hub:test/smol@main:all:train", "licence": "apache-2.0", "files": ["README.md", "data/all/*"]},
        "irc": {"enabled": False, "licence": "-", "note": "none"},
    }}
    cfg = validate_config({**config, "profiles": {**config["profiles"], "mini": profile}})
    monkeypatch.setenv(MIRROR_ENV, str(mirror))
    return cfg, mirror, tmp_path / "hub"


def test_fetch_copies_every_dataset_with_sha256_and_a_profile_marker(mini):
    cfg, mirror, dest = mini
    summary = fetch_profile(cfg, "mini", dest=dest)
    assert set(summary) == {"test/hermes", "test/chat", "test/smol"}
    manifest = json.loads((dest / MANIFEST).read_text())["datasets"]
    for dataset, entry in manifest.items():
        assert entry["complete"] and entry["commit"] == COMMIT
        for rel, meta in entry["files"].items():
            assert meta["sha256"] == sha256_file(mirror / dataset / rel) == sha256_file(dest / dataset / rel)
    assert not any("other" in rel for rel in manifest["test/smol"]["files"])  # only the files asked for
    marker = json.loads((dest / "profiles" / "mini.json").read_text())
    assert marker["datasets"]["test/chat"] == {"revision": COMMIT, "commit": COMMIT, "sources": ["chat"]}


def test_a_second_fetch_needs_no_network_and_changes_nothing(mini, monkeypatch):
    cfg, mirror, dest = mini
    fetch_profile(cfg, "mini", dest=dest)
    marker = dest / "profiles" / "mini.json"
    before = (marker.stat().st_mtime_ns, (dest / MANIFEST).read_text())
    monkeypatch.setenv(MIRROR_ENV, str(mirror.parent / "gone"))  # nothing to fetch from
    summary = fetch_profile(cfg, "mini", dest=dest)
    assert not any(s["fetched"] for s in summary.values())
    assert (marker.stat().st_mtime_ns, (dest / MANIFEST).read_text()) == before  # Snakemake re-runs nothing


def test_an_interrupted_fetch_resumes_where_it_stopped(mini, monkeypatch):
    cfg, mirror, dest = mini
    real_download = MirrorTransport.download
    calls = []

    def failing(self, w, commit, f, repo_dir):
        if len(calls) == 2:
            raise KeyboardInterrupt  # the user stopped it, or the connection broke
        calls.append((w.dataset, f.path))
        return real_download(self, w, commit, f, repo_dir)

    monkeypatch.setattr(MirrorTransport, "download", failing)
    with pytest.raises(KeyboardInterrupt):
        fetch_profile(cfg, "mini", dest=dest)
    assert not (dest / "profiles" / "mini.json").exists()
    first = list(calls)
    calls.clear()
    monkeypatch.setattr(MirrorTransport, "download", lambda self, *a: calls.append((a[0].dataset, a[2].path)) or real_download(self, *a))
    fetch_profile(cfg, "mini", dest=dest)
    assert len(first) == 2 and calls, "stopped after two files; the rest fetched now"
    assert not set(first) & set(calls), "files fetched before the stop are not fetched again"
    assert (dest / "profiles" / "mini.json").exists()


def test_a_damaged_file_is_fetched_again(mini):
    cfg, mirror, dest = mini
    fetch_profile(cfg, "mini", dest=dest)
    entry = json.loads((dest / MANIFEST).read_text())["datasets"]["test/chat"]
    rel = next(r for r in entry["files"] if r.endswith(".parquet"))
    (dest / "test/chat" / rel).write_bytes(b"truncated")
    assert fetch_profile(cfg, "mini", dest=dest)["test/chat"]["fetched"]
    assert sha256_file(dest / "test/chat" / rel) == entry["files"][rel]["sha256"]


def test_main_is_pinned_by_the_first_fetch(mini):
    cfg, mirror, dest = mini
    fetch_profile(cfg, "mini", dest=dest)
    # the hub's main moves on, and the copy is found incomplete: the fetch refuses the new commit
    for meta in (mirror / "test/smol" / ".cache").rglob("*.metadata"):
        meta.write_text(meta.read_text().replace(COMMIT, OTHER_COMMIT))
    (dest / "test/smol" / "README.md").unlink()
    with pytest.raises(FetchError, match=f"fetched at commit {COMMIT}.*--update"):
        fetch_profile(cfg, "mini", dest=dest)
    assert fetch_profile(cfg, "mini", dest=dest, update=True)["test/smol"]["commit"] == OTHER_COMMIT


def test_offline_the_fetch_fails_at_once_naming_what_is_missing_and_both_ways_out(mini, monkeypatch):
    cfg, mirror, dest = mini
    monkeypatch.delenv(MIRROR_ENV)  # the hub itself, in offline mode (the autouse fixture)
    t0 = time.monotonic()
    with pytest.raises(DataNotFetched) as e:
        fetch_profile(cfg, "mini", dest=dest)
    assert time.monotonic() - t0 < 10
    msg = str(e.value)
    for part in ("hermes3 (test/hermes@main)", "chat (test/chat@", "smoltalk (test/smol@main)", "offline mode",
                 f"andrea data fetch --profile mini --dir {dest}", "--config data_profile=embedded"):
        assert part in msg, part
    assert "irc" not in msg


def test_an_unanswering_hub_costs_one_timeout_not_one_per_dataset(mini, monkeypatch):
    cfg, mirror, dest = mini

    class Silent(MirrorTransport):
        def resolve(self, w, key):
            time.sleep(30)

    t0 = time.monotonic()
    with pytest.raises(DataNotFetched, match="did not answer within 1 s"):
        fetch_profile(cfg, "mini", dest=dest, timeout=1, transport=Silent(mirror))
    assert time.monotonic() - t0 < 6


def test_the_data_stages_read_the_fetched_copy_offline(mini, monkeypatch, tmp_path):
    from andrea.hermes3 import pull_hermes3
    from andrea.megachat import prep_megachat

    cfg, mirror, dest = mini
    fetch_profile(cfg, "mini", dest=dest)
    monkeypatch.delenv(MIRROR_ENV)  # offline: only the fetched copy
    pc = profile_config(cfg, "mini")
    counts = pull_hermes3(pc["hermes3"], tmp_path / "pull", "v", hub_dir=dest)
    assert counts["kept"] == 5
    pull_manifest = json.loads((tmp_path / "pull" / "manifest.json").read_text())
    assert pull_manifest["inputs"][0]["commit"] == COMMIT and str(dest) in pull_manifest["inputs"][0]["mirror"]
    # the mini Hermes-3 copy holds general conversations only: its other parts would be empty (an error)
    pc["sources"] = {k: v for k, v in pc["sources"].items() if k in ("chat", "smoltalk", "hermes3-general")}
    counts = prep_megachat(pc, tmp_path / "prep", "v", pull_dir=tmp_path / "pull", hub_dir=dest)
    assert counts["per_source"]["chat"]["kept"] == 2 and counts["per_source"]["smoltalk"]["kept"] == 3  # `all` only: the files fetched
    inputs = {i.get("source"): i for i in json.loads((tmp_path / "prep" / "manifest.json").read_text())["inputs"]}
    assert inputs["smoltalk"]["commit"] == COMMIT


def test_oasst_languages_keeps_the_ones_asked_for(config, tmp_path):
    from conftest import run_prep, with_sources, write_jsonl

    rows = [{"message_id": "1", "parent_id": None, "role": "prompter", "text": "hi", "lang": "en"},
            {"message_id": "2", "parent_id": "1", "role": "assistant", "text": "hello", "lang": "en"},
            {"message_id": "3", "parent_id": None, "role": "prompter", "text": "hola", "lang": "es"},
            {"message_id": "4", "parent_id": "3", "role": "assistant", "text": "buenas", "lang": "es"}]
    path = write_jsonl(tmp_path / "oasst.jsonl", rows)
    cfg = with_sources(config, {"oasst": {"adapter": "oasst", "location": str(path), "languages": ["en"]}})
    counts, docs, _ = run_prep(cfg, tmp_path / "out")
    assert [d["turns"][0]["text"] for d in docs] == ["hi"]
    assert counts["per_source"]["oasst"]["skipped"] == {"other_language": 2}


def test_the_cli_fetch_says_what_it_did(mini, capsys):
    from andrea.cli import main

    cfg, mirror, dest = mini
    path = dest.parent / "config.yaml"
    import yaml

    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    raw["profiles"]["mini"] = cfg["profiles"]["mini"]
    path.write_text(yaml.safe_dump(raw))
    assert main(["data", "fetch", "--config", str(path), "--profile", "mini", "--dir", str(dest)]) == 0
    out = capsys.readouterr().out
    assert "test/chat: commit " + COMMIT in out and "3 hub datasets" in out


@pytest.mark.slow
def test_the_mission_command_offline_fails_fast_before_any_stage(workflow_dir, monkeypatch):
    """ANDREA-12M (profile real) with nothing fetched and no network: the first job, fetch_data,
    stops the workflow in seconds with the one message; no data stage ran."""
    from conftest import snakemake

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.monotonic()
    proc = snakemake(workflow_dir, "results/ANDREA-12M/shards.json", check=False)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 120  # Snakemake's own start-up is most of it
    out = proc.stdout + proc.stderr
    assert "andrea data fetch --profile real --dir data/hub" in out and "--config data_profile=embedded" in out
    assert "hermes3 (NousResearch/Hermes-3-Dataset@main)" in out and "Traceback" not in out
    assert not (workflow_dir / "results" / "data" / "pull_hermes3").exists()


def test_the_real_corpus_overlay_puts_every_model_on_its_local_profile(tmp_path):
    """bench/real_corpus.sh's overlay, merged over config/config.yaml as `snakemake --configfile
    config/config.yaml OUT/real-corpus.yaml` merges it: every model trains on the overlay's profile,
    which reads nothing from the hub (the models' own profile, `real`, would)."""
    import importlib.util

    from andrea.config import deep_merge, read_config_file
    from andrea.profiles import hub_inputs

    spec = importlib.util.spec_from_file_location("real_corpus", REPO / "bench" / "real_corpus.py")
    rc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rc)
    out = tmp_path / "data" / "real"
    out.mkdir(parents=True)
    (out / "real-corpus.yaml").write_text(rc.overlay_yaml(out, tmp_path))
    raw = deep_merge(read_config_file(REPO / "config" / "config.yaml"), read_config_file(out / "real-corpus.yaml"))
    config = validate_config(raw, "real-corpus.yaml")
    assert {model_profile(config, m) for m in config["models"]} == {rc.PROFILE}
    p = profile_config(config, rc.PROFILE)
    assert hub_inputs(p) == []
    assert p["hermes3"]["location"] == "data/real/hermes3/chitchat.jsonl"
    assert {k: p["sources"][k]["location"] for k in ("chat", "gutenberg", "dictionary", "repo-docs")} == {
        "chat": "data/real/chat", "gutenberg": "data/real/gutenberg", "dictionary": "data/real/dictionary",
        "repo-docs": "data/real/repo-docs"}
    assert (p["sources"]["chat"]["weight"], p["sources"]["chat"]["floor"]) == (0.1, 0.0)
    assert not any(p["sources"][k]["enabled"] for k in ("smoltalk", "oasst", "irc", "synthetic-chat",
                                                        "hermes3-creative", "hermes3-roleplay"))


# ---------------------------------------------------------------- a profile entry's adapter


def with_profile(config, entries: dict) -> dict:
    return validate_config({**config, "profiles": {**config["profiles"], "p": {"sources": entries}}})


def test_a_profile_entry_s_adapter_reads_its_data_and_is_part_of_the_version(config, tmp_path):
    from andrea.megachat import EmptySource, prep_megachat
    from conftest import write_jsonl

    data = write_jsonl(tmp_path / "everyday.jsonl", [msgs(("user", f"hello {i}"), ("assistant", f"hi {i}")) for i in range(2)])
    own = with_profile(config, {"synthetic-chat": {"location": str(data)}})  # the source's own adapter: sharegpt
    told = with_profile(config, {"synthetic-chat": {"location": str(data), "adapter": "messages"}})
    p_own, p_told = profile_config(own, "p"), profile_config(told, "p")
    assert (p_own["sources"]["synthetic-chat"]["adapter"], p_told["sources"]["synthetic-chat"]["adapter"]) == ("sharegpt", "messages")
    v_own, v_told = stage_versions(p_own), stage_versions(p_told)
    assert v_own["pull_hermes3"] == v_told["pull_hermes3"]
    assert all(v_own[s] != v_told[s] for s in STAGES if s != "pull_hermes3")
    only = {"synthetic-chat"}
    p_told["sources"] = {k: v for k, v in p_told["sources"].items() if k in only}
    counts = prep_megachat(p_told, tmp_path / "told", "v")
    assert counts["per_source"]["synthetic-chat"]["kept"] == 2
    p_own["sources"] = {k: v for k, v in p_own["sources"].items() if k in only}
    with pytest.raises(EmptySource, match=r"profiles\.p\.sources\.synthetic-chat \(location .*, adapter sharegpt\) .*"
                                          r"2 records read, 2 skipped: missing_conversations 2 .*profiles\.p\.sources\.synthetic-chat\.adapter"):
        prep_megachat(p_own, tmp_path / "own", "v")


@pytest.mark.parametrize("entry, says", [
    ({"adapter": "nope"}, "profiles.p.sources.synthetic-chat.adapter: 'nope' is not one of"),
    ({"adapter": "hermes3"}, "profiles.p: sources.synthetic-chat.adapter: the hermes3 adapter serves only"),
    ({"adapter": "docstrings", "location": "hub:a/b@main", "licence": "mit"}, "profiles.p: sources.synthetic-chat.location: hub datasets are not supported"),
])
def test_a_profile_entry_s_adapter_is_checked_as_a_source_s(config, entry, says):
    with pytest.raises(ConfigError) as e:
        with_profile(config, {"synthetic-chat": entry})
    assert says in str(e.value)


def test_a_profile_may_leave_out_or_make_optional_a_hermes3_part_and_nothing_else_of_it(config):
    p = profile_config(with_profile(config, {"hermes3-creative": {"enabled": False}, "hermes3-roleplay": {"optional": True}}), "p")
    assert p["sources"]["hermes3-creative"]["enabled"] is False and p["sources"]["hermes3-roleplay"]["optional"] is True
    with pytest.raises(ConfigError, match=r"profiles\.p\.sources\.hermes3-roleplay: adapter cannot be set for the hermes3 parts"):
        with_profile(config, {"hermes3-roleplay": {"adapter": "sharegpt"}})


def test_the_real_profile_s_synthetic_chat_reads_its_messages_rows(config, tmp_path, monkeypatch):
    """HuggingFaceTB/everyday-conversations-llama3.1-2k holds `messages: [{content, role}]` rows:
    a tiny copy of it at the pinned commit, read through the shipped real profile's location."""
    from andrea.megachat import prep_megachat

    pc = profile_config(config, "real")
    s = pc["sources"]["synthetic-chat"]
    loc = parse_hub_location(s["location"])
    assert (loc.dataset, loc.split, s["adapter"]) == ("HuggingFaceTB/everyday-conversations-llama3.1-2k", "train_sft", "messages")
    row = lambda i: {"full_topic": f"Everyday/{i}",  # a column beside the messages, not read
                     "messages": [{"content": f"Hi, what's a good way to start day {i}?", "role": "user"},
                                  {"content": f"A short walk and a glass of water, day {i}.", "role": "assistant"}]}
    mirror = tmp_path / "mirror"
    hub_dataset(mirror, loc.dataset, {"default": {"train_sft": [row(i) for i in range(3)], "test_sft": [row(9)]}}, commit=loc.revision)
    monkeypatch.setenv(MIRROR_ENV, str(mirror))
    pc["sources"] = {"synthetic-chat": s}
    counts = prep_megachat(pc, tmp_path / "prep", "v")
    c = counts["per_source"]["synthetic-chat"]
    assert (c["read"], c["kept"], c["skipped_total"]) == (3, 3, 0)
