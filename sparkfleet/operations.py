"""sparkfleet's own pyinfra operations: each reads a fact, compares, and acts only on difference."""

from __future__ import annotations

import io
import json
import shlex

from pyinfra import host
from pyinfra.api import RsyncCommand, operation
from pyinfra.operations import files

from sparkfleet.facts import DaemonJson, DockerImageId, KeyringFingerprints, RuntimeMode, WeightsCheck


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
    yield keyring_command(src, fingerprint, dest)


def keyring_command(src: str, fingerprint: str, dest: str) -> str:
    """Download, check and install a keyring. Every inventory value reaches the shell through shlex.quote, the
    refusal message too (printf's arguments, never its format), so a URL cannot run a command on the host."""
    q_src, q_dest, q_fpr = shlex.quote(src), shlex.quote(dest), shlex.quote(fingerprint)
    refusal = shlex.quote("the key at %s has fingerprint %s, not %s: refusing it "
                          "(a rotated key needs a new nvidia_key_fingerprint)\\n")  # printf expands it: one line
    return (
        "set -e; t=$(mktemp -d); trap 'rm -rf \"$t\"' EXIT; "
        f"curl -fsSL --retry 3 {q_src} -o \"$t/key\"; "
        "got=$(gpg --show-keys --with-colons \"$t/key\" | awk -F: '/^pub/{w=1;next} w&&/^fpr/{print $10;exit}'); "
        f"if [ \"$got\" != {q_fpr} ]; then printf {refusal} {q_src} \"$got\" {q_fpr} >&2; exit 1; fi; "
        f"gpg --dearmor < \"$t/key\" > \"$t/keyring\"; install -m 0644 \"$t/keyring\" {q_dest}"
    )


RUNTIME = "nvidia-container-runtime"  # the path `nvidia-ctk runtime configure` writes
# daemon.json keys dockerd applies on SIGHUP (moby daemon/reload.go); a change to any other key needs a restart.
# `features` reloads as a value, but CDI's spec cache is set up only when dockerd starts.
RELOADABLE_KEYS = frozenset({
    "runtimes", "default-runtime", "debug", "labels", "live-restore", "max-concurrent-downloads",
    "max-concurrent-uploads", "max-download-attempts", "shutdown-timeout", "registry-mirrors",
    "insecure-registries", "allow-nondistributable-artifacts",
})


def same_runtime(entry: object, resolved: dict[str, str]) -> bool:
    """Whether a runtimes entry runs the nvidia runtime: the same binary once resolved, with no args."""
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        return False
    path = entry["path"]
    return resolved.get(path, path) == resolved.get(RUNTIME, RUNTIME) and entry.get("args", []) == []


def wanted_daemon_json(current: dict, resolved: dict[str, str], cdi: bool | None,
                       default_runtime: bool | None) -> dict:
    """daemon.json with the nvidia runtime registered, every other key kept as it was.

    An entry that already runs the same binary is left as written. `default-runtime` and `features.cdi`
    are left as the host has them when the inventory says None (unmanaged), set when it says True, and
    turned off when it says False (CDI explicitly: deleting `features.cdi` leaves Docker's default, on).
    """
    wanted = json.loads(json.dumps(current))
    runtimes = wanted.get("runtimes") if isinstance(wanted.get("runtimes"), dict) else {}
    if not same_runtime(runtimes.get("nvidia"), resolved):
        runtimes = {**runtimes, "nvidia": {"path": RUNTIME, "args": []}}
    wanted["runtimes"] = runtimes
    if default_runtime:
        wanted["default-runtime"] = "nvidia"
    elif default_runtime is False and wanted.get("default-runtime") == "nvidia":
        del wanted["default-runtime"]
    if cdi is not None:
        features = wanted.get("features") if isinstance(wanted.get("features"), dict) else {}
        wanted["features"] = {**features, "cdi": cdi}
    return wanted


def restart_keys(current: dict, wanted: dict) -> list[str]:
    """Top-level keys that differ between the two and that dockerd cannot reload (empty: a reload is enough)."""
    return sorted(key for key in set(current) | set(wanted)
                  if current.get(key) != wanted.get(key) and key not in RELOADABLE_KEYS)


@operation()
def docker_runtime(path: str, cdi: bool | None, default_runtime: bool | None):
    """
    Register the nvidia runtime in dockerd's daemon.json without losing anyone else's keys.

    Like `nvidia-ctk runtime configure` (merge, 4-space JSON), but an entry naming the same binary counts as
    registered, and default-runtime and CDI are touched only when the inventory manages them.

    + path: daemon.json
    + cdi, default_runtime: True/False to enforce, None to leave as the host has it
    """
    fact = host.get_fact(DaemonJson, path=path, runtime=RUNTIME) or {"error": "python3 could not read it"}
    if fact["error"]:
        why = f"{path} cannot be used ({fact['error']}); dockerd would not start with it either: fix it by hand"
        yield f"echo {shlex.quote(why)} >&2; exit 1"
        return
    current = fact["config"]
    wanted = wanted_daemon_json(current or {}, fact["resolved"], cdi, default_runtime)
    if wanted == current:
        host.noop(f"{path} registers the nvidia runtime as configured")
        return
    yield from files.put._inner(src=io.StringIO(json.dumps(wanted, indent=4) + "\n"), dest=path, mode="644")


@operation()
def runtime_mode(path: str, mode: str):
    """
    Set the NVIDIA Container Runtime's mode in its config.toml, the way NVIDIA documents it (`nvidia-ctk config`).

    + path: the runtime's config.toml
    + mode: `legacy` turns CDI off in the runtime (its default since 1.18 is jit-cdi)
    """
    if host.get_fact(RuntimeMode, path=path) == mode:
        host.noop(f"the NVIDIA runtime runs in {mode} mode")
        return
    yield shlex.join(["nvidia-ctk", "config", "--config-file", path, "--in-place", "--set",
                      f"nvidia-container-runtime.mode={mode}"])


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
    if result is None:
        # pyinfra printed why (WeightsCheck raises FactProcessError) and failed this host; should it still run
        # (`_ignore_errors`), stop before staging anything rather than guess at the weights' state.
        why = f"the weights check in {dest} gave no verdict (see the error above); nothing was staged"
        yield f"echo {shlex.quote(why)} >&2; exit 1"
        return
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
