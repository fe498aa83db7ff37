"""`andrea data fetch`: download every hub dataset a data profile reads, once, to a local folder
the data stages then read with no network.

Layout of the folder (config `fetch_dir`, default data/hub):

    <owner>/<name>/...             the dataset repository's files (as `hf download --local-dir`)
    manifest.json                  per dataset: the revision asked for, the commit fetched, the
                                   file patterns, and each file's size and sha256
    profiles/<profile>.json        written when every dataset of the profile is complete: the
                                   Snakemake rule fetch_data's output (rewritten only on change)

A revision that is not a full commit hash (`main`) is resolved once, by the first fetch, and the
commit is kept: a later fetch that finds another commit refuses (`--update` moves to it). A
fetch that was stopped resumes: files already fetched and unchanged are not fetched again (a file
cut off mid-way by a broken connection is resumed by huggingface_hub with range requests; one
whose process was stopped starts again from its beginning: huggingface_hub 2.x downloads to a
temporary name of its own process). A second fetch of a complete copy needs no network.

Before the first byte is downloaded, every dataset of the profile is resolved, listed, its file
patterns checked (each must match a file, and together they must select a data file, not only the
card), and its access checked: a gated dataset whose terms were not accepted, or a machine not
logged in, fails here in one paragraph, not after gigabytes of the other datasets.

Where the hub cannot be reached, the fetch fails at once (in about `timeout` seconds at most),
naming the datasets missing, the command to run where there is network, and how to train on the
embedded corpus instead.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from andrea.hub import (FULL_COMMIT, HUB_TIMEOUT_S, MANIFEST, MIRROR_ENV, HubLocation, HubUnreachable, mirror_commit,
                        parse_hub_location, probe_hub, shortened)
from andrea.io import atomic_path, sha256_file, write_json_atomic
from andrea.profiles import hub_inputs, profile_config, profile_entries

log = logging.getLogger("andrea.fetch")

class FetchError(RuntimeError):
    """A fetch that cannot go on; the message says why and what to do."""


class DataNotFetched(FetchError):
    """A profile's hub datasets are neither in the fetch folder nor reachable."""


@dataclass
class Want:
    """One dataset repository a profile reads, and the sources that read it."""

    dataset: str
    revision: str
    patterns: list[str] | None
    sources: list[str] = field(default_factory=list)
    source_patterns: dict[str, list[str] | None] = field(default_factory=dict)  # each source's own `files`
    licences: dict[str, str] = field(default_factory=dict)  # each source's `licence` in the profile

    def spec(self) -> str:
        return f"{self.dataset}@{self.revision}"


@dataclass
class RemoteFile:
    path: str  # relative to the repository root, '/'-separated
    size: int | None
    sha256: str | None  # known for the hub's large (LFS/xet) files; checked after download
    git_sha1: str | None = None  # the git blob id of a regular (not LFS) file; checked after download


class HubAccessDenied(FetchError):
    """The hub refused a dataset's files (gated, private): nothing was downloaded."""


def wanted(pconfig: dict, entries: dict[str, dict] | None = None) -> list[Want]:
    """The dataset repositories of a profile's config, one per dataset (sources sharing one share
    it: their file patterns are merged; they must ask for the same revision). `entries`: the
    profile's entries, for the licences."""
    out: dict[str, Want] = {}
    for key, location, cfg in hub_inputs(pconfig):
        loc = parse_hub_location(location)
        revision = loc.revision or "main"
        patterns = cfg.get("files")
        licence = str(((entries or {}).get(key) or {}).get("licence") or "not stated in the profile")
        w = out.get(loc.dataset)
        if w is None:
            out[loc.dataset] = Want(loc.dataset, revision, sorted(patterns) if patterns else None, [key],
                                    {key: list(patterns) if patterns else None}, {key: licence})
            continue
        if w.revision != revision:
            raise FetchError(f"{', '.join(w.sources)} and {key} read {loc.dataset} at different revisions "
                             f"({w.revision}, {revision}); give them the same one")
        w.patterns = None if w.patterns is None or not patterns else sorted(set(w.patterns) | set(patterns))
        w.sources.append(key)
        w.source_patterns[key] = list(patterns) if patterns else None
        w.licences[key] = licence
    return list(out.values())


def selected(path: str, patterns: list[str] | None) -> bool:
    return patterns is None or any(fnmatch.fnmatch(path, p) for p in patterns)


def is_data_file(path: str) -> bool:
    """Not the dataset card (README.md at the root) nor a dotfile (.gitattributes): what a pattern
    that selects only these fetches is no data. (Markdown elsewhere can be a dataset's data.)"""
    return path != "README.md" and not any(part.startswith(".") for part in path.split("/"))


def check_patterns(profile: str, w: Want, files: list[RemoteFile], where: str) -> None:
    """Each source's `files` patterns must each match a file of the dataset, and together select a
    data file: README.md always matches, so a mistyped data pattern would fetch only the card."""
    names = [f.path for f in files if not f.path.startswith(".")]
    problems = []
    for source, patterns in w.source_patterns.items():
        if not patterns:
            if not any(is_data_file(n) for n in names):
                problems.append(f"profiles.{profile}.sources.{source} reads {w.spec()}, which has no data file")
            continue
        unmatched = [p for p in patterns if not any(fnmatch.fnmatch(n, p) for n in names)]
        data = [n for n in names if selected(n, patterns) and is_data_file(n)]
        if unmatched:
            problems.append(f"profiles.{profile}.sources.{source}.files {patterns}: {', '.join(unmatched)} "
                            f"match{'es' if len(unmatched) == 1 else ''} no file of {w.spec()}")
        elif not data:
            problems.append(f"profiles.{profile}.sources.{source}.files {patterns} select no data file of "
                            f"{w.spec()}, only {', '.join(n for n in names if selected(n, patterns))}")
    if problems:
        data_files = [n for n in names if is_data_file(n)]
        raise FetchError(f"{'; '.join(problems)} (on {where}). Its files are: {shortened(names)}; its data files: "
                         f"{shortened(data_files)}. Correct the patterns (fnmatch, from the repository root); "
                         f"nothing was downloaded.")


# ---------------------------------------------------------------- where the files come from


class HubTransport:
    """The Hugging Face hub, through huggingface_hub (tests: tests/fake_hub.py answers as the hub)."""

    name = "the Hugging Face hub"

    def __init__(self, timeout: float = HUB_TIMEOUT_S):
        self.timeout = timeout
        # huggingface_hub reads these when it is imported: set before the first import
        os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(int(timeout)))
        os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", str(int(timeout)))

    def resolve(self, w: Want, key: str) -> str:
        """The commit a revision stands for (raises HubUnreachable within about the timeout)."""
        return probe_hub(HubLocation(w.dataset, w.revision), self.timeout, key, "") or w.revision

    def list_files(self, w: Want, commit: str) -> list[RemoteFile]:
        from huggingface_hub import HfApi

        info = HfApi().dataset_info(w.dataset, revision=commit, files_metadata=True, timeout=self.timeout)
        files = []
        for s in info.siblings or []:
            lfs = getattr(s, "lfs", None)
            sha = getattr(lfs, "sha256", None) if lfs is not None and not isinstance(lfs, dict) else (lfs or {}).get("sha256")
            # a regular file's blob id is its git sha1; an LFS file's is its pointer's, not the data's
            git_sha1 = getattr(s, "blob_id", None) if lfs is None else None
            files.append(RemoteFile(s.rfilename, getattr(s, "size", None), sha, git_sha1))
        return files

    def check_access(self, w: Want, commit: str, f: RemoteFile) -> None:
        """The metadata request hf_hub_download makes first (HEAD .../resolve/<commit>/<file>), for
        one file: a gated dataset's metadata and file list are public, its files are not, so this
        is where the hub says 401 (not logged in) or 403 (logged in, terms not accepted) with
        X-Error-Code GatedRepo (huggingface_hub utils/_http.py hf_raise_for_status; datasets'
        load.py tells the two apart the same way; huggingface/huggingface_hub#2457 for the public
        metadata). Raises HubAccessDenied; a network failure raises HubUnreachable."""
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

        url = hf_hub_url(w.dataset, f.path, repo_type="dataset", revision=commit)
        try:
            get_hf_file_metadata(url, timeout=self.timeout)
        except GatedRepoError as e:
            raise HubAccessDenied(gated_message(w, e.response.status_code if e.response is not None else None)) from None
        except RepositoryNotFoundError as e:
            raise HubAccessDenied(private_message(w, e.response.status_code if e.response is not None else None)) from None
        except HfHubHTTPError as e:
            status = e.response.status_code if e.response is not None else None
            if status in (401, 403):
                raise HubAccessDenied(denied_message(w, status, str(e).splitlines()[-1])) from None
            raise HubUnreachable(f"{w.spec()}: the hub answered {status} for {f.path} ({type(e).__name__})") from None
        except Exception as e:  # noqa: BLE001 - httpx's network errors, offline mode: out of reach
            raise HubUnreachable(f"{w.spec()}: {f.path}: {type(e).__name__}: {e}") from None

    def download(self, w: Want, commit: str, f: RemoteFile, repo_dir: Path) -> Path:
        from huggingface_hub import hf_hub_download

        # into repo_dir as `hf download --local-dir` does (its download metadata in repo_dir/.cache/huggingface);
        # a connection that breaks mid-file is resumed by huggingface_hub with a range request
        return Path(hf_hub_download(w.dataset, f.path, repo_type="dataset", revision=commit, local_dir=repo_dir,
                                    etag_timeout=self.timeout))


def token_advice(w: Want) -> str:
    page = f"https://huggingface.co/datasets/{w.dataset}"
    return (f"accept its terms on {page} (logged in to the hub), then give this machine a token of that account: "
            f"`hf auth login`, or HF_TOKEN=<token> in the environment (a read token, from "
            f"https://huggingface.co/settings/tokens)")


def gated_message(w: Want, status: int | None) -> str:
    who = ", ".join(w.sources)
    if status == 403:
        return (f"{w.dataset} ({who}) is a gated dataset and the hub refused the token in use (HTTP 403): its account "
                f"has not been granted access. Accept the terms on https://huggingface.co/datasets/{w.dataset} with "
                f"that account (a gate reviewed by hand waits for the authors' approval), or log in with an account "
                f"that has (`hf auth login`, or HF_TOKEN)")
    return (f"{w.dataset} ({who}) is a gated dataset and this machine sent no token the hub accepts (HTTP "
            f"{status or 401}): {token_advice(w)}")


def private_message(w: Want, status: int | None) -> str:
    return (f"the hub shows no dataset {w.dataset} ({', '.join(w.sources)}) to this machine (HTTP {status}): it does "
            f"not exist, or it is private; for a private one, {token_advice(w)}")


def denied_message(w: Want, status: int, detail: str) -> str:
    return (f"the hub refused {w.dataset} ({', '.join(w.sources)}) (HTTP {status}: {detail}); where a token is set "
            f"(HF_TOKEN, or `hf auth login`), check that it is valid; {token_advice(w)}")


class MirrorTransport:
    """A local folder laid out as the hub's repositories (ANDREA_HUB_MIRROR): what the tests fetch
    from, and a way to fetch from a copy on a shared disk. Files are copied."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.name = f"the mirror {self.root} ({MIRROR_ENV})"

    def repo(self, w: Want) -> Path:
        path = self.root / w.dataset
        if not path.is_dir():
            raise HubUnreachable(f"{self.name} has no {w.dataset}")
        return path

    def resolve(self, w: Want, key: str) -> str:
        repo = self.repo(w)
        commit = mirror_commit(repo, HubLocation(w.dataset, w.revision))
        return commit or (w.revision if FULL_COMMIT.match(w.revision) else f"mirror:{w.revision}")

    def list_files(self, w: Want, commit: str) -> list[RemoteFile]:
        repo = self.repo(w)
        return [RemoteFile(p.relative_to(repo).as_posix(), p.stat().st_size, None)
                for p in sorted(repo.rglob("*")) if p.is_file() and ".cache" not in p.relative_to(repo).parts]

    def check_access(self, w: Want, commit: str, f: RemoteFile) -> None:
        self.repo(w)  # a local folder: readable, or not there

    def download(self, w: Want, commit: str, f: RemoteFile, repo_dir: Path) -> Path:
        dest = repo_dir / f.path
        with atomic_path(dest) as tmp:
            shutil.copyfile(self.repo(w) / f.path, tmp)
        return dest


def default_transport(timeout: float) -> HubTransport | MirrorTransport:
    root = os.environ.get(MIRROR_ENV)
    return MirrorTransport(root) if root else HubTransport(timeout)


# ---------------------------------------------------------------- the manifest


def read_manifest(dest: Path) -> dict:
    path = dest / MANIFEST
    if not path.exists():
        return {"datasets": {}}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise FetchError(f"{path} cannot be read ({e}); move it away and fetch again") from None
    data.setdefault("datasets", {})
    return data


def is_complete(dest: Path, w: Want, entry: dict | None) -> bool:
    """The copy of `w` in `dest` is whole: the manifest says so for this revision and these file
    patterns, and every file it lists is there with its size (its sha256 was checked when fetched)."""
    if not entry or not entry.get("complete") or entry.get("revision") != w.revision or entry.get("patterns") != w.patterns:
        return False
    if FULL_COMMIT.match(w.revision) and entry.get("commit") != w.revision:
        return False
    repo = dest / w.dataset
    for rel, meta in entry.get("files", {}).items():
        p = repo / rel
        if not p.is_file() or p.stat().st_size != meta["size"]:
            return False
    return True


# ---------------------------------------------------------------- the fetch


def fetch_command(profile: str, dest: Path) -> str:
    return f"andrea data fetch --profile {profile} --dir {dest}"


def not_fetched_message(profile: str, dest: Path, missing: list[Want], why: str) -> str:
    listed = "; ".join(f"{', '.join(w.sources)} ({w.spec()})" for w in missing)
    n = len(missing)
    return (
        f"data profile {profile!r} reads {n} hub dataset{'s' if n != 1 else ''} not fetched to {dest}: {listed}; "
        f"and {why}. On a machine with network, run `{fetch_command(profile, dest)}` and copy {dest} here "
        f"(the same path from the working directory), then run this again. Or train on the embedded demo corpus "
        f"instead, with no network: add `--config data_profile=embedded` to the snakemake command "
        f"(or set models.<model>.data: embedded in config/config.yaml); that still trains the model you asked "
        f"for, and ANDREA-12M and larger need an NVIDIA GPU (on a CPU the trainer refuses them: its estimate for "
        f"ANDREA-120M on 2 cores is about 2,300 days). "
        f"On a CPU, train ANDREA-tiny, the CPU model, which reads the embedded corpus: "
        f"`snakemake --cores 2 results/ANDREA-tiny/ckpt`."
    )


def resolve_all(transport, wants: list[Want], timeout: float) -> tuple[dict[str, str], dict[str, Exception]]:
    """Each dataset's commit, asked concurrently so that an unreachable hub costs one timeout."""
    commits: dict[str, str] = {}
    errors: dict[str, Exception] = {}

    def one(w: Want) -> None:
        try:
            commits[w.dataset] = transport.resolve(w, ", ".join(w.sources))
        except Exception as e:  # noqa: BLE001 - sorted out by the caller
            errors[w.dataset] = e

    threads = [threading.Thread(target=one, args=(w,), daemon=True, name=f"resolve-{w.dataset}") for w in wants]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout + 2.0  # one deadline for all: they run at once
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    for w in wants:
        if w.dataset not in commits and w.dataset not in errors:
            errors[w.dataset] = HubUnreachable(f"no answer for {w.dataset} within {timeout:g} s")
    return commits, errors


@dataclass
class Plan:
    """What a fetch of one dataset downloads: the files its patterns select at `commit`, and those
    of them already fetched and unchanged (`done`)."""

    want: Want
    commit: str
    files: list[RemoteFile]
    done: set[str]

    @property
    def to_download(self) -> list[RemoteFile]:
        return [f for f in self.files if f.path not in self.done]


def _setup(config: dict, profile: str, dest, timeout):
    pconfig = profile_config({**config, "data_profile": None}, profile)
    dest = Path(dest if dest is not None else config["fetch_dir"])
    timeout = float(timeout if timeout is not None else config["hermes3"]["hub_timeout_s"])
    wants = wanted(pconfig, profile_entries(config, profile))
    manifest = read_manifest(dest)
    missing = [w for w in wants if not is_complete(dest, w, manifest["datasets"].get(w.dataset))]
    return dest, timeout, wants, manifest, missing


def fetch_profile(config: dict, profile: str, dest: str | os.PathLike | None = None, update: bool = False,
                  timeout: float | None = None, transport=None) -> dict:
    """Fetch every hub dataset of `profile` into `dest` (default: the config's fetch_dir). Returns
    {dataset: {"commit", "files", "bytes", "fetched"}}; raises DataNotFetched (no network and
    something missing), HubAccessDenied (gated or private, before any download) or FetchError."""
    dest, timeout, wants, manifest, missing = _setup(config, profile, dest, timeout)
    for w in wants:
        if w not in missing:
            log.info("fetch: %s is complete in %s (commit %s)", w.spec(), dest, manifest["datasets"][w.dataset]["commit"])

    if missing:
        transport = transport or default_transport(timeout)
        plans = plan_missing(profile, transport, dest, manifest, missing, timeout, update)
        check_access(profile, transport, plans)
        for plan in plans:
            _fetch_one(transport, dest, manifest, plan)

    summary = {}
    for w in wants:
        entry = manifest["datasets"][w.dataset]
        summary[w.dataset] = {"commit": entry["commit"], "files": len(entry["files"]),
                              "bytes": sum(f["size"] for f in entry["files"].values()), "fetched": w in missing,
                              "sources": w.sources}
    marker = {"profile": profile, "datasets": {w.dataset: {"revision": w.revision, "commit": summary[w.dataset]["commit"],
                                                         "sources": w.sources} for w in wants}}
    _write_if_changed(dest / "profiles" / f"{profile}.json", marker)
    return summary


def dry_run(config: dict, profile: str, dest: str | os.PathLike | None = None, update: bool = False,
            timeout: float | None = None, transport=None) -> tuple[list[dict], HubAccessDenied | None]:
    """What `fetch_profile` would download, through the same transport and checks, downloading and
    writing nothing: per dataset {"dataset", "sources", "revision", "commit", "licences", "files":
    [(path, size, already_fetched)]}, and the access refusal the fetch would stop at (None: none).
    Datasets complete in `dest` are read from its manifest (no network); offline, it fails as the
    fetch does."""
    dest, timeout, wants, manifest, missing = _setup(config, profile, dest, timeout)
    plans = {}
    refused = None
    if missing:
        transport = transport or default_transport(timeout)
        plans = {p.want.dataset: p for p in plan_missing(profile, transport, dest, manifest, missing, timeout, update)}
        try:
            check_access(profile, transport, list(plans.values()))
        except HubAccessDenied as e:
            refused = e
    out = []
    for w in wants:
        plan = plans.get(w.dataset)
        if plan is not None:
            commit, files = plan.commit, [(f.path, f.size, f.path in plan.done) for f in plan.files]
        else:
            entry = manifest["datasets"][w.dataset]
            commit, files = entry["commit"], [(rel, meta["size"], True) for rel, meta in sorted(entry["files"].items())]
        out.append({"dataset": w.dataset, "sources": w.sources, "revision": w.revision, "commit": commit,
                    "licences": sorted(set(w.licences.values())), "files": files})
    return out, refused


def human_size(n: int | None) -> str:
    if n is None:
        return "size unknown"
    for unit, step in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= step:
            return f"{n / step:.1f} {unit}"
    return f"{n} B"


def plan_missing(profile: str, transport, dest: Path, manifest: dict, missing: list[Want], timeout: float,
                 update: bool) -> list[Plan]:
    """Resolve, list and check every dataset not complete in `dest`; downloads nothing."""
    commits, errors = resolve_all(transport, missing, timeout)
    if errors:
        offline = [w for w in missing if isinstance(errors.get(w.dataset), HubUnreachable) and _is_network(errors[w.dataset])]
        if len(offline) == len(errors):
            why = _why_unreachable(transport, errors[offline[0].dataset], timeout)
            raise DataNotFetched(not_fetched_message(profile, dest, missing, why))
        detail = "; ".join(f"{w.spec()} ({', '.join(w.sources)}): {str(errors[w.dataset]).strip()}"
                           for w in missing if w.dataset in errors)
        raise FetchError(f"data profile {profile!r}: cannot fetch {detail}")
    plans = []
    for w in missing:
        commit = commits[w.dataset]
        entry = manifest["datasets"].get(w.dataset)
        if entry and entry.get("revision") == w.revision and entry.get("commit") not in (None, commit) and not update:
            raise FetchError(
                f"{w.spec()} was fetched at commit {entry['commit']}, and {w.revision} is now commit {commit}: the copy in "
                f"{dest} stays as it is. Run the fetch with --update to move to {commit} (the data stages then re-run), "
                f"or pin the location to @{entry['commit']}"
            )
        try:
            listed = transport.list_files(w, commit)
        except (HubUnreachable, FetchError):
            raise
        except Exception as e:  # noqa: BLE001 - the hub's answer, named
            raise FetchError(f"data profile {profile!r}: cannot list the files of {w.spec()} ({', '.join(w.sources)}) "
                             f"on {transport.name} ({type(e).__name__}: {e})") from None
        files = [f for f in listed if selected(f.path, w.patterns) and not f.path.startswith(".")]
        if not files:
            raise FetchError(f"{w.spec()} has no file matching {w.patterns} on {transport.name}")
        check_patterns(profile, w, listed, transport.name)
        have = (entry or {}).get("files", {}) if (entry or {}).get("commit") == commit else {}
        repo = dest / w.dataset
        done = {f.path for f in files if _unchanged(have.get(f.path), repo / f.path, f)}
        plans.append(Plan(w, commit, files, done))
    return plans


def _unchanged(have: dict | None, local: Path, f: RemoteFile) -> bool:
    """Fetched before (by a fetch that stopped), and still whole."""
    return bool(have) and local.is_file() and local.stat().st_size == have["size"] and f.size in (None, have["size"])


def check_access(profile: str, transport, plans: list[Plan]) -> None:
    """Ask for one file of every dataset that has files to download, before any is downloaded:
    one paragraph for every dataset the hub refuses."""
    refused = []
    for plan in plans:
        todo = plan.to_download
        if not todo:
            continue
        probe = next((f for f in todo if is_data_file(f.path)), todo[0])  # the card of a gated repo may be open
        try:
            transport.check_access(plan.want, plan.commit, probe)
        except HubAccessDenied as e:
            refused.append(str(e))
        except HubUnreachable as e:  # it answered the listing a moment ago
            raise FetchError(f"data profile {profile!r}: {transport.name} stopped answering ({e}); run the fetch "
                             f"again") from None
    if refused:
        n = len(refused)
        raise HubAccessDenied(f"data profile {profile!r}: {'; '.join(refused)}. Nothing was downloaded"
                              f"{'' if n == len(plans) else ' (the other datasets wait for these)'}; run the fetch "
                              f"again once {'it is' if n == 1 else 'they are'} open to this machine.")


def _is_network(e: Exception) -> bool:
    """An error that says the hub is out of reach (not: no such dataset, gated, bad revision)."""
    text = str(e)
    return not any(s in text for s in ("gated dataset", "has no revision", "the hub has no dataset", "the hub refused"))


def _why_unreachable(transport, e: Exception, timeout: float) -> str:
    text = str(e)
    if "offline mode" in text:
        return "offline mode is on (HF_HUB_OFFLINE)"
    if "no answer" in text or "did not answer" in text:
        return f"{transport.name} did not answer within {timeout:g} s"
    if isinstance(transport, MirrorTransport):
        return f"{transport.name} does not hold them"
    m = re.search(r"\(([^()]*(?:\([^()]*\)[^()]*)*)\)\.", text)  # the probe's (ErrorType: detail)
    return f"the Hugging Face hub cannot be reached ({m.group(1) if m else text})"


def _fetch_one(transport, dest: Path, manifest: dict, plan: Plan) -> None:
    w, commit, files = plan.want, plan.commit, plan.files
    entry = manifest["datasets"].get(w.dataset)
    if not entry or entry.get("commit") != commit:
        entry = {"revision": w.revision, "commit": commit, "patterns": w.patterns, "complete": False, "files": {}}
    entry.update(revision=w.revision, patterns=w.patterns, complete=False)
    manifest["datasets"][w.dataset] = entry
    repo = dest / w.dataset
    total = sum(f.size or 0 for f in files)
    log.info("fetch: %s (%s) commit %s: %d files, %.1f MB, into %s", w.spec(), ", ".join(w.sources), commit,
             len(files), total / 1e6, repo)
    done_bytes = 0
    for k, f in enumerate(files, 1):
        if f.path in plan.done:
            done_bytes += entry["files"][f.path]["size"]
            continue  # fetched before this (stopped) fetch: unchanged
        path = transport.download(w, commit, f, repo)
        digest = sha256_file(path)
        size = path.stat().st_size
        if f.sha256 and digest != f.sha256:
            path.unlink()
            raise FetchError(f"{w.dataset}/{f.path}: sha256 {digest} is not the hub's {f.sha256}; it was removed, fetch again")
        if f.git_sha1 and git_blob_sha1(path) != f.git_sha1:
            path.unlink()
            raise FetchError(f"{w.dataset}/{f.path}: its git blob id is not the hub's {f.git_sha1}; it was removed, "
                             "fetch again")
        if f.size is not None and size != f.size:
            path.unlink()
            raise FetchError(f"{w.dataset}/{f.path}: {size} bytes, the hub says {f.size}; it was removed, fetch again")
        entry["files"][f.path] = {"size": size, "sha256": digest}
        done_bytes += size
        write_json_atomic(dest / MANIFEST, manifest)  # progress survives a stop
        log.info("fetch: [%d/%d] %s/%s %.1f MB (%.0f%% of %.1f MB)", k, len(files), w.dataset, f.path, size / 1e6,
                 100 * done_bytes / max(total, 1), total / 1e6)
    wanted_paths = {f.path for f in files}
    entry["files"] = {p: m for p, m in entry["files"].items() if p in wanted_paths}
    entry["complete"] = True
    write_json_atomic(dest / MANIFEST, manifest)


def git_blob_sha1(path: Path) -> str:
    """The id git (and the hub, as a regular file's blobId) gives a file's content."""
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_if_changed(path: Path, obj: dict) -> None:
    """Snakemake re-runs what reads a file whose time changed: an unchanged marker keeps its own."""
    text = json.dumps(obj, indent=2, sort_keys=True) + "\n"
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
