"""A fake Hugging Face hub for tests: a threaded HTTP server on 127.0.0.1 that serves a folder of
dataset repositories the way the hub answers the calls huggingface_hub 2.4 makes for
`HfApi().dataset_info(id, revision=..., files_metadata=True)`, `HfApi().auth_check(...)` and
`hf_hub_download(id, path, repo_type="dataset", revision=...)`. Nothing leaves the machine.

Folder layout (ROOT is what `serve_hub` is given):

    ROOT/<owner>/<name>/...          the repository's files, as on the hub (README.md, data/..., .gitattributes)
    ROOT/<owner>/<name>/.hub.json    optional, hidden (never listed or served): the hub's side of the repo
        {
          "sha": "<40 hex>",         the commit the repository is at (default: a hash of its files, so
                                     changing a file changes the commit). Revisions served: "main" and it.
          "gated": false | "auto" | "manual",   default false
          "accepted": false,         a gated repo: whether the user of the server's token accepted its terms
          "private": false           private: only the server's token sees it (others: not found)
        }

A file is stored with LFS (served through the "CDN", with an sha256 in the listing) when the
repository's .gitattributes marks it `filter=lfs`, or, without a .gitattributes, when its name
matches DEFAULT_LFS (extensions the hub's default .gitattributes tracks, among others); and always when it
is over 10 MiB (the hub refuses larger non-LFS files).

How the hub answers, and where that is written down (what the fake follows):
- GET /api/datasets/<id>[/revision/<rev>][?blobs=true]: the repo's metadata, `sha`, `gated`,
  `private`, and `siblings` (with blobs: `size`, `blobId`, and `lfs: {sha256, size, pointerSize}`
  for LFS files), as huggingface_hub's DatasetInfo reads it (hf_api.py). For a gated repo the
  metadata is public, logged in or not: huggingface/huggingface_hub#2457 ("Gated dataset info is
  leaked"), huggingface/datasets#7110, and the hub's own page for gated datasets ("You can list
  files but not access them").
- HEAD/GET /datasets/<id>/resolve/<rev>/<path>: a regular file answers 200 with `X-Repo-Commit`,
  `ETag` (its git blob sha1) and `Content-Length`; an LFS file answers 302 to a storage host with
  `X-Repo-Commit`, `X-Linked-Etag` (its sha256) and `X-Linked-Size` (file_download.py
  get_hf_file_metadata and _httpx2_follow_hub_redirects_with_backoff: a redirect to another host is
  not followed, the metadata is read from the redirect itself, and the download then goes to the
  Location without the Authorization header). The "CDN" here is a second listener on another
  port: another origin, as a real storage host is.
- Gated files: `X-Error-Code: GatedRepo`, 401 without a token ("... Please log in.") and 403 with a
  token whose user has not been granted access ("... not in the authorized list. Visit
  https://huggingface.co/datasets/<id> to ask for access."): utils/_http.py hf_raise_for_status,
  datasets' load.py (401: "You must be authenticated", 403: "Visit the dataset page ... to ask for
  access"), and the messages quoted in huggingface/dataset-viewer#2083 (403) and
  ToTheBeginning/PuLID#97 (401).
- A repo that does not exist, or is private to someone else: 401 without a token, 404 with one,
  `X-Error-Code: RepoNotFound`; an unknown revision: 404 `RevisionNotFound`; an unknown file: 404
  `EntryNotFound` (hf_raise_for_status). A token the server does not know: 401 "Invalid
  credentials in Authorization header".
- Range requests (`Range: bytes=N-`) answer 206, as huggingface_hub's http_get asks when a
  download broke off mid-file and it resumes.

Use:

    write_repo(root, "org/name", {"README.md": card, "data/train-00000-of-00001.parquet": data},
               sha=COMMIT, gated="manual")            # or lay the folder out by hand
    with serve_hub(root, token="hf_x") as url:      # url is the endpoint, a str ("http://127.0.0.1:PORT")
        use_hub(monkeypatch, url, token="hf_x")     # huggingface_hub (and datasets) now talk to it
        ...
        url.requests                                # [Request(method, path, range, auth, status)], in order
        url.gets("train-")                          # the GETs of file contents whose path holds "train-"
        url.cut_once("data/train-00000-of-00001.parquet", after=100)  # its next GET breaks after 100 bytes

Everything is bounded: sockets time out after TIMEOUT_S, the server threads are daemons and are
stopped on leaving the `with`, and a request body is never read beyond its Content-Length.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import http.server
import json
import re
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

TIMEOUT_S = 10.0
CHUNK = 1 << 20
HIDDEN = ".hub.json"
LFS_OVER = 10 * 1024 * 1024
DEFAULT_LFS = ("*.parquet", "*.arrow", "*.jsonl", "*.json.gz", "*.jsonl.gz", "*.gz", "*.zst", "*.zip", "*.tar",
               "*.bin", "*.npy", "*.pt", "*.safetensors", "*.csv.gz")
COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # unquoted, without the query
    range: str | None  # the Range header, when asked
    auth: bool  # an Authorization header was sent
    status: int


class HubEndpoint(str):
    """The endpoint URL (a str), with what the server saw and a way to break one download."""

    requests: list[Request]  # every request, in the order answered (status 299: a download cut on purpose)
    cdn: str

    def cut_once(self, path: str, after: int) -> None:
        """The next full GET of `path` (repo-relative, any repo) sends its headers and `after`
        bytes, then drops the connection: a download that broke mid-file."""
        with self._lock:
            self._cuts[path] = after

    def gets(self, kind: str = "") -> list[Request]:
        """The GETs of file contents (resolve or CDN) whose path contains `kind`."""
        return [r for r in self.requests if r.method == "GET" and ("/resolve/" in r.path or r.path.startswith("/cdn/"))
                and kind in r.path]


# ---------------------------------------------------------------- the repositories


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass
class RepoFile:
    path: str
    local: Path
    size: int
    blob_sha1: str
    sha256: str
    lfs: bool


class Repos:
    """The repositories under ROOT, read on each request (a test may change them between calls);
    file hashes are cached by (path, size, mtime)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._hashes: dict[tuple, tuple[str, str]] = {}
        self._lock = threading.Lock()

    def repo_dir(self, repo_id: str) -> Path | None:
        if repo_id.count("/") != 1 or ".." in repo_id.split("/"):
            return None
        path = self.root / repo_id
        return path if path.is_dir() else None

    @staticmethod
    def meta(repo: Path) -> dict:
        p = repo / HIDDEN
        return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {}

    def _hash(self, p: Path) -> tuple[str, str]:
        st = p.stat()
        key = (str(p), st.st_size, st.st_mtime_ns)
        with self._lock:
            if key in self._hashes:
                return self._hashes[key]
        sha1, sha256 = hashlib.sha1(b"blob %d\0" % st.st_size), hashlib.sha256()
        with open(p, "rb") as fh:  # in chunks: a replica's files may be large
            for chunk in iter(lambda: fh.read(CHUNK), b""):
                sha1.update(chunk)
                sha256.update(chunk)
        out = (sha1.hexdigest(), sha256.hexdigest())
        with self._lock:
            self._hashes[key] = out
        return out

    def files(self, repo: Path) -> dict[str, RepoFile]:
        lfs_patterns = DEFAULT_LFS
        attrs = repo / ".gitattributes"
        if attrs.is_file():
            lfs_patterns = tuple(line.split()[0] for line in attrs.read_text(encoding="utf-8").splitlines()
                                 if "filter=lfs" in line and line.split() and not line.startswith("#"))
        out = {}
        for p in sorted(repo.rglob("*")):
            rel = p.relative_to(repo).as_posix()
            if not p.is_file() or rel == HIDDEN or rel.split("/")[0] in (".cache", ".git"):
                continue
            blob, sha256 = self._hash(p)
            size = p.stat().st_size
            name = rel.rsplit("/", 1)[-1]
            lfs = size > LFS_OVER or any(fnmatch.fnmatch(rel if "/" in pat else name, pat.lstrip("/"))
                                         for pat in lfs_patterns)
            if lfs:
                blob = git_blob_sha1(lfs_pointer(sha256, size))
            out[rel] = RepoFile(rel, p, size, blob, sha256, lfs)
        return out

    def commit(self, repo: Path, files: dict[str, RepoFile]) -> str:
        sha = self.meta(repo).get("sha")
        if sha:
            return sha
        h = hashlib.sha1()
        for rel, f in sorted(files.items()):
            h.update(f"{rel}\0{f.blob_sha1}\n".encode())
        return h.hexdigest()


# ---------------------------------------------------------------- the server


class HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "fake-hub/1"
    protocol_version = "HTTP/1.1"
    timeout = TIMEOUT_S  # a client that stops sending cannot hold a thread

    # set per server class
    hub: "_Hub"
    is_cdn = False

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def do_HEAD(self):
        self._answer(head=True)

    def do_GET(self):
        self._answer(head=False)

    def do_POST(self):
        self._answer(head=False)

    def _answer(self, head: bool) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(min(length, 1 << 20))
        url = urlsplit(self.path)
        self._path = unquote(url.path)
        try:
            (self._cdn if self.is_cdn else self._hub)(self._path, parse_qs(url.query), head)
        except HubError as e:
            body = json.dumps({"error": e.message}).encode()
            headers = {"X-Error-Message": e.message, "Content-Type": "application/json"}
            if e.code:
                headers["X-Error-Code"] = e.code
            self._send(e.status, headers, b"" if head else body, len(body))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away; its request is logged already

    # -------------------------------------------------------- hub routes

    def _user(self) -> str | None:
        """The token sent; an unknown one is refused as the hub refuses it."""
        auth = self.headers.get("Authorization")
        if not auth:
            return None
        token = auth.removeprefix("Bearer ").strip()
        if self.hub.token is None or token != self.hub.token:
            raise HubError(401, None, "Invalid credentials in Authorization header")
        return token

    def _repo(self, repo_id: str, revision: str | None) -> tuple[Path, dict, dict[str, RepoFile], str]:
        user = self._user()
        repo = self.hub.repos.repo_dir(repo_id)
        meta = self.hub.repos.meta(repo) if repo else {}
        if repo is None or (meta.get("private") and user is None):
            # the hub does not say whether a repo it will not show exists
            raise HubError(401 if user is None else 404, "RepoNotFound", "Repository not found")
        files = self.hub.repos.files(repo)
        sha = self.hub.repos.commit(repo, files)
        if revision is not None and revision not in ("main", sha):
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return repo, meta, files, sha

    def _check_gate(self, repo_id: str, meta: dict) -> None:
        if not meta.get("gated"):
            return
        if self._user() is None:
            raise HubError(401, "GatedRepo", f"Access to dataset {repo_id} is restricted. You must have access to it "
                                             "and be authenticated to access it. Please log in.")
        if not meta.get("accepted"):
            raise HubError(403, "GatedRepo", f"Access to dataset {repo_id} is restricted and you are not in the "
                                             f"authorized list. Visit https://huggingface.co/datasets/{repo_id} to "
                                             "ask for access.")

    def _hub(self, path: str, query: dict, head: bool) -> int:
        m = re.fullmatch(r"/api/datasets/([^/]+/[^/]+)(?:/revision/(.+))?", path)
        if m:
            return self._info(m.group(1), m.group(2), query, head)
        m = re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/auth-check", path)
        if m:
            repo, meta, _, _ = self._repo(m.group(1), None)
            self._check_gate(m.group(1), meta)
            return self._json({"ok": True}, head)
        m = re.fullmatch(r"/datasets/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            return self._resolve(m.group(1), m.group(2), m.group(3), head)
        raise HubError(404, None, f"no route for {path} on the fake hub")

    def _info(self, repo_id: str, revision: str | None, query: dict, head: bool) -> int:
        repo, meta, files, sha = self._repo(repo_id, revision)
        blobs = query.get("blobs", ["false"])[0].lower() in ("1", "true")
        siblings = []
        for rel, f in files.items():
            s = {"rfilename": rel}
            if blobs:
                s.update(blobId=f.blob_sha1, size=f.size)
                if f.lfs:
                    s["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": len(lfs_pointer(f.sha256, f.size))}
            siblings.append(s)
        owner = repo_id.split("/")[0]
        info = {"_id": hashlib.md5(repo_id.encode()).hexdigest()[:24], "id": repo_id, "author": owner, "sha": sha,
                "lastModified": "2024-01-01T00:00:00.000Z", "createdAt": "2024-01-01T00:00:00.000Z",
                "private": bool(meta.get("private")), "gated": meta.get("gated") or False, "disabled": False,
                "downloads": 0, "likes": 0, "tags": [], "siblings": siblings,
                "usedStorage": sum(f.size for f in files.values())}
        return self._json(info, head)

    def _resolve(self, repo_id: str, revision: str, rel: str, head: bool) -> int:
        repo, meta, files, sha = self._repo(repo_id, revision)
        self._check_gate(repo_id, meta)
        f = files.get(rel)
        if f is None:
            raise HubError(404, "EntryNotFound", f"{rel} does not exist on \"{revision}\"")
        headers = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
        if f.lfs:
            location = f"{self.hub.cdn_url}/cdn/{quote(repo_id)}/{f.sha256}/{quote(rel)}"
            headers.update({"Location": location, "X-Linked-Size": str(f.size), "X-Linked-Etag": f'"{f.sha256}"',
                            "ETag": f'"{f.blob_sha1}"', "Content-Type": "text/plain"})
            body = f"Found. Redirecting to {location}".encode()
            self._send(302, headers, b"" if head else body, len(body))
            return 302
        headers["ETag"] = f'"{f.blob_sha1}"'
        return self._file(f, headers, head)

    # -------------------------------------------------------- the storage host

    def _cdn(self, path: str, query: dict, head: bool) -> int:
        m = re.fullmatch(r"/cdn/([^/]+/[^/]+)/([0-9a-f]{64})/(.+)", path)
        repo = self.hub.repos.repo_dir(m.group(1)) if m else None
        f = self.hub.repos.files(repo).get(m.group(3)) if repo else None
        if f is None or f.sha256 != m.group(2):
            raise HubError(403, None, "Request has expired or the object is gone")  # as a signed URL that no longer holds
        return self._file(f, {"ETag": f'"{f.sha256}"', "Accept-Ranges": "bytes"}, head)

    # -------------------------------------------------------- sending

    def _file(self, f: RepoFile, headers: dict, head: bool) -> int:
        size = f.size
        start, status = 0, 200
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if not m or int(m.group(1)) >= size:
                self._send(416, {"Content-Range": f"bytes */{size}"}, b"", 0)
                return 416
            start, status = int(m.group(1)), 206
            end = int(m.group(2)) if m.group(2) else size - 1
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            size = end + 1 - start
        headers["Content-Type"] = "application/octet-stream"
        if head:
            self._send(status, headers, b"", size)
            return status
        cut = self.hub.take_cut(f.path) if status == 200 else None
        self._send(status, headers, b"", size, close=cut is not None)  # a cut one is logged as 299
        left = size if cut is None else min(cut, size)
        with open(f.local, "rb") as fh:
            fh.seek(start)
            while left > 0:
                chunk = fh.read(min(CHUNK, left))
                if not chunk:
                    break
                self.wfile.write(chunk)
                left -= len(chunk)
        if cut is not None:
            self._drop()
            return 299
        return status

    def _json(self, obj, head: bool) -> int:
        body = json.dumps(obj).encode()
        self._send(200, {"Content-Type": "application/json"}, b"" if head else body, len(body))
        return 200

    def _send(self, status: int, headers: dict, body: bytes, length: int, close: bool = False) -> None:
        # logged before the client can read the answer: a test that asserts right after a call sees it
        self.hub.log(Request(self.command, self._path, self.headers.get("Range"), "Authorization" in self.headers,
                             299 if close else status))
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(length))
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        if body:
            self.wfile.write(body)
        if close:
            self.close_connection = True

    def _drop(self) -> None:
        """End the connection now, mid-body: the client sees a download break off."""
        self.wfile.flush()
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    timeout = TIMEOUT_S


class _Hub:
    def __init__(self, root: Path, token: str | None):
        self.repos = Repos(root)
        self.token = token
        self.requests: list[Request] = []
        self.cuts: dict[str, int] = {}
        self.lock = threading.Lock()
        self.cdn_url = ""

    def log(self, r: Request) -> None:
        with self.lock:
            self.requests.append(r)

    def take_cut(self, rel: str) -> int | None:
        with self.lock:
            return self.cuts.pop(rel, None)


@contextlib.contextmanager
def serve_hub(root: str | Path, token: str | None = None):
    """Serve the repositories under `root` as the hub would; yields the endpoint (a HubEndpoint,
    a str). `token`: the one token the server knows (a logged-in user); None: nobody can log in."""
    hub = _Hub(Path(root), token)
    servers = []
    for is_cdn in (False, True):
        handler = type("Handler", (_Handler,), {"hub": hub, "is_cdn": is_cdn})
        servers.append(_Server(("127.0.0.1", 0), handler))
    threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                                name=f"fake-hub-{i}") for i, s in enumerate(servers)]
    for t in threads:
        t.start()
    url = HubEndpoint(f"http://127.0.0.1:{servers[0].server_address[1]}")
    hub.cdn_url = f"http://127.0.0.1:{servers[1].server_address[1]}"
    url.requests, url.cdn, url._cuts, url._lock = hub.requests, hub.cdn_url, hub.cuts, hub.lock
    try:
        yield url
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
        for t in threads:
            t.join(TIMEOUT_S)


def write_repo(root: str | Path, repo_id: str, files: dict[str, bytes | str], sha: str | None = None,
               gated: bool | str = False, accepted: bool = False, private: bool = False) -> Path:
    """A repository under `root` with these files (and its .hub.json when any hub setting is given)."""
    repo = Path(root) / repo_id
    for rel, data in files.items():
        p = repo / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
    meta = {k: v for k, v in (("sha", sha), ("gated", gated), ("accepted", accepted), ("private", private)) if v}
    if meta:
        (repo / HIDDEN).write_text(json.dumps(meta), encoding="utf-8")
    return repo


def use_hub(monkeypatch, url: str, token: str | None = None, home: str | Path | None = None) -> None:
    """Point huggingface_hub (and datasets) at `url` for one test: they read HF_ENDPOINT and
    HF_HUB_OFFLINE when imported, so their module constants are patched too. `token`: sent as
    HF_TOKEN (None: not logged in; a token file of the machine is never read). `home`: HF_HOME."""
    import datasets.config
    import huggingface_hub.constants as hc

    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setattr(hc, "ENDPOINT", url)
    monkeypatch.setattr(hc, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", url)
    monkeypatch.setattr(datasets.config, "HUB_DATASETS_URL", url + "/datasets/{repo_id}/resolve/{revision}/{path}")
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_OIDC_RESOURCE", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hc, "HF_HUB_DISABLE_XET", True)  # the fake serves plain HTTP, as a hub without Xet
    if home is not None:
        monkeypatch.setenv("HF_HOME", str(home))
        monkeypatch.setattr(hc, "HF_TOKEN_PATH", str(Path(home) / "token"))
        monkeypatch.setattr(hc, "HF_STORED_TOKENS_PATH", str(Path(home) / "stored_tokens"))
    else:
        monkeypatch.setattr(hc, "HF_TOKEN_PATH", "/nonexistent/fake-hub/token")
        monkeypatch.setattr(hc, "HF_STORED_TOKENS_PATH", "/nonexistent/fake-hub/stored_tokens")
    if token is None:
        monkeypatch.delenv("HF_TOKEN", raising=False)
    else:
        monkeypatch.setenv("HF_TOKEN", token)
