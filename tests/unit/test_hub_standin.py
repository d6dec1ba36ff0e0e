"""The Hub stand-in, driven by the real huggingface_hub client (the one the product uses) over loopback.

A small generated checkpoint stands in for the lab's 1 GiB one; the repositories are laid out by the same
`hub.lab_repos` the lab uses (`main`, `next`, a gated copy).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import tomllib
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import HfApi, constants, get_hf_file_metadata, hf_hub_download, hf_hub_url, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils._runtime import is_xet_available

from tests.lab import REPO, fleet
from tests.lab.standins import hub, model

MODEL_REPO = fleet.hub_model_repo()
GATED_REPO = fleet.HUB_GATED_REPO
TOKEN = fleet.HUB_TOKEN
SHARD = model.shard_name(1, 2)


@dataclass
class LabHub:
    url: str
    model_dir: Path

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(f"{self.url}/_lab/stats") as response:
            return json.load(response)

    def post(self, path: str) -> dict:
        with urllib.request.urlopen(urllib.request.Request(f"{self.url}{path}", method="POST")) as response:
            return json.load(response)

    def api(self, token: str | bool = False) -> HfApi:
        return HfApi(endpoint=self.url, token=token)

    def repo_files(self) -> dict[str, Path]:
        """What the model repository holds at main: the checkpoint (not the mirror's SHA256SUMS)."""
        return {p.name: p for p in self.model_dir.iterdir() if p.name not in ("SHA256SUMS", ".lab-generated")}


@pytest.fixture(scope="module")
def lab_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabHub]:
    root = tmp_path_factory.mktemp("www")
    model_dir = root / "models" / "standin"
    model.generate_checkpoint(model_dir, total_bytes=4 << 20, shards=2)
    model.write_sha256sums(model_dir)
    manifest = root / "hub" / "repos.json"
    hub.write_manifest(root, hub.lab_repos(root, model_dir, MODEL_REPO, GATED_REPO), manifest, MODEL_REPO, [TOKEN])
    server = hub.serve(root, manifest, ("127.0.0.1", 0))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield LabHub(f"http://127.0.0.1:{server.server_address[1]}", model_dir)
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def no_stored_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only the tokens a test passes: none from this machine's environment or login."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


def download(lab_hub: LabHub, dest: Path, repo: str = MODEL_REPO, **kwargs) -> Path:
    kwargs.setdefault("token", False)
    return Path(snapshot_download(repo, endpoint=lab_hub.url, local_dir=dest, cache_dir=dest.parent / "cache",
                                  **kwargs))


def git_hash_object(data: bytes) -> str:
    """git's own blob id, computed by git, not by the code under test."""
    return subprocess.run(["git", "hash-object", "--stdin"], input=data, capture_output=True,
                          check=True).stdout.decode().strip()


def test_snapshot_download_gives_the_model_byte_for_byte_over_plain_http(lab_hub: LabHub, tmp_path: Path) -> None:
    lab_hub.post("/_lab/stats/reset")
    local = download(lab_hub, tmp_path / "weights")
    for name, source in lab_hub.repo_files().items():
        assert (local / name).read_bytes() == source.read_bytes(), name
    assert (local / ".gitattributes").read_text() == hub.GITATTRIBUTES  # every Hub repository has one
    assert not (local / "SHA256SUMS").exists()
    # hf_xet is installed, yet every byte came over HTTP from this server: it sends no xet headers.
    assert is_xet_available()
    stats = lab_hub.stats()
    expected = sum(p.stat().st_size for p in lab_hub.repo_files().values()) + len(hub.GITATTRIBUTES)
    assert stats == {"bytes_served": expected, "model_bytes": expected}
    download(lab_hub, tmp_path / "weights")
    assert lab_hub.stats()["bytes_served"] == expected, "a second download fetched bytes again"


def test_model_info_lists_the_commit_and_the_hashes_the_files_have(lab_hub: LabHub, tmp_path: Path) -> None:
    info = lab_hub.api().model_info(MODEL_REPO, revision="main", files_metadata=True)
    refs = {ref.name: ref.target_commit for ref in lab_hub.api().list_repo_refs(MODEL_REPO).branches}
    assert re.fullmatch(r"[0-9a-f]{40}", info.sha) and info.sha == refs["main"]
    assert info.gated is False
    files = lab_hub.repo_files()
    assert {s.rfilename for s in info.siblings} == set(files) | {".gitattributes"}
    for sibling in info.siblings:
        if sibling.rfilename == ".gitattributes":
            continue
        data = files[sibling.rfilename].read_bytes()
        assert sibling.size == len(data)
        if sibling.rfilename.endswith(".safetensors"):
            sha256 = hashlib.sha256(data).hexdigest()
            assert sibling.lfs is not None and (sibling.lfs.sha256, sibling.lfs.size) == (sha256, len(data))
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(data)}\n"
            assert sibling.blob_id == git_hash_object(pointer.encode())
            assert sibling.lfs.pointer_size == len(pointer)
        else:
            assert sibling.lfs is None and sibling.blob_id == git_hash_object(data)
    # The client's own check of a download against the Hub's listing for that commit.
    local = download(lab_hub, tmp_path / "weights", revision=info.sha)
    verification = lab_hub.api().verify_repo_checksums(MODEL_REPO, revision=info.sha, local_dir=local)
    assert verification.checked_count == len(info.siblings)
    assert (verification.mismatches, verification.missing_paths, verification.extra_paths) == ([], [], [])


def test_branch_next_differs_from_main_in_one_small_file(lab_hub: LabHub, tmp_path: Path) -> None:
    api = lab_hub.api()
    main = api.model_info(MODEL_REPO, revision="main", files_metadata=True)
    next_ = api.model_info(MODEL_REPO, revision="next", files_metadata=True)
    assert main.sha != next_.sha
    changed = {s.rfilename for s in main.siblings} ^ {s.rfilename for s in next_.siblings} | {
        a.rfilename for a, b in zip(main.siblings, next_.siblings, strict=True) if a.blob_id != b.blob_id
    }
    assert changed == {"generation_config.json"}
    assert {r.name for r in api.list_repo_refs(MODEL_REPO).branches} == {"main", "next"}
    # Pinned by its commit, as a deploy records it.
    path = hf_hub_download(MODEL_REPO, "generation_config.json", revision=next_.sha, endpoint=lab_hub.url,
                           cache_dir=tmp_path / "cache", token=False)
    assert json.loads(Path(path).read_text())["temperature"] == 0.6
    assert json.loads((lab_hub.model_dir / "generation_config.json").read_text())["temperature"] == 0.7


def test_resolve_answers_with_the_headers_the_client_reads(lab_hub: LabHub) -> None:
    commit = lab_hub.api().model_info(MODEL_REPO).sha
    shard = lab_hub.model_dir / SHARD
    meta = get_hf_file_metadata(hf_hub_url(MODEL_REPO, SHARD, endpoint=lab_hub.url), token=False)
    assert (meta.commit_hash, meta.etag, meta.size) == (
        commit, hashlib.sha256(shard.read_bytes()).hexdigest(), shard.stat().st_size)
    assert meta.xet_file_data is None
    with httpx2.Client() as client:
        redirect = client.head(f"{lab_hub.url}/{MODEL_REPO}/resolve/main/{SHARD}")
        config = client.head(f"{lab_hub.url}/{MODEL_REPO}/resolve/main/config.json")
    assert redirect.status_code == 302 and redirect.headers["Location"] == meta.location
    assert redirect.headers["X-Linked-Size"] == str(shard.stat().st_size)
    assert redirect.headers["X-Repo-Commit"] == commit
    assert config.status_code == 200
    assert config.headers["ETag"] == f'"{git_hash_object((lab_hub.model_dir / "config.json").read_bytes())}"'
    assert config.headers["Content-Length"] == str((lab_hub.model_dir / "config.json").stat().st_size)
    assert not [h for h in (*redirect.headers, *config.headers) if "xet" in h.lower() or h.lower() == "link"]


def test_range_requests_resume_a_partial_file(lab_hub: LabHub, tmp_path: Path) -> None:
    data = (lab_hub.model_dir / SHARD).read_bytes()
    url = get_hf_file_metadata(hf_hub_url(MODEL_REPO, SHARD, endpoint=lab_hub.url), token=False).location
    partial = tmp_path / "shard.incomplete"
    partial.write_bytes(data[:1000])
    with partial.open("ab") as fh:
        http_get(url, fh, resume_size=1000, expected_size=len(data))  # the client's resume: Range: bytes=1000-
    assert partial.read_bytes() == data
    with httpx2.Client(follow_redirects=True) as client:
        resolve = f"{lab_hub.url}/{MODEL_REPO}/resolve/main/{SHARD}"
        middle = client.get(resolve, headers={"Range": "bytes=10-19"})
        tail = client.get(resolve, headers={"Range": "bytes=-5"})
        beyond = client.get(resolve, headers={"Range": f"bytes={len(data)}-"})
    assert (middle.status_code, middle.content) == (206, data[10:20])
    assert middle.headers["Content-Range"] == f"bytes 10-19/{len(data)}"
    assert (tail.status_code, tail.content) == (206, data[-5:])
    assert beyond.status_code == 416


def test_a_dropped_connection_is_resumed_not_restarted(
    lab_hub: LabHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client writes (and so resumes from) whole chunks of 10 MiB; smaller ones fit this small shard.
    chunk = 64 << 10
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", chunk)
    size = (lab_hub.model_dir / SHARD).stat().st_size
    lab_hub.post("/_lab/stats/reset")
    lab_hub.post(f"/_lab/cut?after={size // 2}")
    path = hf_hub_download(MODEL_REPO, SHARD, endpoint=lab_hub.url, local_dir=tmp_path / "weights",
                           cache_dir=tmp_path / "cache", token=False)
    assert Path(path).read_bytes() == (lab_hub.model_dir / SHARD).read_bytes()
    served = lab_hub.stats()["bytes_served"]
    assert size <= served < size + chunk, f"{served} bytes served for {size}: the download restarted"


def test_gated_repository_needs_the_lab_token(lab_hub: LabHub, tmp_path: Path) -> None:
    assert lab_hub.api().model_info(GATED_REPO).gated == "manual"  # its card is public, as on the Hub
    with pytest.raises(GatedRepoError) as error:
        download(lab_hub, tmp_path / "anonymous", GATED_REPO)
    assert error.value.response.status_code == 401
    with pytest.raises(GatedRepoError):
        lab_hub.api().auth_check(GATED_REPO)
    with pytest.raises(HfHubHTTPError, match="Invalid credentials") as error:
        download(lab_hub, tmp_path / "wrong", GATED_REPO, token="hf_not_a_lab_token")
    assert error.value.response.status_code == 401
    assert not isinstance(error.value, RepositoryNotFoundError | GatedRepoError)
    lab_hub.api(TOKEN).auth_check(GATED_REPO)
    local = download(lab_hub, tmp_path / "granted", GATED_REPO, token=TOKEN)
    assert (local / SHARD).read_bytes() == (lab_hub.model_dir / SHARD).read_bytes()


def test_unknown_repository_revision_and_file_raise_the_clients_errors(lab_hub: LabHub, tmp_path: Path) -> None:
    for token in (False, TOKEN):  # the Hub answers 401 to an anonymous caller, 404 to a known one
        with pytest.raises(RepositoryNotFoundError) as error:
            download(lab_hub, tmp_path / "repo", "lab/no-such-model", token=token)
        assert error.value.response.status_code == (404 if token else 401)
    with pytest.raises(RevisionNotFoundError):
        download(lab_hub, tmp_path / "branch", revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        download(lab_hub, tmp_path / "commit", revision="0" * 40)
    with pytest.raises(RevisionNotFoundError):
        lab_hub.api().model_info(MODEL_REPO, revision="no-such-branch", files_metadata=True)
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(MODEL_REPO, "no-such-file.json", endpoint=lab_hub.url, cache_dir=tmp_path, token=False)


def test_stats_count_body_bytes_and_reset(lab_hub: LabHub, tmp_path: Path) -> None:
    assert lab_hub.post("/_lab/stats/reset")["bytes_served"] == 0
    hf_hub_download(MODEL_REPO, "config.json", endpoint=lab_hub.url, cache_dir=tmp_path, token=False)
    assert lab_hub.stats()["bytes_served"] == (lab_hub.model_dir / "config.json").stat().st_size
    lab_hub.post("/_lab/stats/reset")
    assert lab_hub.stats()["bytes_served"] == 0


def hf_cli(lab_hub: LabHub, tmp_path: Path, *args: str, token: str | None = None) -> subprocess.CompletedProcess:
    """`hf` as the product runs it: a subprocess with HF_ENDPOINT (and HF_TOKEN for a gated repository)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_ENDPOINT": lab_hub.url, "HF_HOME": str(tmp_path / "hf-home")} | ({"HF_TOKEN": token} if token else {})
    hf = Path(sys.executable).parent / "hf"
    return subprocess.run([str(hf), "download", "--json", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_hf_download_cli_fetches_a_revision_and_a_gated_repository(lab_hub: LabHub, tmp_path: Path) -> None:
    result = hf_cli(lab_hub, tmp_path, MODEL_REPO, "--revision", "next", "--local-dir", str(tmp_path / "next"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"path": str(tmp_path / "next")}
    assert json.loads((tmp_path / "next" / "generation_config.json").read_text())["temperature"] == 0.6
    assert (tmp_path / "next" / SHARD).read_bytes() == (lab_hub.model_dir / SHARD).read_bytes()
    refused = hf_cli(lab_hub, tmp_path, GATED_REPO, "--local-dir", str(tmp_path / "refused"))
    assert refused.returncode != 0 and f"Access denied. Model '{GATED_REPO}' requires approval" in refused.stderr
    granted = hf_cli(lab_hub, tmp_path, GATED_REPO, "--local-dir", str(tmp_path / "gated"), token=TOKEN)
    assert granted.returncode == 0, granted.stderr


def test_the_vllm_image_and_the_controller_pin_the_same_client() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    lock = (REPO / "tests" / "lab" / "standins" / "vllm_image_requirements.txt").read_text()
    image = re.search(r"^huggingface_hub==(\S+) --hash=sha256:[0-9a-f]{64}$", lock, re.M)
    assert image and f"huggingface_hub=={image.group(1)}" in pyproject
