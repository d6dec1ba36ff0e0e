#!/usr/bin/env python3
"""A Hugging Face Hub stand-in: the part of the Hub's HTTP API that the real huggingface_hub client downloads with.

Lab hosts cannot reach huggingface.co, and the product speaks the Hub protocol only through the real client
(`hf download`, `snapshot_download`, `HfApi.model_info`), so the lab serves what that client reads, the way the
Hub answers it (huggingface_hub 2.4.0: file_download.py, _snapshot_download.py, hf_api.py, utils/_http.py):

- `GET /api/models/{repo}[/revision/{rev}]` model info: `sha` (the commit) and `siblings`, with `?blobs=true`
  their size, git blob id and LFS sha256; `GET /api/models/{repo}/tree/{rev}[/{path}]` the file list that
  snapshot_download fetches; `/refs` and `/auth-check`;
- `HEAD|GET /{repo}/resolve/{rev}/{path}`: small files with `X-Repo-Commit`, `ETag` (git blob id) and
  `Content-Length`; LFS files (`*.safetensors`, anything over 10 MiB) as a 302 to a CDN-like URL on this same
  server, with `X-Linked-Etag` (sha256) and `X-Linked-Size`; `Range` requests (206, 416); no xet headers, so the
  client downloads over plain HTTP;
- errors as the Hub sends them (`X-Error-Code`, which the client maps to its exception classes): an unknown
  repository is `RepoNotFound` (401 to an anonymous caller, 404 to an authenticated one, as on the Hub), an
  unknown revision `RevisionNotFound` (404), an unknown file `EntryNotFound` (404), a gated repository's files
  `GatedRepo` (401) without a token, and a token it does not know `401 Invalid credentials in Authorization
  header` on every route. A gated repository's metadata stays public, as on the Hub.

It counts the file-body bytes it sends (`GET /_lab/stats`: `{"bytes_served": N, "model_bytes": M}`, M the size
of the lab model's files at `main`; `POST /_lab/stats/reset`), and `POST /_lab/cut?after=N` makes the next
file body stop after N bytes, the connection dropped, as a flaky network would.

What it serves comes from a manifest written on the controller (`write_manifest`): repositories, branches and
commits, each file's hashes and the file on disk that holds its bytes, so large files are never copied and the
server hashes nothing at start. Stdlib only: it runs under the lab services image's python3.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import socket
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_MIN_BYTES = 10 << 20  # the Hub stores larger files in LFS
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
GITATTRIBUTES = "".join(f"*{suffix} filter=lfs diff=lfs merge=lfs -text\n" for suffix in LFS_SUFFIXES)
TIMESTAMP = "2026-11-01T00:00:00.000Z"  # every repository's lastModified: the lab has no history
SENDFILE_CHUNK = 8 << 20
INVALID_TOKEN = "Invalid credentials in Authorization header"  # the Hub's words; the client matches them


def git_blob_id(data: bytes) -> str:
    """The git object id of a file's content: what the Hub lists as a small file's blob id and ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The pointer git stores for an LFS file; the Hub lists its blob id and size for LFS files."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def is_lfs(path: str, size: int) -> bool:
    return path.endswith(LFS_SUFFIXES) or size > LFS_MIN_BYTES


def describe_file(path: str, source: Path) -> dict[str, Any]:
    """A file's entry in the manifest: size, git blob id and, for LFS files, sha256 and pointer size."""
    size = source.stat().st_size
    if not is_lfs(path, size):
        return {"size": size, "blob_id": git_blob_id(source.read_bytes()), "lfs": None}
    with source.open("rb") as fh:
        sha256 = hashlib.file_digest(fh, "sha256").hexdigest()
    pointer = lfs_pointer(sha256, size)
    return {"size": size, "blob_id": git_blob_id(pointer), "lfs": {"sha256": sha256, "pointer_size": len(pointer)}}


@dataclass(frozen=True)
class RepoSpec:
    """A repository to serve: each branch a full map of repository path to the file that holds its bytes.

    Branches are committed in order, each on top of the one before it, so a later branch's commit is a child
    of the earlier one's (like `next` branched off `main` and changed a file).
    """

    repo_id: str
    branches: dict[str, dict[str, Path]]
    gated: bool = False


def write_manifest(root: Path, repos: list[RepoSpec], dest: Path, model_repo: str, tokens: list[str]) -> dict:
    """Hash every file once and write what the server needs; sources must lie under `root` (what it serves)."""
    described: dict[tuple[str, Path], dict[str, Any]] = {}
    manifest: dict[str, Any] = {"model_repo": model_repo, "tokens": sorted(tokens), "repos": {}}
    for spec in repos:
        repo: dict[str, Any] = {"gated": spec.gated, "branches": {}, "commits": {}}
        parent = ""
        for branch, files in spec.branches.items():
            entries = {}
            for path, source in sorted(files.items()):
                if (path, source) not in described:
                    described[path, source] = describe_file(path, source)
                entries[path] = {"source": source.resolve().relative_to(root.resolve()).as_posix(),
                                 **described[path, source]}
            tree = "".join(f"{entry['blob_id']} {path}\n" for path, entry in entries.items())
            commit = hashlib.sha1(f"repo {spec.repo_id}\nparent {parent}\n{tree}".encode()).hexdigest()
            repo["commits"][commit] = {"parent": parent or None, "files": entries}
            repo["branches"][branch] = parent = commit
        manifest["repos"][spec.repo_id] = repo
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def lab_repos(root: Path, model_dir: Path, model_repo: str, gated_repo: str) -> list[RepoSpec]:
    """The lab's repositories: the model at `main`, a `next` branch that changes generation_config.json (a new
    revision to roll out), and a gated copy. Extra files are written under `root`/hub/files."""
    files_dir = root / "hub" / "files"
    files_dir.mkdir(parents=True, exist_ok=True)
    (files_dir / ".gitattributes").write_text(GITATTRIBUTES)
    main = {p.name: p for p in sorted(model_dir.iterdir()) if p.is_file() and not p.name.startswith(".")}
    main.pop("SHA256SUMS", None)  # the mirror's manifest, not part of a Hub repository
    main[".gitattributes"] = files_dir / ".gitattributes"
    generation = json.loads((model_dir / "generation_config.json").read_text())
    generation["temperature"] = 0.6  # the new revision's recommended sampling
    (files_dir / "next").mkdir(exist_ok=True)
    (files_dir / "next" / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    next_ = main | {"generation_config.json": files_dir / "next" / "generation_config.json"}
    return [RepoSpec(model_repo, {"main": main, "next": next_}),
            RepoSpec(gated_repo, {"main": main}, gated=True)]


class HubError(Exception):
    """An error answer: status, the Hub's X-Error-Code (or None) and message."""

    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


@dataclass
class Stats:
    """What the server sent, for the lab's tests and benchmarks; `cut_after` is the one pending fault."""

    bytes_served: int = 0
    cut_after: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, count: int) -> None:
        with self.lock:
            self.bytes_served += count

    def take_cut(self) -> int | None:
        with self.lock:
            cut, self.cut_after = self.cut_after, None
            return cut


class Hub:
    """The manifest, resolved: look-ups the handler answers from."""

    def __init__(self, root: Path, manifest: dict[str, Any]) -> None:
        self.root = root
        self.repos: dict[str, dict[str, Any]] = manifest["repos"]
        self.tokens = set(manifest["tokens"])
        model = self.repos.get(manifest["model_repo"])
        self.model_bytes = (
            sum(f["size"] for f in model["commits"][model["branches"]["main"]]["files"].values()) if model else 0
        )
        self.commits = {commit: repo_id for repo_id, repo in self.repos.items() for commit in repo["commits"]}
        self.stats = Stats()

    def repo(self, repo_id: str, token: str | None) -> dict[str, Any]:
        if repo_id not in self.repos:
            # The Hub does not tell an anonymous caller whether a repository exists (it may be private).
            raise HubError(404 if token else 401, "RepoNotFound", "Repository not found")
        return self.repos[repo_id]

    def commit(self, repo: dict[str, Any], revision: str) -> str:
        commit = repo["branches"].get(revision, revision)
        if commit not in repo["commits"]:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    def files(self, repo: dict[str, Any], commit: str) -> dict[str, dict[str, Any]]:
        return repo["commits"][commit]["files"]

    def check_access(self, repo_id: str, token: str | None) -> None:
        if self.repos[repo_id]["gated"] and not token:
            raise HubError(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to it"
                                             " and be authenticated to access it. Please log in.")


def model_info(repo_id: str, repo: dict[str, Any], commit: str, blobs: bool) -> dict[str, Any]:
    """`/api/models/{repo}`: the fields ModelInfo reads; siblings' sizes and hashes only with `blobs`."""
    siblings = []
    for path, entry in repo["commits"][commit]["files"].items():
        sibling: dict[str, Any] = {"rfilename": path}
        if blobs:
            sibling |= {"size": entry["size"], "blobId": entry["blob_id"]}
            if entry["lfs"]:
                sibling["lfs"] = {"sha256": entry["lfs"]["sha256"], "size": entry["size"],
                                  "pointerSize": entry["lfs"]["pointer_size"]}
        siblings.append(sibling)
    return {
        "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24], "id": repo_id, "modelId": repo_id,
        "author": repo_id.split("/")[0] if "/" in repo_id else None, "sha": commit,
        "lastModified": TIMESTAMP, "createdAt": TIMESTAMP, "private": False,
        "gated": "manual" if repo["gated"] else False, "disabled": False, "downloads": 0, "likes": 0,
        "library_name": "transformers", "pipeline_tag": "text-generation", "tags": ["transformers", "safetensors"],
        "siblings": siblings,
        "usedStorage": sum(entry["size"] for entry in repo["commits"][commit]["files"].values()),
    }


def tree(files: dict[str, dict[str, Any]], prefix: str, recursive: bool) -> list[dict[str, Any]]:
    """`/api/models/{repo}/tree/{rev}/{prefix}`: files, and folders unless recursive lists their files."""
    base = prefix.strip("/") + "/" if prefix.strip("/") else ""
    entries, folders = [], set()
    for path, entry in files.items():
        if not path.startswith(base):
            continue
        rest = path[len(base):]
        if "/" in rest and not recursive:
            folders.add(base + rest.split("/")[0])
            continue
        item: dict[str, Any] = {"type": "file", "oid": entry["blob_id"], "size": entry["size"], "path": path}
        if entry["lfs"]:
            item["lfs"] = {"oid": entry["lfs"]["sha256"], "size": entry["size"],
                           "pointerSize": entry["lfs"]["pointer_size"]}
        entries.append(item)
    if not entries and not folders and base:
        raise HubError(404, "EntryNotFound", f"{prefix} does not exist on the revision")
    folder_entries = [{"type": "directory", "oid": hashlib.sha1(f.encode()).hexdigest(), "size": 0, "path": f}
                      for f in sorted(folders)]
    return folder_entries + entries


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) of a single `bytes=` range; None for the whole file; HubError 416 when unsatisfiable."""
    if not header:
        return None
    match = re.fullmatch(r"bytes=(\d*)-(\d*)", header.strip())
    if not match or match.groups() == ("", ""):
        return None  # a form we do not serve (several ranges): the whole file, as HTTP allows
    first, last = match.groups()
    if first == "":
        start, end = max(size - int(last), 0), size - 1
    else:
        start, end = int(first), min(int(last), size - 1) if last else size - 1
    if start >= size or start > end:
        raise HubError(416, None, "Requested Range Not Satisfiable")
    return start, end


class Handler(BaseHTTPRequestHandler):
    """Routes: the Hub's API and resolve URLs, the CDN-like LFS URLs, and the lab's /_lab endpoints."""

    protocol_version = "HTTP/1.1"
    server: HubServer

    def do_HEAD(self) -> None:
        self._dispatch(body=False)

    def do_GET(self) -> None:
        self._dispatch(body=True)

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        hub = self.server.hub
        self.rfile.read(int(self.headers.get("Content-Length") or 0))  # unread, it would spoil the next request
        if url.path == "/_lab/stats/reset":
            with hub.stats.lock:
                hub.stats.bytes_served = 0
            self._json(200, self._stats())
        elif url.path == "/_lab/cut":
            hub.stats.cut_after = int(parse_qs(url.query).get("after", ["0"])[0])
            self._json(200, {"cut_after": hub.stats.cut_after})
        else:
            self._error(HubError(404, None, "Not Found"), body=True)

    def _dispatch(self, body: bool) -> None:
        url = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        parts = [unquote(p) for p in url.path.split("/")[1:]]
        try:
            if parts[:2] == ["_lab", "stats"]:
                return self._json(200, self._stats(), body)
            token = self._token()
            if parts[:1] == ["api"]:
                return self._api(parts[1:], query, token, body)
            if parts[:1] == ["_lfs"] and len(parts) == 3:
                return self._lfs(parts[1], parts[2], body)
            if "resolve" in parts[1:3]:
                split = parts.index("resolve", 1)
                return self._resolve("/".join(parts[:split]), parts[split + 1:], token, body)
            raise HubError(404, None, "Not Found")
        except HubError as error:
            self._error(error, body)

    def _token(self) -> str | None:
        """The caller's token; one the Hub does not know is refused outright, on every route."""
        header = self.headers.get("Authorization", "")
        if not header:
            return None
        token = header.removeprefix("Bearer ").strip()
        if token not in self.server.hub.tokens:
            raise HubError(401, None, INVALID_TOKEN)
        return token

    def _stats(self) -> dict[str, int]:
        hub = self.server.hub
        return {"bytes_served": hub.stats.bytes_served, "model_bytes": hub.model_bytes}

    def _api(self, parts: list[str], query: dict[str, str], token: str | None, body: bool) -> None:
        if not parts or parts[0] != "models" or len(parts) < 2:
            raise HubError(404, "RepoNotFound", "Repository not found")
        rest = parts[1:]
        size = 2 if len(rest) >= 2 and rest[1] not in ("revision", "tree", "refs", "auth-check") else 1
        repo_id, op, args = "/".join(rest[:size]), rest[size:size + 1], rest[size + 1:]
        hub = self.server.hub
        repo = hub.repo(repo_id, token)
        if op in ([], ["revision"]):
            commit = hub.commit(repo, "/".join(args) or "main")
            return self._json(200, model_info(repo_id, repo, commit, query.get("blobs") == "true"), body)
        if op == ["tree"] and args:
            commit = hub.commit(repo, args[0])
            recursive = query.get("recursive", "false").lower() == "true"
            return self._json(200, tree(hub.files(repo, commit), "/".join(args[1:]), recursive), body)
        if op == ["refs"]:
            branches = [{"name": name, "ref": f"refs/heads/{name}", "targetCommit": commit}
                        for name, commit in repo["branches"].items()]
            return self._json(200, {"branches": branches, "converts": [], "tags": [], "pullRequests": []}, body)
        if op == ["auth-check"]:
            hub.check_access(repo_id, token)
            return self._json(200, {"access": "granted" if repo["gated"] else "public"}, body)
        raise HubError(404, None, "Not Found")

    def _resolve(self, repo_id: str, parts: list[str], token: str | None, body: bool) -> None:
        hub = self.server.hub
        repo = hub.repo(repo_id, token)
        if len(parts) < 2:
            raise HubError(404, "EntryNotFound", "Entry not found")
        commit = hub.commit(repo, parts[0])
        hub.check_access(repo_id, token)
        path = "/".join(parts[1:])
        entry = hub.files(repo, commit).get(path)
        if entry is None:
            raise HubError(404, "EntryNotFound", "Entry not found", commit)
        headers = {"X-Repo-Commit": commit, "ETag": f'"{entry["blob_id"]}"'}
        if entry["lfs"] is None:
            return self._file(hub.root / entry["source"], entry["size"], headers, body)
        sha256 = entry["lfs"]["sha256"]
        # Like the Hub's CDN: a second URL for the bytes, here on this same server (so the client follows it).
        host = self.headers.get("Host") or f"{self.server.server_address[0]}:{self.server.server_address[1]}"
        headers |= {"Location": f"http://{host}/_lfs/{commit}/{sha256}", "X-Linked-Etag": f'"{sha256}"',
                    "X-Linked-Size": str(entry["size"]), "Content-Length": "0"}
        self._head(302, headers)

    def _lfs(self, commit: str, sha256: str, body: bool) -> None:
        hub = self.server.hub
        repo_id = hub.commits.get(commit)
        files = hub.files(hub.repos[repo_id], commit) if repo_id else {}
        match = next(((p, e) for p, e in files.items() if e["lfs"] and e["lfs"]["sha256"] == sha256), None)
        if match is None:
            raise HubError(404, None, "Not Found")
        path, entry = match
        name = quote(path.rsplit("/", 1)[-1])
        headers = {"X-Repo-Commit": commit, "ETag": f'"{sha256}"',
                   "Content-Disposition": f"inline; filename*=UTF-8''{name}; filename=\"{name}\";"}
        self._file(hub.root / entry["source"], entry["size"], headers, body)

    def _file(self, source: Path, size: int, headers: dict[str, str], body: bool) -> None:
        """A file's bytes (or the asked range), sent by the kernel straight from the page cache."""
        span = parse_range(self.headers.get("Range"), size)
        start, end = span if span else (0, size - 1)
        headers |= {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream",
                    "Content-Length": str(end - start + 1)}
        if span:
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        self._head(206 if span else 200, headers)
        if body and size:
            self._send(source, start, end - start + 1)

    def _send(self, source: Path, offset: int, count: int) -> None:
        hub = self.server.hub
        cut = hub.stats.take_cut()
        limit = count if cut is None else min(cut, count)
        out = self.connection.fileno()
        with source.open("rb") as fh:
            while limit > 0:
                try:
                    sent = os.sendfile(out, fh.fileno(), offset, min(limit, SENDFILE_CHUNK))
                except OSError:  # the client went away (or was cut off mid-body)
                    self.close_connection = True
                    return
                if sent == 0:
                    break
                hub.stats.add(sent)
                offset, limit = offset + sent, limit - sent
        if cut is not None and cut < count:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)

    def _head(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()

    def _json(self, status: int, obj: Any, body: bool = True, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self._head(status, {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})})
        if body:
            self.wfile.write(data)

    def _error(self, error: HubError, body: bool) -> None:
        headers = {"X-Error-Message": error.message}
        if error.code:
            headers["X-Error-Code"] = error.code
        if error.commit:
            headers["X-Repo-Commit"] = error.commit
        self._json(error.status, {"error": error.message}, body, headers)

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)


class HubServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # several hosts, each with the client's 8 parallel downloads

    def __init__(self, address: tuple[str, int], hub: Hub, verbose: bool = False) -> None:
        super().__init__(address, Handler)
        self.hub, self.verbose = hub, verbose


def serve(root: Path, manifest: Path, address: tuple[str, int], verbose: bool = False) -> HubServer:
    """A server (not yet serving: call serve_forever) for the manifest's repositories, files under `root`."""
    return HubServer(address, Hub(root, json.loads(manifest.read_text())), verbose)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="directory the manifest's sources are under")
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--bind", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    server = serve(args.root, args.manifest, (args.bind, args.port), verbose=True)
    print(f"hub stand-in: serving {len(server.hub.repos)} repositories on {args.bind}:{args.port}",
          file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
