"""sparkfleet/remote/stage_weights.py, run as pyinfra runs it: a subprocess against a tmp DEST.

The mirror is a local http.server with Range support serving a tmp directory (a few small shards, one in a
subdirectory, plus SHA256SUMS); its request log shows what was (not) fetched.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "sparkfleet" / "remote" / "stage_weights.py"
MANIFEST = ".sparkfleet-manifest.json"
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
TOKENIZER = "tokenizer/tokenizer.json"
HUGE = str(10**18)
# A proxy from the environment must not intercept requests to the local mirror.
ENV = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}

# Runs the script under an audit hook that records every file opened inside DEST: proof that a check
# (or a no-op stage) reads no weights, only the manifest.
AUDIT_RUNNER = """
import json, os, runpy, sys
dest, script = os.path.abspath(sys.argv[1]), sys.argv[2]
opened = []
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, os.PathLike)):
        path = os.path.abspath(os.fspath(args[0]))
        if path.startswith(dest + os.sep):
            opened.append(os.path.relpath(path, dest))
sys.addaudithook(hook)
sys.argv = [script, *sys.argv[3:]]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    sys.stderr.write("OPENED " + json.dumps(opened) + "\\n")
"""


@dataclass(frozen=True)
class Hit:
    """One request the mirror answered."""

    method: str
    rel: str
    range: str | None


@dataclass
class MirrorState:
    """What the mirror serves and how, and everything it was asked."""

    root: Path
    prefix: str  # URL path of the model directory, as on a real mirror serving several models
    honour_range: bool = True
    cut_after: dict[str, int] = field(default_factory=dict)  # rel -> bytes sent before dropping the line
    log: list[Hit] = field(default_factory=list)


class RangeHandler(BaseHTTPRequestHandler):
    """Static files with single `bytes=N-` ranges, which SimpleHTTPRequestHandler lacks."""

    server: MirrorServer

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        state = self.server.state
        url_path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        rel = url_path.removeprefix(state.prefix)
        state.log.append(Hit(self.command, rel, self.headers.get("Range")))
        path = state.root / rel
        if not url_path.startswith(state.prefix) or not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if match and state.honour_range and int(match.group(1)) < len(data):
            start = int(match.group(1))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            data = data[start:]
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data[: state.cut_after.get(rel, len(data))])


class MirrorServer(ThreadingHTTPServer):
    daemon_threads = True
    state: MirrorState


@dataclass
class Mirror:
    """The http(s) mirror of one model: files, SHA256SUMS, and the log of requests."""

    state: MirrorState
    url: str
    files: dict[str, bytes]

    @property
    def sums_url(self) -> str:
        return f"{self.url}/SHA256SUMS"

    def sums_text(self) -> bytes:
        lines = [f"{hashlib.sha256(data).hexdigest()}  {rel}\n" for rel, data in sorted(self.files.items())]
        return "".join(lines).encode()

    def publish(self, rel: str, data: bytes) -> None:
        """Change (or add) one file and its SHA256SUMS line, as a new model revision would."""
        self.files[rel] = data
        self.serve_only(rel, data)
        (self.state.root / "SHA256SUMS").write_bytes(self.sums_text())

    def serve_only(self, rel: str, data: bytes) -> None:
        """Serve bytes without updating SHA256SUMS: a broken or hostile mirror."""
        path = self.state.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def gets(self) -> list[str]:
        """Files downloaded (GET), SHA256SUMS excluded."""
        return [hit.rel for hit in self.state.log if hit.method == "GET" and hit.rel != "SHA256SUMS"]

    def file_hits(self) -> list[Hit]:
        return [hit for hit in self.state.log if hit.rel != "SHA256SUMS"]


def payload(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


@contextmanager
def serving(root: Path) -> Iterator[Mirror]:
    """A mirror of one model on a free localhost port, for as long as the block runs."""
    state = MirrorState(root=root, prefix="/models/qwen/")
    server = MirrorServer(("127.0.0.1", 0), RangeHandler)
    server.state = state
    # A short poll interval: shutdown() waits for it, at every test's teardown.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    mirror = Mirror(state, f"http://127.0.0.1:{server.server_address[1]}{state.prefix.rstrip('/')}", {})
    # SHARD1 spans more than one 4 MiB read, so chunked streaming and resume cross chunk borders.
    sizes = {"config.json": 700, SHARD1: (4 << 20) + 123, SHARD2: 300_000, TOKENIZER: 40_000}
    for seed, (rel, size) in enumerate(sizes.items()):
        mirror.publish(rel, payload(seed, size))
    try:
        yield mirror
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[Mirror]:
    with serving(tmp_path / "mirror") as mirror:
        yield mirror


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    return tmp_path / "models" / "nvidia--Qwen3.6-35B-A3B-NVFP4"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DEST as a successful stage leaves it, staged once per module (the mirror content is seeded)."""
    root = tmp_path_factory.mktemp("template")
    with serving(root / "mirror") as mirror:
        staged_ok(root / "dest", mirror)
    return root / "dest"


@pytest.fixture
def installed(template: Path, dest: Path) -> None:
    """DEST holds the weights of an earlier successful stage (copy2 keeps the mtimes the manifest records)."""
    shutil.copytree(template, dest)


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(SCRIPT), *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=60, check=False)


def stage(dest: Path, mirror: Mirror, *extra: str) -> subprocess.CompletedProcess[str]:
    return run("stage", "--dest", dest, "--sums-url", mirror.sums_url, *extra)


def staged_ok(dest: Path, mirror: Mirror, *extra: str) -> subprocess.CompletedProcess[str]:
    result = stage(dest, mirror, *extra)
    assert result.returncode == 0, result.stderr
    return result


def check(dest: Path, *source: str) -> dict[str, Any]:
    result = run("check", "--dest", dest, *source)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1
    return json.loads(result.stdout)


def check_url(dest: Path, mirror: Mirror, *extra: str) -> dict[str, Any]:
    return check(dest, "--sums-url", mirror.sums_url, *extra)


def manifest(dest: Path) -> dict[str, Any]:
    return json.loads((dest / MANIFEST).read_text())


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under root with its content and mtime: 'nothing changed' made checkable."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def corrupt_same_size(path: Path) -> None:
    """Flip bytes in place and restore the mtime: invisible to stat, visible to a hash."""
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[10:20] = bytes(b ^ 0xFF for b in data[10:20])
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def assert_in_place(dest: Path, mirror: Mirror) -> None:
    for rel, data in mirror.files.items():
        assert (dest / rel).read_bytes() == data, rel
    assert manifest(dest)["source_digest"] == hashlib.sha256(mirror.sums_text()).hexdigest()
    assert not (dest / ".staging").exists()


# --- fresh stage and idempotence ------------------------------------------------------------------------


def test_fresh_stage_installs_every_file_and_a_manifest(dest: Path, mirror: Mirror) -> None:
    result = staged_ok(dest, mirror)

    assert_in_place(dest, mirror)
    data = manifest(dest)
    assert data["version"] == 1
    assert set(data["files"]) == set(mirror.files)
    for rel, content in mirror.files.items():
        st = (dest / rel).stat()
        expected = {
            "sha256": hashlib.sha256(content).hexdigest(),
            "size": len(content),
            "mtime_ns": st.st_mtime_ns,
        }
        assert data["files"][rel] == expected
    assert sorted(mirror.gets()) == sorted(mirror.files)
    assert result.stdout == f"staged 4 files (0.00 GiB fetched, 0 files already in place) into {dest}\n"
    fetched_lines = [line for line in result.stderr.splitlines() if line.startswith("fetched ")]
    assert len(fetched_lines) == 4
    # Files are fetched a few at once, so their lines come in the order they finish.
    shard = next(line for line in fetched_lines if line.startswith(f"fetched {SHARD1} "))
    assert re.fullmatch(rf"fetched {SHARD1} 4\.0 MiB in \d+\.\d s \(\d+ MiB/s\)", shard)


@pytest.mark.usefixtures("installed")
def test_rerun_fetches_nothing_and_check_says_ok(dest: Path, mirror: Mirror) -> None:
    before = snapshot(dest)

    result = staged_ok(dest, mirror)

    assert result.stdout == "weights already in place: 4 files\n"
    assert mirror.file_hits() == []
    assert snapshot(dest) == before
    total = sum(len(data) for data in mirror.files.values())
    assert check_url(dest, mirror) == {"state": "ok", "files": 4, "bytes": total}
    assert check_url(dest, mirror, "--full") == {"state": "ok", "files": 4, "bytes": total}


@pytest.mark.parametrize("command", ["check", "stage"])
@pytest.mark.usefixtures("installed")
def test_fast_mode_opens_only_the_manifest(dest: Path, mirror: Mirror, command: str) -> None:
    argv = [command, "--dest", str(dest), "--sums-url", mirror.sums_url]

    result = subprocess.run(
        [sys.executable, "-c", AUDIT_RUNNER, str(dest), str(SCRIPT), *argv],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    opened = json.loads(result.stderr.rsplit("OPENED ", 1)[1])
    assert opened == [MANIFEST]


@pytest.mark.usefixtures("installed")
def test_fast_check_trusts_stat_and_full_check_hashes(dest: Path, mirror: Mirror) -> None:
    corrupt_same_size(dest / SHARD2)

    assert check_url(dest, mirror)["state"] == "ok"
    full = check_url(dest, mirror, "--full")
    assert full["state"] == "stale"
    assert full["missing"] == []
    recorded = manifest(dest)["files"][SHARD2]["sha256"]
    actual = hashlib.sha256((dest / SHARD2).read_bytes()).hexdigest()
    assert full["reasons"] == [f"{SHARD2}: sha256 {actual} != {recorded}"]


# --- repairs ---------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("installed")
def test_truncated_file_is_stale_and_only_it_is_refetched(dest: Path, mirror: Mirror) -> None:
    with (dest / SHARD2).open("r+b") as handle:
        handle.truncate(100)

    state = check_url(dest, mirror)
    assert state["state"] == "stale"
    assert f"{SHARD2}: size 100 != {len(mirror.files[SHARD2])}" in state["reasons"]
    assert state["missing"] == []
    assert state["stale_files"] == [SHARD2]

    result = staged_ok(dest, mirror)
    assert mirror.gets() == [SHARD2]
    assert {hit.rel for hit in mirror.file_hits()} == {SHARD2}
    assert result.stdout == f"staged 1 files (0.00 GiB fetched, 3 files already in place) into {dest}\n"
    assert_in_place(dest, mirror)


@pytest.mark.usefixtures("installed")
def test_deleted_file_is_missing_and_only_it_is_refetched(dest: Path, mirror: Mirror) -> None:
    (dest / TOKENIZER).unlink()

    state = check_url(dest, mirror)
    assert state == {"state": "stale", "reasons": [f"{TOKENIZER}: missing"], "missing": [TOKENIZER],
                     "stale_files": [TOKENIZER]}

    staged_ok(dest, mirror)
    assert mirror.gets() == [TOKENIZER]
    assert_in_place(dest, mirror)


@pytest.mark.usefixtures("installed")
def test_same_size_corruption_needs_full_to_be_repaired(dest: Path, mirror: Mirror) -> None:
    corrupt_same_size(dest / SHARD1)

    plain = staged_ok(dest, mirror)
    assert plain.stdout == "weights already in place: 4 files\n"
    assert mirror.gets() == []
    assert (dest / SHARD1).read_bytes() != mirror.files[SHARD1]

    staged_ok(dest, mirror, "--full")
    assert mirror.gets() == [SHARD1]
    assert_in_place(dest, mirror)


@pytest.mark.usefixtures("installed")
def test_touched_file_is_rehashed_not_refetched(dest: Path, mirror: Mirror) -> None:
    os.utime(dest / SHARD2, ns=(1, 1_000_000_000))

    assert check_url(dest, mirror)["state"] == "stale"
    assert staged_ok(dest, mirror).stdout == "weights already in place: 4 files\n"
    assert mirror.gets() == []
    assert manifest(dest)["files"][SHARD2]["mtime_ns"] == 1_000_000_000


@pytest.mark.usefixtures("installed")
def test_changed_source_refetches_only_the_changed_file(dest: Path, mirror: Mirror) -> None:
    kept = {rel: (dest / rel).stat().st_mtime_ns for rel in mirror.files if rel != SHARD2}
    old_digest = manifest(dest)["source_digest"]
    mirror.publish(SHARD2, payload(99, 300_000))

    state = check_url(dest, mirror)
    assert state["state"] == "stale"
    assert any(old_digest in reason for reason in state["reasons"])

    staged_ok(dest, mirror)
    assert mirror.gets() == [SHARD2]
    assert_in_place(dest, mirror)
    assert {rel: (dest / rel).stat().st_mtime_ns for rel in kept} == kept
    assert check_url(dest, mirror)["state"] == "ok"


@pytest.mark.usefixtures("installed")
def test_unknown_files_are_kept_and_staging_leftovers_removed(dest: Path, mirror: Mirror) -> None:
    (dest / "NOTES.md").write_text("operator notes")
    (dest / ".staging" / "old").mkdir(parents=True)
    (dest / ".staging" / "old" / "leftover.bin").write_bytes(b"x" * 10)
    (dest / SHARD2).unlink()

    staged_ok(dest, mirror)

    assert (dest / "NOTES.md").read_text() == "operator notes"
    assert_in_place(dest, mirror)
    assert "NOTES.md" not in manifest(dest)["files"]


# --- resume -----------------------------------------------------------------------------------------------


def test_partial_file_in_staging_is_resumed_with_a_range_request(dest: Path, mirror: Mirror) -> None:
    half = len(mirror.files[SHARD1]) // 2 + 7
    partial = dest / ".staging" / SHARD1
    partial.parent.mkdir(parents=True)
    partial.write_bytes(mirror.files[SHARD1][:half])

    result = staged_ok(dest, mirror)

    shard_gets = [hit for hit in mirror.state.log if hit.method == "GET" and hit.rel == SHARD1]
    assert shard_gets == [Hit("GET", SHARD1, f"bytes={half}-")]
    assert all(hit.range is None for hit in mirror.state.log if hit.rel != SHARD1)
    assert f"(resumed at {half} bytes)" in result.stderr
    assert_in_place(dest, mirror)


def test_complete_file_in_staging_is_verified_not_fetched(dest: Path, mirror: Mirror) -> None:
    partial = dest / ".staging" / TOKENIZER
    partial.parent.mkdir(parents=True)
    partial.write_bytes(mirror.files[TOKENIZER])

    staged_ok(dest, mirror)

    assert sorted(mirror.gets()) == sorted(set(mirror.files) - {TOKENIZER})
    assert_in_place(dest, mirror)


def test_server_ignoring_range_restarts_from_zero(dest: Path, mirror: Mirror) -> None:
    mirror.state.honour_range = False
    partial = dest / ".staging" / SHARD2
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"garbage that must not survive")

    staged_ok(dest, mirror)

    assert Hit("GET", SHARD2, "bytes=29-") in mirror.state.log
    assert_in_place(dest, mirror)


def test_partial_of_an_older_revision_is_refetched_from_zero(dest: Path, mirror: Mirror) -> None:
    partial = dest / ".staging" / SHARD2
    partial.parent.mkdir(parents=True)
    partial.write_bytes(payload(77, 1000))  # same name, other content: a revision the source no longer lists

    result = staged_ok(dest, mirror)

    shard_gets = [hit.range for hit in mirror.state.log if hit.method == "GET" and hit.rel == SHARD2]
    assert shard_gets == ["bytes=1000-", None]
    assert f"discarded {SHARD2} in .staging: resumed copy does not verify" in result.stderr
    assert_in_place(dest, mirror)


def test_dropped_connection_keeps_the_partial_file_for_the_next_run(dest: Path, mirror: Mirror) -> None:
    mirror.state.cut_after[SHARD1] = 1 << 20

    first = stage(dest, mirror)
    assert first.returncode == 5
    assert "connection closed after 1048576 of" in first.stderr
    assert (dest / ".staging" / SHARD1).stat().st_size == 1 << 20
    assert not (dest / SHARD1).exists()

    mirror.state.cut_after.clear()
    mirror.state.log.clear()
    staged_ok(dest, mirror)
    assert Hit("GET", SHARD1, f"bytes={1 << 20}-") in mirror.state.log
    assert_in_place(dest, mirror)


# --- refusals ---------------------------------------------------------------------------------------------


def test_wrong_bytes_exit_4_and_nothing_moves_into_place(dest: Path, mirror: Mirror) -> None:
    bad = payload(7, len(mirror.files[TOKENIZER]))
    mirror.serve_only(TOKENIZER, bad)

    result = stage(dest, mirror)

    assert result.returncode == 4
    wanted = hashlib.sha256(mirror.files[TOKENIZER]).hexdigest()
    got = hashlib.sha256(bad).hexdigest()
    assert f"checksum mismatch for {TOKENIZER}: wanted sha256 {wanted}, got {got}" in result.stderr
    assert not (dest / ".staging" / TOKENIZER).exists()
    assert not (dest / MANIFEST).exists()
    assert [rel for rel in mirror.files if (dest / rel).exists()] == []

    mirror.serve_only(TOKENIZER, mirror.files[TOKENIZER])
    mirror.state.log.clear()
    staged_ok(dest, mirror)
    assert mirror.gets() == [TOKENIZER]  # the verified files waited in .staging
    assert_in_place(dest, mirror)


@pytest.mark.usefixtures("installed")
def test_wrong_bytes_leave_the_old_file_in_place(dest: Path, mirror: Mirror) -> None:
    before = snapshot(dest)
    mirror.publish(SHARD2, payload(42, 1000))
    mirror.serve_only(SHARD2, payload(43, 1000))

    assert stage(dest, mirror).returncode == 4
    assert snapshot(dest) == before


def test_not_enough_space_exits_3_before_any_change(dest: Path, mirror: Mirror) -> None:
    result = stage(dest, mirror, "--min-free-bytes", HUGE)

    assert result.returncode == 3
    pattern = (
        r"not enough space on /\S*: need 0\.0 GiB for weights \(\+ \d+\.\d GiB margin\), \d+\.\d GiB free; "
        r"free space or point model_dir at a larger NVMe"
    )
    assert re.fullmatch(pattern, result.stderr.strip())
    assert not dest.exists()
    assert mirror.gets() == []


@pytest.mark.usefixtures("installed")
def test_not_enough_space_leaves_existing_weights_untouched(dest: Path, mirror: Mirror) -> None:
    (dest / SHARD1).unlink()
    partial = dest / ".staging" / SHARD1
    partial.parent.mkdir()
    partial.write_bytes(mirror.files[SHARD1][:1000])
    before = snapshot(dest)

    assert stage(dest, mirror, "--min-free-bytes", HUGE).returncode == 3
    assert snapshot(dest) == before
    assert mirror.gets() == []


def load_script() -> Any:
    """The script as a module, for its pure parser; everything else is exercised as a subprocess."""
    spec = importlib.util.spec_from_file_location("stage_weights", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["stage_weights"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "name",
    [
        "../escaped.bin",
        "/tmp/escaped.bin",
        "sub/../../escaped.bin",
        "a//b",
        "./a",
        "a\\..\\b",
        ".staging/x",
        MANIFEST,
    ],
)
def test_parser_refuses_paths_outside_dest_or_over_sparkfleet_state(name: str) -> None:
    script = load_script()
    text = f"{'ab' * 32}  config.json\n{'cd' * 32}  {name}\n".encode()

    with pytest.raises(script.StageError, match="invalid SHA256SUMS line 2: unsafe path") as raised:
        script.parse_sums(text)
    assert raised.value.code == 2


def test_parser_reads_sha256sum_output() -> None:
    script = load_script()
    text = f"{'AB' * 32}  config.json\n\n{'cd' * 32} *sub dir/w.bin\n{'ef' * 32}  SHA256SUMS\n".encode()

    assert script.parse_sums(text) == {"config.json": "ab" * 32, "sub dir/w.bin": "cd" * 32}


def test_traversal_in_sha256sums_changes_nothing(tmp_path: Path, dest: Path) -> None:
    sums = tmp_path / "SHA256SUMS"
    sums.write_text(f"{'ab' * 32}  config.json\n{'cd' * 32}  ../escaped.bin\n")

    for command in ("stage", "check"):
        result = run(command, "--dest", dest, "--sums-file", sums)
        assert result.returncode == 2
        assert result.stderr.strip() == "invalid SHA256SUMS line 2: unsafe path '../escaped.bin'"
    assert not dest.exists()
    assert not (dest.parent / "escaped.bin").exists()


def test_unreachable_mirror_exits_5(dest: Path, mirror: Mirror) -> None:
    missing = f"{mirror.url}/nope/SHA256SUMS"
    for command in ("stage", "check"):
        result = run(command, "--dest", dest, "--sums-url", missing)
        assert result.returncode == 5
        assert result.stderr.strip() == f"cannot fetch {missing}: HTTP 404 Not Found"


def test_file_missing_on_mirror_exits_5_before_any_download(dest: Path, mirror: Mirror) -> None:
    (mirror.state.root / SHARD2).unlink()

    result = stage(dest, mirror)

    assert result.returncode == 5
    assert f"cannot fetch {mirror.url}/{SHARD2}: HTTP 404" in result.stderr
    assert mirror.gets() == []
    assert not dest.exists()


# --- check sources and states -----------------------------------------------------------------------------


def test_check_absent_without_dest_or_manifest(dest: Path, mirror: Mirror) -> None:
    assert check_url(dest, mirror) == {"state": "absent"}
    dest.mkdir(parents=True)
    (dest / SHARD1).write_bytes(mirror.files[SHARD1])
    assert check_url(dest, mirror) == {"state": "absent"}


@pytest.mark.usefixtures("installed")
def test_check_by_digest(dest: Path, mirror: Mirror) -> None:
    digest = hashlib.sha256(mirror.sums_text()).hexdigest()

    assert check(dest, "--digest", digest)["state"] == "ok"
    stale = check(dest, "--digest", "0" * 64)
    assert stale["state"] == "stale"
    assert stale["reasons"] == [f"source digest {'0' * 64} != recorded {digest}"]


@pytest.mark.usefixtures("installed")
def test_corrupt_manifest_is_stale_and_stage_rebuilds_it_without_fetching(dest: Path, mirror: Mirror) -> None:
    (dest / MANIFEST).write_text("{not json")

    assert check_url(dest, mirror)["state"] == "stale"
    staged_ok(dest, mirror)
    assert mirror.gets() == []
    assert_in_place(dest, mirror)


# --- controller-staged files ------------------------------------------------------------------------------


def controller_upload(tmp_path: Path, dest: Path, mirror: Mirror) -> Path:
    """What the controller does before `stage --staged`: rsync files into DEST/.staging, upload SHA256SUMS."""
    sums = tmp_path / "upload" / "SHA256SUMS"
    sums.parent.mkdir()
    sums.write_bytes(mirror.sums_text())
    for rel in mirror.files:
        target = dest / ".staging" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(mirror.state.root / rel, target)
    return sums


def test_sums_file_with_staged_files(tmp_path: Path, dest: Path, mirror: Mirror) -> None:
    sums = controller_upload(tmp_path, dest, mirror)
    mtimes = {rel: (mirror.state.root / rel).stat().st_mtime_ns for rel in mirror.files}

    result = run("stage", "--dest", dest, "--sums-file", sums, "--staged", dest / ".staging")

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"staged 4 files (0.00 GiB fetched, 0 files already in place) into {dest}\n"
    assert mirror.state.log == []
    assert_in_place(dest, mirror)
    assert {rel: (dest / rel).stat().st_mtime_ns for rel in mirror.files} == mtimes
    assert check(dest, "--sums-file", sums)["state"] == "ok"
    assert run("stage", "--dest", dest, "--sums-file", sums).stdout == "weights already in place: 4 files\n"


def test_staged_file_with_wrong_content_is_deleted(tmp_path: Path, dest: Path, mirror: Mirror) -> None:
    sums = controller_upload(tmp_path, dest, mirror)
    (dest / ".staging" / SHARD2).write_bytes(b"not the shard")

    result = run("stage", "--dest", dest, "--sums-file", sums)  # --staged defaults to DEST/.staging

    assert result.returncode == 4
    assert f"checksum mismatch for {SHARD2}" in result.stderr
    assert not (dest / ".staging" / SHARD2).exists()
    assert [rel for rel in mirror.files if (dest / rel).exists()] == []


def test_staged_file_missing_exits_5(tmp_path: Path, dest: Path, mirror: Mirror) -> None:
    sums = controller_upload(tmp_path, dest, mirror)
    (dest / ".staging" / TOKENIZER).unlink()

    result = run("stage", "--dest", dest, "--sums-file", sums)

    assert result.returncode == 5
    assert result.stderr.strip() == f"missing from staged directory {dest / '.staging'}: {TOKENIZER}"
    assert not (dest / MANIFEST).exists()
