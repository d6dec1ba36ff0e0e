#!/usr/bin/env python3
"""Stage model weights on a DGX Spark: verified, resumable, never fetched twice.

Installed as /usr/local/lib/sparkfleet/stage_weights.py and run by the sparkfleet deploy as root. It is
stdlib-only on purpose: it runs on the Spark's bare python3, with no sparkfleet installed.

The wanted list is a `sha256sum`-format SHA256SUMS, fetched from an http(s) mirror or uploaded by the
controller; its sha256 names the version of the weights. Files land in DEST/.staging first (kept between runs,
so a killed transfer resumes with a Range request), are verified against the wanted sha256 and only then
renamed into place. DEST/.sparkfleet-manifest.json, written last, records each file's size and mtime_ns, so a
re-run on intact weights only stats them (20-40 GB are not re-hashed on every deploy).

    check --dest DEST (--sums-url URL | --sums-file PATH | --digest HEX) [--full]    one JSON object on stdout
    stage --dest DEST (--sums-url URL | --sums-file PATH [--base-url URL]) [--staged DIR] [--full]
          [--min-free-bytes N]

--base-url fetches the files listed in --sums-file from another server (a Spark that holds them verified, or a
mirror), so the list comes from the controller and the bytes from wherever is nearest.

Exit codes: 0 ok (check: also when stale), 1 unexpected OS error, 2 usage or invalid SHA256SUMS,
3 not enough space, 4 checksum mismatch, 5 fetch error (HTTP, unreachable source, staged file missing).
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import http.client
import json
import os
import re
import shutil
import stat
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MANIFEST_NAME = ".sparkfleet-manifest.json"
STAGING_NAME = ".staging"
SUMS_NAME = "SHA256SUMS"
MANIFEST_VERSION = 1
CHUNK = 4 << 20  # streamed reads: a 20 GB shard never sits in memory
PARALLEL_FILES = 4  # files fetched at once
MIB, GIB = 1 << 20, 1 << 30
MAX_SUMS_BYTES = 16 << 20  # a SHA256SUMS is a few KB; anything this large is not one
HTTP_TIMEOUT = 60  # seconds without progress before a transfer counts as failed
USER_AGENT = "sparkfleet-stage-weights/1"
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NO_SPACE, EXIT_MISMATCH, EXIT_FETCH = 0, 1, 2, 3, 4, 5
_SUM_LINE = re.compile(r"([0-9a-fA-F]{64}) [ *](.+)")
_HEX64 = re.compile(r"[0-9a-f]{64}")
# Names sparkfleet keeps in DEST: a listed file must never overwrite them.
_RESERVED = (STAGING_NAME, MANIFEST_NAME, f"{MANIFEST_NAME}.tmp")


class StageError(Exception):
    """A failure an operator must act on: one line of message and the exit code that classifies it."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Wanted:
    """The source's file list (relpath -> sha256); sums_url is None when it came from a file on the host."""

    text: bytes
    files: dict[str, str]
    sums_url: str | None

    @property
    def digest(self) -> str:
        """The version of the weights: sha256 of the exact SHA256SUMS bytes."""
        return hashlib.sha256(self.text).hexdigest()


@dataclass(frozen=True)
class Record:
    """What the manifest remembers of one file: enough to trust it again without reading it."""

    sha256: str
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class Manifest:
    """The state of DEST after the last successful stage."""

    source_digest: str
    files: dict[str, Record]


# --- the wanted list -----------------------------------------------------------------------------------


def safe_relpath(raw: str, number: int) -> str:
    """Refuse a listed path that could escape DEST or clobber sparkfleet's own state (a hostile mirror)."""
    parts = raw.split("/")
    if (
        raw.startswith("/")
        or "\\" in raw
        or "\0" in raw
        or any(part in ("", ".", "..") for part in parts)
        or parts[0] in _RESERVED
    ):
        raise StageError(EXIT_USAGE, f"invalid {SUMS_NAME} line {number}: unsafe path {raw!r}")
    return raw


def parse_sums(text: bytes) -> dict[str, str]:
    """Parse `sha256sum` output into relpath -> lowercase sha256, in listed order."""
    try:
        lines = text.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise StageError(EXIT_USAGE, f"invalid {SUMS_NAME}: not UTF-8 ({exc})") from None
    files: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        match = _SUM_LINE.fullmatch(line)
        if match is None:
            raise StageError(EXIT_USAGE, f"invalid {SUMS_NAME} line {number}: {line[:120]!r}")
        rel = safe_relpath(match.group(2), number)
        if rel == SUMS_NAME:
            continue  # a list cannot hold its own hash: an artefact of `sha256sum * > SHA256SUMS`
        if rel in files:
            raise StageError(EXIT_USAGE, f"invalid {SUMS_NAME} line {number}: {rel} listed twice")
        files[rel] = match.group(1).lower()
    if not files:
        raise StageError(EXIT_USAGE, f"invalid {SUMS_NAME}: no files listed")
    return files


def open_url(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> Any:
    """Open an http(s) URL; every network failure becomes exit 5 naming the URL, what an operator needs."""
    request = urllib.request.Request(
        url, method=method, headers={"User-Agent": USER_AGENT, **(headers or {})}
    )
    try:
        return urllib.request.urlopen(request, timeout=HTTP_TIMEOUT)
    except urllib.error.HTTPError as exc:
        raise StageError(EXIT_FETCH, f"cannot fetch {url}: HTTP {exc.code} {exc.reason}") from None
    except (OSError, http.client.HTTPException) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise StageError(EXIT_FETCH, f"cannot fetch {url}: {reason}") from None


def read_sums(sums_url: str | None, sums_file: str | None) -> bytes:
    """The exact SHA256SUMS bytes: their digest must match what the controller computed."""
    if sums_url:
        with open_url(sums_url) as response:
            try:
                text = response.read(MAX_SUMS_BYTES + 1)
            except (OSError, http.client.HTTPException) as exc:
                raise StageError(EXIT_FETCH, f"cannot fetch {sums_url}: {exc}") from None
    else:
        try:
            text = Path(str(sums_file)).read_bytes()
        except OSError as exc:
            raise StageError(EXIT_USAGE, f"cannot read --sums-file {sums_file}: {exc.strerror}") from None
    if len(text) > MAX_SUMS_BYTES:
        raise StageError(EXIT_USAGE, f"invalid {SUMS_NAME}: larger than {MAX_SUMS_BYTES} bytes")
    return text


def load_wanted(args: argparse.Namespace) -> Wanted:
    """Read and parse the wanted list from whichever source the command line names."""
    text = read_sums(args.sums_url, args.sums_file)
    return Wanted(text, parse_sums(text), args.sums_url)


def file_url(sums_url: str, rel: str) -> str:
    """<base>/<relpath>, base being the directory that publishes SHA256SUMS."""
    parts = urllib.parse.urlsplit(sums_url)
    base = parts.path.rsplit("/", 1)[0]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, f"{base}/{urllib.parse.quote(rel)}", "", ""))


# --- files and the manifest ----------------------------------------------------------------------------


def sha256_file(path: Path, sync: bool = False) -> str:
    """Hash a file in bounded memory; sync flushes a staged copy to disk before it is trusted."""
    with path.open("rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
        if sync:
            os.fsync(handle.fileno())
    return digest


def fsync_dir(path: Path) -> None:
    """Make renames and new entries in a directory durable: a crash must not lose a move or the manifest."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def regular_stat(path: Path) -> os.stat_result | None:
    """stat() of a regular file, None for anything else: a directory where a shard should be is missing."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def read_manifest(dest: Path) -> Manifest | None:
    """The manifest of the last successful stage; None when there is none, ValueError when it is corrupt."""
    try:
        data = json.loads((dest / MANIFEST_NAME).read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise ValueError(exc.strerror) from None
    try:
        if data["version"] != MANIFEST_VERSION:
            raise ValueError(f"version {data['version']!r} != {MANIFEST_VERSION}")
        files = {
            str(rel): Record(str(rec["sha256"]), int(rec["size"]), int(rec["mtime_ns"]))
            for rel, rec in data["files"].items()
        }
        return Manifest(str(data["source_digest"]), files)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed: {exc!r}") from None


def write_manifest(dest: Path, manifest: Manifest) -> None:
    """Write the manifest atomically and durably: it vouches that every file before it is in place."""
    files = {rel: asdict(rec) for rel, rec in sorted(manifest.files.items())}
    data = {"version": MANIFEST_VERSION, "source_digest": manifest.source_digest, "files": files}
    tmp = dest / f"{MANIFEST_NAME}.tmp"
    with tmp.open("w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, dest / MANIFEST_NAME)
    fsync_dir(dest)


# --- check ---------------------------------------------------------------------------------------------


def file_problems(dest: Path, rel: str, rec: Record | None, sha: str, full: bool) -> list[str]:
    """Why one file cannot be trusted; stat only unless full, so a routine check reads no weights."""
    st = regular_stat(dest / rel)
    if st is None:
        return [f"{rel}: missing"]
    if rec is None:
        return [f"{rel}: not in manifest"]
    problems = []
    if rec.sha256 != sha:
        problems.append(f"{rel}: sha256 in source {sha} != recorded {rec.sha256}")
    if st.st_size != rec.size:
        problems.append(f"{rel}: size {st.st_size} != {rec.size}")
    if st.st_mtime_ns != rec.mtime_ns:
        problems.append(f"{rel}: mtime_ns {st.st_mtime_ns} != {rec.mtime_ns}")
    if full and not problems:
        actual = sha256_file(dest / rel)
        if actual != rec.sha256:
            problems.append(f"{rel}: sha256 {actual} != {rec.sha256}")
    return problems


def check_state(dest: Path, wanted: Wanted | None, digest: str, full: bool) -> dict[str, Any]:
    """absent / stale (with reasons and missing files) / ok, as the deploy's fact reads it."""
    try:
        manifest = read_manifest(dest)
    except ValueError as exc:
        manifest, reasons = Manifest("", {}), [f"{MANIFEST_NAME}: unreadable ({exc})"]
    else:
        if manifest is None:
            return {"state": "absent"}
        reasons = []
        if manifest.source_digest != digest:
            reasons.append(f"source digest {digest} != recorded {manifest.source_digest}")
    expected = wanted.files if wanted else {rel: rec.sha256 for rel, rec in manifest.files.items()}
    stale = []
    for rel, sha in expected.items():
        problems = file_problems(dest, rel, manifest.files.get(rel), sha, full)
        reasons += problems
        stale += [rel] if problems else []
    missing = [rel for rel in expected if regular_stat(dest / rel) is None]
    if reasons:
        # stale_files: what a repair must bring (the Hub download asks for these files only)
        return {"state": "stale", "reasons": reasons, "missing": missing, "stale_files": stale}
    total = sum(manifest.files[rel].size for rel in expected)
    return {"state": "ok", "files": len(expected), "bytes": total}


def cmd_check(args: argparse.Namespace) -> int:
    """Print DEST's state as one JSON object; staleness is an answer, not an error."""
    if args.digest:
        wanted, digest = None, args.digest
    else:
        wanted = load_wanted(args)
        digest = wanted.digest
    print(json.dumps(check_state(Path(args.dest), wanted, digest, args.full)))
    return EXIT_OK


# --- stage: what needs work ----------------------------------------------------------------------------


def load_manifest_quietly(dest: Path) -> Manifest | None:
    """A corrupt manifest vouches for nothing: staging then falls back to hashing what is there."""
    try:
        return read_manifest(dest)
    except ValueError:
        return None


def is_in_place(path: Path, sha: str, rec: Record | None, full: bool) -> bool:
    """Trust stat where the manifest vouches for this content; otherwise hash, so nothing is fetched twice."""
    st = regular_stat(path)
    if st is None:
        return False
    if rec is not None and rec.sha256 == sha:
        if rec.size != st.st_size:
            return False
        if not full and rec.mtime_ns == st.st_mtime_ns:
            return True
    return sha256_file(path) == sha


def plan(dest: Path, wanted: Wanted, manifest: Manifest | None, full: bool) -> tuple[list[str], list[str]]:
    """Split the wanted files into those already in place and those to fetch, in listed order."""
    in_place, needed = [], []
    for rel, sha in wanted.files.items():
        rec = manifest.files.get(rel) if manifest else None
        (in_place if is_in_place(dest / rel, sha, rec, full) else needed).append(rel)
    return in_place, needed


def head_length(url: str) -> int | None:
    """Content-Length by HEAD: sizes are known before any transfer, so the space check comes first."""
    with open_url(url, method="HEAD") as response:
        value = response.headers.get("Content-Length", "")
    return int(value) if value.isdigit() else None


def bytes_to_fetch(staging: Path, lengths: dict[str, int | None]) -> int:
    """Bytes still to download: what a partial file in .staging already holds is not fetched again."""
    total = 0
    for rel, length in lengths.items():
        if length is None:
            continue
        st = regular_stat(staging / rel)
        partial = st.st_size if st is not None and st.st_size <= length else 0
        total += length - partial
    return total


def nearest_existing(path: Path) -> Path:
    """DEST or its closest existing ancestor: DEST itself may not exist before the first stage."""
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def mount_point(path: Path) -> Path:
    """The mount holding path, named in the no-space message so the operator knows which disk to free."""
    while not os.path.ismount(path):
        path = path.parent
    return path


def ensure_space(dest: Path, need: int, margin: int) -> None:
    """Refuse before any transfer: a disk filling mid-stage leaves a broken stage and maybe a broken host."""
    existing = nearest_existing(dest)
    free = shutil.disk_usage(existing).free
    if need + margin <= free:
        return
    raise StageError(
        EXIT_NO_SPACE,
        f"not enough space on {mount_point(existing)}: need {need / GIB:.1f} GiB for weights "
        f"(+ {margin / GIB:.1f} GiB margin), {free / GIB:.1f} GiB free; "
        "free space or point model_dir at a larger NVMe",
    )


# --- stage: getting verified files into .staging -------------------------------------------------------


def progress(verb: str, rel: str, count: int, seconds: float, note: str = "") -> None:
    """One stderr line per file: a 20 GB transfer must show it is alive."""
    rate = count / MIB / seconds if seconds > 0 else 0.0
    say(f"{verb} {rel} {count / MIB:.1f} MiB in {seconds:.1f} s ({rate:.0f} MiB/s){note}")


def say(line: str) -> None:
    """One stderr line in one write: parallel fetches must not interleave a line with another's newline."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def verify(rel: str, path: Path, wanted: str, streamed: str | None) -> None:
    """A staged file must hash to the wanted sha256; a bad copy is deleted so the next run refetches it."""
    actual = streamed or sha256_file(path, sync=True)
    if actual != wanted:
        path.unlink(missing_ok=True)
        raise StageError(
            EXIT_MISMATCH,
            f"checksum mismatch for {rel}: wanted sha256 {wanted}, got {actual}; "
            "the staged copy was deleted and the next run fetches it again",
        )


def partial_size(path: Path, length: int | None) -> int:
    """Bytes of an interrupted download worth resuming from; an unusable partial file is discarded."""
    st = regular_stat(path)
    if st is None:
        return 0
    if length is None or st.st_size > length:
        path.unlink()
        return 0
    return st.st_size


def write_stream(response: Any, path: Path, append: bool) -> tuple[str | None, int]:
    """Stream a response to disk in chunks, hashing on the way unless it continues an earlier file."""
    hasher = None if append else hashlib.sha256()
    count = 0
    buffer = memoryview(bytearray(CHUNK))  # one buffer reused: no allocation per read
    with path.open("ab" if append else "wb") as handle:
        while size := response.readinto(buffer):
            chunk = buffer[:size]
            handle.write(chunk)
            if hasher is not None:
                hasher.update(chunk)
            count += size
        handle.flush()
        os.fsync(handle.fileno())
    return (hasher.hexdigest() if hasher else None), count


def receive(url: str, path: Path, offset: int) -> tuple[str | None, int, bool]:
    """GET from offset; append on 206, restart on 200. A short body keeps its bytes for the next resume."""
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    with open_url(url, headers=headers) as response:
        resumed = offset > 0 and response.status == 206
        if resumed and not response.headers.get("Content-Range", "").startswith(f"bytes {offset}-"):
            raise StageError(EXIT_FETCH, f"cannot fetch {url}: Content-Range does not start at {offset}")
        expected = response.headers.get("Content-Length", "")
        try:
            sha, count = write_stream(response, path, append=resumed)
        except (OSError, http.client.HTTPException) as exc:
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                raise
            raise StageError(EXIT_FETCH, f"cannot fetch {url}: {exc}") from None
    if expected.isdigit() and count < int(expected):
        raise StageError(
            EXIT_FETCH, f"cannot fetch {url}: connection closed after {count} of {expected} bytes"
        )
    return sha, count, resumed


def fetch_one(url: str, rel: str, path: Path, length: int | None) -> tuple[str | None, int]:
    """Bring one file into .staging, resuming a partial one; returns the streamed sha256 and bytes moved."""
    path.parent.mkdir(parents=True, exist_ok=True)
    offset = partial_size(path, length)
    if offset and offset == length:
        say(f"found {rel} complete in {STAGING_NAME}")
        return None, 0
    started = time.monotonic()
    sha, count, resumed = receive(url, path, offset)
    note = f" (resumed at {offset} bytes)" if resumed else ""
    progress("fetched", rel, count, time.monotonic() - started, note)
    return sha, count


def fetch_verified(url: str, rel: str, path: Path, length: int | None, wanted: str) -> int:
    """Fetch and verify one file; returns the bytes transferred.

    A resumed copy that does not verify may be the partial of an older revision (same name, other content):
    it is fetched once more from zero before the mismatch counts, so a changed source never needs two runs.
    """
    sha, count = fetch_one(url, rel, path, length)
    if sha is None:
        sha = sha256_file(path, sync=True)
        if sha != wanted:
            say(f"discarded {rel} in {STAGING_NAME}: resumed copy does not verify")
            path.unlink()
            sha, more = fetch_one(url, rel, path, length)
            count += more
    verify(rel, path, wanted, sha)
    return count


def fetch_all(sums_url: str, wanted: Wanted, lengths: dict[str, int | None], staging: Path) -> int:
    """Download and verify every needed file, a few at once; returns the bytes transferred.

    One stream is bound by one core hashing and copying; sha256 and socket reads release the GIL, so parallel
    shards use the other cores and the link's full width (as huggingface_hub does for the Hub).
    """
    with ThreadPoolExecutor(max_workers=PARALLEL_FILES) as pool:
        counts = [pool.submit(fetch_verified, file_url(sums_url, rel), rel, staging / rel, length, wanted.files[rel])
                  for rel, length in lengths.items()]
        return sum(count.result() for count in counts)


def take_staged(dest: Path, wanted: Wanted, needed: list[str], staging: Path) -> None:
    """Verify files the controller already copied into the staged directory; nothing is downloaded."""
    absent = [rel for rel in needed if regular_stat(staging / rel) is None]
    if absent:
        raise StageError(EXIT_FETCH, f"missing from staged directory {staging}: {', '.join(absent)}")
    if staging.stat().st_dev != nearest_existing(dest).stat().st_dev:
        raise StageError(
            EXIT_USAGE, f"--staged {staging} must be on the filesystem of {dest} (files are renamed)"
        )
    for rel in needed:
        started = time.monotonic()
        verify(rel, staging / rel, wanted.files[rel], None)
        progress("verified", rel, (staging / rel).stat().st_size, time.monotonic() - started, " (staged)")


# --- stage: into place ---------------------------------------------------------------------------------


def install(dest: Path, staging: Path, rels: list[str]) -> None:
    """Rename verified files into place (same filesystem): a reader never sees a half-written shard."""
    touched = {dest}
    for rel in rels:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / rel, target)  # a rename keeps the staged file's mtime
        touched.add(target.parent)
    for directory in sorted(touched):
        fsync_dir(directory)


def finish(dest: Path, wanted: Wanted, manifest: Manifest | None) -> None:
    """Drop .staging leftovers, then write the manifest last (skipped when it already says the same)."""
    staging = dest / STAGING_NAME
    if staging.exists():
        shutil.rmtree(staging)
    records = {}
    for rel, sha in wanted.files.items():
        st = (dest / rel).stat()
        records[rel] = Record(sha, st.st_size, st.st_mtime_ns)
    current = Manifest(wanted.digest, records)
    if current != manifest:
        write_manifest(dest, current)


def cmd_stage(args: argparse.Namespace) -> int:
    """Bring DEST to the wanted list: plan, check space, fetch or take staged files, verify, move, record."""
    dest = Path(args.dest)
    wanted = load_wanted(args)
    manifest = load_manifest_quietly(dest)
    in_place, needed = plan(dest, wanted, manifest, args.full)
    if not needed:
        finish(dest, wanted, manifest)
        print(f"weights already in place: {len(in_place)} files")
        return EXIT_OK
    base = args.base_url.rstrip("/") + "/" + SUMS_NAME if args.base_url else wanted.sums_url
    sums_url = None if args.staged else base
    staging = Path(args.staged) if args.staged else dest / STAGING_NAME
    lengths = {rel: head_length(file_url(sums_url, rel)) for rel in needed} if sums_url else {}
    ensure_space(dest, bytes_to_fetch(staging, lengths), args.min_free_bytes)
    if sums_url:
        fetched = fetch_all(sums_url, wanted, lengths, staging)
    else:
        fetched = 0
        take_staged(dest, wanted, needed, staging)
    install(dest, staging, needed)
    finish(dest, wanted, manifest)
    print(
        f"staged {len(needed)} files ({fetched / GIB:.2f} GiB fetched, "
        f"{len(in_place)} files already in place) into {dest}"
    )
    return EXIT_OK


# --- command line --------------------------------------------------------------------------------------


def http_url(value: str) -> str:
    """Only http(s): urllib would also open file:// and ftp:// URLs, which no mirror should hand us."""
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {value}")
    return value


def sha256_hex(value: str) -> str:
    """A digest the controller computed: 64 hex digits, compared lowercase."""
    if not _HEX64.fullmatch(value.lower()):
        raise argparse.ArgumentTypeError(f"not a sha256 hex digest: {value}")
    return value.lower()


def byte_count(value: str) -> int:
    """A non-negative number of bytes."""
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"not a byte count: {value}")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    """check and stage share --dest and the source options; argparse exits 2 on misuse."""
    parser = argparse.ArgumentParser(prog="stage_weights.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="report absent / stale / ok as one JSON object")
    stage = commands.add_parser("stage", help="fetch or take staged files, verify, move into place")
    for sub, func in ((check, cmd_check), (stage, cmd_stage)):
        sub.set_defaults(func=func)
        sub.add_argument("--dest", required=True, help="model directory on local NVMe")
        sub.add_argument("--full", action="store_true", help="hash every file instead of trusting stat")
        source = sub.add_mutually_exclusive_group(required=True)
        source.add_argument("--sums-url", type=http_url, help="<base>/SHA256SUMS on an http(s) mirror")
        source.add_argument("--sums-file", help="SHA256SUMS already on this host")
        if sub is check:
            source.add_argument("--digest", type=sha256_hex, help="sha256 of the wanted SHA256SUMS")
    stage.add_argument("--staged", help="directory the controller filled (default DEST/.staging)")
    stage.add_argument("--base-url", type=http_url, help="fetch the files of --sums-file from <base>/<path>")
    stage.add_argument(
        "--min-free-bytes", type=byte_count, default=GIB, help="space to leave free (default 1 GiB)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; failures become one line on stderr and the exit code that classifies them."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except StageError as exc:
        print(exc, file=sys.stderr)
        return exc.code
    except OSError as exc:
        print(f"stage_weights: {exc}", file=sys.stderr)
        return EXIT_NO_SPACE if exc.errno == errno.ENOSPC else EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
