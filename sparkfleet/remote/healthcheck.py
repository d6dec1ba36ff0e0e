#!/usr/bin/env python3
"""sparkfleet health check for the vLLM endpoint of one DGX Spark.

Installed into /usr/local/lib/sparkfleet beside common.py and run by sparkfleet-health.timer with the health.json
the deploy writes (every value in it comes from the controller). It is stdlib-only on purpose: it runs on a bare
Ubuntu 24.04 / Debian 12 python3, with no sparkfleet installed.

An open port is not health (vllm #39863): the check walks from the systemd unit to /health, /v1/models and,
every Nth run, a real 1-token completion, then turns a failure plus the logs of the engine's current start into
one sentence an operator can act on. A restart systemd made counts as a failure that loading does not clear, so a
crash loop alerts while systemd still restarts it, however long each load takes; a completion that times out
behind running requests whose tokens still advance is "busy", not hung; low host memory (CPU and GPU share it on
a Spark) alerts before the host wedges. Output lines carry sd-daemon priority prefixes (<3> err .. <6> info) so
the journal files them at the right priority. Exit codes: 0 healthy or starting, 1 unhealthy, 2 bad config.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import ipaddress
import json
import os
import re
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

try:
    from .common import DIRECT, run, samples  # imported as sparkfleet.remote.healthcheck (the controller's tests)
except ImportError:
    from common import DIRECT, run, samples  # run as a script, beside common.py

HEALTHY, STARTING, UNHEALTHY = "healthy", "starting", "unhealthy"
STATES = (HEALTHY, STARTING, UNHEALTHY)
EXIT_OK, EXIT_UNHEALTHY, EXIT_BAD_CONFIG = 0, 1, 2
ERR, WARNING, NOTICE, INFO = 3, 4, 5, 6
COMMAND_TIMEOUT = 30  # seconds: a wedged dockerd must not wedge the check
MEMINFO = "/proc/meminfo"
# TCP sockets of this host's network namespace, which the endpoint's container shares (--network host).
TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
ESTABLISHED = "01"
WEBHOOK_TIMEOUT = 10
EVIDENCE_KEEP = 50  # a flapping endpoint must not fill the disk with evidence files
UNIT_PROPERTIES = (
    "LoadState,ActiveState,SubState,Result,NRestarts,ActiveEnterTimestampMonotonic,ExecMainStatus,"
    "InvocationID,ExecMainStartTimestampMonotonic"
)
# An engine that stays healthy this long with no restart is not looping, whatever its load time: the open
# crash-loop incident closes. One that crashes sooner after each load keeps it open until it alerts.
STABLE_SECONDS = 3600
GIB = 2**30
# What /metrics says about the engine's load when a completion times out (vLLM's own names).
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
TOKEN_COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")
TEXTFILE_NAME = "sparkfleet_health.prom"


# --- configuration -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """What one health.json value must be: its JSON types, and for numbers whether 0 is allowed."""

    types: tuple[type, ...]
    description: str
    positive: bool = False  # numbers: above 0 (otherwise 0 or more)

    def accepts(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, self.types):
            return False  # bool is an int to Python, never to us
        if isinstance(value, str):
            return bool(value.strip())
        if isinstance(value, (int, float)):
            return value > 0 if self.positive else value >= 0
        return True  # null, where it is allowed


TEXT = Expected((str,), "a non-empty string")
TEXT_OR_NULL = Expected((str, type(None)), "a non-empty string or null")
COUNT = Expected((int,), "a whole number above 0", positive=True)
WHOLE = Expected((int,), "a whole number, 0 or more")
SECONDS = Expected((int, float), "a number above 0", positive=True)
AMOUNT = Expected((int, float), "a number, 0 or more")
OBJECT_OR_NULL = Expected((dict, type(None)), "an object or null")
PAIR_KEYS = {"name": str, "role": str, "peer": str, "master_addr": str, "master_port": int, "interface": str}


def _value(expected: Expected) -> Any:
    return field(metadata={"expected": expected})


@dataclass(frozen=True)
class Config:
    """health.json as the deploy writes it, every key required (sparkfleet's deploys/health.py is the home of
    their values); secrets never live here, they come from the environment."""

    endpoint: str = _value(TEXT)
    unit: str = _value(TEXT)
    container: str = _value(TEXT)
    url: str = _value(TEXT)
    served_model_name: str = _value(TEXT)
    env_file: str = _value(TEXT)  # where VLLM_API_KEY comes from, named when the endpoint refuses the key
    load_window_seconds: float = _value(AMOUNT)
    interval_seconds: float = _value(SECONDS)
    deep_every: int = _value(COUNT)
    timeout_seconds: float = _value(SECONDS)
    deep_timeout_seconds: float = _value(SECONDS)
    alert_after: int = _value(COUNT)
    textfile_dir: str | None = _value(TEXT_OR_NULL)
    state_dir: str = _value(TEXT)
    log_lines: int = _value(COUNT)
    renotify_minutes: int = _value(WHOLE)  # repeat an open alert this often; 0 alerts once per incident
    min_mem_available_gib: float = _value(AMOUNT)  # host MemAvailable floor; 0 disables the check
    busy_sample_seconds: float = _value(SECONDS)  # gap between the two /metrics reads that tell busy from hung
    # A pair host's role (head or worker), its partner's name and where the two meet; null when standalone.
    pair: dict[str, Any] | None = _value(OBJECT_OR_NULL)


class ConfigError(ValueError):
    """health.json is missing or malformed: exit 2 so a broken deploy is not mistaken for a sick engine."""


def load_config(path: str) -> Config:
    """Read and validate health.json: a key missing or unknown means the deploy did not write it, so say so."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    fields = dataclasses.fields(Config)
    names = {item.name for item in fields}
    unknown, missing = sorted(set(raw) - names), sorted(names - set(raw))
    if unknown or missing:
        raise ConfigError(f"{path}: unknown keys {unknown}, missing keys {missing}; the deploy writes this file, "
                          "re-run it")
    for item in fields:
        expected = item.metadata["expected"]
        if not expected.accepts(raw[item.name]):
            raise ConfigError(f"{item.name} must be {expected.description}, not {raw[item.name]!r}")
    if not raw["url"].startswith(("http://", "https://")):
        raise ConfigError(f"url must start with http:// or https://, not {raw['url']!r}")
    pair = raw["pair"]
    if pair is not None and (set(pair) != set(PAIR_KEYS) or pair.get("role") not in ("head", "worker") or
                             not all(isinstance(pair[key], kind) for key, kind in PAIR_KEYS.items())):
        raise ConfigError(f"pair must hold {sorted(PAIR_KEYS)} with role head or worker, not {pair!r}")
    return replace(Config(**raw), url=raw["url"].rstrip("/"))


# --- facts about the host ------------------------------------------------------------------------------


def tool(*argv: str) -> str | None:
    """systemctl, docker or journalctl: what it printed (both streams), None if missing, failing or hung."""
    return run(list(argv), COMMAND_TIMEOUT, with_stderr=True)


@dataclass(frozen=True)
class Start:
    """One start of the unit: its invocation id (what its journal lines carry) and when its process began."""

    invocation: str
    started_at: float | None  # Unix time the main process started; None when systemd does not say


@dataclass(frozen=True)
class UnitState:
    """What systemd knows about the serving unit; active_seconds is the time since it last became active."""

    load_state: str
    active_state: str
    sub_state: str
    result: str
    restarts: int
    exit_status: str
    active_seconds: float | None
    start: Start = Start("", None)

    def describe(self) -> str:
        return f"{self.active_state}/{self.sub_state}"


def unit_state(cfg: Config) -> UnitState | None:
    """Ask systemd; None when systemctl is unusable, so the HTTP checks still run."""
    out = tool("systemctl", "show", cfg.unit, "-p", UNIT_PROPERTIES)
    props = dict(line.split("=", 1) for line in (out or "").splitlines() if "=" in line)
    if "ActiveState" not in props:
        return None
    entered = _count(props.get("ActiveEnterTimestampMonotonic"))
    main_started = _count(props.get("ExecMainStartTimestampMonotonic")) or entered
    # Both sides are CLOCK_MONOTONIC: systemd in microseconds, time.monotonic() in seconds.
    started_at = time.time() - (time.monotonic() - main_started / 1e6) if main_started else None
    return UnitState(
        load_state=props.get("LoadState", "loaded"),
        active_state=props["ActiveState"],
        sub_state=props.get("SubState", ""),
        result=props.get("Result", ""),
        restarts=_count(props.get("NRestarts")),
        exit_status=props.get("ExecMainStatus", ""),
        active_seconds=time.monotonic() - entered / 1e6 if entered else None,
        start=Start(props.get("InvocationID", "").strip(), started_at),
    )


def _count(value: object) -> int:
    """A non-negative integer from systemd or state.json text, 0 for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return max(value, 0)
    return int(value) if isinstance(value, str) and value.isdigit() else 0


def container_status(cfg: Config) -> str:
    """Docker's view of the container, for the diagnosis (a --rm container is gone once it exits)."""
    fmt = "{{.State.Status}} {{.State.ExitCode}}"
    out = tool("docker", "inspect", "-f", fmt, cfg.container)
    if out is None:
        return f"no container named {cfg.container}"
    status, _, code = out.strip().partition(" ")
    return status if status == "running" else f"{status}, exit code {code}"


@dataclass(frozen=True)
class Logs:
    """What the engine's current start logged: docker while its container exists, the journal always.

    earlier is the unit's whole recent journal, read only for an alert's evidence file: the first stack trace of
    a crash loop may be starts ago, but a line from an earlier incident must never drive today's diagnosis.
    """

    docker: str | None
    journal: str | None
    earlier: str | None = None

    def text(self) -> str:
        return "\n".join(part for part in (self.docker, self.journal) if part)


def collect_logs(cfg: Config, starts: list[Start]) -> Logs:
    """Read the logs of the given starts of the unit (newest last); with none known, the container's only."""
    tail = str(cfg.log_lines)
    current = starts[-1] if starts else None
    # The container is --rm and removed before each start: by name it is the current one. --since also drops
    # anything a container of that name printed before this start of the unit.
    since = ["--since", str(int(current.started_at))] if current and current.started_at else []
    docker = tool("docker", "logs", *since, "--tail", tail, cfg.container)
    return Logs(docker, journal_of(cfg, starts))


def journal_of(cfg: Config, starts: list[Start]) -> str | None:
    """The unit's journal lines of these starts only: by invocation id, else by time since the oldest start.

    The time fallback covers a journald that does not stamp invocation ids (some containers); with neither,
    the journal is not read, rather than risk an earlier incident's lines.
    """
    options = ["-n", str(cfg.log_lines), "--no-pager", "-o", "cat"]
    matches = [f"_SYSTEMD_INVOCATION_ID={s.invocation}" for s in starts if s.invocation]
    if matches:
        out = tool("journalctl", *matches, *options)
        if out and out.strip():
            return out
    times = [s.started_at for s in starts if s.started_at]
    if not times:
        return None
    since = f"@{int(min(times))}"  # whole seconds: every journalctl parses them
    return tool("journalctl", "-u", cfg.unit, "--since", since, *options)


def earlier_journal(cfg: Config) -> str | None:
    """The unit's recent journal across starts, for the evidence file only (never for the diagnosis)."""
    options = ["-n", str(cfg.log_lines), "--no-pager", "-o", "cat"]
    return tool("journalctl", "-u", cfg.unit, *options)


def mem_available() -> int | None:
    """MemAvailable in bytes: on a Spark CPU and GPU share it, and hosts wedge when it runs out."""
    try:
        text = Path(MEMINFO).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = re.search(r"^MemAvailable:\s+(\d+)\s*kB", text, re.M)
    return int(match.group(1)) * 1024 if match else None


def _endpoint(text: str) -> tuple[str, int]:
    """`0100007F:1F90` (/proc/net/tcp's little-endian words in hex) as ("127.0.0.1", 8080); IPv4 in IPv6 unmapped."""
    address, _, port = text.partition(":")
    raw = bytes.fromhex(address)
    packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(packed)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(port, 16)


def connections(tables: tuple[str, ...] | None = None) -> list[tuple[tuple[str, int], tuple[str, int]]] | None:
    """Established TCP connections (local, remote) of this network namespace; None when none can be read."""
    found, read = [], False
    for table in tables or TCP_TABLES:
        try:
            lines = Path(table).read_text(encoding="ascii", errors="replace").splitlines()[1:]
        except OSError:
            continue
        read = True
        for line in lines:
            parts = line.split()
            if len(parts) > 3 and parts[3] == ESTABLISHED:
                with contextlib.suppress(ValueError):
                    found.append((_endpoint(parts[1]), _endpoint(parts[2])))
    return found if read else None


def pair_linked(pair: dict[str, Any]) -> bool | None:
    """Whether the pair's link is up, as this host sees it: on the head, a connection from another host to its
    master port (its own processes reach it from the master address itself); on the worker, its connection to
    the head's master address and port. None when the socket tables cannot be read."""
    found = connections()
    if found is None:
        return None
    master = (pair["master_addr"], pair["master_port"])
    if pair["role"] == "worker":
        return any(remote == master for _, remote in found)
    return any(local[1] == pair["master_port"] and remote[0] != pair["master_addr"]
               and not ipaddress.ip_address(remote[0]).is_loopback for local, remote in found)


# --- HTTP probes ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """One HTTP exchange; error is "refused", "timeout" or a short reason when no response came back."""

    status: int | None
    body: bytes
    error: str | None
    seconds: float


def probe(url: str, timeout: float, api_key: str | None = None, payload: object = None) -> Probe:
    """One HTTP request that never raises: refusals, timeouts and HTTP errors all come back as data."""
    headers = {"Accept": "application/json"}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if payload is None else json.dumps(payload).encode()
    if data is not None:
        headers["Content-Type"] = "application/json"
    started = time.monotonic()
    try:
        request = urllib.request.Request(url, data=data, headers=headers)
        with DIRECT.open(request, timeout=timeout) as response:
            status, body, error = response.status, response.read(), None
    except urllib.error.HTTPError as exc:
        status, body, error = exc.code, _read_quietly(exc), None
    except (OSError, ValueError, http.client.HTTPException) as exc:
        status, body, error = None, b"", _failure_reason(exc)
    return Probe(status, body, error, time.monotonic() - started)


def _read_quietly(exc: urllib.error.HTTPError) -> bytes:
    """The body of an HTTP error, which may itself fail to arrive."""
    try:
        return exc.read()
    except (OSError, http.client.HTTPException):
        return b""


def _failure_reason(exc: BaseException) -> str:
    """Name a transport failure; "refused" and "timeout" are the two the verdict depends on."""
    reason: object = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ConnectionRefusedError):
        return "refused"
    if isinstance(reason, TimeoutError):
        return "timeout"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason) or type(reason).__name__


def _error_detail(body: bytes) -> str:
    """The server's error message (OpenAI-style JSON or plain text), short enough for one line."""
    text = body.decode("utf-8", "replace").strip()
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        error = json.loads(text).get("error")
        text = str(error.get("message", error) if isinstance(error, dict) else error or text)
    return " ".join(text.split())[:160] or "empty body"


# --- the checks ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """What went wrong, as a key of KINDS plus the facts its message needs."""

    kind: str
    facts: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """The verdict of the checks; summary words healthy/starting, failure is set when unhealthy."""

    state: str
    summary: str = ""
    failure: Failure | None = None
    http_status: int | None = None
    deep: bool = False
    busy: bool = False  # the completion timed out behind requests that still make progress


def _unhealthy(kind: str, status: int | None = None, **facts: str) -> Outcome:
    return Outcome(UNHEALTHY, failure=Failure(kind, facts), http_status=status)


def check_unit(unit: UnitState | None) -> Outcome | None:
    """Fail fast when systemd has stopped the unit: no HTTP probe can say more than systemd does."""
    if unit is None:
        return None
    stopped = unit.active_state in ("inactive", "failed")
    if unit.load_state == "not-found":
        return _unhealthy("not_installed")
    if stopped and "start-limit" in f"{unit.result} {unit.sub_state}":
        return _unhealthy("crashloop")
    if stopped:
        return _unhealthy("down")
    if unit.active_state == "activating" and unit.sub_state == "auto-restart":
        return _unhealthy("crashing")
    return None


def check_health(cfg: Config, unit: UnitState | None) -> Outcome | None:
    """GET /health: refused means loading inside the load window; 5xx means the engine died."""
    reply = probe(f"{cfg.url}/health", cfg.timeout_seconds)
    if reply.error == "refused":
        return refused(cfg, unit)
    failure = http_failure("/health", reply, cfg.timeout_seconds)
    if failure is None and reply.status is not None and not 200 <= reply.status < 300:
        failure = Failure("bad_response", {"what": "/health", "status": str(reply.status)})
    return None if failure is None else Outcome(UNHEALTHY, failure=failure, http_status=reply.status)


def refused(cfg: Config, unit: UnitState | None) -> Outcome:
    """The port refuses while weights load (3-15 min on a Spark): fine in the load window, a failure after."""
    if unit is not None and unit.active_state == "activating":
        return Outcome(STARTING, f"{cfg.unit} is still activating ({unit.sub_state}); nothing listens yet")
    age = unit.active_seconds if unit is not None and unit.active_state == "active" else None
    if age is not None and age < cfg.load_window_seconds:
        restarts = f", {unit.restarts} restarts so far" if unit and unit.restarts else ""
        return Outcome(
            STARTING,
            f"loading: nothing listens on {cfg.url} yet, {age:.0f} s into the "
            f"{cfg.load_window_seconds:g} s load window{restarts}",
        )
    window = f"{cfg.load_window_seconds:g} s" if unit is not None else f"state of {cfg.unit} unknown"
    return _unhealthy("refused", window=window)


def http_failure(what: str, reply: Probe, timeout: float) -> Failure | None:
    """The failures all endpoints share; None leaves the response to the caller."""
    if reply.error == "timeout":
        return Failure("hung", {"what": what, "seconds": f"{timeout:g}", "load": ""})
    if reply.error is not None:
        reason = "connection refused" if reply.error == "refused" else reply.error
        return Failure("unreachable", {"what": what, "error": reason})
    status = reply.status or 0
    if status in (401, 403):
        return Failure("auth", {"what": what, "status": str(status)})
    if status >= 500:
        return Failure("engine_dead", {"what": what, "status": str(status)})
    return None


def check_models(cfg: Config, api_key: str | None) -> Outcome | None:
    """GET /v1/models with the key: catches a rotated key and a served name that drifted from the config."""
    reply = probe(f"{cfg.url}/v1/models", cfg.timeout_seconds, api_key)
    failure = http_failure("/v1/models", reply, cfg.timeout_seconds)
    names = served_names(reply) if failure is None else []
    if failure is None and names is None:
        failure = Failure("bad_response", {"what": "/v1/models", "status": str(reply.status)})
    elif failure is None and names is not None and cfg.served_model_name not in names:
        failure = Failure("wrong_model", {"names": ", ".join(names) or "no model"})
    return None if failure is None else Outcome(UNHEALTHY, failure=failure, http_status=reply.status)


def served_names(reply: Probe) -> list[str] | None:
    """Model ids from an OpenAI model list; None when the reply is not one."""
    if reply.status != 200:
        return None
    try:
        return [str(model["id"]) for model in json.loads(reply.body)["data"]]
    except (ValueError, KeyError, TypeError):
        return None


def check_completion(cfg: Config, api_key: str | None) -> Outcome:
    """The deep check: /health and /v1/models keep answering while a deadlocked engine never generates."""
    payload = {"model": cfg.served_model_name, "prompt": "ping", "max_tokens": 1}
    reply = probe(f"{cfg.url}/v1/completions", cfg.deep_timeout_seconds, api_key, payload)
    failure = http_failure("a 1-token completion", reply, cfg.deep_timeout_seconds)
    if reply.error == "timeout":
        load = sample_load(cfg)
        if load.busy:
            summary = (
                f"not hung: a 1-token completion waited over {cfg.deep_timeout_seconds:g} s behind "
                f"{load.describe()}; the engine is serving, not stuck"
            )
            return Outcome(HEALTHY, summary, deep=True, busy=True)
        facts = {"what": "a 1-token completion", "seconds": f"{cfg.deep_timeout_seconds:g}"}
        failure = Failure("hung", {**facts, "load": f" ({load.describe()})"})
    if failure is None and not _has_choices(reply.body):
        detail = _error_detail(reply.body)
        failure = Failure("no_choices", {"status": str(reply.status), "detail": detail})
    if failure is not None:
        return Outcome(UNHEALTHY, failure=failure, http_status=reply.status, deep=True)
    summary = f"/health ok; /v1/models lists {cfg.served_model_name}; "
    summary += f"a 1-token completion answered in {reply.seconds:.2f} s"
    return Outcome(HEALTHY, summary, http_status=reply.status, deep=True)


@dataclass(frozen=True)
class Load:
    """Two /metrics reads some seconds apart: requests in the engine and whether its token counters moved."""

    readable: bool
    running: float = 0
    waiting: float = 0
    tokens: float = 0  # generated plus prefilled tokens counted between the two reads
    seconds: float = 0

    @property
    def busy(self) -> bool:
        """Requests are in the engine and tokens advance: it is working through a queue, not deadlocked."""
        return self.readable and self.running + self.waiting > 0 and self.tokens > 0

    def describe(self) -> str:
        if not self.readable:
            return "/metrics did not answer either"
        progress = f"{self.tokens:.0f} tokens" if self.tokens > 0 else "no token"
        return (
            f"{self.running:.0f} running and {self.waiting:.0f} waiting requests, "
            f"{progress} processed in {self.seconds:.1f} s"
        )


def read_metrics(cfg: Config) -> dict[str, float] | None:
    """The few vLLM series that tell busy from hung, summed over engines; None when /metrics fails."""
    reply = probe(f"{cfg.url}/metrics", cfg.timeout_seconds)
    if reply.status != 200:
        return None
    wanted = (RUNNING, WAITING, *TOKEN_COUNTERS)
    values: dict[str, float] = {}
    for name, value in samples(reply.body.decode("utf-8", "replace")):
        if name in wanted:
            values[name] = values.get(name, 0.0) + value
    return values if RUNNING in values or WAITING in values else None


def sample_load(cfg: Config) -> Load:
    """A long prefill queue (256K contexts) can hold a 1-token probe for minutes: look before calling it hung."""
    first = read_metrics(cfg)
    started = time.monotonic()
    time.sleep(cfg.busy_sample_seconds)
    second = read_metrics(cfg)
    if first is None or second is None:
        return Load(readable=False)
    tokens = sum(max(0.0, second.get(name, 0.0) - first.get(name, 0.0)) for name in TOKEN_COUNTERS)
    return Load(True, second.get(RUNNING, 0.0), second.get(WAITING, 0.0), tokens, time.monotonic() - started)


def _has_choices(body: bytes) -> bool:
    try:
        return bool(json.loads(body).get("choices"))
    except (ValueError, AttributeError):
        return False


def check_pair(cfg: Config, unit: UnitState | None) -> Outcome | None:
    """A pair host's link to its partner (None: linked, or standalone). Neither engine runs without the other: a
    head blocks until its worker joins, and each exits when the other goes away. Unlinked is "starting" only in
    the load window of a deliberate start; after a restart systemd made (the engine died, typically with its
    partner) or past the window, the partner is lost."""
    pair = cfg.pair
    if pair is None:
        return None
    linked = pair_linked(pair)
    if linked is not False:
        return None  # linked, or no socket table to read: the HTTP checks still judge the head
    kind = "worker_lost" if pair["role"] == "head" else "head_lost"
    waiting = f"waiting for {pair['peer']} to join at {pair['master_addr']}:{pair['master_port']}"
    age = unit.active_seconds if unit is not None and unit.active_state == "active" else None
    if unit is not None and unit.active_state == "activating":
        return Outcome(STARTING, f"{cfg.unit} is still activating ({unit.sub_state}); {waiting}")
    if age is not None and age < cfg.load_window_seconds and not unit.restarts:  # type: ignore[union-attr]
        return Outcome(STARTING, f"loading: {waiting}, {age:.0f} s into the {cfg.load_window_seconds:g} s load window")
    return _unhealthy(kind)


def run_checks(cfg: Config, unit: UnitState | None, deep: bool, api_key: str | None) -> Outcome:
    """Unit, then a pair's link, then /health, then /v1/models, then (deep runs only) a completion; the first
    failure decides. A pair's worker serves no HTTP: its unit and its link to the head are its health."""
    if cfg.pair is not None and cfg.pair["role"] == "worker":
        master = f"{cfg.pair['master_addr']}:{cfg.pair['master_port']}"
        return check_unit(unit) or check_pair(cfg, unit) or Outcome(
            HEALTHY, f"worker of pair {cfg.pair['name']}: joined its head {cfg.pair['peer']} at {master} "
            "(headless: no API of its own)")
    outcome = check_unit(unit) or check_pair(cfg, unit) or check_health(cfg, unit) or check_models(cfg, api_key)
    if outcome is not None:
        return outcome
    if deep:
        return check_completion(cfg, api_key)
    return Outcome(HEALTHY, f"/health ok; /v1/models lists {cfg.served_model_name}", http_status=200)


# --- diagnosis: data tables ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """How to word one kind of failure; with_cause wraps a cause found in the logs (None: logs irrelevant)."""

    template: str
    with_cause: str | None = None


KINDS: dict[str, Kind] = {
    "not_installed": Kind("{unit} is not installed on this host: re-run the deploy"),
    "crashloop": Kind(
        "crash loop: systemd gave up after {restarts} restarts; the first stack trace is in {evidence}; "
        "fix the cause, then `systemctl reset-failed {unit} && systemctl start {unit}`",
        "{cause}; crash loop: systemd gave up after {restarts} restarts, so once fixed run "
        "`systemctl reset-failed {unit} && systemctl start {unit}` (logs in {evidence})",
    ),
    "down": Kind(
        "{unit} is {active_state} ({result}, exit status {exit_status}), so nothing serves {url}: "
        "read {evidence}, fix the cause, then `systemctl start {unit}`",
        "{cause}; {unit} is {active_state} ({result}), start it again once fixed",
    ),
    "crashing": Kind(
        "crash loop: the engine exited and systemd keeps restarting {unit} ({restart_count} so far) until "
        "its start limit stops it; read {evidence}, fix the cause, then re-run the deploy",
        "{cause}; crash loop: systemd keeps restarting {unit} ({restart_count} so far) until its start "
        "limit stops it (logs in {evidence})",
    ),
    "refused": Kind(
        "nothing listens on {url} after the load window ({window}; container: {container}): "
        "the container is not running or bound elsewhere (check --host/--port)",
        "{cause}; nothing listens on {url} after the load window (container: {container})",
    ),
    "unreachable": Kind(
        "{what} on {url} failed ({error}): check that the container runs and listens on {url} ({container})",
        "{cause}; {what} on {url} failed ({error})",
    ),
    "hung": Kind(
        "the engine is hung: {what} timed out after {seconds} s{load}; restart the unit "
        "(`systemctl restart {unit}`), and report with the saved logs",
    ),
    "engine_dead": Kind(
        "the engine is dead: {what} answered HTTP {status}; restart the unit (`systemctl restart {unit}`), "
        "and report with the saved logs",
        "{cause}; {what} answered HTTP {status}",
    ),
    "auth": Kind(
        "the endpoint refused our API key ({what} answered HTTP {status}): check VLLM_API_KEY in "
        "{env_file} (missing, whitespace or rotated) and re-run the deploy",
    ),
    "wrong_model": Kind("the endpoint serves {names}, not {name}: check vllm_served_model_name"),
    "bad_response": Kind(
        "{what} answered HTTP {status} with something vLLM would not send: check that {url} is the vLLM "
        "server (vllm_port in the inventory, --port in vllm_args)",
    ),
    "memory_low": Kind(
        "host memory low: {available} GiB available, below {minimum} GiB; unified memory is shared by CPU and "
        "GPU, so the engine, the page cache and sshd compete for it and the host can wedge: stop other memory "
        "users or lower --gpu-memory-utilization / --max-num-seqs in vllm_args, then restart the unit",
    ),
    "worker_lost": Kind(
        "the worker {peer} of pair {pair} is not connected to this head's master port {master}: the engine cannot "
        "serve without it; check {peer} (`systemctl status {unit}` and `journalctl -u {unit}` there, or "
        "`sparkfleet status`) and the fabric link on {interface}",
        "{cause}; the worker {peer} of pair {pair} is not connected to this head's master port {master}: check "
        "{peer} (`systemctl status {unit}` there) and the fabric link on {interface}",
    ),
    "head_lost": Kind(
        "this worker of pair {pair} is not connected to its head {peer} at {master}: check that {peer}'s {unit} "
        "runs (`sparkfleet status`) and that {master} answers on {interface}",
        "{cause}; this worker of pair {pair} is not connected to its head {peer} at {master}",
    ),
    "no_choices": Kind(
        "a 1-token completion returned no choices (HTTP {status}: {detail}): the engine accepts requests but "
        "cannot generate; restart the unit, and report with the saved logs",
        "{cause}; a 1-token completion returned no choices (HTTP {status})",
    ),
}


@dataclass(frozen=True)
class LogRule:
    """A known crash signature in the container output and the sentence that explains and fixes it."""

    name: str
    pattern: re.Pattern[str]
    template: str
    pair_only: bool = False  # read only on a pair host (a standalone engine's own workers die in other ways)


# Most specific first: the first rule that matches anywhere in the logs wins.
LOG_RULES: tuple[LogRule, ...] = (
    LogRule(
        "cutlass",
        re.compile(r"cutlass_scaled_mm|Error Internal"),
        "FP8 kernels crash on GB10 with this image (cutlass_scaled_mm: Error Internal): its kernels lack sm_121; "
        "use an image validated on a GB10, pinned by digest (a name such as cu130 cannot tell); --enforce-eager or "
        "VLLM_DISABLED_KERNELS=CutlassFp8BlockScaledMMKernel only as a diagnostic fallback",
    ),
    LogRule(
        "unrecognized_arguments",
        re.compile(r"unrecognized arguments: (?P<args>[^\n]+)"),
        "this vLLM no longer accepts {args}: remove it from vllm_args "
        "(--disable-log-requests was removed: request logging is off by default)",
    ),
    LogRule(
        "tool_parser",
        re.compile(r"invalid tool call parser:\s*(?P<parser>[\w.-]+)"),
        "this vLLM has no tool call parser {parser}: use qwen3_xml or qwen3_coder for Qwen3.6 in vllm_args",
    ),
    LogRule(
        "reasoning_parser",
        re.compile(r"invalid reasoning parser:\s*(?P<parser>[\w.-]+)"),
        "this vLLM has no reasoning parser {parser}: use qwen3 for Qwen3.6 in vllm_args",
    ),
    LogRule(
        "quantization",
        re.compile(r"a3b_fp8"),
        "--quantization a3b_fp8 is not a vLLM quantization: use fp8 in vllm_args "
        "(or leave it unset for pre-quantized NVFP4 checkpoints)",
    ),
    LogRule(
        "gpu_runtime",
        re.compile(r"unknown or invalid runtime name: nvidia|could not select device driver[^\n]*"),
        "Docker cannot reach the GPU ({match}): the NVIDIA runtime is not registered; re-run the deploy "
        "(nvidia-ctk runtime configure --runtime=docker, then systemctl restart docker)",
    ),
    LogRule(
        "nvml",
        re.compile(r"Failed to initialize NVML[^\n]*"),
        "the container lost its GPU ({match}), typically after `systemctl daemon-reload` "
        "(nvidia-container-toolkit #48): restart the unit",
    ),
    LogRule(
        "memory",
        re.compile(
            r"(?i:out of memory)|OutOfMemoryError|Insufficient memory[^\n]*"
            r"|Free memory on device[^\n]*less than desired[^\n]*"
        ),
        "unified-memory pressure ({match}): drop the page cache (`sync; echo 3 > /proc/sys/vm/drop_caches`) "
        "or lower --gpu-memory-utilization / --max-num-seqs in vllm_args, then restart the unit",
    ),
    LogRule(
        "weights",
        re.compile(
            r"does not appear to have a file named[^\n]*|couldn't connect to 'https://huggingface\.co'"
            r"|LocalEntryNotFoundError|HFValidationError|bind source path does not exist[^\n]*"
            r"|(?:FileNotFoundError|OSError)[^\n]*No such file[^\n]*"
        ),
        "model weights are missing on the host ({match}): re-run the deploy to stage them",
    ),
    # Last: a pair host's own crash (memory, weights) also takes its partner's link down.
    LogRule(
        "peer_lost",
        re.compile(
            r"(?i:connection (?:closed|reset) by peer)[^\n]*|(?i:remote process exited)[^\n]*"
            r"|(?i:(?:worker|node|peer|rank)[^\n]{0,60}(?:died|disconnected|lost|went away))[^\n]*"
            r"|TCPStore[^\n]{0,80}(?:closed|failed|Broken pipe)[^\n]*"
        ),
        "the engine lost the other host of its pair, {peer} ({match}); each half of a pair exits without the other",
        pair_only=True,
    ),
)


class _Facts(dict[str, str]):
    """Template values; a fact a message needs but the run lacks prints as "?" instead of raising."""

    def __missing__(self, key: str) -> str:
        return "?"


def find_cause(logs: str, paired: bool = False) -> tuple[LogRule, re.Match[str]] | None:
    """The first LOG_RULES entry whose pattern occurs in the logs (table order = priority)."""
    for rule in LOG_RULES:
        if rule.pair_only and not paired:
            continue
        match = rule.pattern.search(logs)
        if match:
            return rule, match
    return None


def diagnose(failure: Failure, facts: dict[str, str], logs: str) -> tuple[str, str]:
    """One sentence naming cause and fix, plus a stable key (kind/rule) that says whether an alert is news."""
    kind = KINDS[failure.kind]
    values = _Facts({**facts, **failure.facts})
    found = find_cause(logs, paired="peer" in values) if kind.with_cause else None
    if found is None or kind.with_cause is None:
        return failure.kind, kind.template.format_map(values)
    rule, match = found
    rule_values = _Facts({**values, **match.groupdict(), "match": match.group(0).strip()[:160]})
    values["cause"] = rule.template.format_map(rule_values)
    return f"{failure.kind}/{rule.name}", kind.with_cause.format_map(values)


# --- one run -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """One run's verdict: printed by --json, summarised in state.json, sent to the webhook."""

    endpoint: str
    host: str
    state: str
    diagnosis: str
    cause: str
    checked_at: str
    http_status: int | None
    deep_check: bool
    unit: str
    consecutive_failures: int = 0
    alerting: bool = False
    evidence: str | None = None
    duration_seconds: float = 0.0
    busy: bool = False  # healthy, but the completion waited behind requests that still make progress
    restarts: int | None = None  # systemd's NRestarts for the unit
    crash_restarts: int = 0  # restarts seen in the crash-loop incident still open
    mem_available_gib: float | None = None


@dataclass(frozen=True)
class Restarts:
    """Restarts systemd made: since the last check, and in the crash-loop incident still open."""

    new: int = 0
    open: int = 0


def count_restarts(previous: dict[str, Any], unit: UnitState | None) -> Restarts:
    """Compare NRestarts with the last check's; a manual (re)start sets it back to 0 and ends the incident."""
    carried = _count(previous.get("crash_restarts"))
    if unit is None:
        return Restarts(0, carried)
    if "restarts" not in previous:  # first run: restarts from before it are not news
        return Restarts(0, 0)
    last = _count(previous["restarts"])
    if unit.restarts < last:
        return Restarts(unit.restarts, unit.restarts)
    return Restarts(unit.restarts - last, carried + unit.restarts - last)


def memory_low(cfg: Config, available: int | None) -> dict[str, str] | None:
    """The memory_low facts when MemAvailable is under the configured floor; None when fine or disabled."""
    floor = cfg.min_mem_available_gib
    if not floor or available is None or available >= floor * GIB:
        return None
    return {"available": f"{available / GIB:.1f}", "minimum": f"{floor:g}"}


@dataclass(frozen=True)
class Evaluation:
    """The checks' outcome with what is needed to re-word it once the alert knows its evidence path."""

    outcome: Outcome
    unit: UnitState | None
    facts: dict[str, str]
    logs: Logs
    restarts: Restarts = Restarts()
    mem_available: int | None = None
    note: str = ""  # a second finding the diagnosis carries (low memory beside an engine failure)

    def explain(self, evidence: str) -> tuple[str, str]:
        if self.outcome.failure is None:
            return "", self.outcome.summary
        cause, diagnosis = diagnose(self.outcome.failure, {**self.facts, "evidence": evidence}, self.logs.text())
        return cause, diagnosis + self.note


# Verdicts of a stopped unit: they say more than "it restarted" does.
STOPPED_KINDS = ("not_installed", "crashloop", "down")


def evaluate(cfg: Config, deep: bool, previous: dict[str, Any]) -> Evaluation:
    """Run the checks, count restarts, weigh host memory; logs are read only on failure (cheap healthy runs)."""
    unit = unit_state(cfg)
    restarts = count_restarts(previous, unit)
    available = mem_available()
    outcome = run_checks(cfg, unit, deep, os.environ.get("VLLM_API_KEY"))
    if restarts.new and (outcome.failure is None or outcome.failure.kind not in STOPPED_KINDS):
        # The restart is the news, whatever the probes see now (loading again, or serving for a while).
        outcome = replace(outcome, state=UNHEALTHY, failure=Failure("crashing"), summary="", busy=False)
    low = memory_low(cfg, available)
    note = ""
    if low is not None and outcome.failure is None:
        outcome = Outcome(UNHEALTHY, failure=Failure("memory_low", low), http_status=outcome.http_status,
                          deep=outcome.deep)
    elif low is not None:
        note = f"; host memory is low too: {low['available']} GiB available, below {low['minimum']} GiB"
    if outcome.failure is None:
        return Evaluation(outcome, unit, {}, Logs(None, None), restarts, available)
    facts = {
        "endpoint": cfg.endpoint,
        "unit": cfg.unit,
        "url": cfg.url,
        "name": cfg.served_model_name,
        "env_file": cfg.env_file,
        "container": container_status(cfg),
    }
    if cfg.pair is not None:
        facts.update(peer=cfg.pair["peer"], pair=cfg.pair["name"], interface=cfg.pair["interface"],
                     master=f"{cfg.pair['master_addr']}:{cfg.pair['master_port']}")
    if unit is not None:
        facts.update(
            active_state=unit.active_state,
            result=unit.result,
            restarts=str(unit.restarts),
            restart_count=f"{unit.restarts} restart{'' if unit.restarts == 1 else 's'}",
            exit_status=unit.exit_status,
        )
    logs = collect_logs(cfg, starts_to_read(previous, unit, restarts))
    return Evaluation(outcome, unit, facts, logs, restarts, available, note)


def starts_to_read(previous: dict[str, Any], unit: UnitState | None, restarts: Restarts) -> list[Start]:
    """The unit's current start; after a restart also the start the last check saw: the one that crashed."""
    if unit is None:
        return []
    seen = previous.get("start")
    if restarts.new and isinstance(seen, dict) and seen.get("invocation") not in (None, "", unit.start.invocation):
        started_at = seen.get("started_at")
        crashed = Start(str(seen["invocation"]), float(started_at) if isinstance(started_at, (int, float)) else None)
        return [crashed, unit.start]
    return [unit.start]


def journal_hint(cfg: Config) -> str:
    """Where the logs are before an alert has saved them."""
    return f"`journalctl -u {cfg.unit}`"


def should_alert(previous: dict[str, Any], result: Result, cfg: Config) -> bool:
    """Alert once per incident: at the threshold, again only if the cause changes or after a recovery.

    A cause that only loses its log detail (crashing/cutlass, then crashing while the next start loads) is not
    a new cause.
    """
    if result.state != UNHEALTHY or result.consecutive_failures < cfg.alert_after:
        return False
    if not previous.get("alerted"):
        return True
    last = str((previous.get("last_alert") or {}).get("cause") or "")
    return result.cause != last and not last.startswith(f"{result.cause}/")


def should_renotify(previous: dict[str, Any], result: Result, cfg: Config) -> bool:
    """Repeat an open alert every renotify_minutes while the endpoint stays unhealthy (0: never)."""
    if not cfg.renotify_minutes or not result.alerting or result.state != UNHEALTHY:
        return False
    last = previous.get("notified_at") or (previous.get("last_alert") or {}).get("time")
    return _elapsed(last, result.checked_at) >= cfg.renotify_minutes * 60


def _elapsed(since: object, until: str) -> float:
    """Seconds between two ISO times from state.json; a missing or unreadable start counts as long ago."""
    try:
        return (datetime.fromisoformat(until) - datetime.fromisoformat(str(since))).total_seconds()
    except (TypeError, ValueError):
        return float("inf")


def healthy_since(previous: dict[str, Any], state: str, checked_at: str) -> str | None:
    """When the current run of healthy checks began; None when this check is not healthy."""
    if state != HEALTHY:
        return None
    since = previous.get("healthy_since")
    last = (previous.get("last_result") or {}).get("state")
    return since if last == HEALTHY and isinstance(since, str) else checked_at


def count_failures(previous: dict[str, Any], state: str, new_restarts: int, crash_open: bool) -> int:
    """Failures in the open incident: one per unhealthy check, one per restart.

    Loading or serving between the restarts of an open crash loop does not reset the count: it did, and a
    crash loop whose loads are long never alerted.
    """
    before = _count(previous.get("consecutive_failures"))
    if state == UNHEALTHY:
        return before + max(1, new_restarts)
    return before if crash_open else 0


def update_state(
    previous: dict[str, Any], result: Result, runs: int, alerted_now: bool, notified: bool,
    unit: UnitState | None, since: str | None,
) -> dict[str, Any]:
    """The next state.json; `alerted` stays set until the incident is over, so one incident alerts once."""
    state: dict[str, Any] = {
        "runs": runs,
        "consecutive_failures": result.consecutive_failures,
        "alerted": result.alerting,
        "crash_restarts": result.crash_restarts,
        "healthy_since": since,
        "notified_at": result.checked_at if notified else (previous.get("notified_at") if result.alerting else None),
        "last_result": {
            "state": result.state,
            "diagnosis": result.diagnosis,
            "cause": result.cause,
            "checked_at": result.checked_at,
            "http_status": result.http_status,
            "busy": result.busy,
            "mem_available_gib": result.mem_available_gib,
        },
        "last_alert": previous.get("last_alert"),
    }
    # The last NRestarts and start seen; kept from the previous run when systemd could not be asked.
    if unit is not None:
        state["restarts"] = unit.restarts
        state["start"] = {"invocation": unit.start.invocation, "started_at": unit.start.started_at}
    else:
        state.update({key: previous[key] for key in ("restarts", "start") if key in previous})
    if alerted_now:
        state["last_alert"] = {
            "time": result.checked_at,
            "diagnosis": result.diagnosis,
            "cause": result.cause,
            "evidence": result.evidence,
        }
    return state


def check_once(cfg: Config, stream: TextIO) -> tuple[Result, str]:
    """One full run: check, count, alert or recover, persist, export; returns the result and its log line."""
    started = time.monotonic()
    state_path = Path(cfg.state_dir) / "state.json"
    previous = load_state(state_path, stream)
    runs = _count(previous.get("runs")) + 1
    last_state = (previous.get("last_result") or {}).get("state")
    evaluation = evaluate(cfg, deep=runs % cfg.deep_every == 0 or last_state != HEALTHY, previous=previous)
    cause, diagnosis = evaluation.explain(journal_hint(cfg))
    outcome, unit = evaluation.outcome, evaluation.unit
    checked_at = datetime.now(UTC).isoformat(timespec="seconds")
    since = healthy_since(previous, outcome.state, checked_at)
    crash_restarts = evaluation.restarts.open
    if crash_restarts and outcome.state == HEALTHY and _elapsed(since, checked_at) >= STABLE_SECONDS:
        crash_restarts = 0  # serving this long without a restart: the crash loop is over
    available = evaluation.mem_available
    result = Result(
        endpoint=cfg.endpoint,
        host=socket.gethostname(),
        state=outcome.state,
        diagnosis=diagnosis,
        cause=cause,
        checked_at=checked_at,
        http_status=outcome.http_status,
        deep_check=outcome.deep,
        unit=unit.describe() if unit else "unknown",
        consecutive_failures=count_failures(previous, outcome.state, evaluation.restarts.new, crash_restarts > 0),
        busy=outcome.busy,
        restarts=unit.restarts if unit else None,
        crash_restarts=crash_restarts,
        mem_available_gib=round(available / GIB, 2) if available is not None else None,
    )
    alerted_now = should_alert(previous, result, cfg)
    recovered = bool(previous.get("alerted")) and result.state == HEALTHY and not crash_restarts
    result = replace(result, alerting=(bool(previous.get("alerted")) or alerted_now) and not recovered)
    renotified = not alerted_now and should_renotify(previous, result, cfg)
    if alerted_now:
        result = alert(cfg, result, evaluation, stream)
    elif renotified:
        result = renotify(cfg, result, evaluation, previous, stream)
    elif recovered:
        notify(result, "recovered", stream)
    result = replace(result, duration_seconds=round(time.monotonic() - started, 3))
    state = update_state(previous, result, runs, alerted_now, alerted_now or renotified, unit, since)
    save_state(state_path, state, stream)
    write_textfile(cfg, result, stream)
    alerted_at = str((previous.get("last_alert") or {}).get("time") or "")
    return result, human_line(cfg, result, alerted_now, recovered, alerted_at if renotified else None)


def human_line(
    cfg: Config, result: Result, alerted_now: bool, recovered: bool, repeat_of: str | None = None
) -> str:
    """The run's one journal line, its sd-daemon prefix choosing the priority; repeat_of: the repeated alert's time."""
    name, count = result.endpoint, result.consecutive_failures
    if recovered:
        return f"<{NOTICE}>{name} recovered: healthy again after the alert; {result.diagnosis}"
    if result.state != UNHEALTHY:
        line = f"{name} {'busy' if result.busy else result.state}: {result.diagnosis}"
        if result.crash_restarts:
            plural = "s" if result.crash_restarts > 1 else ""
            return (
                f"<{WARNING}>{line}; crash loop still open ({result.crash_restarts} restart{plural} seen, "
                f"{count}/{cfg.alert_after} failures; it closes after {STABLE_SECONDS // 60} min healthy)"
            )
        return f"<{NOTICE if result.busy else INFO}>{line}"
    mentioned = not result.evidence or result.evidence in result.diagnosis
    saved = "" if mentioned else f"; evidence: {result.evidence}"
    if repeat_of is not None:
        first = f"alerted at {repeat_of}, " if repeat_of else ""
        return (
            f"<{ERR}>{name} ALERT repeated (still unhealthy, {first}{count} failures; "
            f"every {cfg.renotify_minutes} min until it recovers): {result.diagnosis}{saved}"
        )
    if alerted_now and result.cause.startswith("crashing"):
        return f"<{ERR}>{name} ALERT: {result.diagnosis}{saved}"
    if alerted_now:
        checks = f"{count} check{'s' if count > 1 else ''} in a row (~{count * cfg.interval_seconds:g} s)"
        return f"<{ERR}>{name} ALERT: unhealthy for {checks}: {result.diagnosis}{saved}"
    if result.alerting:
        return f"<{WARNING}>{name} still unhealthy ({count} in a row, alert already sent): {result.diagnosis}"
    return f"<{WARNING}>{name} unhealthy ({count}/{cfg.alert_after} before alerting): {result.diagnosis}"


def emit(stream: TextIO, level: int, message: str) -> None:
    """Write one line with its sd-daemon prefix (systemd's SyslogLevelPrefix turns it into the priority)."""
    stream.write(f"<{level}>{message}\n")
    stream.flush()


# --- alerting ------------------------------------------------------------------------------------------


def alert(cfg: Config, result: Result, evaluation: Evaluation, stream: TextIO) -> Result:
    """Save the crash evidence (a --rm container takes its logs with it) and tell a human, once."""
    path = evidence_path(Path(cfg.state_dir) / "evidence", result.checked_at)
    _, diagnosis = evaluation.explain(str(path))
    result = replace(result, diagnosis=diagnosis, evidence=str(path))
    try:
        save_evidence(path, result, replace(evaluation.logs, earlier=earlier_journal(cfg)))
    except OSError as exc:
        emit(stream, WARNING, f"{cfg.endpoint}: cannot save evidence to {path}: {exc}")
        _, diagnosis = evaluation.explain(journal_hint(cfg))
        result = replace(result, diagnosis=diagnosis, evidence=None)
    notify(result, "alert", stream)
    return result


def renotify(
    cfg: Config, result: Result, evaluation: Evaluation, previous: dict[str, Any], stream: TextIO
) -> Result:
    """Repeat the open alert; it points at the evidence the alert saved rather than writing a file each time."""
    evidence = (previous.get("last_alert") or {}).get("evidence")
    _, diagnosis = evaluation.explain(str(evidence) if evidence else journal_hint(cfg))
    result = replace(result, diagnosis=diagnosis, evidence=str(evidence) if evidence else None)
    notify(result, "alert", stream, repeat=True)
    return result


def evidence_path(directory: Path, checked_at: str) -> Path:
    """A new file named by UTC time; a second alert within the same second must not overwrite the first."""
    stamp = datetime.fromisoformat(checked_at).strftime("%Y%m%dT%H%M%SZ")
    path, n = directory / f"{stamp}.log", 0
    while path.exists():
        n += 1
        path = directory / f"{stamp}-{n}.log"
    return path


def save_evidence(path: Path, result: Result, logs: Logs) -> None:
    """Write the logs root-only (0600): stack traces can carry paths and arguments worth keeping private."""
    header = (
        f"# sparkfleet health evidence: {result.endpoint} on {result.host} at {result.checked_at}\n"
        f"# state {result.state}, unit {result.unit}, {result.consecutive_failures} consecutive failures\n"
        f"# diagnosis: {result.diagnosis}\n"
    )
    sections = [
        ("docker logs of this start", logs.docker or "(no container to read: it exited or was removed)\n"),
        ("journal of this start of the unit", logs.journal or "(journal of this start not readable)\n"),
        (
            "journal of the unit, earlier starts included (not used for the diagnosis)",
            logs.earlier or "(journal not readable)\n",
        ),
    ]
    body = "".join(f"\n===== {title} =====\n{text}" for title, text in sections)
    for directory in (path.parent.parent, path.parent):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(header + body)
    os.chmod(path, 0o600)
    for old in sorted(path.parent.glob("*.log"))[:-EVIDENCE_KEEP]:
        old.unlink(missing_ok=True)


def notify(result: Result, event: str, stream: TextIO, repeat: bool = False) -> None:
    """POST the event to the webhook if one is set; a failing webhook is a warning, never fatal."""
    url = os.environ.get("SPARKFLEET_HEALTH_WEBHOOK", "").strip()
    if not url:
        return
    if not url.startswith(("http://", "https://")):
        emit(stream, WARNING, f"{result.endpoint}: SPARKFLEET_HEALTH_WEBHOOK is not an http(s) URL; not sent")
        return
    payload = {
        "event": event,
        "host": result.host,
        "endpoint": result.endpoint,
        "state": result.state,
        "diagnosis": result.diagnosis,
        "consecutive_failures": result.consecutive_failures,
        "evidence": result.evidence,
        "repeat": repeat,
        "restarts": result.restarts,
        "mem_available_gib": result.mem_available_gib,
    }
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        emit(stream, WARNING, f"{result.endpoint}: webhook POST failed (HTTP {exc.code})")
    except (OSError, ValueError, http.client.HTTPException) as exc:
        # The URL may embed a token: never echo it, even inside an exception message.
        reason = _failure_reason(exc).replace(url, "<webhook>")
        emit(stream, WARNING, f"{result.endpoint}: webhook POST failed ({reason})")


# --- persistence ---------------------------------------------------------------------------------------


def atomic_write(path: Path, text: str, mode: int) -> None:
    """Write via a temp file in the same directory and rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def load_state(path: Path, stream: TextIO) -> dict[str, Any]:
    """The previous run's state; a missing or corrupt file starts the counters afresh rather than failing."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        emit(stream, WARNING, f"ignoring unreadable health state {path}: {exc}")
        return {}
    return data if isinstance(data, dict) else {}


def save_state(path: Path, state: dict[str, Any], stream: TextIO) -> None:
    """Persist the counters; failing to do so is loud but must not hide the verdict itself."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(path, json.dumps(state, indent=2) + "\n", 0o600)
    except OSError as exc:
        emit(stream, ERR, f"cannot save health state {path}: {exc}")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _gauge(name: str, help_text: str, samples: list[tuple[str, float]]) -> list[str]:
    """One gauge in the text exposition format; floats in full precision (a timestamp needs all digits)."""
    values = [str(int(v)) if isinstance(v, int) else repr(float(v)) for _, v in samples]
    return [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"] + [
        f"{name}{{{labels}}} {value}" for (labels, _), value in zip(samples, values, strict=True)
    ]


def write_textfile(cfg: Config, result: Result, stream: TextIO) -> None:
    """Export the verdict to node_exporter's textfile collector (a .tmp name it ignores, then rename)."""
    if cfg.textfile_dir is None:
        return
    ep = f'endpoint="{_label(cfg.endpoint)}"'
    checked = datetime.fromisoformat(result.checked_at).timestamp()
    lines = [
        *_gauge(
            "sparkfleet_health_up",
            "1 if the endpoint passed its last health check.",
            [(ep, result.state == HEALTHY)],
        ),
        *_gauge(
            "sparkfleet_health_state",
            "Verdict of the last health check, one-hot over the states.",
            [(f'{ep},state="{state}"', result.state == state) for state in STATES],
        ),
        *_gauge(
            "sparkfleet_health_consecutive_failures",
            "Unhealthy checks in a row.",
            [(ep, result.consecutive_failures)],
        ),
        *_gauge(
            "sparkfleet_health_last_check_timestamp_seconds",
            "Unix time of the last health check.",
            [(ep, checked)],
        ),
        *_gauge(
            "sparkfleet_health_check_duration_seconds",
            "How long the last health check took.",
            [(ep, result.duration_seconds)],
        ),
        *_gauge(
            "sparkfleet_health_alerting",
            "1 while an alert is open (sent and not yet recovered).",
            [(ep, result.alerting)],
        ),
        *_gauge(
            "sparkfleet_health_busy",
            "1 if the last deep check timed out behind requests that still make progress (busy, not hung).",
            [(ep, result.busy)],
        ),
        *_gauge(
            "sparkfleet_health_crash_restarts",
            "Restarts seen in the crash-loop incident still open (0: none open).",
            [(ep, result.crash_restarts)],
        ),
    ]
    if result.restarts is not None:
        lines += _gauge("sparkfleet_health_unit_restarts", "systemd's NRestarts of the unit.", [(ep, result.restarts)])
    if result.mem_available_gib is not None:
        available = int(result.mem_available_gib * GIB)
        lines += _gauge(
            "sparkfleet_health_mem_available_bytes",
            "MemAvailable of the host (CPU and GPU share it on a Spark).",
            [(ep, available)],
        )
    try:
        atomic_write(Path(cfg.textfile_dir) / TEXTFILE_NAME, "\n".join(lines) + "\n", 0o644)
    except OSError as exc:
        emit(stream, WARNING, f"cannot write {TEXTFILE_NAME} to {cfg.textfile_dir}: {exc}")


# --- entry point ---------------------------------------------------------------------------------------


WAIT_INTERVAL_SECONDS = 5
WAIT_UNHEALTHY_RUNS = 3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Check the health of this Spark's vLLM endpoint once.")
    parser.add_argument("--config", required=True, help="health.json as the deploy writes it")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (log lines: stderr)")
    parser.add_argument("--wait", type=float, metavar="SECONDS",
                        help="check every 5 s until healthy; give up after SECONDS or 3 unhealthy runs in a row")
    return parser.parse_args(argv)


def wait_healthy(cfg: Config, stream: TextIO, timeout: float) -> tuple[Result, str]:
    """After a (re)start: loading is "starting", not failure; a crash shows as 3 unhealthy runs in a row.

    Used by the deploy and by rollout gates, so both stop at once on a crash loop instead of waiting out
    the whole load window.
    """
    deadline = time.monotonic() + timeout
    unhealthy = 0
    while True:
        result, line = check_once(cfg, stream)
        unhealthy = unhealthy + 1 if result.state == UNHEALTHY else 0
        if result.state == HEALTHY or unhealthy >= WAIT_UNHEALTHY_RUNS or time.monotonic() >= deadline:
            return result, line
        time.sleep(WAIT_INTERVAL_SECONDS)


def main(argv: list[str] | None = None) -> int:
    """Run one check; exit 0 healthy/starting, 1 unhealthy, 2 bad config (the oneshot's Result says which)."""
    args = parse_args(argv)
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        emit(sys.stderr, ERR, f"sparkfleet health: bad config: {exc}")
        return EXIT_BAD_CONFIG
    stream = sys.stderr if args.json else sys.stdout
    result, line = wait_healthy(cfg, stream, args.wait) if args.wait else check_once(cfg, stream)
    stream.write(line + "\n")
    if args.wait and result.state != HEALTHY:
        result = replace(result, state=UNHEALTHY)  # still starting when the wait ran out is a failure too
    if args.json:
        sys.stdout.write(json.dumps(dataclasses.asdict(result), indent=2) + "\n")
    return EXIT_UNHEALTHY if result.state == UNHEALTHY else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
