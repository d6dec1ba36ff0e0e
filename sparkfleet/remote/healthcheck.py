#!/usr/bin/env python3
"""sparkfleet health check for the vLLM endpoint of one DGX Spark.

Installed as /usr/local/lib/sparkfleet/healthcheck.py and run every 30 s by sparkfleet-health.timer. It is
stdlib-only on purpose: it runs on a bare Ubuntu 24.04 / Debian 12 python3, with no sparkfleet installed.

An open port is not health (vllm #39863): the check walks from the systemd unit to /health, /v1/models and,
every Nth run, a real 1-token completion, then turns a failure plus the container logs into one sentence an
operator can act on. Output lines carry sd-daemon priority prefixes (<3> err .. <6> info) so the journal
files them at the right priority. Exit codes: 0 healthy or starting, 1 unhealthy, 2 bad config.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

DEFAULT_CONFIG = "/etc/sparkfleet/health.json"
HEALTHY, STARTING, UNHEALTHY = "healthy", "starting", "unhealthy"
STATES = (HEALTHY, STARTING, UNHEALTHY)
EXIT_OK, EXIT_UNHEALTHY, EXIT_BAD_CONFIG = 0, 1, 2
ERR, WARNING, NOTICE, INFO = 3, 4, 5, 6
COMMAND_TIMEOUT = 30  # seconds: a wedged dockerd must not wedge the check
WEBHOOK_TIMEOUT = 10
EVIDENCE_KEEP = 50  # a flapping endpoint must not fill the disk with evidence files
UNIT_PROPERTIES = (
    "LoadState,ActiveState,SubState,Result,NRestarts,ActiveEnterTimestampMonotonic,ExecMainStatus"
)
TEXTFILE_NAME = "sparkfleet_health.prom"
# Local probes must not follow an http_proxy from the service environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# --- configuration -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """health.json as the deploy writes it; secrets never live here, they come from the environment."""

    endpoint: str
    unit: str
    container: str
    url: str
    served_model_name: str
    load_window_seconds: float = 900
    interval_seconds: float = 30
    deep_every: int = 10
    timeout_seconds: float = 5
    deep_timeout_seconds: float = 60
    alert_after: int = 3
    textfile_dir: str | None = "/var/lib/node_exporter/textfile_collector"
    state_dir: str = "/var/lib/sparkfleet/health"
    log_lines: int = 1000


class ConfigError(ValueError):
    """health.json is missing or malformed: exit 2 so a broken deploy is not mistaken for a sick engine."""


_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "str | None": (str, type(None)),
    "int": (int,),
    "float": (int, float),
}
_POSITIVE = {
    "interval_seconds",
    "deep_every",
    "timeout_seconds",
    "deep_timeout_seconds",
    "alert_after",
    "log_lines",
}


def load_config(path: str) -> Config:
    """Read and validate health.json; unknown keys are errors because a typo would silently use a default."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    fields = {f.name: f for f in dataclasses.fields(Config)}
    unknown = sorted(set(raw) - set(fields))
    missing = sorted(n for n, f in fields.items() if f.default is dataclasses.MISSING and n not in raw)
    if unknown or missing:
        raise ConfigError(f"{path}: unknown keys {unknown}, missing keys {missing}")
    for name, value in raw.items():
        _check_value(name, str(fields[name].type), value)
    if not raw["url"].startswith(("http://", "https://")):
        raise ConfigError(f"url must start with http:// or https://, not {raw['url']!r}")
    return replace(Config(**raw), url=raw["url"].rstrip("/"))


def _check_value(name: str, type_name: str, value: object) -> None:
    """Reject wrong types and impossible numbers (bool is an int to Python, never to us)."""
    if isinstance(value, bool) or not isinstance(value, _TYPES[type_name]):
        raise ConfigError(f"{name} must be {type_name}, not {value!r}")
    if isinstance(value, str) and not value.strip():
        raise ConfigError(f"{name} must not be empty")
    if isinstance(value, (int, float)) and (value <= 0 if name in _POSITIVE else value < 0):
        raise ConfigError(f"{name} must be positive, not {value!r}")


# --- facts about the host ------------------------------------------------------------------------------


def run_tool(env_name: str, default: str, args: list[str]) -> str | None:
    """Run systemctl/docker/journalctl (overridable by env, for tests); None if missing, failing or hung."""
    argv = shlex.split(os.environ.get(env_name) or default) + args
    try:
        done = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


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

    def describe(self) -> str:
        return f"{self.active_state}/{self.sub_state}"


def unit_state(cfg: Config) -> UnitState | None:
    """Ask systemd; None when systemctl is unusable, so the HTTP checks still run."""
    out = run_tool("SPARKFLEET_SYSTEMCTL", "systemctl", ["show", cfg.unit, "-p", UNIT_PROPERTIES])
    props = dict(line.split("=", 1) for line in (out or "").splitlines() if "=" in line)
    if "ActiveState" not in props:
        return None
    entered = _count(props.get("ActiveEnterTimestampMonotonic"))
    # Both sides are CLOCK_MONOTONIC: systemd in microseconds, time.monotonic() in seconds.
    return UnitState(
        load_state=props.get("LoadState", "loaded"),
        active_state=props["ActiveState"],
        sub_state=props.get("SubState", ""),
        result=props.get("Result", ""),
        restarts=_count(props.get("NRestarts")),
        exit_status=props.get("ExecMainStatus", ""),
        active_seconds=time.monotonic() - entered / 1e6 if entered else None,
    )


def _count(value: object) -> int:
    """A non-negative integer from systemd or state.json text, 0 for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return max(value, 0)
    return int(value) if isinstance(value, str) and value.isdigit() else 0


def container_status(cfg: Config) -> str:
    """Docker's view of the container, for the diagnosis (a --rm container is gone once it exits)."""
    fmt = "{{.State.Status}} {{.State.ExitCode}}"
    out = run_tool("SPARKFLEET_DOCKER", "docker", ["inspect", "-f", fmt, cfg.container])
    if out is None:
        return f"no container named {cfg.container}"
    status, _, code = out.strip().partition(" ")
    return status if status == "running" else f"{status}, exit code {code}"


@dataclass(frozen=True)
class Logs:
    """Container output from both sources: docker while the container exists, the unit's journal always."""

    docker: str | None
    journal: str | None

    def text(self) -> str:
        return "\n".join(part for part in (self.docker, self.journal) if part)


def collect_logs(cfg: Config) -> Logs:
    """Read both log sources; the journal keeps the first crash of a --rm container that restarted since."""
    tail = str(cfg.log_lines)
    docker = run_tool("SPARKFLEET_DOCKER", "docker", ["logs", "--tail", tail, cfg.container])
    journal = run_tool(
        "SPARKFLEET_JOURNALCTL", "journalctl", ["-u", cfg.unit, "-n", tail, "--no-pager", "-o", "cat"]
    )
    return Logs(docker, journal)


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
        with _DIRECT.open(request, timeout=timeout) as response:
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
        return _unhealthy("restarting")
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
        return Failure("hung", {"what": what, "seconds": f"{timeout:g}"})
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
    if failure is None and not _has_choices(reply.body):
        detail = _error_detail(reply.body)
        failure = Failure("no_choices", {"status": str(reply.status), "detail": detail})
    if failure is not None:
        return Outcome(UNHEALTHY, failure=failure, http_status=reply.status, deep=True)
    summary = f"/health ok; /v1/models lists {cfg.served_model_name}; "
    summary += f"a 1-token completion answered in {reply.seconds:.2f} s"
    return Outcome(HEALTHY, summary, http_status=reply.status, deep=True)


def _has_choices(body: bytes) -> bool:
    try:
        return bool(json.loads(body).get("choices"))
    except (ValueError, AttributeError):
        return False


def run_checks(cfg: Config, unit: UnitState | None, deep: bool, api_key: str | None) -> Outcome:
    """Unit, then /health, then /v1/models, then (deep runs only) a completion; the first failure decides."""
    outcome = check_unit(unit) or check_health(cfg, unit) or check_models(cfg, api_key)
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
    "restarting": Kind(
        "{unit} keeps restarting ({restarts} restarts so far): the container exits during start-up; "
        "the first stack trace is in {evidence}",
        "{cause}; {unit} keeps restarting ({restarts} restarts so far)",
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
        "the engine is hung: {what} timed out after {seconds} s; restart the unit "
        "(`systemctl restart {unit}`), and report with the saved logs",
    ),
    "engine_dead": Kind(
        "the engine is dead: {what} answered HTTP {status}; restart the unit (`systemctl restart {unit}`), "
        "and report with the saved logs",
        "{cause}; {what} answered HTTP {status}",
    ),
    "auth": Kind(
        "the endpoint refused our API key ({what} answered HTTP {status}): check VLLM_API_KEY in "
        "/etc/sparkfleet/vllm.env (missing, whitespace or rotated) and re-run the deploy",
    ),
    "wrong_model": Kind("the endpoint serves {names}, not {name}: check vllm_served_model_name"),
    "bad_response": Kind(
        "{what} answered HTTP {status} with something vLLM would not send: check that {url} is the vLLM "
        "server (url in /etc/sparkfleet/health.json, --port in vllm_args)",
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


# Most specific first: the first rule that matches anywhere in the logs wins.
LOG_RULES: tuple[LogRule, ...] = (
    LogRule(
        "cutlass",
        re.compile(r"cutlass_scaled_mm|Error Internal"),
        "FP8 kernels crash on GB10 with this image (cutlass_scaled_mm: Error Internal): use a newer cu130 "
        "image pinned by tag or digest; --enforce-eager or "
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
)


class _Facts(dict[str, str]):
    """Template values; a fact a message needs but the run lacks prints as "?" instead of raising."""

    def __missing__(self, key: str) -> str:
        return "?"


def find_cause(logs: str) -> tuple[LogRule, re.Match[str]] | None:
    """The first LOG_RULES entry whose pattern occurs in the logs (table order = priority)."""
    for rule in LOG_RULES:
        match = rule.pattern.search(logs)
        if match:
            return rule, match
    return None


def diagnose(failure: Failure, facts: dict[str, str], logs: str) -> tuple[str, str]:
    """One sentence naming cause and fix, plus a stable key (kind/rule) that says whether an alert is news."""
    kind = KINDS[failure.kind]
    values = _Facts({**facts, **failure.facts})
    found = find_cause(logs) if kind.with_cause else None
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


@dataclass(frozen=True)
class Evaluation:
    """The checks' outcome with what is needed to re-word it once the alert knows its evidence path."""

    outcome: Outcome
    unit: UnitState | None
    facts: dict[str, str]
    logs: Logs

    def explain(self, evidence: str) -> tuple[str, str]:
        if self.outcome.failure is None:
            return "", self.outcome.summary
        return diagnose(self.outcome.failure, {**self.facts, "evidence": evidence}, self.logs.text())


def evaluate(cfg: Config, deep: bool) -> Evaluation:
    """Run the checks; container state and logs are read only on failure, to keep healthy runs cheap."""
    unit = unit_state(cfg)
    outcome = run_checks(cfg, unit, deep, os.environ.get("VLLM_API_KEY"))
    if outcome.failure is None:
        return Evaluation(outcome, unit, {}, Logs(None, None))
    facts = {
        "endpoint": cfg.endpoint,
        "unit": cfg.unit,
        "url": cfg.url,
        "name": cfg.served_model_name,
        "container": container_status(cfg),
    }
    if unit is not None:
        facts.update(
            active_state=unit.active_state,
            result=unit.result,
            restarts=str(unit.restarts),
            exit_status=unit.exit_status,
        )
    return Evaluation(outcome, unit, facts, collect_logs(cfg))


def journal_hint(cfg: Config) -> str:
    """Where the logs are before an alert has saved them."""
    return f"`journalctl -u {cfg.unit}`"


def should_alert(previous: dict[str, Any], result: Result, cfg: Config) -> bool:
    """Alert once per incident: at the threshold, again only if the cause changes or after a recovery."""
    if result.state != UNHEALTHY or result.consecutive_failures < cfg.alert_after:
        return False
    last_alert = previous.get("last_alert") or {}
    return not previous.get("alerted") or last_alert.get("cause") != result.cause


def update_state(previous: dict[str, Any], result: Result, runs: int, alerted_now: bool) -> dict[str, Any]:
    """The next state.json; `alerted` stays set until a healthy run, so one incident alerts once."""
    state: dict[str, Any] = {
        "runs": runs,
        "consecutive_failures": result.consecutive_failures,
        "alerted": result.alerting,
        "last_result": {
            "state": result.state,
            "diagnosis": result.diagnosis,
            "cause": result.cause,
            "checked_at": result.checked_at,
            "http_status": result.http_status,
        },
        "last_alert": previous.get("last_alert"),
    }
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
    evaluation = evaluate(cfg, deep=runs % cfg.deep_every == 0 or last_state != HEALTHY)
    cause, diagnosis = evaluation.explain(journal_hint(cfg))
    outcome = evaluation.outcome
    failures = _count(previous.get("consecutive_failures")) + 1 if outcome.state == UNHEALTHY else 0
    result = Result(
        endpoint=cfg.endpoint,
        host=socket.gethostname(),
        state=outcome.state,
        diagnosis=diagnosis,
        cause=cause,
        checked_at=datetime.now(UTC).isoformat(timespec="seconds"),
        http_status=outcome.http_status,
        deep_check=outcome.deep,
        unit=evaluation.unit.describe() if evaluation.unit else "unknown",
        consecutive_failures=failures,
    )
    alerted_now = should_alert(previous, result, cfg)
    recovered = bool(previous.get("alerted")) and result.state == HEALTHY
    result = replace(result, alerting=(bool(previous.get("alerted")) or alerted_now) and not recovered)
    if alerted_now:
        result = alert(cfg, result, evaluation, stream)
    elif recovered:
        notify(result, "recovered", stream)
    result = replace(result, duration_seconds=round(time.monotonic() - started, 3))
    save_state(state_path, update_state(previous, result, runs, alerted_now), stream)
    write_textfile(cfg, result, stream)
    return result, human_line(cfg, result, alerted_now, recovered)


def human_line(cfg: Config, result: Result, alerted_now: bool, recovered: bool) -> str:
    """The run's one journal line, its sd-daemon prefix choosing the priority."""
    name, count = result.endpoint, result.consecutive_failures
    if recovered:
        return f"<{NOTICE}>{name} recovered: healthy again after the alert; {result.diagnosis}"
    if result.state != UNHEALTHY:
        return f"<{INFO}>{name} {result.state}: {result.diagnosis}"
    if alerted_now:
        checks = f"{count} check{'s' if count > 1 else ''} in a row (~{count * cfg.interval_seconds:g} s)"
        mentioned = not result.evidence or result.evidence in result.diagnosis
        saved = "" if mentioned else f"; evidence: {result.evidence}"
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
        save_evidence(path, result, evaluation.logs)
    except OSError as exc:
        emit(stream, WARNING, f"{cfg.endpoint}: cannot save evidence to {path}: {exc}")
        _, diagnosis = evaluation.explain(journal_hint(cfg))
        result = replace(result, diagnosis=diagnosis, evidence=None)
    notify(result, "alert", stream)
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
        ("docker logs", logs.docker or "(no container to read: it exited or was removed)\n"),
        ("journal of the unit", logs.journal or "(journal not readable)\n"),
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


def notify(result: Result, event: str, stream: TextIO) -> None:
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
    ]
    try:
        atomic_write(Path(cfg.textfile_dir) / TEXTFILE_NAME, "\n".join(lines) + "\n", 0o644)
    except OSError as exc:
        emit(stream, WARNING, f"cannot write {TEXTFILE_NAME} to {cfg.textfile_dir}: {exc}")


# --- entry point ---------------------------------------------------------------------------------------


WAIT_INTERVAL_SECONDS = 5
WAIT_UNHEALTHY_RUNS = 3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Check the health of this Spark's vLLM endpoint once.")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"health config (default {DEFAULT_CONFIG})")
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
