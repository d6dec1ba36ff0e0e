"""sparkfleet/remote/share_weights.py, the read-only share a Spark serves its verified weights from, on 127.0.0.1
in a thread; and stage_weights.py staging from it (`stage --sums-file F --base-url URL`) as a peer Spark does.

The shared generation is staged by stage_weights.py itself from a staged directory, so its manifest is the one a
real stage writes: only the files it lists are served."""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from sparkfleet.remote import share_weights

STAGE = Path(__file__).resolve().parents[2] / "sparkfleet" / "remote" / "stage_weights.py"
ENV = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
MODEL, GENERATION = "nvidia--Qwen", "sha256-0123456789abcdef"
FILES = {"config.json": b'{"a": 1}\n', "model-00001-of-00002.safetensors": bytes(range(256)) * 64,
         "model-00002-of-00002.safetensors": b"B" * 5000, "tokenizer/tokenizer.json": b"t" * 300}


def sums(files: dict[str, bytes]) -> str:
    return "".join(f"{hashlib.sha256(data).hexdigest()}  {rel}\n" for rel, data in sorted(files.items()))


def stage(*args: str | Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(STAGE), "stage", *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=60, check=False)


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One generation as a successful stage leaves it, staged once per module."""
    work = tmp_path_factory.mktemp("verified")
    staged = work / "staged"
    for rel, data in FILES.items():
        (staged / rel).parent.mkdir(parents=True, exist_ok=True)
        (staged / rel).write_bytes(data)
    (work / "SHA256SUMS").write_text(sums(FILES))
    result = stage("--dest", work / "generation", "--sums-file", work / "SHA256SUMS", "--staged", staged)
    assert result.returncode == 0, result.stderr
    return work / "generation"


@pytest.fixture
def models(tmp_path: Path, verified: Path) -> Path:
    """model_dir of the serving Spark: one verified generation, and what a share must never serve beside it."""
    root = tmp_path / "models"
    generation = root / MODEL / GENERATION
    shutil.copytree(verified, generation)
    (generation / "notes.txt").write_text("not listed")
    (generation / ".staging").mkdir()
    (generation / ".staging" / "config.json").write_text("half-written")
    unverified = root / MODEL / "sha256-fedcba9876543210"  # a stage under way: no manifest yet
    unverified.mkdir()
    (unverified / "config.json").write_bytes(FILES["config.json"])
    (root / "secret.txt").write_text("outside any generation")
    return root


@pytest.fixture
def share(models: Path) -> Iterator[int]:
    """The share of `models` on a free localhost port."""
    handler = type("Handler", (share_weights.Handler,), {"root": models})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def request(port: int, path: str, method: str = "GET", **headers: str) -> tuple[int, dict[str, str], bytes]:
    """One request with `path` sent as written (no client-side normalisation of `..`)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, headers=headers)
        response = connection.getresponse()
        return response.status, dict(response.headers), response.read()
    finally:
        connection.close()


BASE = f"/{MODEL}/{GENERATION}"
SHARD = "model-00001-of-00002.safetensors"


def test_a_listed_file_is_served_whole(share: int) -> None:
    status, headers, body = request(share, f"{BASE}/{SHARD}")
    assert (status, body) == (200, FILES[SHARD])
    assert headers["Content-Length"] == str(len(FILES[SHARD])) and headers["Accept-Ranges"] == "bytes"
    assert request(share, f"{BASE}/tokenizer/tokenizer.json")[2] == FILES["tokenizer/tokenizer.json"]


def test_a_range_resumes_a_copy(share: int) -> None:
    size = len(FILES[SHARD])
    status, headers, body = request(share, f"{BASE}/{SHARD}", Range="bytes=1000-")
    assert (status, body) == (206, FILES[SHARD][1000:])
    assert headers["Content-Range"] == f"bytes 1000-{size - 1}/{size}"
    status, headers, body = request(share, f"{BASE}/{SHARD}", Range="bytes=10-19")
    assert (status, body, headers["Content-Length"]) == (206, FILES[SHARD][10:20], "10")
    status, headers, _ = request(share, f"{BASE}/{SHARD}", Range=f"bytes={size}-")
    assert (status, headers["Content-Range"]) == (416, f"bytes */{size}")
    status, _, body = request(share, f"{BASE}/{SHARD}", Range="bytes=20-10")  # invalid: ignored
    assert (status, body) == (200, FILES[SHARD])


def test_head_gives_the_length_without_the_body(share: int) -> None:
    status, headers, body = request(share, f"{BASE}/{SHARD}", method="HEAD")
    assert (status, headers["Content-Length"], body) == (200, str(len(FILES[SHARD])), b"")


@pytest.mark.parametrize("path", [
    f"{BASE}/notes.txt",  # in the generation, not in its manifest
    f"{BASE}/.sparkfleet-manifest.json",
    f"{BASE}/.staging/config.json",  # a partial copy
    f"{BASE}/tokenizer",  # a directory
    f"{BASE}/",
    f"/{MODEL}/",
    "/",
    f"/{MODEL}/sha256-fedcba9876543210/config.json",  # a generation without a manifest: not verified yet
    f"{BASE}/../../secret.txt",
    f"{BASE}/%2e%2e/%2e%2e/secret.txt",
    f"/{MODEL}/../secret.txt/x",
    f"{BASE}//config.json",
    "/secret.txt",
])
def test_nothing_unlisted_is_served(share: int, path: str) -> None:
    assert request(share, path)[0] == 404
    assert request(share, path, method="HEAD")[0] == 404


def test_only_get_and_head(share: int) -> None:
    assert request(share, f"{BASE}/config.json", method="PUT")[0] == 501
    assert request(share, f"{BASE}/config.json", method="DELETE")[0] == 501


# --- a peer staging from the share ------------------------------------------------------------------------


def test_a_peer_stages_a_generation_from_the_share(share: int, tmp_path: Path) -> None:
    (tmp_path / "wanted.SHA256SUMS").write_text(sums(FILES))
    dest = tmp_path / "peer" / MODEL / GENERATION
    result = stage("--dest", dest, "--sums-file", tmp_path / "wanted.SHA256SUMS",
                   "--base-url", f"http://127.0.0.1:{share}{BASE}", "--min-free-bytes", "0")
    assert result.returncode == 0, result.stderr
    assert {rel: (dest / rel).read_bytes() for rel in FILES} == FILES
    assert (dest / ".sparkfleet-manifest.json").is_file() and not (dest / ".staging").exists()
    assert "notes.txt" not in os.listdir(dest)


def test_a_corrupted_byte_on_the_peer_fails_the_copy(share: int, models: Path, tmp_path: Path) -> None:
    """The share serves what its manifest lists; the receiving Spark verifies against the controller's sums."""
    served = models / MODEL / GENERATION / SHARD
    data = bytearray(served.read_bytes())
    data[100] ^= 0xFF
    served.write_bytes(bytes(data))
    (tmp_path / "wanted.SHA256SUMS").write_text(sums(FILES))
    dest = tmp_path / "peer" / MODEL / GENERATION
    result = stage("--dest", dest, "--sums-file", tmp_path / "wanted.SHA256SUMS",
                   "--base-url", f"http://127.0.0.1:{share}{BASE}", "--min-free-bytes", "0")
    assert result.returncode == 4, result.stderr
    assert f"checksum mismatch for {SHARD}" in result.stderr
    assert not (dest / ".sparkfleet-manifest.json").exists() and not (dest / SHARD).exists()


def test_a_peer_without_the_generation_is_a_fetch_error(share: int, models: Path, tmp_path: Path) -> None:
    """Exit 5: the deploy's `||` then asks the source."""
    shutil.rmtree(models / MODEL / GENERATION)
    (tmp_path / "wanted.SHA256SUMS").write_text(sums(FILES))
    result = stage("--dest", tmp_path / "peer", "--sums-file", tmp_path / "wanted.SHA256SUMS",
                   "--base-url", f"http://127.0.0.1:{share}{BASE}", "--min-free-bytes", "0")
    assert result.returncode == 5 and "HTTP 404" in result.stderr
