"""sparkfleet's own pyinfra operations: each reads a fact, compares, and acts only on difference."""

from __future__ import annotations

import io
import json
import shlex

from pyinfra import host
from pyinfra.api import RsyncCommand, operation
from pyinfra.operations import files

from sparkfleet.facts import DaemonJson, DockerImageId, KeyringFingerprints, WeightsCheck


@operation()
def apt_keyring(src: str, fingerprint: str, dest: str):
    """
    Install a repository signing key as a dearmored keyring, refusing a key with another fingerprint.

    + src: URL of the ASCII-armored key
    + fingerprint: primary key fingerprint the download must have (40 hex digits)
    + dest: keyring path that `signed-by=` names
    """
    if fingerprint in host.get_fact(KeyringFingerprints, path=dest):
        host.noop(f"keyring {dest} holds {fingerprint}")
        return
    q_src, q_dest, q_fpr = shlex.quote(src), shlex.quote(dest), shlex.quote(fingerprint)
    yield (
        "set -e; t=$(mktemp -d); trap 'rm -rf \"$t\"' EXIT; "
        f"curl -fsSL --retry 3 {q_src} -o \"$t/key\"; "
        "got=$(gpg --show-keys --with-colons \"$t/key\" | awk -F: '/^pub/{w=1;next} w&&/^fpr/{print $10;exit}'); "
        f"if [ \"$got\" != {q_fpr} ]; then echo \"the key at {src} has fingerprint $got, not {fingerprint}: "
        "refusing it (a rotated key needs a new nvidia_key_fingerprint)\" >&2; exit 1; fi; "
        f"gpg --dearmor < \"$t/key\" > \"$t/keyring\"; install -m 0644 \"$t/keyring\" {q_dest}"
    )


def wanted_daemon_json(current: dict, cdi: bool, default_runtime: bool) -> dict:
    """daemon.json with the nvidia runtime as configured, every other key kept as it was."""
    wanted = json.loads(json.dumps(current))
    runtimes = wanted.setdefault("runtimes", {})
    runtimes["nvidia"] = {**runtimes.get("nvidia", {}), "path": "nvidia-container-runtime"}
    runtimes["nvidia"].setdefault("args", [])
    if default_runtime:
        wanted["default-runtime"] = "nvidia"
    elif wanted.get("default-runtime") == "nvidia":
        del wanted["default-runtime"]
    features = wanted.get("features", {})
    if cdi:
        wanted["features"] = {**features, "cdi": True}
    elif features.get("cdi"):
        features.pop("cdi")
        if features:
            wanted["features"] = features
        else:
            del wanted["features"]
    return wanted


@operation()
def docker_runtime(path: str, cdi: bool, default_runtime: bool):
    """
    Register the nvidia runtime in dockerd's daemon.json without losing anyone else's keys.

    Like `nvidia-ctk runtime configure` (4-space JSON, merge), but also converges the opposite way:
    default-runtime and CDI are removed when the inventory turns them off.
    """
    current = host.get_fact(DaemonJson, path=path)
    if current is not None and "__invalid__" in current:
        yield f"echo '{path} is not valid JSON; dockerd would not start with it either: fix it by hand' >&2; exit 1"
        return
    wanted = wanted_daemon_json(current or {}, cdi, default_runtime)
    if wanted == current:
        host.noop(f"{path} registers the nvidia runtime as configured")
        return
    yield from files.put._inner(src=io.StringIO(json.dumps(wanted, indent=4) + "\n"), dest=path, mode="644")


@operation()
def image_pulled(image: str):
    """
    Pull an image once, during the deploy, so a boot never waits on (or fails for) a registry.

    + image: reference by tag or digest; pinned references make "present" mean "current"
    """
    if host.get_fact(DockerImageId, ref=image):
        host.noop(f"image {image} is present")
        return
    yield f"docker pull --quiet {shlex.quote(image)}"


@operation()
def weights_staged(script: str, dest: str, source: str, verify: str, sums_file: str = "", digest: str = ""):
    """
    Stage model weights into `dest`: verified by sha256, resumable, and never fetched twice.

    + script: the staging script on the Spark
    + source: http(s) mirror base URL (with SHA256SUMS) or a directory on the controller
    + verify: `fast` (sizes and mtimes) or `full` (re-hash every file)
    + sums_file, digest: for a controller directory: the uploaded SHA256SUMS and its sha256
    """
    full = ["--full"] if verify == "full" else []
    remote = source.startswith(("http://", "https://"))
    wanted = ["--sums-url", source.rstrip("/") + "/SHA256SUMS"] if remote else ["--digest", digest]
    check_args = shlex.join(["--dest", dest, *wanted, *full])
    result = host.get_fact(WeightsCheck, script=script, args=check_args)
    if result["state"] == "ok":
        host.noop(f"weights in {dest} match the manifest ({result['files']} files)")
        return
    if remote:
        yield shlex.join(["python3", script, "stage", "--dest", dest, *wanted[:2], *full])
        return
    staging = f"{dest}/.staging"
    yield f"mkdir -p {shlex.quote(staging)}"
    # --compare-dest skips files already in place (same size and mtime): only what is missing travels.
    flags = ["-a", "--partial", f"--compare-dest={dest}/", "--exclude=.*", "--exclude=SHA256SUMS",
             *(["--checksum"] if full else [])]
    yield RsyncCommand(source.rstrip("/") + "/", staging + "/", flags)
    yield shlex.join(["python3", script, "stage", "--dest", dest, "--sums-file", sums_file, "--staged", staging,
                      *full])


@operation()
def host_ready(problems: list[str]):
    """
    Fail this host, and only this host, before its first change when the preflight found problems.

    + problems: one operator-language sentence per error (empty: the host is fit and nothing runs)
    """
    if not problems:
        host.noop("the host passed its preflight")
        return
    lines = ["sparkfleet preflight refused this host; nothing was changed on it:", *problems]
    yield f"printf '%s\\n' {shlex.join(lines)} >&2; exit 1"
