"""Host preflight: is this Spark fit for its endpoint? Read before anything changes, in one SSH round trip.

`SparkFacts` gathers what the checks need; `host_findings` turns it into findings with stable ids and
messages naming the fix. `deploy.py` refuses a host with an error before its first change, and
`sparkfleet doctor` prints every finding.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

from sparkfleet.endpoint import CONTAINER, DAEMON_JSON, MANIFEST, UNIT, UNIT_FILE, Endpoint
from sparkfleet.facts import json_object
from sparkfleet.memory import budget, gb
from sparkfleet.rules import Finding, memory_budget_for
from sparkfleet.vllm_flags import flag_set

HOST_FACTS_SCRIPT = Path(__file__).parent / "remote" / "host_facts.py"
GB = 10**9
DISK_MARGIN = 0.10  # of the checkpoint: staging keeps partial files, and the OS needs room to breathe
DISK_MARGIN_MIN = 5 * GB
TEMPERATURE_WARN = 85.0  # °C before any load: GB10 throttles in the low 90s
# GB10's SoC is rated 140 W; a cap well below it (nvidia-smi -pl) throttles decode. GB10 reports [N/A].
POWER_CAP_WARN_WATTS = 100.0
# vLLM 0.28's free-memory reading on GB10 is about 2.7 GiB below MemAvailable (llamastash PR #81): its start-up
# check compares that reading, so the preflight keeps the same margin.
VLLM_FREE_GAP = int(2.7 * 2**30)
ENDPOINT_STATES = ("active", "activating", "reloading", "deactivating")  # the unit holds its memory
# dockerd flags whose daemon.json key is not the long flag name without its dashes (dockerd's own mapping).
FLAG_KEYS = {
    "--add-runtime": "runtimes", "--registry-mirror": "registry-mirrors", "--insecure-registry": "insecure-registries",
    "-H": "hosts", "--host": "hosts", "-s": "storage-driver", "--storage-opt": "storage-opts",
    "--log-opt": "log-opts", "-l": "log-level", "-D": "debug", "--exec-opt": "exec-opts", "--dns-opt": "dns-opts",
    "--default-ulimit": "default-ulimits", "--default-address-pool": "default-address-pools",
    "--cdi-spec-dir": "cdi-spec-dirs", "--feature": "features", "--label": "labels",
    "--authorization-plugin": "authorization-plugins", "--node-generic-resource": "node-generic-resources",
    "-b": "bridge", "-G": "group", "-p": "pidfile", "-g": "data-root", "--graph": "data-root",
}
# Checks that always run, in report order; the others (power, temperature, ...) appear only when they fire.
HOST_CHECKS = ("host.arch", "host.os", "host.docker", "host.gpu", "host.memory", "host.disk", "host.port",
               "host.dropin")
PAIR_CHECKS = ("host.fabric",)  # always run on a pair's hosts too

Facts = dict[str, Any]


class SparkFacts(FactBase):
    """Everything sparkfleet reads from a host, as one JSON object (see sparkfleet/remote/host_facts.py): the
    preflight's probes, and under "state" what the deploy's operations compare against (host_state.py)."""

    def command(self, query: str) -> StringCommand:
        return StringCommand("python3", "-c", QuoteString(HOST_FACTS_SCRIPT.read_text()), QuoteString(query))

    def process(self, output: list[str]) -> Facts:
        facts = json_object(output, "the host preflight (sparkfleet/remote/host_facts.py)",
                            "check that `python3 --version` works on the host and that nothing else prints on its "
                            "non-interactive shell (an echo in ~/.bashrc); nothing was changed on it")
        texts = facts.pop("dropin_texts", {})
        facts["dropins"] = dockerd_flags(texts if isinstance(texts, dict) else {})
        return facts


def preflight_query(endpoint: Endpoint) -> dict[str, Any]:
    """What the preflight's probes need to know about the endpoint (SparkFacts' query, without "state"); a pair's
    host is also asked about its fabric interface (judged here), image and weights (doctor compares those across
    the pair)."""
    query: dict[str, Any] = {"weights_dir": endpoint.weights_dir, "port": endpoint.config.vllm_port,
                             "unit": f"{UNIT}.service", "container": CONTAINER, "daemon_json": DAEMON_JSON}
    if endpoint.config.pair is not None:
        query["pair"] = {"interface": endpoint.config.pair.interface, "image": endpoint.image, "unit_file": UNIT_FILE,
                         "manifest": f"{endpoint.weights_dir}/{MANIFEST}", "container": CONTAINER}
        if endpoint.role == "head":
            query["pair"]["master_port"] = endpoint.config.pair.master_port
    return query


def host_checks(endpoint: Endpoint) -> tuple[str, ...]:
    """The checks that always run on this host, in report order."""
    return HOST_CHECKS + (PAIR_CHECKS if endpoint.config.pair is not None else ())


def _exec_starts(text: str) -> Iterator[str]:
    """Values of `ExecStart=` lines, with backslash continuations joined and comments skipped."""
    for line in text.replace("\\\n", " ").splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key.strip() == "ExecStart":
            yield value.strip()


def _dockerd_args(command: str) -> list[str] | None:
    """Flag names of an ExecStart command line that runs dockerd; None when it runs something else."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    words = [words[0].lstrip("-@:+!"), *words[1:]] if words else []
    starts = [i for i, word in enumerate(words) if PurePosixPath(word).name == "dockerd"]
    if not starts:
        return None
    return [word.split("=", 1)[0] for word in words[starts[0] + 1:] if word.startswith("-")]


def dockerd_flags(dropins: dict[str, str]) -> dict[str, list[str]]:
    """dockerd flags set by each drop-in, as systemd applies them (in the given order, by file name):
    an empty `ExecStart=` discards every ExecStart before it."""
    found: dict[str, list[str]] = {}
    for path, text in dropins.items():
        for command in _exec_starts(text):
            if not command:
                found.clear()
                continue
            flags = _dockerd_args(command)
            if flags:
                found.setdefault(path, []).extend(flags)
    return found


def flag_key(flag: str) -> str:
    """The daemon.json key a dockerd flag sets (dockerd refuses to start when both are given)."""
    return FLAG_KEYS.get(flag, flag.lstrip("-"))


def checkpoint_size(endpoint: Endpoint) -> int:
    """Bytes the generation's weights take on the Spark, as the Hub or the controller directory list them (the lab
    stages a ~1 GiB stand-in); the recipe's checkpoint_bytes where the source gives no sizes (a mirror)."""
    if endpoint.weights is not None and endpoint.weights.total_bytes is not None:
        return endpoint.weights.total_bytes
    return endpoint.recipe.model.checkpoint_bytes


def disk_needed(checkpoint_bytes: int) -> int:
    return checkpoint_bytes + max(int(checkpoint_bytes * DISK_MARGIN), DISK_MARGIN_MIN)


def _version(text: str) -> tuple[int, int] | None:
    """major.minor of a driver version ("580.95.05" -> (580, 95)); None when it is not one."""
    parts = text.strip().split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def _probe_errors(facts: Facts) -> Iterator[Finding]:
    for probe, error in facts.get("probe_errors", {}).items():
        if probe.startswith("state."):
            continue  # what the deploy's operations read: the preflight refuses the host (host_state.problem)
        yield Finding("host.facts", "warning", "host", f"could not read {probe} on the host ({error}); "
                      "the checks that need it were skipped")


def _platform(endpoint: Endpoint, facts: Facts) -> Iterator[Finding]:
    arch, wanted = facts.get("arch"), endpoint.recipe.image_architectures
    if arch and arch not in wanted:
        yield Finding("host.arch", "error", "vllm_image",
                      f"this host is {arch} but {endpoint.image} is built for {', '.join(wanted)}: "
                      f"use a recipe or vllm_image built for {arch}")
    release = facts.get("os")
    if release is not None:
        family = {release.get("id", ""), *release.get("id_like", "").split()}
        if not family & {"ubuntu", "debian"}:
            yield Finding("host.os", "warning", "host",
                          f"{release.get('pretty_name') or 'this OS'} is not Ubuntu or Debian: sparkfleet "
                          "targets DGX OS (Ubuntu 24.04) and installs the toolkit with apt")


def _docker(facts: Facts) -> Iterator[Finding]:
    if "docker" not in facts:
        return
    docker = facts["docker"]
    if docker is None:
        yield Finding("host.docker", "error", "host",
                      "docker is not installed: DGX OS ships Docker; install docker.io or docker-ce")
    elif not docker.get("server"):
        yield Finding("host.docker", "error", "host",
                      f"dockerd does not answer ({docker.get('error')}): start it with "
                      "`systemctl start docker` and read `journalctl -u docker` if it will not")
    if facts.get("daemon_json_error"):
        yield Finding("host.daemon-json", "error", "host",
                      f"{DAEMON_JSON} is not valid JSON ({facts['daemon_json_error']}): dockerd would not "
                      "restart with it; fix it by hand")


def _gpu(endpoint: Endpoint, facts: Facts) -> Iterator[Finding]:
    if "gpu" not in facts:
        return
    gpu, minimum = facts["gpu"], endpoint.recipe.min_driver
    if gpu is None:
        yield Finding("host.gpu", "error", "host",
                      f"nvidia-smi is not installed: no NVIDIA driver on this host; install driver {minimum} "
                      "or later (DGX OS ships it)")
        return
    if gpu.get("exit_code") != 0:
        yield Finding("host.gpu", "error", "host",
                      f"no GPU driver answers: {str(gpu.get('error')).rstrip('.')}; check the driver / reboot "
                      "after a driver update")
        return
    name = gpu.get("name") or "unknown GPU"
    if "GB10" not in name:
        yield Finding("host.gpu", "warning", "host",
                      f"the GPU is {name}, not a GB10: this host is not a DGX Spark, and the recipes' "
                      "memory figures assume a Spark's 128 GB of unified memory")
    driver, wanted = _version(gpu.get("driver_version") or ""), _version(minimum)
    if driver is not None and wanted is not None and driver < wanted:
        yield Finding("host.gpu", "error", "host",
                      f"driver {gpu['driver_version']} is older than {minimum}, which "
                      f"{endpoint.recipe.name}'s image needs: update the NVIDIA driver and reboot")
    yield from _gpu_health(name, gpu)


def _gpu_health(name: str, gpu: dict[str, Any]) -> Iterator[Finding]:
    temperature, power = gpu.get("temperature"), gpu.get("power_limit")
    if temperature is not None and temperature >= TEMPERATURE_WARN:
        yield Finding("host.temperature", "warning", "host",
                      f"the GPU is at {temperature:g} °C before any load: check airflow and vents; "
                      "a hot Spark throttles")
    if power is not None and "GB10" in name and power < POWER_CAP_WARN_WATTS:
        yield Finding("host.power", "warning", "host",
                      f"the GPU's power limit is capped at {power:g} W: decode throughput drops; restore "
                      "the default limit (`nvidia-smi -q -d POWER` shows it) with `nvidia-smi -pl`")


def _memory(endpoint: Endpoint, facts: Facts) -> Iterator[Finding]:
    """The recipe's memory rule against this host's MemTotal, then what is free right now."""
    total, available = facts.get("mem_total"), facts.get("mem_available")
    if not total:
        return
    flags = flag_set(endpoint.recipe.vllm_version)
    for finding in memory_budget_for(total)(endpoint, flags):
        yield replace(finding, rule="host.memory",
                      message=f"this host has {gb(total)} (MemTotal): {finding.message}")
    if available is None or facts.get("endpoint_state") in ENDPOINT_STATES:
        return  # a running endpoint holds its own budget: low MemAvailable is expected then
    try:
        wanted = budget(endpoint, total).available
    except (TypeError, ValueError):
        return  # flag.number reports it
    if available - VLLM_FREE_GAP < wanted:
        yield Finding("host.memory", "warning", "vllm_args.gpu-memory-utilization",
                      f"only {gb(available)} is available now (MemAvailable, which vLLM 0.28 reads about 2.7 GiB "
                      f"lower on GB10) but vLLM asks for {gb(wanted)} "
                      "at start-up: page cache or other processes hold unified memory and its start-up check "
                      "fails (vllm #48140); run `sync; echo 3 > /proc/sys/vm/drop_caches` or stop what holds it")


def _disk(endpoint: Endpoint, facts: Facts, checkpoint_bytes: int) -> Iterator[Finding]:
    disk = facts.get("disk")
    if not disk:
        return
    needed, have = disk_needed(checkpoint_bytes), disk["free"] + disk["staged"]
    if have < needed:
        staged = f" + {gb(disk['staged'])} already staged" if disk["staged"] else ""
        yield Finding("host.disk", "error", "model_dir",
                      f"not enough space on {disk['mount']} for {endpoint.weights_dir}: the weights need "
                      f"{gb(needed)} with margin, {gb(disk['free'])} is free{staged}; free space or point "
                      "model_dir at a larger local NVMe")


def _port_is_ours(facts: Facts) -> bool:
    """The listener runs in our endpoint's container; when it could not be named, trust the unit's state."""
    ours = facts.get("port_ours")
    return facts.get("endpoint_state") in ENDPOINT_STATES if ours is None else ours


def _port(endpoint: Endpoint, facts: Facts) -> Iterator[Finding]:
    listener, port = facts.get("port_listener"), endpoint.config.vllm_port
    if listener and not _port_is_ours(facts) and endpoint.role != "worker":  # a worker serves no API
        yield Finding("host.port", "error", "vllm_port",
                      f"port {port} is already held by {listener} (not {UNIT}): stop it, or set vllm_port "
                      "to a free port")


def _dropins(endpoint: Endpoint, facts: Facts) -> Iterator[Finding]:
    keys = set(facts.get("daemon_json_keys") or ())
    written = {"runtimes"}  # what the deploy's docker_runtime step puts into daemon.json
    written |= {"default-runtime"} if endpoint.config.nvidia_default_runtime else set()
    written |= {"features"} if endpoint.config.nvidia_cdi is not None else set()
    for path, flags in facts.get("dropins", {}).items():
        for flag in dict.fromkeys(flags):
            key = flag_key(flag)
            if key in keys | written:
                where = "is in daemon.json" if key in keys else "is what sparkfleet writes into daemon.json"
                yield Finding("host.dropin", "error", "host",
                              f"dockerd refuses to start when a key is set both as a flag ({path}: {flag}) and "
                              f"in daemon.json (deepops #305): `{key}` {where}; remove one")


def fabric(facts: Facts) -> dict[str, Any] | None:
    """The pair probe's reading of the fabric interface (None when not asked or not read)."""
    pair = facts.get("pair")
    return pair.get("fabric") if isinstance(pair, dict) else None


def _has_address(addresses: list[str], address: str) -> bool:
    """Whether `address` is one of the interface's `addr/prefix` addresses."""
    wanted = ipaddress.ip_address(address)
    return any(ipaddress.ip_interface(found).ip == wanted for found in addresses)


def _fabric(endpoint: Endpoint, facts: Facts) -> Iterator[Finding]:
    """A pair's fabric interface exists, is up with a carrier and an address; the head holds master_addr."""
    pair, found = endpoint.config.pair, fabric(facts)
    if pair is None or found is None:
        return
    name, field = pair.interface, "pair.interface"
    if found["exists"] is None:
        yield Finding("host.fabric", "warning", field, f"could not read interface {name} ({found['error']}); its "
                      "checks were skipped")
    elif not found["exists"]:
        yield Finding("host.fabric", "error", field,
                      f"there is no interface {name} on this host: NCCL, Gloo and vLLM's sockets of pair {pair.name} "
                      "are pinned to it; name the ConnectX-7 port `ip -br link` lists (enp1s0f0np0 ...)")
    elif "UP" not in found["flags"]:
        yield Finding("host.fabric", "error", field, f"{name} is down (not brought up): bring it up "
                      f"(`ip link set {name} up`, and in netplan so it stays up across boots)")
    elif "LOWER_UP" not in found["flags"]:
        yield Finding("host.fabric", "error", field, f"{name} is up but has no carrier ({found['operstate']}): check "
                      f"the QSFP cable between the two Sparks of pair {pair.name}")
    elif not found["addresses"]:
        yield Finding("host.fabric", "error", field, f"{name} has no address: give both Sparks of pair {pair.name} "
                      f"an address in one subnet on it (netplan), the head's being master_addr {pair.master_addr}")
    elif endpoint.role == "head" and not _has_address(found["addresses"], pair.master_addr):
        yield Finding("host.fabric", "error", "pair.master_addr",
                      f"{pair.master_addr} is not an address of this head's {name} (it has "
                      f"{', '.join(found['addresses'])}): the worker connects to master_addr; set `pair.master_addr` "
                      f"to the head's address on {name}, or add it there")


def _master_port(endpoint: Endpoint, facts: Facts) -> Iterator[Finding]:
    """The head's engine binds master_port: another listener there fails the pair at its start."""
    pair, held = endpoint.config.pair, ((facts.get("pair") or {}).get("master_port") or {})
    if pair is None or endpoint.role != "head" or not held.get("port_listener"):
        return
    if not _port_is_ours({**held, "endpoint_state": facts.get("endpoint_state")}):
        yield Finding("host.port", "error", "pair.master_port",
                      f"port {pair.master_port} (the master port of pair {pair.name}) is already held by "
                      f"{held['port_listener']} (not {UNIT}): the head's engine could not bind it; stop it, or set "
                      "`pair.master_port` to a free port in the pair's group data")


def host_findings(endpoint: Endpoint, facts: Facts, checkpoint_bytes: int | None = None) -> list[Finding]:
    """Every host finding for `endpoint` on a host with `facts` (SparkFacts); `checkpoint_bytes` defaults
    to the recipe's (pass `checkpoint_size(endpoint)`)."""
    size = endpoint.recipe.model.checkpoint_bytes if checkpoint_bytes is None else checkpoint_bytes
    return [
        *_probe_errors(facts), *_platform(endpoint, facts), *_docker(facts), *_gpu(endpoint, facts),
        *_memory(endpoint, facts), *_disk(endpoint, facts, size), *_port(endpoint, facts),
        *_master_port(endpoint, facts), *_dropins(endpoint, facts), *_fabric(endpoint, facts),
    ]


def _budget_line(endpoint: Endpoint, facts: Facts) -> str:
    total, available = facts.get("mem_total"), facts.get("mem_available")
    if not total:
        return "MemTotal unknown"
    try:
        found = budget(endpoint, total)
    except (TypeError, ValueError):
        return f"{gb(total)} MemTotal"
    now = f", {gb(available)} available now" if available is not None else ""
    share = f" (this Spark's share of the model split across {found.split})" if found.split > 1 else ""
    return f"budget {gb(found.total)}{share} fits in {found.gpu_memory_utilization:g} x {gb(total)} MemTotal{now}"


def host_summary(endpoint: Endpoint, facts: Facts, checkpoint_bytes: int) -> dict[str, str]:
    """What each always-run check saw, for the `ok` rows of `sparkfleet doctor`."""
    release, docker = facts.get("os") or {}, facts.get("docker") or {}
    gpu, disk = facts.get("gpu") or {}, facts.get("disk") or {}
    architectures = ", ".join(endpoint.recipe.image_architectures)
    return {
        "host.arch": f"{facts.get('arch')}; {endpoint.image} is built for {architectures}",
        "host.os": release.get("pretty_name", "unknown"),
        "host.docker": f"Docker {docker.get('server')}",
        "host.gpu": f"{gpu.get('name')}, driver {gpu.get('driver_version')} (needs {endpoint.recipe.min_driver})",
        "host.memory": _budget_line(endpoint, facts),
        "host.disk": f"{gb(disk.get('free', 0))} free on {disk.get('mount')}, {gb(disk.get('staged', 0))} "
                     f"staged; the weights need {gb(disk_needed(checkpoint_bytes))} with margin",
        "host.port": _port_line(endpoint, facts),
        "host.dropin": "no docker.service.d flag collides with a daemon.json key",
        "host.fabric": _fabric_line(endpoint, facts),
    }


def _port_line(endpoint: Endpoint, facts: Facts) -> str:
    port = endpoint.config.vllm_port
    if endpoint.role == "worker":
        return f"a pair's worker serves no API: port {port} is not needed here"
    line = f"port {port} is served by {UNIT}" if facts.get("port_listener") else f"port {port} is free"
    if endpoint.role == "head":
        master = endpoint.config.pair.master_port  # type: ignore[union-attr]
        held = ((facts.get("pair") or {}).get("master_port") or {}).get("port_listener")
        line += f"; master port {master} is " + (f"held by {UNIT}" if held else "free")
    return line


def _fabric_line(endpoint: Endpoint, facts: Facts) -> str:
    pair, found = endpoint.config.pair, fabric(facts) or {}
    if pair is None:
        return "not in a pair"
    if not found.get("exists"):
        return f"{pair.interface} was not read (host.facts says why)"
    head = f"; master_addr {pair.master_addr} is this head's" if endpoint.role == "head" else ""
    return f"{pair.interface} is up with {', '.join(found['addresses'])}{head}"
