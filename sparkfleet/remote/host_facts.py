#!/usr/bin/env python3
"""Every read-only fact sparkfleet needs from a Spark, printed as one JSON object.

The controller sends this file's text as `python3 -c SOURCE QUERY_JSON`: nothing is installed on the host, and a
converged host answers a whole deploy in one SSH round trip. The query names the preflight's inputs (weights
directory, port, unit, container) and, under "state", what the deploy's operations compare against: files,
units, daemon.json, packages, the image, the weights (facts.StateQuery builds it). A pair's host is also asked
about its fabric interface, image and weights ("pair"); only doctor asks a worker to try the head's master port
("master"): a deploy never opens connections. Stdlib only: it runs on DGX OS's bare python3. Each probe reports
null (and its error under `probe_errors`) rather than failing: the controller decides what a missing value means.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import platform
import pwd
import re
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

GPU_FIELDS = ("name", "driver_version", "power.limit", "temperature.gpu")
# systemd reads docker.service drop-ins from these; a file in /etc hides one of the same name in /run.
DROPIN_DIRS = ("/run/systemd/system/docker.service.d", "/etc/systemd/system/docker.service.d")
TIMEOUT = 20  # seconds: a wedged driver can hang nvidia-smi for minutes
_USERS = re.compile(r'users:\(\("([^"]+)",pid=(\d+)')
TCP_LISTEN = "0A"
DOCKERD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # dockerd's PATH under systemd
CONNECT_TIMEOUT = 2.0  # seconds for the worker's test connection to the head's master port


def run(*argv: str, timeout: float | None = TIMEOUT) -> tuple[int | None, str, str] | None:
    """(exit code, stdout, stderr) of a command; None when it is not installed, code None on timeout."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", f"{argv[0]} did not answer within {timeout} s"
    return done.returncode, done.stdout, done.stderr


def first_line(*texts: str) -> str:
    return next((line.strip() for text in texts for line in text.splitlines() if line.strip()), "")


def arch() -> str:
    result = run("dpkg", "--print-architecture")
    if result and result[0] == 0:
        return result[1].strip()
    machine = platform.machine()
    return {"aarch64": "arm64", "x86_64": "amd64"}.get(machine, machine)


def os_release() -> dict[str, str]:
    fields = {}
    for line in Path("/etc/os-release").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("PRETTY_NAME", "ID", "ID_LIKE", "VERSION_ID"):
            fields[key.lower()] = value.strip().strip('"')
    return fields


def docker() -> dict[str, Any] | None:
    result = run("docker", "version", "-f", "{{.Server.Version}}")
    if result is None:
        return None
    code, out, err = result
    server = out.strip() if code == 0 else ""
    return {"server": server or None, "error": None if server else first_line(err, out)}


def _number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None  # [N/A] on GB10 for power and memory


def gpu() -> dict[str, Any] | None:
    result = run("nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits")
    if result is None:
        return None
    code, out, err = result
    cells = [cell.strip() for cell in out.splitlines()[0].split(",")] if code == 0 and out.strip() else []
    if len(cells) != len(GPU_FIELDS):
        return {"exit_code": code, "error": first_line(err, out) or f"exit code {code}"}
    name, driver, power, temperature = cells
    return {"exit_code": 0, "error": None, "name": name, "driver_version": driver,
            "power_limit": _number(power), "temperature": _number(temperature)}


def meminfo() -> dict[str, int]:
    """Bytes of MemTotal and MemAvailable: on GB10 nvidia-smi reports memory as N/A (unified memory)."""
    values = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            values["mem_" + key[3:].lower()] = int(rest.split()[0]) * 1024
    return values


def staged_bytes(path: Path) -> int:
    """Apparent size of the regular files already under the model's directory (what staging keeps)."""
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            info = os.lstat(os.path.join(root, name))
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return total


def disk(weights_dir: str) -> dict[str, Any]:
    """Free space on the filesystem that will hold the weights; the directory may not exist yet."""
    existing = Path(weights_dir)
    while not existing.exists():
        existing = existing.parent
    mount = existing
    while not os.path.ismount(mount):
        mount = mount.parent
    fs = os.statvfs(existing)
    return {"path": str(existing), "mount": str(mount), "free": fs.f_bavail * fs.f_frsize,
            "staged": staged_bytes(Path(weights_dir))}


def _proc_net_listening(port: int) -> bool:
    """Without `ss`: is anything listening on the port? (The process is not named there.)"""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == TCP_LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def _in_container(pid: str, container: str) -> bool:
    """Whether a process runs in the named container: its cgroup path holds the container's id."""
    result = run("docker", "inspect", "-f", "{{.Id}}", container)
    if result is None or result[0] != 0:
        return False  # no such container: the listener cannot be ours
    container_id = result[1].strip()
    return bool(container_id) and container_id in Path(f"/proc/{pid}/cgroup").read_text()


def port_listener(port: int, container: str) -> dict[str, Any]:
    """Who listens on the TCP port: {"port_listener": process name ("unknown" when it cannot be named) or
    None when free, "port_ours": whether it is our endpoint's container (None when unknown)}."""
    result = run("ss", "-Hltnp", "sport", "=", f":{port}")
    if result is None or result[0] != 0:
        listening = _proc_net_listening(port)
        return {"port_listener": "unknown" if listening else None, "port_ours": None if listening else False}
    lines = [line for line in result[1].splitlines() if line.strip()]
    if not lines:
        return {"port_listener": None, "port_ours": False}
    match = _USERS.search(lines[0])
    if match is None:
        return {"port_listener": "unknown", "port_ours": None}
    return {"port_listener": match.group(1), "port_ours": _in_container(match.group(2), container)}


def unit_state(unit: str) -> str | None:
    result = run("systemctl", "is-active", unit)
    return result[1].strip() or None if result else None


def dropins() -> dict[str, str]:
    """Text of every docker.service drop-in, by path, in the order systemd applies them (by file name)."""
    files: dict[str, Path] = {}
    for directory in DROPIN_DIRS:
        for path in sorted(Path(directory).glob("*.conf")) if Path(directory).is_dir() else []:
            files[path.name] = path
    return {str(files[name]): files[name].read_text() for name in sorted(files)}


def daemon_json_keys(path: str) -> dict[str, Any]:
    """Top-level keys of daemon.json (empty when the file is missing), or why it cannot be read."""
    try:
        data = json.loads(Path(path).read_text() or "{}") if Path(path).exists() else {}
    except json.JSONDecodeError as error:
        return {"daemon_json_keys": [], "daemon_json_error": f"{error.msg} at line {error.lineno}"}
    if not isinstance(data, dict):
        return {"daemon_json_keys": [], "daemon_json_error": "the top level is not an object"}
    return {"daemon_json_keys": sorted(data), "daemon_json_error": None}


# --- a pair's host: what doctor compares across the two ------------------------------------------------


def fabric(interface: str) -> dict[str, Any]:
    """The fabric interface as `ip -j addr show dev IFACE` reports it: {"exists": False} when there is no such
    interface (an answer, not an error), None when it could not be asked; else `link`'s reading."""
    result = run("ip", "-j", "addr", "show", "dev", interface)
    if result is None or result[0] is None:
        return {"exists": None, "error": result[2] if result else "ip (iproute2) is not installed"}
    code, out, err = result
    if code != 0:
        exists = False if "does not exist" in err else None
        return {"exists": exists, "error": first_line(err, out) or f"exit code {code}"}
    return link(out)


def link(output: str) -> dict[str, Any]:
    """An interface's flags, operstate and addresses (`addr/prefix`) from `ip -j addr show dev IFACE`; IPv6
    link-local addresses are left out: NCCL and vLLM's rendezvous do not use them."""
    links = json.loads(output or "[]")
    if not links:
        return {"exists": False, "error": None}
    found = links[0]
    addresses = [f"{entry['local']}/{entry['prefixlen']}" for entry in found.get("addr_info", [])
                 if not (entry.get("family") == "inet6" and entry.get("scope") == "link")]
    return {"exists": True, "error": None, "flags": found.get("flags", []), "operstate": found.get("operstate"),
            "addresses": addresses}


def mounted_weights(unit_file: str) -> str | None:
    """The weights directory the installed unit mounts (its generation is the directory's name); None without a
    unit."""
    text = Path(unit_file).read_text() if Path(unit_file).is_file() else ""
    found = re.search(r"--volume (\S+?):", text)
    return found.group(1) if found else None


def pair_facts(query: dict[str, Any]) -> dict[str, Any]:
    """What doctor compares across a pair's two hosts: the fabric interface, the image's id, the weights the unit
    mounts and whether the wanted generation is staged; on the head, who listens on the master port."""
    found = {"fabric": fabric(query["interface"]), "image_id": image_id(query["image"]),
             "mounted": mounted_weights(query["unit_file"]), "staged": Path(query["manifest"]).is_file()}
    if "master_port" in query:  # the head: its engine binds the master port, which nothing else may hold
        found["master_port"] = port_listener(query["master_port"], query["container"])
    return found


def reach(address: str, port: int) -> str:
    """Whether a TCP connection to address:port opens within CONNECT_TIMEOUT (closed at once, nothing sent):
    "ok", "refused", "timed out", or why not (no route to host, ...)."""
    try:
        with socket.create_connection((address, port), timeout=CONNECT_TIMEOUT):
            return "ok"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timed out"
    except OSError as error:
        return (error.strerror or str(error)).lower()


# --- what the deploy's operations compare against ---------------------------------------------------------


def resolve(program: str) -> str:
    """What dockerd would exec for a runtime path: a bare name through its PATH, then every symlink followed."""
    found = program if "/" in program else shutil.which(program, path=DOCKERD_PATH)
    return os.path.realpath(found) if found else program


def daemon_json(path: str, runtime: str) -> dict[str, Any]:
    """daemon.json as dockerd reads it: {"config": dict | None (missing), "error": why it is unusable | None,
    "resolved": {runtime path: the binary it runs}} for every runtime's path and for `runtime`."""
    result: dict[str, Any] = {"config": None, "error": None, "resolved": {runtime: resolve(runtime)}}
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        text = ""
    if text.strip():
        try:
            result["config"] = json.loads(text)
        except ValueError as error:
            result["error"] = str(error)
    config = result["config"]
    if config is not None and not isinstance(config, dict):
        result["config"], result["error"] = None, "the top level is not a JSON object"
    runtimes = config.get("runtimes") if isinstance(config, dict) else None
    for entry in runtimes.values() if isinstance(runtimes, dict) else ():
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            result["resolved"][entry["path"]] = resolve(entry["path"])
    return result


def file_state(path: str) -> dict[str, Any] | None:
    """A path as pyinfra's File/Directory facts see it, plus a file's sha1; None when nothing is there."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    kinds = {stat.S_IFREG: "file", stat.S_IFDIR: "directory", stat.S_IFLNK: "link"}
    found: dict[str, Any] = {"type": kinds.get(stat.S_IFMT(info.st_mode), "other"),
                             "mode": format(stat.S_IMODE(info.st_mode), "o"),
                             "user": _name(pwd.getpwuid, info.st_uid), "group": _name(grp.getgrgid, info.st_gid)}
    if found["type"] == "file":
        digest = hashlib.sha1()
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        found["sha1"] = digest.hexdigest()
    return found


def _name(lookup: Callable[[int], Any], number: int) -> str:
    try:
        return lookup(number)[0]
    except KeyError:
        return str(number)


def unit_files(units: list[str]) -> dict[str, dict[str, str]]:
    """ActiveState and UnitFileState of each unit, from one `systemctl show`."""
    result = run("systemctl", "show", "-p", "Id,ActiveState,UnitFileState", *units)
    found = {unit: {"active": "", "enabled": ""} for unit in units}
    if result is None or result[0] != 0:
        return found
    for unit, block in zip(units, result[1].strip().split("\n\n"), strict=False):
        fields = dict(line.partition("=")[::2] for line in block.splitlines())
        found[unit] = {"active": fields.get("ActiveState", ""), "enabled": fields.get("UnitFileState", "")}
    return found


def keyring_fingerprints(path: str) -> list[str]:
    """Primary-key fingerprints in an apt keyring file (empty when missing or unreadable)."""
    result = run("gpg", "--show-keys", "--with-colons", path) if Path(path).is_file() else None
    if result is None or result[0] != 0:
        return []
    fingerprints, want = [], False
    for line in result[1].splitlines():
        fields = line.split(":")
        if fields[0] == "pub":
            want = True
        elif want and fields[0] == "fpr":
            fingerprints.append(fields[9])
            want = False
    return fingerprints


def apt_sources(url: str) -> dict[str, list[str]]:
    """Every apt source file (one-line and deb822) that names the repository URL on a line that is not a comment,
    with all its lines (a commented-out source, as a release upgrade leaves it, is no source)."""
    paths = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.list")),
             *sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))]
    texts = {str(path): path.read_text(errors="replace").splitlines() for path in paths if path.is_file()}
    return {path: lines for path, lines in texts.items()
            if any(url in line and not line.lstrip().startswith("#") for line in lines)}


def installed_versions(packages: list[str]) -> dict[str, str]:
    """Installed version of each package that dpkg has fully installed (held or not)."""
    result = run("dpkg-query", "-W", "-f=${Package} ${db:Status-Abbrev} ${Version}\n", *packages)
    versions = {}
    for line in result[1].splitlines() if result else ():
        parts = line.split()
        if len(parts) == 3 and parts[1][1:2] == "i":  # installed: `ii`, or `hi` when held (apt-mark hold)
            versions[parts[0]] = parts[2]
    return versions


def image_id(ref: str) -> str | None:
    result = run("docker", "image", "inspect", "-f", "{{.Id}}", ref)
    return result[1].strip() or None if result and result[0] == 0 else None


def running_containers() -> list[str]:
    result = run("docker", "ps", "--format", "{{.Names}}")
    return sorted(line.strip() for line in result[1].splitlines() if line.strip()) if result and not result[0] else []


def runtime_mode(path: str) -> str:
    """The NVIDIA Container Runtime's mode (auto, legacy, cdi, jit-cdi) in its config.toml; "" when unset."""
    import tomllib  # python3.11+, as on DGX OS (Ubuntu 24.04); imported here so older hosts fail only this probe

    try:
        with open(path, "rb") as handle:
            config = tomllib.load(handle)
    except FileNotFoundError:
        return ""
    return str(config.get("nvidia-container-runtime", {}).get("mode", ""))


def weights_check(script: str, args: list[str]) -> dict[str, Any]:
    """The installed staging script's verdict on the weights; absent before the script is installed."""
    if not Path(script).is_file():
        return {"state": "absent"}
    # `check --full` re-hashes every file (minutes for a 37 GB checkpoint): no time limit then.
    result = run("python3", script, "check", *args, timeout=None if "--full" in args else TIMEOUT)
    if result is None or result[0] != 0:
        return {"state": "error", "error": first_line(result[2], result[1]) if result else "python3 is missing"}
    try:
        verdict = json.loads(result[1])
    except ValueError:
        verdict = None
    if not isinstance(verdict, dict):
        return {"state": "error", "error": f"it printed {first_line(result[1])[:120]!r}, not one JSON object"}
    return verdict


def weights_loaded(manifest: str, loaded: str) -> str:
    """Whether the running endpoint started on the weights now staged (the unit copies the manifest to /run)."""
    if not Path(loaded).is_file():
        return "unknown"
    try:
        return "same" if Path(manifest).read_bytes() == Path(loaded).read_bytes() else "differs"
    except FileNotFoundError:
        return "differs"


def generations(model_root: str, unit_files: list[str]) -> dict[str, Any]:
    """The model's generation directories (name -> mtime), whether weights of the flat layout from before
    generations sit in it, and the directories the unit and its known-good copy mount (those stay)."""
    root = Path(model_root)
    entries = list(root.iterdir()) if root.is_dir() else []
    dirs = {entry.name: entry.stat().st_mtime for entry in entries if entry.is_dir() and not entry.name.startswith(".")}
    mounts = []
    for unit in unit_files:
        text = Path(unit).read_text() if Path(unit).is_file() else ""
        mounts += re.findall(r"--volume (\S+?):", text)
    return {"dirs": dirs, "flat": (root / ".sparkfleet-manifest.json").exists(), "in_use": sorted(set(mounts))}


def login_user() -> str:
    """The SSH user: under sudo, the one who ran it."""
    return os.environ.get("SUDO_USER") or pwd.getpwuid(os.getuid()).pw_name


def deploy_state(query: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """Probes for the deploy's operations (gather runs those the query asks for: NEEDS)."""
    probes: dict[str, Callable[[], Any]] = {
        "files": lambda: {path: file_state(path) for path in query["files"]},
        "units": lambda: unit_files(query["units"]),
        "daemon_json": lambda: daemon_json(query["daemon_json"], query["runtime"]),
        "runtime_mode": lambda: runtime_mode(query["runtime_config"]),
        "keyring": lambda: keyring_fingerprints(query["keyring"]),
        "apt_sources": lambda: apt_sources(query["apt_url"]),
        "installed": lambda: installed_versions(query["packages"]),
        "image_id": lambda: image_id(query["image"]),
        "containers": running_containers,
        "weights": lambda: weights_check(query["weights_script"], query["weights_args"]),
        "weights_loaded": lambda: weights_loaded(query["manifest"], query["loaded_weights"]),
        "login_user": login_user,
        "generations": lambda: generations(query["model_root"], query["unit_files"]),
    }
    if query.get("weights_args") is None:
        del probes["weights"]  # a re-read after a change keeps the first verdict (host_state.current)
    return probes


# The state query key each probe reads (its own name otherwise): a gateway's query asks for files, units and
# packages only, and a probe runs only when the query has what it reads.
NEEDS = {"daemon_json": "runtime", "runtime_mode": "runtime_config", "apt_sources": "apt_url",
         "installed": "packages", "image_id": "image", "containers": "image", "weights": "weights_script",
         "weights_loaded": "manifest", "login_user": "files", "generations": "model_root"}


def gather(query: dict[str, Any]) -> dict[str, Any]:
    os.environ["PATH"] = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/bin:/bin"
    # Probes named like a fact give its value; the others give several facts at once. A Spark's preflight runs
    # them all; a gateway, which has no endpoint to check, asks only for the deploy's state.
    probes: dict[str, Callable[[], Any]] = {} if "weights_dir" not in query else {
        "arch": arch, "os": os_release, "docker": docker, "gpu": gpu, "memory": meminfo,
        "disk": lambda: disk(query["weights_dir"]), "port": lambda: port_listener(query["port"], query["container"]),
        "endpoint_state": lambda: unit_state(query["unit"]), "dropin_texts": dropins,
        "daemon": lambda: daemon_json_keys(query["daemon_json"]),
    }
    if "pair" in query:  # a pair's host
        probes["pair"] = lambda: pair_facts(query["pair"])
    if "master" in query:  # doctor on a pair's worker only: a deploy never opens connections
        probes["master_reach"] = lambda: reach(query["master"]["address"], query["master"]["port"])
    state = query.get("state")
    if state is not None:
        probes.update({f"state.{name}": probe for name, probe in deploy_state({**query, **state}).items()
                       if NEEDS.get(name, name) in state})
    facts: dict[str, Any] = {"probe_errors": {}}
    for name, probe in probes.items():
        try:
            value = probe()
        except Exception as error:  # a broken probe must not hide the others
            facts["probe_errors"][name] = f"{type(error).__name__}: {error}"
            continue
        if name in ("memory", "port", "daemon"):
            facts.update(value)
        elif name.startswith("state."):
            facts.setdefault("state", {})[name[len("state."):]] = value
        else:
            facts[name] = value
    return facts


if __name__ == "__main__":
    print(json.dumps(gather(json.loads(sys.argv[1]))))
