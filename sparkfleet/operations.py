"""sparkfleet's own pyinfra operations: each compares the host's state with what is wanted and acts only on a
difference. They read the host through host_state.current(): one round trip for the whole deploy, not one per
operation, which is what keeps a converged deploy close to a bare SSH round trip.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import re
import shlex
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path

from pyinfra import host
from pyinfra.api import FileUploadCommand, RsyncCommand, StringCommand, operation

from sparkfleet.config import ModelSource
from sparkfleet.host_state import HostState, current


def _read() -> Generator[StringCommand, None, HostState | None]:
    """The host's state; when the host-side script gave no answer (pyinfra printed why and failed the host),
    a command that fails this operation instead of guessing: `if (found := (yield from _read())) is None: return`."""
    found = current()
    if found is None or found.problem:
        why = found.problem if found else "the host state could not be read (see the error above)"
        yield _fail(f"{why}; nothing was changed")
        return None
    return found


def _fail(why: str) -> StringCommand:
    return StringCommand(f"echo {shlex.quote(why)} >&2; exit 1")


@operation()
def managed_file(src: str | io.StringIO, dest: str, mode: str, user: str = "", group: str = "",
                 private: bool = False, check: str = ""):
    """
    Put a file on the host when its content, mode or owner differ (pyinfra's files.put, read from host_state).

    + src: a local file path or a StringIO
    + dest: remote path; its directory is created when the file is new
    + mode, user, group: what the file must have ("" leaves owner and group as they are)
    + private: the file holds secrets: it is created empty with its mode and owner first, and corrected before
      new content is copied in (a copy keeps the target's mode), so it is never readable by others
    + check: a command that must accept new content before it replaces `dest` (`{}` is the candidate file's
      path): the candidate is written beside `dest`, checked, then renamed over it; a refused one stays there
    """
    if (found := (yield from _read())) is None:
        return
    # getvalue, not read: pyinfra runs an operation's body twice (to plan, then to execute)
    data = src.getvalue() if isinstance(src, io.StringIO) else Path(src).read_text()
    remote = found.file(dest)
    if check and (remote is None or remote.get("sha1") != hashlib.sha1(data.encode()).hexdigest()):
        yield from _put_checked(data, dest, mode, user, group, check)
        return
    yield from _put(found, data, dest, mode, user, group, private)


def _put_checked(data: str, dest: str, mode: str, user: str, group: str,
                 check: str) -> Generator[StringCommand | FileUploadCommand, None, None]:
    """Write a candidate beside `dest` (created empty with its mode and owner, then filled: a copy keeps them),
    run `check` on it, and only then rename it over `dest`: a refused candidate never goes live."""
    candidate = f"{dest}.sparkfleet-new"
    yield StringCommand("mkdir", "-p", posixpath.dirname(dest))
    yield StringCommand("install", "-m", mode, *(["-o", user] if user else []), *(["-g", group] if group else []),
                        "/dev/null", candidate)
    temp_dir = (host.current_op_global_arguments or {}).get("_temp_dir")
    yield FileUploadCommand(io.StringIO(data), candidate,
                            remote_temp_filename=host.get_temp_filename(candidate, temp_directory=temp_dir))
    yield from _attributes(candidate, None, mode, user, group)  # an upload may have replaced the file
    yield StringCommand(check.format(shlex.quote(candidate)))
    yield StringCommand("mv", "-f", candidate, dest)


def _put(found: HostState, data: str, dest: str, mode: str, user: str = "", group: str = "",
         private: bool = False) -> Generator[StringCommand | FileUploadCommand, None, None]:
    """The commands that make `dest` hold `data` with its mode and owner (none when it already does)."""
    remote = found.file(dest)
    if remote is not None and remote["type"] != "file":
        yield _fail(f"{dest} is a {remote['type']} on the host, where sparkfleet puts a file: move it away")
        return
    same = remote is not None and remote["sha1"] == hashlib.sha1(data.encode()).hexdigest()
    attributes = _attributes(dest, remote, mode, user, group)
    if same and not attributes:
        host.noop(f"{dest} is up to date")
        return
    if remote is None:
        yield StringCommand("mkdir", "-p", posixpath.dirname(dest))
        if private:
            yield StringCommand("install", "-m", mode, *(["-o", user] if user else []),
                                *(["-g", group] if group else []), "/dev/null", dest)
    elif private:
        yield from attributes  # before the copy, which keeps the target's mode
    if not same:
        temp_dir = (host.current_op_global_arguments or {}).get("_temp_dir")
        yield FileUploadCommand(io.StringIO(data), dest,
                                remote_temp_filename=host.get_temp_filename(dest, temp_directory=temp_dir))
        yield from _attributes(dest, None, mode, user, group)  # an upload may have replaced the file
    elif not private:
        yield from attributes


def _attributes(path: str, remote: dict | None, mode: str, user: str, group: str) -> list[StringCommand]:
    """chown/chmod commands for what differs (everything when `remote` is None)."""
    commands = []
    differs = {key: wanted and (remote is None or remote[key] != wanted) for key, wanted in (("user", user),
                                                                                          ("group", group))}
    if any(differs.values()):
        commands.append(StringCommand("chown", f"{user}{':' + group if group else ''}", path))
    if remote is None or remote["mode"] != mode:
        commands.append(StringCommand("chmod", mode, path))
    return commands


@operation()
def managed_directory(path: str, mode: str, user: str = ""):
    """
    A directory with a mode (and owner), created when missing.

    + path: remote directory
    + mode, user: what it must have ("" leaves the owner as it is)
    """
    if (found := (yield from _read())) is None:
        return
    remote = found.file(path)
    if remote is not None and remote["type"] != "directory":
        yield _fail(f"{path} is a {remote['type']} on the host, where sparkfleet needs a directory: move it away")
        return
    if remote is None:
        yield StringCommand("mkdir", "-p", path)
    commands = _attributes(path, remote, mode, user, "")
    if remote is not None and not commands:
        host.noop(f"directory {path} is in place")
        return
    yield from commands


@operation()
def unit_state(unit: str, running: bool, enabled: bool):
    """
    A systemd unit started or stopped, enabled or disabled (pyinfra's systemd.service, read from host_state).

    + unit: full unit name (`x.service`, `x.timer`)
    + running, enabled: what it must be
    """
    if (found := (yield from _read())) is None:
        return
    current_unit = found.unit(unit)
    active = current_unit["active"] in ("active", "activating", "reloading")
    is_enabled = current_unit["enabled"] in ("enabled", "enabled-runtime", "static", "alias")
    commands = []
    if running != active:
        commands.append(StringCommand("systemctl", "start" if running else "stop", unit))
    if enabled != is_enabled:
        commands.append(StringCommand("systemctl", "enable" if enabled else "disable", unit))
    if not commands:
        host.noop(f"{unit} is {'running' if running else 'stopped'} and {'enabled' if enabled else 'disabled'}")
        return
    yield from commands


@operation()
def apt_source(path: str, line: str):
    """
    An apt source line in a one-line source file, replacing any other active line there for the same URL (two
    lines with different `signed-by` for one repository break `apt update`: "Conflicting values").

    + path: /etc/apt/sources.list.d/<name>.list
    + line: `deb [signed-by=...] URL SUITE`
    """
    if (found := (yield from _read())) is None:
        return
    lines = found["apt_sources"].get(path, [])
    if " ".join(line.split()) in (" ".join(existing.split()) for existing in lines):
        host.noop(f"{path} names the repository")
        return
    url = next(word for word in line.split() if "://" in word)
    kept = [old for old in lines if url not in old or old.lstrip().startswith("#")]
    yield from _put(found, "".join(f"{text}\n" for text in [*kept, line]), path, "644")


@operation()
def apt_keyring(src: str, fingerprint: str, dest: str):
    """
    Install a repository signing key as a dearmored keyring, refusing a key with another fingerprint.

    + src: URL of the ASCII-armored key
    + fingerprint: primary key fingerprint the download must have (40 hex digits)
    + dest: keyring path that `signed-by=` names
    """
    if (found := (yield from _read())) is None:
        return
    if fingerprint in found["keyring"]:
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
    if (found := (yield from _read())) is None:
        return
    fact = found["daemon_json"]
    if fact["error"]:
        why = f"{path} cannot be used ({fact['error']}); dockerd would not start with it either: fix it by hand"
        yield f"echo {shlex.quote(why)} >&2; exit 1"
        return
    current = fact["config"]
    wanted = wanted_daemon_json(current or {}, fact["resolved"], cdi, default_runtime)
    if wanted == current:
        host.noop(f"{path} registers the nvidia runtime as configured")
        return
    yield from _put(found, json.dumps(wanted, indent=4) + "\n", path, "644")


@operation()
def runtime_mode(path: str, mode: str):
    """
    Set the NVIDIA Container Runtime's mode in its config.toml, the way NVIDIA documents it (`nvidia-ctk config`).

    + path: the runtime's config.toml
    + mode: `legacy` turns CDI off in the runtime (its default since 1.18 is jit-cdi)
    """
    if (found := (yield from _read())) is None:
        return
    if found["runtime_mode"] == mode:
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
    if (found := (yield from _read())) is None:
        return
    if found["image_id"]:
        host.noop(f"image {image} is present")
        return
    yield f"docker pull --quiet {shlex.quote(image)}"


@dataclass(frozen=True)
class Fetch:
    """How a generation's files reach this Spark: from the source, or from a peer Spark with the source as the
    fallback. Every file is verified against the controller's SHA256SUMS either way."""

    source: ModelSource
    peer_url: str = ""  # http://<peer>:<port>/<model>/<generation>: try it first
    image: str = ""  # hub: the vLLM image, whose huggingface_hub downloads
    hub_env: str = ""  # hub: root-only env file with HF_ENDPOINT and HF_TOKEN
    commit: str = ""  # hub: the commit the revision resolved to


@operation()
def weights_staged(script: str, dest: str, sums_file: str, verify: str, fetch: Fetch, waiting: str = ""):
    """
    Stage one generation of model weights into `dest`: verified by sha256, resumable, never fetched twice.

    + script: the staging script on the Spark (its `check` verdict comes with the host state)
    + sums_file: the generation's SHA256SUMS, uploaded by the deploy
    + verify: `fast` (sizes and mtimes) or `full` (re-hash every file)
    + fetch: where the files come from (Fetch)
    + waiting: not this host's fan-out round: why it waits (nothing runs)
    """
    if (found := (yield from _read())) is None:
        return
    result = found["weights"]
    if result.get("state") not in ("ok", "stale", "absent"):
        why = (f"the weights check in {dest} gave no verdict ({result.get('error') or result}): run `python3 {script} "
               "check --help` on the host to see why (a broken python3, or a script from another sparkfleet "
               "version: delete it and re-run the deploy); nothing was staged")
        yield _fail(why)
        return
    if result["state"] == "ok":
        host.noop(f"weights in {dest} match the manifest ({result['files']} files)")
        return
    if waiting:
        host.noop(waiting)
        return
    full = ["--full"] if verify == "full" else []
    stage = ["python3", script, "stage", "--dest", dest, "--sums-file", sums_file, *full]
    staging = f"{dest}/.staging"
    peer = f"{shlex.join([*stage, '--base-url', fetch.peer_url])} || " if fetch.peer_url else ""
    source = fetch.source
    if source.kind == "mirror":
        yield peer + shlex.join([*stage, "--base-url", source.url or ""])
    elif source.kind == "hub":
        # A repair asks the Hub for the files that failed the check only, not the whole generation again.
        files = result.get("stale_files", []) if result["state"] == "stale" else []
        download = ["docker", "run", "--rm", "--network", "host", "--env-file", fetch.hub_env, "--volume",
                    f"{staging}:/stage", "--entrypoint", "hf", fetch.image, "download", source.repo or "", *files,
                    "--revision", fetch.commit, "--local-dir", "/stage"]
        yield (f"{peer}{{ mkdir -p {shlex.quote(staging)} && {shlex.join(download)} && "
               f"{shlex.join([*stage, '--staged', staging])}; }}")
    elif fetch.peer_url:
        # The controller's rsync cannot run only when the peer fails: a peer that fails fails this host (re-run,
        # or weights_fanout=false); a copy that half-arrived resumes from the peer next time.
        yield shlex.join([*stage, "--base-url", fetch.peer_url])
    else:
        yield f"mkdir -p {shlex.quote(staging)}"
        # --compare-dest skips files already in place (same size and mtime): only what is missing travels.
        flags = ["-a", "--partial", f"--compare-dest={dest}/", "--exclude=.*", "--exclude=SHA256SUMS",
                 *(["--checksum"] if full else [])]
        yield RsyncCommand((source.path or "").rstrip("/") + "/", staging + "/", flags)
        yield shlex.join([*stage, "--staged", staging])


GENERATION = re.compile(r"[0-9a-f]{40}|sha256-[0-9a-f]{16}")


def prunable(dirs: dict[str, float], in_use: set[str], wanted: str, keep: int) -> list[str]:
    """Generations to delete: never the wanted one or one a unit mounts; of the rest, the newest stay until
    `keep` are kept in all."""
    generations = {name: mtime for name, mtime in dirs.items() if GENERATION.fullmatch(name)}
    kept = {wanted} | (in_use & set(generations))
    for name in sorted(generations, key=lambda name: generations[name], reverse=True):
        if len(kept) >= keep:
            break
        kept.add(name)
    return sorted(set(generations) - kept)


@operation()
def weights_pruned(root: str, wanted: str, keep: int):
    """
    Remove old generations of a model's weights that no unit uses, keeping `keep` (and weights of the flat
    layout from before generations, once the unit no longer mounts them).

    + root: model_dir/<model>
    + wanted: the generation this deploy serves
    + keep: weights_keep
    """
    if (found := (yield from _read())) is None:
        return
    listing = found["generations"]
    mounted = set(listing["in_use"])
    in_use = {posixpath.basename(path.rstrip("/")) for path in mounted if posixpath.dirname(path.rstrip("/")) == root}
    old = [f"{root}/{name}" for name in prunable(listing["dirs"], in_use, wanted, keep)]
    flat = listing["flat"] and root not in {path.rstrip("/") for path in mounted}
    if not old and not flat:
        host.noop(f"{root} keeps {len(listing['dirs'])} generation(s), none unused beyond weights_keep")
        return
    if flat:  # the files of the layout from before generations (its manifest among them), and its .staging
        yield (f"find {shlex.quote(root)} -mindepth 1 -maxdepth 1 \\( -type f -o -name .staging \\) "
               "-exec rm -rf {} +")
    if old:
        yield StringCommand("rm", "-rf", *old)


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


@operation()
def pair_step(commands: list[str], restarting: Callable[[], bool], peer_failed: Callable[[], str | None],
              unchanged: str):
    """
    Run `commands` on a pair host when its pair (re)starts in this run; fail it when its partner already failed.

    + commands: shell commands (stop the unit, or wait for the pair's health)
    + restarting: whether the pair restarts: when planning, from this host's own planned changes; when executing,
      from what both hosts changed (a partner's changes are known only then, so a host whose partner alone
      drifted plans nothing and still restarts with it)
    + peer_failed: a sentence when the partner failed earlier in this run (the pair cannot serve without it)
    + unchanged: the no-op message
    """
    why = peer_failed()
    if why:
        yield _fail(why)
        return
    if not restarting():
        host.noop(unchanged)
        return
    for command in commands:
        yield StringCommand(command)
