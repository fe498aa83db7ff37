"""Datasets on the Hugging Face hub: `hub:<dataset id>[@revision][:split]` locations, read with
`datasets` in streaming mode (so `max_docs` stops the download early), and a reachability probe
with a hard deadline, so that an unreachable hub fails in seconds with advice instead of hanging.

A local copy stands in for the hub without changing the configuration or any stage version:
the dataset `owner/name` is read from ROOT/owner/name when that folder exists (a copy made with
`hf download --repo-type dataset owner/name --local-dir ROOT/owner/name`), where ROOT is
ANDREA_HUB_MIRROR when set, else the folder `andrea data fetch` fills (config `fetch_dir`, passed
by the data stages as `mirror_root`). The copy's README.md `configs:` name the subsets and their
splits' files, as on the hub; but only the split asked for is read, from its own files
(`local_split`): a copy holds the files fetched, and `datasets` refuses a whole dataset whose card
declares a split with no file here (smoltalk's `all` subset declares a test split the real
profile does not fetch).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from andrea.records import RawRow

log = logging.getLogger("andrea.hub")

HUB_PREFIX = "hub:"
HUB_TIMEOUT_S = 20.0  # an unreachable hub fails within about this (the sources' deadline)
MIRROR_ENV = "ANDREA_HUB_MIRROR"
RECORD_DIR_READS = "every Parquet/JSON/JSONL file under it is read"  # what `location: DIR` does for record adapters
# The fetch folder's record of what `andrea data fetch` downloaded (andrea.fetch writes it): read here
# too, for the commit of a dataset read from that folder.
MANIFEST = "manifest.json"
HUB_FORM = "hub:<owner>/<name>[@<revision>][:<split>] or hub:<owner>/<name>[@<revision>]:<subset>:<split>"

# Repository ids as the hub spells them; git refs cannot hold ':' or '@{', so ':' ends a revision.
DATASET_ID = re.compile(r"^[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?(?:/[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?)?$")
REVISION = re.compile(r"^[^\s:@~^?*\[\\]+$")
SUBSET = re.compile(r"^[\w.-]+$")
SPLIT = re.compile(r"^\w+(?:\.\w+)*$")  # the split names `datasets` accepts
FULL_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class HubUnreachable(RuntimeError):
    """The Hugging Face hub could not be reached (or would not answer) in time."""


class HubDatasetError(ValueError):
    """The hub (or the mirror) answered, but the dataset cannot be read as configured."""


@dataclass(frozen=True)
class HubLocation:
    dataset: str
    revision: str | None = None
    subset: str | None = None
    split: str = "train"

    def __str__(self) -> str:
        s = HUB_PREFIX + self.dataset + (f"@{self.revision}" if self.revision else "")
        return s + (f":{self.subset}" if self.subset else "") + f":{self.split}"

    def as_input(self) -> dict:
        """How a manifest names what was read."""
        return {"hub": self.dataset, "revision": self.revision, "subset": self.subset, "split": self.split}


def is_hub_location(location) -> bool:
    return isinstance(location, str) and location.startswith(HUB_PREFIX)


def parse_hub_location(text: str) -> HubLocation:
    """`hub:ID[@REV][:SPLIT]` or `hub:ID[@REV]:SUBSET:SPLIT` (split `train` when absent).
    Raises ValueError saying what is wrong and what the form is."""
    if not is_hub_location(text):
        raise ValueError(f"{text!r} is not a hub location ({HUB_FORM})")
    body = text[len(HUB_PREFIX):]
    if "[" in body:
        raise ValueError(f"{text!r}: split slices such as train[:10%] are not supported; use max_docs to read fewer rows")
    parts = body.split(":")
    if len(parts) > 3:
        raise ValueError(f"{text!r} has too many ':'-separated fields; the form is {HUB_FORM}")
    head, fields = parts[0], parts[1:]
    dataset, at, revision = head.partition("@")
    if not dataset:
        raise ValueError(f"{text!r} names no dataset; the form is {HUB_FORM}")
    if not DATASET_ID.match(dataset) or "--" in dataset or ".." in dataset:
        raise ValueError(f"{text!r}: {dataset!r} is not a hub dataset id (owner/name); the form is {HUB_FORM}")
    if at and not revision:
        raise ValueError(f"{text!r} has '@' but no revision after it; the form is {HUB_FORM}")
    if revision and not REVISION.match(revision):
        raise ValueError(f"{text!r}: {revision!r} is not a revision (a commit hash, branch or tag)")
    subset, split = (None, "train") if not fields else (None, fields[0]) if len(fields) == 1 else fields
    if subset is not None and not SUBSET.match(subset):
        raise ValueError(f"{text!r}: {subset!r} is not a subset name; the form is {HUB_FORM}")
    if not SPLIT.match(split):
        raise ValueError(f"{text!r}: {split!r} is not a split name (letters, digits, '_'); the form is {HUB_FORM}")
    return HubLocation(dataset, revision or None, subset, split)


def download_advice(loc: HubLocation, key: str, local_dir_reads: str | None) -> str:
    """How to run without the hub. `local_dir_reads` says what `key: DIR` would read, for the
    adapters that read a downloaded folder as it is (None for those that do not)."""
    rev = f" --revision {loc.revision}" if loc.revision else ""
    fetch = f"`hf download --repo-type dataset {loc.dataset}{rev} --local-dir DIR`"
    mirror = (
        f"keep this location and set {MIRROR_ENV}=M with the copy at M/{loc.dataset} (read as from the hub: "
        "the same subset, split and stage version)"
    )
    if local_dir_reads:
        return (
            f"To use a local copy, run {fetch} on a machine with network and bring DIR here; then set {key} "
            f"to DIR ({local_dir_reads}), or {mirror}."
        )
    return f"To use a local copy, run {fetch} on a machine with network and bring DIR here; then {mirror}."


def probe_hub(loc: HubLocation, timeout: float, key: str, advice: str) -> str | None:
    """Ask the hub for the dataset's metadata with a hard deadline; returns the commit the
    revision stands for. Raises HubUnreachable (naming the config `key`, with `advice`) when the
    hub is out of reach, offline mode is on, or the dataset or revision does not exist."""
    result: dict = {}

    def probe() -> None:
        try:
            from huggingface_hub import HfApi

            result["sha"] = HfApi().dataset_info(loc.dataset, revision=loc.revision, timeout=timeout).sha
        except Exception as e:  # noqa: BLE001 - reported below with its type
            result["error"] = e

    t = threading.Thread(target=probe, daemon=True, name="hub-probe")
    t.start()
    t.join(timeout + 1.0)
    if t.is_alive():
        raise HubUnreachable(f"{key}: the Hugging Face hub did not answer for {loc.dataset} within {timeout:g} s. {advice}")
    err = result.get("error")
    if err is None:
        return result.get("sha")
    name = type(err).__name__
    if "OfflineMode" in name:
        raise HubUnreachable(f"{key}: {loc.dataset} is on the Hugging Face hub and offline mode is on (HF_HUB_OFFLINE). {advice}")
    if "GatedRepo" in name:
        raise HubUnreachable(
            f"{key}: {loc.dataset} is a gated dataset: accept its terms on https://huggingface.co/datasets/{loc.dataset} "
            f"and give this machine a token of that account (`hf auth login`, or HF_TOKEN) ({name}). {advice}"
        )
    status = getattr(getattr(err, "response", None), "status_code", None)
    if status in (401, 403) and "NotFound" not in name:  # the token sent is refused (the hub answers 401 to a bad one)
        detail = str(err).strip().splitlines()[-1] if str(err).strip() else name
        raise HubUnreachable(
            f"{key}: the hub refused the request for {loc.dataset} (HTTP {status}: {detail}): the token this machine "
            f"sends is not valid; set HF_TOKEN to a valid read token, or run `hf auth login` again (or unset HF_TOKEN "
            f"for a public dataset). {advice}"
        )
    if "RevisionNotFound" in name:
        raise HubUnreachable(f"{key}: the hub's dataset {loc.dataset} has no revision {loc.revision!r} ({name}). {advice}")
    if "RepositoryNotFound" in name or "NotFound" in name:
        raise HubUnreachable(f"{key}: the hub has no dataset {loc.dataset!r} that this machine may see ({name}): check the "
                             f"id; a private dataset needs a token of an account that can read it (`hf auth login`, or "
                             f"HF_TOKEN). {advice}")
    raise HubUnreachable(f"{key}: could not reach the Hugging Face hub for {loc.dataset} ({name}: {err}). {advice}")


def mirror_dir(loc: HubLocation, fetch_root: str | os.PathLike | None = None) -> Path | None:
    """The local copy of the dataset: in ANDREA_HUB_MIRROR when it is set and holds one, else in
    `fetch_root` (the fetch folder) when that holds one; None: read it from the hub."""
    for root, what in ((os.environ.get(MIRROR_ENV), MIRROR_ENV), (fetch_root, "the fetch folder")):
        if not root:
            continue
        path = Path(root) / loc.dataset
        if path.is_dir():
            return path
        log.info("%s %s has no %s", what, root, loc.dataset)
    return None


def mirror_commit(path: Path, loc: HubLocation) -> str | None:
    """The commit an `hf download --local-dir` copy was made from (huggingface_hub writes it as the
    first line of .cache/huggingface/download/<file>.metadata). A location that pins a full commit
    hash must match it: a stage version names that commit, so a copy of another one is refused."""
    commits = set()
    meta = path / ".cache" / "huggingface" / "download"
    for f in sorted(meta.rglob("*.metadata")) if meta.is_dir() else []:
        first = f.read_text(encoding="utf-8", errors="replace").partition("\n")[0].strip()
        if FULL_COMMIT.match(first):
            commits.add(first)
    if len(commits) > 1:
        raise HubDatasetError(f"the mirror copy {path} mixes files of commits {', '.join(sorted(commits))}; download it again")
    commit = commits.pop() if commits else None
    if loc.revision and FULL_COMMIT.match(loc.revision):
        if commit is None:
            log.warning("%s: cannot check that the mirror copy %s is commit %s (no download metadata)", loc, path, loc.revision)
        elif commit != loc.revision:
            raise HubDatasetError(
                f"the mirror copy {path} is commit {commit}, but the location pins {loc.revision}; download "
                f"that revision (`hf download --repo-type dataset {loc.dataset} --revision {loc.revision} "
                f"--local-dir {path}`) or change the location"
            )
    return commit


@dataclass
class LocalSplit:
    """What `datasets.load_dataset` is given to read one split of a local copy."""

    builder: str  # the packaged builder ("parquet", "json", ...)
    data_files: list[str]
    kwargs: dict  # the subset's other settings from the card (builder options, its declared features)


def local_files(path: Path) -> list[str]:
    """The files of a local copy, repository-relative (not huggingface_hub's .cache)."""
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*")
                  if p.is_file() and ".cache" not in p.relative_to(path).parts)


def shortened(items: list[str], most: int = 12) -> str:
    """The first `most` items, comma-separated, and how many more: a file list an error can show."""
    return (", ".join(items[:most]) + (f" (and {len(items) - most} more)" if len(items) > most else "")) if items else "none"


def local_split(path: Path, loc: HubLocation, key: str) -> LocalSplit:
    """The files of split `loc.split` of subset `loc.subset` in the copy at `path`: the subset's
    split patterns from its README.md `configs:` (or `datasets`' default file names where the card
    declares none), that split's alone, resolved against the files here, and the builder their
    extension calls for. `datasets`' own helpers do each step, as its load_dataset does for a
    folder; only the other splits are left out. Raises HubDatasetError naming `key`."""
    from datasets.data_files import DataFilesList, EmptyDatasetError, get_data_patterns, sanitize_patterns
    from datasets.info import DatasetInfosDict
    from datasets.load import infer_module_for_data_files_list
    from datasets.packaged_modules import _ALL_ALLOWED_EXTENSIONS
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCard, DatasetCardData

    where = f"{key}: {loc}: the local copy {path}"
    readme = path / "README.md"
    try:
        card = DatasetCard.load(readme).data if readme.is_file() else DatasetCardData()
        configs = MetadataConfigs.from_dataset_card_data(card)
        infos = DatasetInfosDict.from_dataset_card_data(card)
    except Exception as e:  # noqa: BLE001 - a card that does not parse, named
        raise HubDatasetError(f"{where}: its README.md cannot be read as a dataset card ({type(e).__name__}: {e})") from None
    if configs:
        try:
            name = loc.subset or configs.get_default_config_name()
        except ValueError as e:
            raise HubDatasetError(f"{where}: {e}; name the subset in the location") from None
        if name is None:
            raise HubDatasetError(f"{where} has several subsets and none is the default; name one in the location "
                                  f"({', '.join(configs)})")
        if name not in configs:
            raise HubDatasetError(f"{where} has no subset {name!r}: its README.md names {', '.join(configs)}")
        params = dict(configs[name])
        declared = f"its README.md's configs: for subset {name}"
    else:
        if loc.subset not in (None, "default"):
            raise HubDatasetError(f"{where} has no subset {loc.subset!r}: its README.md declares no configs:")
        name, params = "default", {}
        declared = "datasets' default file names (the README.md declares no configs:)"
    params.pop("config_name", None)
    params.pop("default", None)
    data_dir = params.pop("data_dir", None)
    base = (path / data_dir) if data_dir else path
    data_files = params.pop("data_files", None)
    if data_files is not None:
        patterns = sanitize_patterns(data_files)
    else:
        try:
            patterns = get_data_patterns(base.as_posix())
        except EmptyDatasetError:
            patterns = {}
        declared = "datasets' default file names" + (f" under {data_dir}" if data_dir else "")
    if loc.split not in patterns:
        raise HubDatasetError(f"{where} has no split {loc.split!r} in subset {name} (splits: "
                              f"{', '.join(patterns) or 'none'}, from {declared}); its files: "
                              f"{shortened(local_files(path))}")
    split_patterns = list(patterns[loc.split])
    try:
        files = DataFilesList.from_patterns(split_patterns, base_path=base.as_posix(),
                                            allowed_extensions=_ALL_ALLOWED_EXTENSIONS)
    except FileNotFoundError:
        files = []
    if not files:
        present = [f for f in local_files(path) if f != "README.md" and not f.rsplit("/", 1)[-1].startswith(".")]
        raise HubDatasetError(
            f"{where} has no file of split {loc.split!r} (subset {name}): its patterns {split_patterns} (from {declared}) "
            f"match nothing here. The data files it holds: {shortened(present)}. Fetch that split's files (the "
            f"profile entry's `files`), or read a split it holds"
        )
    builder, builder_kwargs = infer_module_for_data_files_list(files)
    if builder is None:
        raise HubDatasetError(f"{where}: split {loc.split!r} has no file of a format datasets reads ({shortened(list(files))})")
    kwargs = {**builder_kwargs, **params}
    info = infos.get(name)
    if info is not None and info.features is not None:
        kwargs.setdefault("features", info.features)  # the card's declared types, as load_dataset(path) applies them
    return LocalSplit(builder, list(files), kwargs)


def fetched_commit(root: str | os.PathLike, dataset: str) -> str | None:
    """The commit of a dataset in a fetch folder, as its manifest records it (None: not fetched)."""
    path = Path(root) / MANIFEST
    if not path.exists():
        return None
    try:
        entry = json.loads(path.read_text(encoding="utf-8")).get("datasets", {}).get(dataset)
    except (OSError, ValueError):
        return None
    return entry.get("commit") if entry and entry.get("complete") else None


def iter_hub_rows(
    loc: HubLocation,
    key: str,
    timeout: float = HUB_TIMEOUT_S,
    local_dir_reads: str | None = None,
    extra_advice: str = "",
    read: dict | None = None,
    mirror_root: str | os.PathLike | None = None,
) -> Iterator[RawRow]:
    """Rows of a hub dataset's split, streamed. `key` is the config key that holds the location
    (named in errors). `read`, when given, receives what was read: the commit and the mirror path.
    `mirror_root`: the fetch folder, read before the hub (mirror_dir)."""
    advice = download_advice(loc, key, local_dir_reads) + (f" {extra_advice}" if extra_advice else "")
    mirror = mirror_dir(loc, mirror_root)
    if mirror is not None:
        try:
            commit = mirror_commit(mirror, loc)
        except HubDatasetError as e:
            raise HubDatasetError(f"{key}: {e}") from None
        if commit is None and mirror_root and mirror.is_relative_to(Path(mirror_root)):
            commit = fetched_commit(mirror_root, loc.dataset)
        path, revision = str(mirror), None
        log.info("%s: reading the mirror copy %s%s", loc, mirror, f" (commit {commit})" if commit else "")
    else:
        # huggingface_hub reads these when it is imported: set before the first import
        os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(int(timeout)))
        os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", str(int(timeout)))
        commit = probe_hub(loc, timeout, key, advice)
        path, revision = loc.dataset, loc.revision
        if commit and not (loc.revision and FULL_COMMIT.match(loc.revision)):
            log.info("%s is commit %s on the hub; to pin it: %s", loc, commit, HubLocation(loc.dataset, commit, loc.subset, loc.split))
    if read is not None:
        read.update(commit=commit, mirror=str(mirror) if mirror else None)
    import datasets

    try:
        if mirror is not None:
            part = local_split(mirror, loc, key)
            ds = datasets.load_dataset(part.builder, data_files={loc.split: part.data_files}, split=loc.split,
                                       streaming=True, **part.kwargs)
        else:
            ds = datasets.load_dataset(path, name=loc.subset, split=loc.split, revision=revision, streaming=True)
    except HubDatasetError:
        raise
    except (ValueError, FileNotFoundError) as e:  # no such subset or split, no data files
        raise HubDatasetError(f"{key}: {loc} cannot be read: {e}") from None
    except ConnectionError as e:
        raise HubUnreachable(f"{key}: {loc}: the hub stopped answering ({e}). {advice}") from None
    where = f"{loc}{f' (mirror {mirror})' if mirror else ''}"
    i = 0
    rows = iter(ds)
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except ConnectionError as e:  # the stream broke after the probe
            raise HubUnreachable(f"{key}: {loc}: the hub stopped answering at row {i} ({e}). {advice}") from None
        except UnicodeDecodeError as e:  # a stream cannot skip past a row it cannot decode
            hint = "; read from a downloaded copy (location: DIR), such rows are skipped one by one" if local_dir_reads else ""
            raise HubDatasetError(f"{key}: {where} row {i}: a string is not valid UTF-8 ({e.reason}){hint}") from None
        except Exception as e:  # noqa: BLE001 - a data file that does not parse or match the others' columns
            raise HubDatasetError(f"{key}: {where} row {i}: cannot be read ({type(e).__name__}: {e})") from None
        yield RawRow(where=f"{where} row {i}", key=str(i), value=row)
        i += 1
