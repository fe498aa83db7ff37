"""`andrea data fetch` through the real HubTransport and huggingface_hub, against tests/fake_hub.py:
a local server answering as the Hugging Face hub does (its metadata, file, redirect and gating
answers, documented there with the evidence they follow). No network: 127.0.0.1 only.
"""

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from andrea.config import validate_config
from andrea.fetch import MANIFEST, DataNotFetched, FetchError, HubAccessDenied, HubTransport, fetch_profile, human_size
from andrea.hub import MIRROR_ENV
from andrea.io import sha256_file
from fake_hub import serve_hub, use_hub, write_repo
from test_hub_sources import COMMIT, OTHER_COMMIT, msgs, offline  # noqa: F401 (offline: autouse, undone by use_hub)

TOKEN = "hf_faketoken0123456789"


def parquet_bytes(rows: list[dict]) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue().to_pybytes()


CARD = """---
license: apache-2.0
configs:
- config_name: all
  default: true
  data_files:
  - split: train
    path: data/all/train-*
  - split: test
    path: data/all/test-*
- config_name: other
  data_files:
  - split: train
    path: data/other/train-*
---
# a dataset
"""


@pytest.fixture
def hub_root(tmp_path):
    """Two datasets as the hub holds them: `org/smol` (subsets, Parquet through LFS, a test split the
    profile does not fetch) at COMMIT, and `org/chat` (one JSON file stored in git, not LFS)."""
    root = tmp_path / "hub-root"
    rows = [msgs(("user", f"u{i}"), ("assistant", f"a{i}")) for i in range(6)]
    write_repo(root, "org/smol", {
        ".gitattributes": "*.parquet filter=lfs diff=lfs merge=lfs -text\n",
        "README.md": CARD,
        "data/all/train-00000-of-00002.parquet": parquet_bytes(rows[:3]),
        "data/all/train-00001-of-00002.parquet": parquet_bytes(rows[3:]),
        "data/all/test-00000-of-00001.parquet": parquet_bytes(rows[:1]),
        "data/other/train-00000-of-00001.parquet": parquet_bytes(rows[:2]),
    }, sha=COMMIT)
    chat = [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}]
    write_repo(root, "org/chat", {".gitattributes": "*.parquet filter=lfs diff=lfs merge=lfs -text\n",
                                  "chat.json": json.dumps(chat)}, sha=OTHER_COMMIT)
    return root


@pytest.fixture
def profile_cfg(config):
    profile = {"sources": {
        "smoltalk": {"location": "hub:org/smol@main:all:train", "licence": "apache-2.0",
                     "files": ["README.md", "data/all/train-*"]},
        "chat": {"location": f"hub:org/chat@{OTHER_COMMIT}:train", "licence": "cc-by-4.0"},
    }}
    return validate_config({**config, "profiles": {**config["profiles"], "mini": profile}})


@pytest.fixture
def hub(hub_root, monkeypatch, tmp_path):
    with serve_hub(hub_root, token=TOKEN) as url:
        use_hub(monkeypatch, url, home=tmp_path / "hf-home")
        monkeypatch.delenv(MIRROR_ENV, raising=False)
        yield url


# ---------------------------------------------------------------- the fake hub answers as the hub


def test_the_fake_hub_answers_huggingface_hub_as_the_hub_does(hub, hub_root, tmp_path):
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    info = HfApi().dataset_info("org/smol", revision="main", files_metadata=True, timeout=5)
    assert info.sha == COMMIT
    sib = {s.rfilename: s for s in info.siblings}
    big = "data/all/train-00000-of-00002.parquet"
    assert sib[big].size == (hub_root / "org/smol" / big).stat().st_size
    assert sib[big].lfs.sha256 == sha256_file(hub_root / "org/smol" / big)
    assert sib["README.md"].lfs is None and sib["README.md"].blob_id  # a regular git file: its blob id only
    assert ".hub.json" not in sib
    with pytest.raises(RevisionNotFoundError):
        HfApi().dataset_info("org/smol", revision=OTHER_COMMIT, timeout=5)
    with pytest.raises(RepositoryNotFoundError):
        HfApi().dataset_info("org/nope", timeout=5)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download("org/smol", "nope.txt", repo_type="dataset", revision=COMMIT, local_dir=tmp_path / "x")
    # an LFS file: a redirect to the storage host, followed without the token
    path = hf_hub_download("org/smol", big, repo_type="dataset", revision=COMMIT, local_dir=tmp_path / "dl")
    assert sha256_file(path) == sib[big].lfs.sha256
    assert [r.status for r in hub.requests if big in r.path] == [302, 200]
    assert hub.gets(big)[0].path.startswith("/cdn/")
    # gating: the metadata is open, the files are not
    (hub_root / "org/smol" / ".hub.json").write_text(json.dumps({"sha": COMMIT, "gated": "manual"}))
    assert HfApi().dataset_info("org/smol", timeout=5).gated == "manual"
    with pytest.raises(GatedRepoError) as e:
        hf_hub_download("org/smol", "README.md", repo_type="dataset", revision=COMMIT, local_dir=tmp_path / "g")
    assert e.value.response.status_code == 401
    with pytest.raises(GatedRepoError):
        HfApi().auth_check("org/smol", repo_type="dataset")


def test_a_range_request_gets_the_rest_of_the_file(hub, hub_root):
    import httpx2

    rel = "data/all/train-00001-of-00002.parquet"
    data = (hub_root / "org/smol" / rel).read_bytes()
    head = httpx2.head(f"{hub}/datasets/org/smol/resolve/main/{rel}", timeout=5)
    assert head.status_code == 302 and int(head.headers["X-Linked-Size"]) == len(data)
    r = httpx2.get(head.headers["Location"], headers={"Range": "bytes=100-"}, timeout=5)
    assert r.status_code == 206 and r.content == data[100:]
    assert r.headers["Content-Range"] == f"bytes 100-{len(data) - 1}/{len(data)}"


# ---------------------------------------------------------------- the real transport, end to end


def test_fetch_through_the_hub_transport_checks_every_file_and_a_second_fetch_asks_nothing(hub, hub_root, profile_cfg, tmp_path):
    dest = tmp_path / "fetched"
    summary = fetch_profile(profile_cfg, "mini", dest=dest, timeout=5)
    assert {d: s["commit"] for d, s in summary.items()} == {"org/smol": COMMIT, "org/chat": OTHER_COMMIT}
    manifest = json.loads((dest / MANIFEST).read_text())["datasets"]
    assert sorted(manifest["org/smol"]["files"]) == ["README.md", "data/all/train-00000-of-00002.parquet",
                                                     "data/all/train-00001-of-00002.parquet"]
    for dataset, entry in manifest.items():
        for rel, meta in entry["files"].items():
            assert meta["sha256"] == sha256_file(hub_root / dataset / rel) == sha256_file(dest / dataset / rel)
    assert not hub.gets("test-0000") and not hub.gets("other")  # only the files asked for
    before, n = (dest / MANIFEST).read_text(), len(hub.requests)
    again = fetch_profile(profile_cfg, "mini", dest=dest, timeout=5)
    assert not any(s["fetched"] for s in again.values())
    assert len(hub.requests) == n and (dest / MANIFEST).read_text() == before


def test_the_fetched_copy_reads_with_the_test_split_declared_but_not_fetched(hub, profile_cfg, tmp_path, monkeypatch):
    """smoltalk's layout: the card declares train and test for `all`, only train is fetched."""
    from andrea.hub import iter_hub_rows, parse_hub_location

    dest = tmp_path / "fetched"
    fetch_profile(profile_cfg, "mini", dest=dest, timeout=5)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # read with no hub at all
    rows = list(iter_hub_rows(parse_hub_location("hub:org/smol@main:all:train"), "sources.smoltalk.location",
                              mirror_root=dest))
    assert [r.value["messages"][0]["content"] for r in rows] == [f"u{i}" for i in range(6)]


def test_a_stopped_fetch_resumes_without_fetching_a_file_twice(hub, profile_cfg, tmp_path, monkeypatch):
    dest = tmp_path / "fetched"
    real = HubTransport.download
    calls = []

    def stop_after_two(self, w, commit, f, repo_dir):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(f.path)
        return real(self, w, commit, f, repo_dir)

    monkeypatch.setattr(HubTransport, "download", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        fetch_profile(profile_cfg, "mini", dest=dest, timeout=5)
    first = {r.path for r in hub.gets()}
    monkeypatch.setattr(HubTransport, "download", real)
    fetch_profile(profile_cfg, "mini", dest=dest, timeout=5)
    second = [r.path for r in hub.gets()][len(first):]
    assert len(calls) == 2 and second
    assert not {p.rsplit("/", 1)[-1] for p in first} & {p.rsplit("/", 1)[-1] for p in second}
    assert (dest / "profiles" / "mini.json").exists()


def test_a_download_cut_mid_file_is_completed_and_checked(hub, profile_cfg, tmp_path):
    rel = "data/all/train-00001-of-00002.parquet"
    hub.cut_once(rel, after=50)
    dest = tmp_path / "fetched"
    fetch_profile(profile_cfg, "mini", dest=dest, timeout=5)
    assert [r.status for r in hub.gets(rel)] == [299, 200]  # broken once, then whole
    entry = json.loads((dest / MANIFEST).read_text())["datasets"]["org/smol"]["files"][rel]
    assert entry["sha256"] == sha256_file(dest / "org/smol" / rel)


def test_a_file_that_is_not_what_the_hub_lists_is_removed(hub, hub_root, profile_cfg, tmp_path, monkeypatch):
    real = HubTransport.list_files

    def stale(self, w, commit):  # the listing of one moment, the file of another
        out = real(self, w, commit)
        for f in out:
            if f.path == "chat.json":
                f.git_sha1 = hashlib.sha1(b"other").hexdigest()
        return out

    monkeypatch.setattr(HubTransport, "list_files", stale)
    dest = tmp_path / "fetched"
    with pytest.raises(FetchError, match="org/chat/chat.json: its git blob id is not the hub's"):
        fetch_profile(profile_cfg, "mini", dest=dest, timeout=5)
    assert not (dest / "org/chat/chat.json").exists()


# ---------------------------------------------------------------- patterns that match nothing


@pytest.mark.parametrize("files, says", [
    (["README.md", "data/nope-*"], "data/nope-* matches no file of org/smol@main"),
    (["README.md", "*.md"], "select no data file of org/smol@main, only README.md"),
])
def test_a_data_pattern_that_matches_nothing_fails_the_fetch_naming_the_entry(hub, profile_cfg, tmp_path, files, says):
    """README.md always matches: `files: [README.md, data/nope-*]` would fetch the card alone."""
    cfg = json.loads(json.dumps(profile_cfg))
    cfg["profiles"]["mini"]["sources"]["smoltalk"]["files"] = files
    with pytest.raises(FetchError) as e:
        fetch_profile(cfg, "mini", dest=tmp_path / "fetched", timeout=5)
    msg = str(e.value)
    assert "profiles.mini.sources.smoltalk.files" in msg and says in msg, msg
    assert "data/all/train-00000-of-00002.parquet" in msg and "nothing was downloaded" in msg
    assert not hub.gets() and not (tmp_path / "fetched" / "org").exists()


# ---------------------------------------------------------------- gated datasets


@pytest.mark.parametrize("token, status, says", [
    (None, 401, "sent no token the hub accepts (HTTP 401)"),
    (TOKEN, 403, "refused the token in use (HTTP 403)"),
])
def test_a_gated_dataset_fails_before_any_download_naming_the_page_and_the_token(
        hub, hub_root, profile_cfg, tmp_path, monkeypatch, token, status, says):
    (hub_root / "org/smol" / ".hub.json").write_text(json.dumps({"sha": COMMIT, "gated": "manual"}))
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    dest = tmp_path / "fetched"
    with pytest.raises(HubAccessDenied) as e:
        fetch_profile(profile_cfg, "mini", dest=dest, timeout=5)
    msg = str(e.value)
    assert says in msg and "org/smol (smoltalk) is a gated dataset" in msg
    assert "https://huggingface.co/datasets/org/smol" in msg and "hf auth login" in msg and "HF_TOKEN" in msg
    assert "Nothing was downloaded" in msg and "\n" not in msg
    assert not hub.gets(), "no file of any dataset (org/chat is open) was downloaded"
    assert [r.status for r in hub.requests if r.method == "HEAD" and "org/smol" in r.path] == [status], hub.requests
    assert not dest.exists()


def test_a_gated_dataset_whose_terms_were_accepted_is_fetched_with_the_token(hub, hub_root, profile_cfg, tmp_path, monkeypatch):
    (hub_root / "org/smol" / ".hub.json").write_text(json.dumps({"sha": COMMIT, "gated": "auto", "accepted": True}))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    fetch_profile(profile_cfg, "mini", dest=tmp_path / "fetched", timeout=5)
    resolves = [r for r in hub.requests if "/resolve/" in r.path]
    assert resolves and all(r.auth for r in resolves)
    assert hub.gets("/cdn/") and not any(r.auth for r in hub.gets("/cdn/"))  # the token stays on the hub


def test_offline_the_fetch_still_fails_at_once(hub, profile_cfg, tmp_path, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(DataNotFetched, match="offline mode"):
        fetch_profile(profile_cfg, "mini", dest=tmp_path / "fetched", timeout=5)
    assert not hub.requests or all(r.path == "/api/agent-harnesses" for r in hub.requests)


# ---------------------------------------------------------------- andrea data fetch --dry-run


def write_config(tmp_path, profile_cfg):
    import yaml

    from conftest import REPO

    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    raw["profiles"]["mini"] = profile_cfg["profiles"]["mini"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def tree(path):
    return sorted((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*")) if path.exists() else []


def test_dry_run_lists_every_file_revision_commit_licence_and_total_and_writes_nothing(
        hub, hub_root, profile_cfg, tmp_path, monkeypatch, capsys):
    from andrea.cli import main

    config = write_config(tmp_path, profile_cfg)
    dest = tmp_path / "fetched"
    real = HubTransport.download
    monkeypatch.setattr(HubTransport, "download", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt)
                        if a[3].path.endswith("00001-of-00002.parquet") else real(*a))
    with pytest.raises(KeyboardInterrupt):  # a fetch stopped after two files of org/smol
        fetch_profile(profile_cfg, "mini", dest=dest, timeout=5)
    monkeypatch.setattr(HubTransport, "download", real)
    before, gets = tree(dest), len(hub.gets())
    assert main(["data", "fetch", "--config", str(config), "--profile", "mini", "--dir", str(dest), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert tree(dest) == before and len(hub.gets()) == gets  # nothing downloaded or written

    size = {rel: (hub_root / "org/smol" / rel).stat().st_size for rel in
            ("README.md", "data/all/train-00000-of-00002.parquet", "data/all/train-00001-of-00002.parquet")}
    assert f"org/smol (smoltalk): revision main = commit {COMMIT}; licence apache-2.0" in out
    assert f"org/chat (chat): revision {OTHER_COMMIT} (a pinned commit); licence cc-by-4.0" in out
    lines = out.splitlines()
    for rel in size:
        line = next(ln for ln in lines if ln.strip().startswith(rel + " "))
        assert human_size(size[rel]) in line
        assert ("already fetched" in line) == (rel != "data/all/train-00001-of-00002.parquet"), line
    assert "1 of 3 files to download" in out and "test-0000" not in out and "other" not in out
    assert "chat.json" in out
    # chat comes first in the profile: it was fetched whole before the stop
    left = size["data/all/train-00001-of-00002.parquet"]
    assert out.splitlines()[-1] == (f"total: 1 file, {human_size(left)} to download; 3 files, "
                                    f"{human_size(sum(size.values()) - left + (hub_root / 'org/chat/chat.json').stat().st_size)} "
                                    "already fetched")


def test_dry_run_offline_fails_as_the_fetch_does(hub, profile_cfg, tmp_path, monkeypatch, capsys):
    from andrea.cli import main

    config = write_config(tmp_path, profile_cfg)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    rc = main(["data", "fetch", "--config", str(config), "--profile", "mini", "--dir", str(tmp_path / "f"), "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 1 and "offline mode" in err and "andrea data fetch --profile mini" in err
    assert not (tmp_path / "f").exists()


def test_dry_run_of_a_gated_dataset_lists_the_files_then_says_what_the_fetch_would_stop_at(
        hub, hub_root, profile_cfg, tmp_path, capsys):
    from andrea.cli import main

    (hub_root / "org/smol" / ".hub.json").write_text(json.dumps({"sha": COMMIT, "gated": "auto"}))
    config = write_config(tmp_path, profile_cfg)
    rc = main(["data", "fetch", "--config", str(config), "--profile", "mini", "--dir", str(tmp_path / "f"), "--dry-run"])
    out, err = capsys.readouterr()
    assert rc == 1 and "data/all/train-00000-of-00002.parquet" in out and "total: " in out
    assert "https://huggingface.co/datasets/org/smol" in err and "hf auth login" in err
    assert not hub.gets()


def test_a_token_the_hub_refuses_is_named_not_taken_for_an_unreachable_hub(hub, profile_cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_expired")  # the hub answers 401 "Invalid credentials" to any request with it
    with pytest.raises(FetchError) as e:
        fetch_profile(profile_cfg, "mini", dest=tmp_path / "fetched", timeout=5)
    assert not isinstance(e.value, DataNotFetched)
    msg = str(e.value)
    assert "the hub refused the request for org/smol (HTTP 401" in msg and "Invalid credentials" in msg
    assert "HF_TOKEN" in msg and "hf auth login" in msg
    assert "\n" not in msg, msg


def test_a_private_dataset_out_of_sight_names_the_token(hub, hub_root, profile_cfg, tmp_path, monkeypatch):
    (hub_root / "org/smol" / ".hub.json").write_text(json.dumps({"sha": COMMIT, "private": True}))
    with pytest.raises(FetchError) as e:
        fetch_profile(profile_cfg, "mini", dest=tmp_path / "fetched", timeout=5)
    assert not isinstance(e.value, DataNotFetched)
    assert "the hub has no dataset 'org/smol' that this machine may see" in str(e.value) and "HF_TOKEN" in str(e.value)
    assert not hub.gets()
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # an account that can read it
    assert fetch_profile(profile_cfg, "mini", dest=tmp_path / "fetched", timeout=5)["org/smol"]["commit"] == COMMIT
