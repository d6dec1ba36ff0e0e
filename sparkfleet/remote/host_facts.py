#!/usr/bin/env python3
"""Read-only facts about a Spark for sparkfleet's preflight, printed as one JSON object.

The controller sends this file's text as `python3 -c SOURCE WEIGHTS_DIR PORT UNIT CONTAINER`: nothing is installed on
the host, and the whole preflight is one SSH round trip. Stdlib only: it runs on DGX OS's bare python3. Each
probe reports null (and its error under `probe_errors`) rather than failing: the controller decides what a
missing value means.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

GPU_FIELDS = ("name", "driver_version", "power.limit", "temperature.gpu")
# systemd reads docker.service drop-ins from these; a file in /etc hides one of the same name in /run.
DROPIN_DIRS = ("/run/systemd/system/docker.service.d", "/etc/systemd/system/docker.service.d")
DAEMON_JSON = "/etc/docker/daemon.json"
TIMEOUT = 20  # seconds: a wedged driver can hang nvidia-smi for minutes
_USERS = re.compile(r'users:\(\("([^"]+)",pid=(\d+)')
TCP_LISTEN = "0A"


def run(*argv: str) -> tuple[int | None, str, str] | None:
    """(exit code, stdout, stderr) of a command; None when it is not installed, code None on timeout."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return None, "", f"{argv[0]} did not answer within {TIMEOUT} s"
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


def daemon_json() -> dict[str, Any]:
    """Top-level keys of daemon.json (empty when the file is missing), or why it cannot be read."""
    path = Path(DAEMON_JSON)
    try:
        data = json.loads(path.read_text() or "{}") if path.exists() else {}
    except json.JSONDecodeError as error:
        return {"daemon_json_keys": [], "daemon_json_error": f"{error.msg} at line {error.lineno}"}
    if not isinstance(data, dict):
        return {"daemon_json_keys": [], "daemon_json_error": "the top level is not an object"}
    return {"daemon_json_keys": sorted(data), "daemon_json_error": None}


def gather(weights_dir: str, port: int, unit: str, container: str) -> dict[str, Any]:
    os.environ["PATH"] = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/bin:/bin"
    # Probes named like a fact give its value; the others give several facts at once.
    probes: dict[str, Callable[[], Any]] = {
        "arch": arch, "os": os_release, "docker": docker, "gpu": gpu, "memory": meminfo,
        "disk": lambda: disk(weights_dir), "port": lambda: port_listener(port, container),
        "endpoint_state": lambda: unit_state(unit), "dropin_texts": dropins, "daemon": daemon_json,
    }
    facts: dict[str, Any] = {"probe_errors": {}}
    for name, probe in probes.items():
        try:
            value = probe()
        except Exception as error:  # a broken probe must not hide the others
            facts["probe_errors"][name] = f"{type(error).__name__}: {error}"
            continue
        if name in ("memory", "port", "daemon"):
            facts.update(value)
        else:
            facts[name] = value
    return facts


if __name__ == "__main__":
    print(json.dumps(gather(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])))
