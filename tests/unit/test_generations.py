"""generations.resolve: each kind of model source named, on the controller, by one generation (its directory name,
its SHA256SUMS, its size), and every way a source cannot be resolved said in one sentence naming the variable.

The mirror is a local http.server; the controller source a tmp directory; the Hub is huggingface_hub's own
HfApi.model_info and hf_hub_download replaced by fakes that answer as the Hub does (LFS files with their sha256,
the others with their git blob id), its errors raised by huggingface_hub's own hf_raise_for_status from the
responses the Hub gives."""

from __future__ import annotations

import hashlib
import http.server
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx2
import huggingface_hub
import pytest
from huggingface_hub.hf_api import BlobLfsInfo, RepoSibling
from huggingface_hub.utils import hf_raise_for_status

from sparkfleet import generations, manifest
from sparkfleet.config import ModelSource, SparkConfig
from sparkfleet.endpoint import resolve
from sparkfleet.fleet import FleetError, resolve_weights, with_weights
from sparkfleet.generations import SourceError, git_blob_id

COMMIT = "4f1c2b3a5d6e7f8091a2b3c4d5e6f708192a3b4c"
HUB = "http://hub.lan"


@pytest.fixture(autouse=True)
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No generation remembered from another test, no cache in the home directory, no proxy in the way."""
    monkeypatch.setattr(generations, "_resolved", {})
    monkeypatch.setattr(generations, "CACHE", tmp_path / "hub-cache")
    monkeypatch.setattr(manifest, "CACHE", tmp_path / "sums-cache")
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def sums(files: dict[str, bytes]) -> str:
    return "".join(f"{hashlib.sha256(data).hexdigest()}  {rel}\n" for rel, data in sorted(files.items()))


# --- a mirror ------------------------------------------------------------------------------------------


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(base URL, directory) of a static http mirror of one model."""
    root = tmp_path / "mirror"
    (root / "models" / "qwen").mkdir(parents=True)
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *args: Quiet(*args, directory=str(root)))  # type: ignore[misc]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/models/qwen", root / "models" / "qwen"
    finally:
        server.shutdown()
        server.server_close()


def test_a_mirror_is_named_by_the_digest_of_its_sha256sums(mirror: tuple[str, Path]) -> None:
    url, root = mirror
    text = sums({"config.json": b"{}", "model.safetensors": b"x" * 100})
    (root / "SHA256SUMS").write_text(text)
    generation = generations.resolve(ModelSource.parse(url + "/"))
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert (generation.id, generation.sums, generation.digest) == (f"sha256-{digest[:16]}", text, digest)
    assert generation.total_bytes is None and generation.commit is None  # a SHA256SUMS gives no sizes
    assert generation.label == f"{url}/ = sha256-{digest[:16]}"


def test_a_changed_mirror_is_another_generation(mirror: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    url, root = mirror
    (root / "SHA256SUMS").write_text(sums({"a": b"1"}))
    first = generations.resolve(ModelSource.parse(url))
    (root / "SHA256SUMS").write_text(sums({"a": b"2"}))
    assert generations.resolve(ModelSource.parse(url)) == first  # asked once per run
    monkeypatch.setattr(generations, "_resolved", {})
    assert generations.resolve(ModelSource.parse(url)).id != first.id


def test_a_mirror_without_sha256sums_is_one_sentence(mirror: tuple[str, Path]) -> None:
    url, _ = mirror
    with pytest.raises(SourceError) as error:
        generations.resolve(ModelSource.parse(url))
    assert str(error.value) == (f"`model_source` {url}: its SHA256SUMS cannot be fetched (File not found): check the "
                                "mirror URL, or publish SHA256SUMS (`sha256sum` of every file) beside the weights")


def test_a_mirror_that_cannot_be_reached_is_one_sentence() -> None:
    with pytest.raises(SourceError, match=r"^`model_source` http://127\.0\.0\.1:9/m: its SHA256SUMS cannot be "
                                          r"fetched \(.*\): check the mirror URL"):
        generations.resolve(ModelSource.parse("http://127.0.0.1:9/m"))


def test_a_mirror_file_too_large_for_a_sha256sums_is_refused(mirror: tuple[str, Path],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    url, root = mirror
    monkeypatch.setattr(generations, "MAX_SUMS_BYTES", 100)
    (root / "SHA256SUMS").write_text(sums({f"f{i}": b"" for i in range(5)}))
    with pytest.raises(SourceError, match="SHA256SUMS is larger than a SHA256SUMS can be"):
        generations.resolve(ModelSource.parse(url))


# --- a controller directory ----------------------------------------------------------------------------


def test_a_controller_directory_is_named_by_its_files(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    files = {"config.json": b"{}", "model.safetensors": b"w" * 1000, "tokenizer/tokenizer.json": b"t" * 10}
    for rel, data in files.items():
        (weights / rel).parent.mkdir(parents=True, exist_ok=True)
        (weights / rel).write_bytes(data)
    (weights / "SHA256SUMS").write_text("not listed\n")
    (weights / ".hidden").write_text("not listed")
    generation = generations.resolve(ModelSource.parse(str(weights)))
    assert generation.sums == sums(files)
    assert generation.id == f"sha256-{hashlib.sha256(sums(files).encode()).hexdigest()[:16]}"
    assert generation.total_bytes == 1012


def test_a_directory_written_by_hf_download_stages_without_its_cache(tmp_path: Path) -> None:
    """`hf download --local-dir` leaves .cache/huggingface/ beside the weights; rsync's --exclude=.* never sends
    it, so it must not be listed either (the stage would wait for files that never come)."""
    weights = tmp_path / "weights"
    (weights / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (weights / ".cache" / "huggingface" / "download" / "model.safetensors.metadata").write_text("commit\netag\n")
    (weights / "model.safetensors").write_bytes(b"w" * 10)
    generation = generations.resolve(ModelSource.parse(str(weights)))
    assert generation.sums == sums({"model.safetensors": b"w" * 10})
    assert generation.total_bytes == 10


def test_an_unreadable_controller_directory_is_one_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(root: Path) -> tuple[str, str]:
        raise PermissionError(13, "Permission denied", str(root))

    monkeypatch.setattr(generations, "controller_sums", refused)
    with pytest.raises(SourceError) as error:
        generations.resolve(ModelSource.parse(str(tmp_path)))
    assert str(error.value) == (f"`model_source` {tmp_path} cannot be read on the controller (Permission denied): "
                                "give a readable directory holding the weights")


# --- the Hub -------------------------------------------------------------------------------------------


def test_git_blob_id_is_gits(tmp_path: Path) -> None:
    for data in (b"", b"{}\n", bytes(range(256)) * 40):
        path = tmp_path / "file"
        path.write_bytes(data)
        git = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True)
        assert git_blob_id(data) == git.stdout.strip()


@dataclass
class FakeHub:
    """One repository at one commit, as model_info(files_metadata=True) and hf_hub_download see it."""

    cache: Path
    files: dict[str, bytes]
    lfs: set[str]
    served: dict[str, bytes] = field(default_factory=dict)  # what a download returns, where it differs
    error: dict[str, str] | None = None  # the Hub's error response to model_info: status and headers
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def sibling(self, rel: str) -> RepoSibling:
        data = self.files[rel]
        if rel in self.lfs:
            lfs = BlobLfsInfo(size=len(data), sha256=hashlib.sha256(data).hexdigest(), pointer_size=134)
            return RepoSibling(rel, size=len(data), blob_id="0" * 40, lfs=lfs)
        return RepoSibling(rel, size=len(data), blob_id=hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())

    def _answer(self, url: str) -> None:
        """The Hub's error response for `url`, raised the way huggingface_hub raises it, when one is set."""
        if self.error is not None:
            status = int(self.error["status"])
            headers = {key: value for key, value in self.error.items() if key != "status"}
            hf_raise_for_status(httpx2.Response(status, headers=headers, request=httpx2.Request("GET", url)))

    def auth_check(self, api: huggingface_hub.HfApi, repo_id: str, **kwargs: Any) -> None:
        self._answer(f"{HUB}/api/models/{repo_id}/auth-check")

    def model_info(self, api: huggingface_hub.HfApi, repo_id: str, **kwargs: Any) -> SimpleNamespace:
        self.calls.append(("model_info", {"repo_id": repo_id, "endpoint": api.endpoint, "token": api.token,
                                          **kwargs}))
        self._answer(f"{HUB}/api/models/{repo_id}/revision/{kwargs['revision']}")
        return SimpleNamespace(sha=COMMIT, siblings=[self.sibling(rel) for rel in reversed(self.files)])

    def download(self, repo_id: str, filename: str, **kwargs: Any) -> str:
        self.calls.append(("download", {"repo_id": repo_id, "filename": filename, **kwargs}))
        path = self.cache / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.served.get(filename, self.files[filename]))
        return str(path)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    fake = FakeHub(tmp_path / "downloads", {
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n", "config.json": b'{"a": 1}\n',
        "model-00001-of-00002.safetensors": b"A" * 3000, "model-00002-of-00002.safetensors": b"B" * 2000,
    }, lfs={"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"})
    # A function, not the bound method: set on the class, it receives the HfApi the code under test made.
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info",
                        lambda api, repo_id, **kwargs: fake.model_info(api, repo_id, **kwargs))
    # Access is checked first; the fake Hub answers it as it answers model info (its errors included).
    monkeypatch.setattr(huggingface_hub.HfApi, "auth_check",
                        lambda api, repo_id, **kwargs: fake.auth_check(api, repo_id, **kwargs))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake.download)
    return fake


SOURCE = ModelSource.parse("hf://nvidia/Qwen@main")


def test_a_hub_revision_is_named_by_its_commit_with_the_hubs_own_sums(hub: FakeHub) -> None:
    generation = generations.resolve(SOURCE, HUB, "hf_secret")
    assert (generation.id, generation.commit) == (COMMIT, COMMIT)
    assert generation.sums == sums(hub.files)  # LFS files by the Hub's sha256, the others hashed once checked
    assert generation.total_bytes == sum(len(data) for data in hub.files.values())
    assert generation.label == f"nvidia/Qwen@main = {COMMIT[:12]}"
    info, *downloads = hub.calls
    assert info == ("model_info", {"repo_id": "nvidia/Qwen", "endpoint": HUB, "token": "hf_secret",
                                   "revision": "main", "files_metadata": True})
    # Only the small files are downloaded, at the commit the branch named (not at `main`, which may move).
    assert [(call["filename"], call["revision"], call["endpoint"], call["token"]) for _, call in downloads] == [
        (".gitattributes", COMMIT, HUB, "hf_secret"), ("config.json", COMMIT, HUB, "hf_secret")]


def test_without_a_token_the_hub_is_asked_anonymously(hub: FakeHub) -> None:
    """token=False: not the token some `hf auth login` left on the controller."""
    generations.resolve(SOURCE)
    assert hub.calls[0][1]["token"] is False
    assert {call["token"] for _, call in hub.calls[1:]} == {False}


def test_a_small_file_that_is_not_the_hubs_blob_is_refused(hub: FakeHub) -> None:
    hub.served["config.json"] = b'{"a": 2}\n'  # what a proxy in between changed
    with pytest.raises(SourceError) as error:
        generations.resolve(SOURCE, HUB)
    blob = hub.sibling("config.json").blob_id
    assert str(error.value) == (f"`model_source` hf://nvidia/Qwen@main: config.json does not match the Hub's blob id "
                                f"{blob}: a proxy or mirror (hf_endpoint) altered it")


@pytest.mark.parametrize(("response", "token", "expected"), [
    ({"status": "401", "X-Error-Code": "GatedRepo", "X-Error-Message": "Access to model nvidia/Qwen is restricted."},
     None, "the repository is gated; set `hf_token` to a token of an account that accepted the model's terms"),
    ({"status": "403", "X-Error-Code": "GatedRepo", "X-Error-Message": "Access to model nvidia/Qwen is restricted."},
     "hf_x", "the repository is gated; the token in `hf_token` has no access to it: accept the model's terms on "
     "the Hub with that account"),
    ({"status": "404", "X-Error-Code": "RepoNotFound"}, None,
     "the Hub has no repository nvidia/Qwen (or it is private and `hf_token` is not set): check the name"),
    ({"status": "404", "X-Error-Code": "RevisionNotFound"}, None,
     "nvidia/Qwen has no revision 'main': give a branch, tag or commit of it"),
    ({"status": "401", "X-Error-Message": "Invalid credentials in Authorization header"}, "hf_old",
     "the Hub refused the token in `hf_token` (401): renew it"),
    ({"status": "503"}, None, "the Hub answered 503: "),
])
def test_the_hubs_refusals_are_one_sentence_naming_the_variable(hub: FakeHub, response: dict[str, str],
                                                                token: str | None, expected: str) -> None:
    hub.error = response
    with pytest.raises(SourceError) as error:
        generations.resolve(SOURCE, HUB, token)
    assert str(error.value).startswith(f"`model_source` hf://nvidia/Qwen@main: {expected}")
    assert "\n" not in str(error.value) and (token is None or token not in str(error.value))


def test_an_unreachable_hub_names_hf_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(api: huggingface_hub.HfApi, repo_id: str, **kwargs: Any) -> None:
        raise httpx2.ConnectError("[Errno 111] Connection refused")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", refused)
    monkeypatch.setattr(huggingface_hub.HfApi, "auth_check", refused)
    with pytest.raises(SourceError) as error:
        generations.resolve(SOURCE, HUB)
    assert str(error.value) == ("`model_source` hf://nvidia/Qwen@main: the Hub at http://hub.lan cannot be reached "
                                "([Errno 111] Connection refused): check the network or `hf_endpoint`")


def test_a_revision_without_files_is_refused(hub: FakeHub) -> None:
    hub.files.clear()
    with pytest.raises(SourceError, match="revision main of nvidia/Qwen has no files"):
        generations.resolve(SOURCE, HUB)


def test_a_source_is_asked_once_per_endpoint_and_token(hub: FakeHub) -> None:
    generations.resolve(SOURCE, HUB, "t1")
    generations.resolve(SOURCE, HUB, "t1")
    assert [name for name, _ in hub.calls].count("model_info") == 1
    generations.resolve(SOURCE, HUB, "t2")
    generations.resolve(SOURCE, None, "t1")
    assert [name for name, _ in hub.calls].count("model_info") == 3


# --- the fleet -----------------------------------------------------------------------------------------


def test_with_weights_reads_the_token_and_endpoint_of_the_host(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_HF_TOKEN", "hf_from_env")
    spark = resolve("spark-01", SparkConfig(hf_token="env:SPARK_HF_TOKEN", hf_endpoint=HUB))
    assert with_weights(spark).weights_dir == f"{spark.model_root}/{COMMIT}"
    assert (hub.calls[0][1]["endpoint"], hub.calls[0][1]["token"]) == (HUB, "hf_from_env")


def test_resolve_weights_names_every_host_that_cannot_be_resolved(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.mkdir()
    (good / "model.safetensors").write_bytes(b"w")
    endpoints = {name: resolve(name, SparkConfig(model_source=source)) for name, source in (
        ("spark-01", str(good)), ("spark-02", "http://127.0.0.1:9/a"), ("spark-03", "http://127.0.0.1:9/b"))}
    with pytest.raises(FleetError) as error:
        resolve_weights(endpoints)
    lines = str(error.value).splitlines()
    assert lines[0] == "model source not usable, nothing was changed on any host:"
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["spark-02", "spark-03"]
    assert "http://127.0.0.1:9/a" in lines[1] and "http://127.0.0.1:9/b" in lines[2]
    fine = resolve_weights({"spark-01": endpoints["spark-01"]})
    assert fine["spark-01"].weights is not None and fine["spark-01"].weights.total_bytes == 1
