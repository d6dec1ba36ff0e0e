"""`sparkfleet bench`: how well each endpoint serves, measured from where clients run, kept with what produced it.

Health checks say an endpoint answers, not how well: seed 004's three missing flags (`--moe-backend marlin`,
`--kv-cache-dtype fp8`, `--attention-backend flashinfer`) cost 34 points of MTP acceptance with every check
green. A bench runs N parallel streaming chat completions per endpoint for S seconds and measures time to
first token, decode tokens/s, end-to-end latency, errors, and MTP acceptance over the run (vLLM's spec-decode
counters on `/metrics`, read before and after). "The serving config is part of the model": every result is
recorded with the container's exact argv, the image digest, the weights' manifest digest, driver and toolkit
versions (read once per host over SSH by the status reporter), as one JSON line in
`$SPARKFLEET_HOME/bench/<host>.jsonl`. `sparkfleet rollout --bench` compares each batch with those records
(Gate, below).
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console
from rich.live import Live
from rich.table import Table

from sparkfleet import secrets, status, tables
from sparkfleet.endpoint import Endpoint, endpoint_url
from sparkfleet.recipes import Expected
from sparkfleet.remote.status import parse_metrics
from sparkfleet.runner import load_hosts, quiet_pyinfra

RECORD_VERSION = 1
REQUEST_TIMEOUT = 120.0  # seconds without a byte before a stream counts as failed
WARMUP_TIMEOUT = 300.0  # the first request after a start compiles kernels (~25 s on a Spark)
ERROR_PAUSE = 1.0  # a stream that failed waits this long before its next request, so a dead endpoint is not hammered
DEFAULT_TOLERANCE = 0.15
# The figures the rollout gate compares, in the order its message names them.
FIGURES = {"mtp_acceptance": "MTP acceptance", "tokens_per_second": "tokens/s per stream",
           "aggregate_tokens_per_second": "aggregate tokens/s"}
# What a record's config must match for an earlier known-good record to describe what runs now.
CONFIG_KEYS = ("argv", "image_digest", "model_revision", "driver", "toolkit")
WORDS = ("fleet", "spark", "model", "token", "serve", "cache", "batch", "graph", "queue", "power", "steady", "green")


@dataclass(frozen=True)
class Load:
    """What a bench asks of each endpoint; records are compared only between runs of the same load."""

    concurrency: int = 4
    duration: float = 30.0
    prompt_tokens: int = 512
    max_tokens: int = 256


@dataclass(frozen=True)
class Target:
    """One endpoint as a client reaches it."""

    host: str
    url: str
    served_name: str
    api_key: str | None
    recipe: str
    expected: Expected | None = None


def target(spark: Endpoint, ssh_hostname: str | None, served_name: str | None = None) -> Target:
    """`served_name`: what the host serves now (the status reporter's), which a rollout may be about to change."""
    reference = spark.config.vllm_api_key
    return Target(spark.host, endpoint_url(spark, ssh_hostname), served_name or spark.served_name,
                  secrets.resolve(reference) if reference else None, spark.recipe.name, spark.recipe.expected)


# --- statistics ------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) with linear interpolation between the two nearest samples; None without any."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def acceptance_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """MTP acceptance over the run: accepted / drafted tokens between two /metrics reads; None without MTP
    (no spec-decode counters), without a read, or when nothing was drafted in between."""
    if before is None or after is None or "draft_tokens" not in after:
        return None
    drafted = after["draft_tokens"] - before.get("draft_tokens", 0.0)
    accepted = after.get("accepted_tokens", 0.0) - before.get("accepted_tokens", 0.0)
    return round(accepted / drafted, 4) if drafted > 0 else None


# --- one streaming request -------------------------------------------------------------------------------


def sse_events(lines: Iterable[bytes]) -> Iterator[str]:
    """The data of each server-sent event: `data:` lines joined by newlines, an empty line ends an event."""
    data: list[str] = []
    for raw in lines:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
            data = []
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def generated(chunk: dict[str, Any]) -> bool:
    """Whether a chat completion chunk carries generated output (answer, reasoning or a tool call)."""
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if any(delta.get(key) for key in ("content", "reasoning_content", "reasoning", "tool_calls")):
            return True
    return False


@dataclass
class Sample:
    """One request's timeline (monotonic seconds) and its generated tokens, or why it failed."""

    start: float
    first: float | None = None  # first generated token
    last: float | None = None  # last generated token
    end: float | None = None
    tokens: int = 0
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.start

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.start

    @property
    def decode_rate(self) -> float | None:
        """Tokens/s after the first token; None when fewer than two tokens arrived apart."""
        if self.first is None or self.last is None or self.tokens < 2 or self.last <= self.first:
            return None
        return (self.tokens - 1) / (self.last - self.first)


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return kind(parts.hostname or "", parts.port, timeout=timeout), parts.path.rstrip("/")


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}


def _reason(code: int, body: bytes) -> str:
    """An error answer in one line: vLLM's error message when it gave one."""
    try:
        error = json.loads(body).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    text = message or body.decode("utf-8", "replace").strip()[:200]
    return f"HTTP {code}" + (f": {text}" if text else "")


def stream(target: Target, body: dict[str, Any], timeout: float = REQUEST_TIMEOUT) -> Sample:
    """POST one streaming chat completion and time it; never raises (a failure is the sample's error)."""
    connection, path = _connection(target.url, timeout)
    sample = Sample(time.monotonic())
    usage_tokens = None
    try:
        connection.request("POST", f"{path}/v1/chat/completions", json.dumps(body), _headers(target.api_key))
        response = connection.getresponse()
        if response.status != 200:
            sample.error = _reason(response.status, response.read())
            return sample
        for data in sse_events(response):
            if data == "[DONE]":
                sample.end = time.monotonic()
                break
            chunk = json.loads(data)
            if chunk.get("error"):
                sample.error = f"error in the stream: {chunk['error']}"
                return sample
            if generated(chunk):
                sample.last = time.monotonic()
                sample.first = sample.first or sample.last
                sample.tokens += 1
            usage_tokens = (chunk.get("usage") or {}).get("completion_tokens", usage_tokens)
        else:
            sample.error = "the stream ended without [DONE]"
    except (OSError, http.client.HTTPException, ValueError) as error:
        sample.error = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    finally:
        connection.close()
    # With MTP a chunk may carry several tokens: the server's own count is the true one.
    sample.tokens = usage_tokens if isinstance(usage_tokens, int) and usage_tokens > 0 else sample.tokens
    return sample


def read_metrics(target: Target) -> dict[str, float] | None:
    """vLLM's counters from /metrics; None when the endpoint does not serve them."""
    connection, path = _connection(target.url, 10)
    try:
        connection.request("GET", f"{path}/metrics", headers=_headers(target.api_key))
        response = connection.getresponse()
        text = response.read().decode("utf-8", "replace")
        return parse_metrics(text) if response.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()


def prompt_text(tokens: int, nonce: str) -> str:
    """About `tokens` tokens (a common word is one), led by a nonce so prefix caching cannot skip the prefill."""
    words = " ".join(WORDS[k % len(WORDS)] for k in range(max(0, tokens - 16)))
    return f"Request {nonce}. Repeat these words back, one per line, then keep going: {words}"


def request_body(served_name: str, load: Load) -> dict[str, Any]:
    """`ignore_eos` (as `vllm bench` sends it) makes every reply max_tokens long, so runs compare."""
    return {"model": served_name, "messages": [{"role": "user", "content": prompt_text(load.prompt_tokens,
                                                                                     uuid.uuid4().hex)}],
            "max_tokens": load.max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}


# --- one endpoint under load -----------------------------------------------------------------------------


@dataclass
class Figures:
    """What a run measured; seconds for latencies, None where nothing was measured."""

    requests: int = 0
    errors: int = 0
    error: str | None = None  # the first failure, in its own words
    ttft_p50: float | None = None
    ttft_p95: float | None = None
    tokens_per_second: float | None = None  # decode rate of one stream (median over requests)
    aggregate_tokens_per_second: float | None = None  # every stream's tokens over the run's wall time
    e2e_p50: float | None = None
    e2e_p95: float | None = None
    mtp_acceptance: float | None = None
    seconds: float | None = None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def figures(samples: Sequence[Sample], seconds: float | None, acceptance: float | None = None) -> Figures:
    """A run's figures from its requests; latencies and rates count only the requests that completed."""
    ok = [s for s in samples if s.error is None]
    failed = [s for s in samples if s.error is not None]
    ttfts = [s.ttft for s in ok if s.ttft is not None]
    e2es = [s.e2e for s in ok if s.e2e is not None]
    rates = [s.decode_rate for s in ok if s.decode_rate is not None]
    tokens = sum(s.tokens for s in ok)
    return Figures(
        requests=len(ok), errors=len(failed), error=failed[0].error if failed else None,
        ttft_p50=_round(percentile(ttfts, 0.5), 4), ttft_p95=_round(percentile(ttfts, 0.95), 4),
        tokens_per_second=_round(percentile(rates, 0.5), 2),
        aggregate_tokens_per_second=round(tokens / seconds, 2) if seconds and tokens else None,
        e2e_p50=_round(percentile(e2es, 0.5), 4), e2e_p95=_round(percentile(e2es, 0.95), 4),
        mtp_acceptance=acceptance, seconds=_round(seconds, 2),
    )


class Probe:
    """One endpoint under load: a warm-up request, /metrics, N streams until the duration is up, /metrics."""

    def __init__(self, target: Target, load: Load) -> None:
        self.target, self.load = target, load
        self.samples: list[Sample] = []
        self.in_flight = 0
        self.started: float | None = None
        self.finished: float | None = None
        self.failure: str | None = None  # the endpoint could not be benched at all
        self.acceptance: float | None = None
        self._lock = threading.Lock()

    def run(self) -> None:
        warm = stream(self.target, {**request_body(self.target.served_name, self.load), "max_tokens": 1,
                                    "ignore_eos": False}, WARMUP_TIMEOUT)
        if warm.error:
            self.failure = f"warm-up request failed: {warm.error}"
            self.finished = time.monotonic()
            return
        before = read_metrics(self.target)
        self.started = time.monotonic()
        streams = [threading.Thread(target=self._stream_until, args=(self.started + self.load.duration,))
                   for _ in range(self.load.concurrency)]
        for thread in streams:
            thread.start()
        for thread in streams:
            thread.join()
        self.finished = time.monotonic()
        self.acceptance = acceptance_delta(before, read_metrics(self.target))

    def _stream_until(self, deadline: float) -> None:
        """Request after request until the deadline; the one running then finishes and counts."""
        while time.monotonic() < deadline:
            with self._lock:
                self.in_flight += 1
            sample = stream(self.target, request_body(self.target.served_name, self.load))
            with self._lock:
                self.in_flight -= 1
                self.samples.append(sample)
            if sample.error:
                time.sleep(ERROR_PAUSE)

    def figures(self) -> Figures:
        """What was measured so far (the live view) or in all (once finished)."""
        with self._lock:
            samples = list(self.samples)
        end = self.finished or time.monotonic()
        result = figures(samples, end - self.started if self.started else None, self.acceptance)
        if self.failure:
            result.errors, result.error = result.errors + 1, self.failure
        return result


def measure(probes: list[Probe], tick: Callable[[], None] = lambda: None, every: float = 0.25) -> None:
    """Run every probe at once (each endpoint is its own machine), calling `tick` until all are done."""
    threads = [threading.Thread(target=probe.run, daemon=True) for probe in probes]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        tick()
        time.sleep(every)
    tick()


# --- records ---------------------------------------------------------------------------------------------


def home() -> Path:
    """`$SPARKFLEET_HOME`, else `$XDG_DATA_HOME/sparkfleet` (`~/.local/share/sparkfleet`)."""
    if os.environ.get("SPARKFLEET_HOME"):
        return Path(os.environ["SPARKFLEET_HOME"]).expanduser()
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "sparkfleet"


def records_path(host: str) -> Path:
    return home() / "bench" / f"{host.replace('/', '_')}.jsonl"


def append(record: dict[str, Any]) -> Path:
    path = records_path(record["host"])
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(record, sort_keys=True) + "\n")
    return path


def read(host: str) -> list[dict[str, Any]]:
    """A host's records, oldest first; a line that is not a record (a write cut short) is skipped."""
    try:
        lines = records_path(host).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("config"), dict):
            records.append(record)
    return records


def serving_config(report: dict[str, Any] | None, error: str | None, model: str) -> dict[str, Any]:
    """The config a result belongs to, from the status reporter's `--serving` answer (None: unread, and why)."""
    serving = (report or {}).get("serving")
    if not isinstance(serving, dict):
        why = error or ("the status reporter gave no serving configuration: deploy this host to install the "
                        "current one")
        return {key: None for key in (*CONFIG_KEYS, "image", "hostname")} | {"error": why}
    return {
        "argv": serving.get("argv"), "image": serving.get("image"), "image_digest": serving.get("image_digest"),
        "model_revision": serving.get("weights_digest") or model, "driver": serving.get("driver"),
        "toolkit": (report or {}).get("toolkit_version"), "hostname": (report or {}).get("host"), "error": None,
    }


def versus_recipe(result: Figures, expected: Expected | None, load: Load) -> list[dict[str, Any]]:
    """Each figure the recipe states (a floor), against this run's; tokens/s only at the same concurrency."""
    if expected is None:
        return []
    wanted = {"mtp_acceptance": expected.mtp_acceptance}
    if expected.concurrency == load.concurrency:
        wanted["tokens_per_second"] = expected.tokens_per_second
    rows = []
    for name, floor in wanted.items():
        measured = getattr(result, name)
        if floor is not None:
            rows.append({"figure": name, "expected": floor, "measured": measured,
                         "meets": measured is not None and measured >= floor, "source": expected.source})
    return rows


def make_record(target: Target, load: Load, result: Figures, config: dict[str, Any], started_at: str,
                run: str) -> dict[str, Any]:
    """One JSON line: the figures, the config that produced them, the load and where it ran.

    `run` is `bench`, `baseline` (a rollout's reference, taken before its batch) or `gate` (a rollout batch);
    `known_good` is set by the rollout once the record passed its gate.
    """
    return {
        "version": RECORD_VERSION, "host": target.host, "url": target.url, "served_name": target.served_name,
        "recipe": target.recipe, "started_at": started_at, "run": run, "known_good": False,
        "load": asdict(load), **asdict(result), "config": config,
        "versus_recipe": versus_recipe(result, target.expected, load),
    }


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def reference(records: Iterable[dict[str, Any]], config: dict[str, Any], load: Load) -> dict[str, Any] | None:
    """The last known-good record of this load on this very config (a record of another config is not what
    the host would be rolled back to); None when the config could not be read."""
    if config.get("error"):
        return None
    wanted = [config.get(key) for key in CONFIG_KEYS]
    matches = [r for r in records if r.get("known_good") and r.get("load") == asdict(load)
               and [r["config"].get(key) for key in CONFIG_KEYS] == wanted]
    return matches[-1] if matches else None


# --- comparing two records ---------------------------------------------------------------------------------


def argv_flags(argv: Sequence[str] | None) -> dict[str, str]:
    """`--flag value` pairs of an argv (`--flag=value` too; a flag without a value maps to ""); the words
    before the first flag (program, subcommand, model) are one entry under the key ""."""
    flags: dict[str, str] = {}
    current = ""
    for word in argv or []:
        if word.startswith("--"):
            current, _, value = word.partition("=")
            flags[current] = value
        else:
            flags[current] = f"{flags.get(current, '')} {word}".strip()
    return flags


def _flag(name: str, value: str) -> str:
    return f"{name} {value}".strip()


def _short(value: object) -> str:
    """Digests cut to 12 hex digits: enough to tell two apart in a message."""
    text = str(value)
    head, at, digest = text.rpartition("@")
    if digest.startswith("sha256:"):
        return f"{head}{at}{digest[:19]}…"
    return f"{text[:12]}…" if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text


def config_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What differs between two configs, in words: flags added, removed or changed, image, weights, versions."""
    changes = []
    if before.get("argv") is not None and after.get("argv") is not None:
        old, new = argv_flags(before["argv"]), argv_flags(after["argv"])
        for name in old.keys() - new.keys():
            changes.append(f"removed {_flag(name, old[name])}")
        for name in new.keys() - old.keys():
            changes.append(f"added {_flag(name, new[name])}")
        for name in old.keys() & new.keys():
            if old[name] != new[name]:
                changes.append(f"{name or 'command'} {old[name] or '(set)'} → {new[name] or '(set)'}")
        changes.sort(key=lambda line: (not line.startswith("removed"), not line.startswith("added"), line))
    for key, word in (("image_digest", "image"), ("model_revision", "weights"), ("driver", "driver"),
                      ("toolkit", "toolkit")):
        if before.get(key) != after.get(key):
            changes.append(f"{word} {_short(before.get(key))} → {_short(after.get(key))}")
    return changes


def show(name: str, value: float | None) -> str:
    if value is None:
        return "none"
    return f"{value * 100:.1f}%" if name == "mtp_acceptance" else f"{value:.1f}"


@dataclass
class Verdict:
    """A gate bench against its reference: the figures that dropped beyond the tolerance and what changed."""

    passed: bool
    drops: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    figures: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)  # before, after
    reference: str | None = None  # when the reference record was taken

    def as_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "message": self.message(), "drops": self.drops, "changes": self.changes,
                "figures": {name: {"before": old, "after": new} for name, (old, new) in self.figures.items()},
                "reference": self.reference}

    def message(self) -> str:
        if self.passed:
            shown = ", ".join(f"{FIGURES[name]} {show(name, old)} → {show(name, new)}"
                              for name, (old, new) in self.figures.items() if new is not None)
            return f"bench: {shown or 'no figures'}" + ("" if self.reference else " (no known-good record to "
                                                         "compare with)")
        text = f"bench dropped: {'; '.join(self.drops)}"
        if self.reference is None:
            return text
        return f"{text}; config since the known-good record of {self.reference}: " + (
            ", ".join(self.changes) or "no difference (the host itself changed?)")


def compare(before: dict[str, Any] | None, after: dict[str, Any], tolerance: float) -> Verdict:
    """Fail on a drop of more than `tolerance` (a fraction) in any FIGURES, or on more failed requests.

    A figure the reference lacks (no MTP before) is not compared; one the new run lacks is a drop to nothing.
    Without a reference only failed requests fail the gate.
    """
    verdict = Verdict(True, reference=before["started_at"] if before else None)
    if before is not None:
        verdict.changes = config_changes(before["config"], after["config"])
    for name, label in FIGURES.items():
        old, new = (before or {}).get(name), after.get(name)
        verdict.figures[name] = (old, new)
        if old is None:
            continue
        if new is None or new < old * (1 - tolerance):
            change = f" ({(new - old) / old:+.0%})" if new is not None and old else ""
            verdict.drops.append(f"{label} {show(name, old)} → {show(name, new)}{change}")
    old_errors = (before or {}).get("errors", 0)
    if after["errors"] > old_errors or not after["requests"]:
        verdict.drops.append(f"failed requests {old_errors} → {after['errors']}"
                             + (f" ({after['error']})" if after.get("error") else ""))
    verdict.passed = not verdict.drops
    return verdict


# --- rendering ---------------------------------------------------------------------------------------------


def _seconds(*values: float | None) -> str:
    return "/".join("-" if value is None else f"{value:.2f}" for value in values)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def live_table(probes: list[Probe], load: Load, console: Console) -> Table:
    """While it runs: per endpoint, what was measured so far (80 columns)."""
    table = tables.table(console, f"bench: {load.concurrency} streams per endpoint for {load.duration:g} s")
    for column in ("host", "done", "running", "err", "TTFT s\np50", "tok/s\nstream", "tok/s\nall", "time"):
        table.add_column(column, justify="left" if column == "host" else "right", no_wrap=column != "host")
    for probe in probes:
        result = probe.figures()
        state = "failed" if probe.failure else "warm-up" if probe.started is None else f"{result.seconds or 0:.0f} s"
        table.add_row(probe.target.host, str(result.requests), str(probe.in_flight), str(result.errors),
                      _seconds(result.ttft_p50), _number(result.tokens_per_second),
                      _number(result.aggregate_tokens_per_second), state)
    return table


def summary_table(records: list[dict[str, Any]], console: Console) -> Table:
    """Per endpoint, the run's figures; latencies in seconds as p50/p95 (80 columns)."""
    table = tables.table(console, "sparkfleet bench")
    for column in ("host", "req", "err", "TTFT s\np50/p95", "tok/s\nstream", "tok/s\nall", "e2e s\np50/p95",
                   "MTP\naccept"):
        table.add_column(column, justify="left" if column == "host" else "right", no_wrap=column != "host")
    for r in records:
        errors = f"[bold red]{r['errors']}[/]" if r["errors"] else "0"
        table.add_row(r["host"], str(r["requests"]), errors, _seconds(r["ttft_p50"], r["ttft_p95"]),
                      _number(r["tokens_per_second"]), _number(r["aggregate_tokens_per_second"]),
                      _seconds(r["e2e_p50"], r["e2e_p95"]), show("mtp_acceptance", r["mtp_acceptance"]))
    return table


def notes(record: dict[str, Any]) -> list[str]:
    """The lines under the table: failures, the config, how the host compares with its recipe."""
    host, config = record["host"], record["config"]
    lines = [f"[bold red]{host}[/]: {record['error']}"] if record.get("error") else []
    if config.get("error"):
        lines.append(f"{host}: config not recorded: {config['error']}")
    else:
        lines.append(f"{host}: {_short(config['image_digest'])}, weights {_short(config['model_revision'])}, "
                     f"driver {config['driver'] or '?'}, toolkit {config['toolkit'] or '?'}")
    for row in record["versus_recipe"]:
        verdict = "[green]meets[/]" if row["meets"] else "[bold red]is below[/]"
        lines.append(f"{host}: {FIGURES[row['figure']]} {show(row['figure'], row['measured'])} {verdict} "
                     f"{record['recipe']}'s {show(row['figure'], row['expected'])}")
    return lines


def sources(records: list[dict[str, Any]]) -> list[str]:
    """Where each recipe's expected figures come from, once per recipe."""
    found = {r["recipe"]: row["source"] for r in records for row in r["versus_recipe"]}
    return [f"{recipe}'s figures: {source}" for recipe, source in found.items()]


# --- the command -------------------------------------------------------------------------------------------


def positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text}: give a number above 0")
        return value
    return parse


def add_load_arguments(command: argparse.ArgumentParser, prefix: str = "") -> None:
    """--concurrency and --duration (`prefix` for the rollout's --bench-…); the defaults are Load's."""
    command.add_argument(f"--{prefix}concurrency", type=positive(int), default=Load.concurrency, metavar="N",
                         help=f"parallel streams per endpoint (default {Load.concurrency})")
    command.add_argument(f"--{prefix}duration", type=positive(float), default=Load.duration, metavar="S",
                         help=f"seconds of load per endpoint (default {Load.duration:g})")


def add_parser(commands: argparse._SubParsersAction,
               add_targeting: Callable[[argparse.ArgumentParser], None]) -> None:
    bench = commands.add_parser(
        "bench", help="measure TTFT, tokens/s, latency and MTP acceptance per endpoint, recorded with its config",
        description="Run parallel streaming chat completions against every targeted endpoint from this "
        "controller, then record each result with the exact config that produced it.")
    add_targeting(bench)
    add_load_arguments(bench)
    bench.add_argument("--prompt-tokens", type=positive(int), default=Load.prompt_tokens, metavar="P",
                       help=f"prompt length in tokens, about (default {Load.prompt_tokens})")
    bench.add_argument("--max-tokens", type=positive(int), default=Load.max_tokens, metavar="T",
                       help=f"tokens generated per request (default {Load.max_tokens})")


def read_configs(state: Any, hosts: list[Any], endpoints: dict[str, Endpoint]) -> dict[str, tuple[dict, str | None]]:
    """Each host's serving config and the name it serves now, read over SSH by the status reporter."""
    answers = status.probe(state, hosts, lambda host: "--serving")
    return {answer.host: (serving_config(answer.status, answer.error, endpoints[answer.host].model_revision),
                          (answer.status or {}).get("served_name")) for answer in answers}


def run_probes(targets: list[Target], load: Load, console: Console | None) -> list[Probe]:
    """Bench every target at once; with a console on a terminal, a live table while it runs."""
    probes = [Probe(target, load) for target in targets]
    if console is None or not console.is_terminal:
        measure(probes)
        return probes
    with Live(live_table(probes, load, console), console=console, refresh_per_second=4, transient=True) as live:
        measure(probes, lambda: live.update(live_table(probes, load, console)))
    return probes


def main(args: argparse.Namespace) -> int:
    """Exit 0 when every targeted endpoint served the whole run without a failed request, else 1."""
    from sparkfleet.fleet import GATEWAYS, load_fleet

    console = Console(stderr=args.json)
    quiet_pyinfra()
    state, targeted = load_hosts(args.inventory, args.limit, args.data)
    hosts = [host for host in targeted if GATEWAYS not in host.groups]  # a gateway serves no model of its own
    endpoints, _ = load_fleet({host.name: host.data.dict() for host in hosts})
    serving = [host for host in hosts if endpoints[host.name].config.vllm_start]
    for host in hosts:
        if host not in serving:
            console.print(f"{host.name}: not benched: vllm_start is false (nothing serves there)")
    if not serving:
        console.print("bench: no targeted host serves an endpoint")
        return 1
    load = Load(args.concurrency, args.duration, args.prompt_tokens, args.max_tokens)
    configs = read_configs(state, serving, endpoints)
    targets = [target(endpoints[h.name], h.data.get("ssh_hostname"), configs[h.name][1]) for h in serving]
    started_at = now()
    probes = run_probes(targets, load, console)
    records = [make_record(p.target, load, p.figures(), configs[p.target.host][0], started_at, "bench")
               for p in probes]
    for record in records:
        append(record)
    if args.json:
        sys.stdout.write(json.dumps(records, indent=2) + "\n")
    else:
        console.print(summary_table(records, console))
        for line in [line for record in records for line in notes(record)] + sources(records):
            console.print(line, highlight=False)
        console.print(f"recorded in {home() / 'bench'}/<host>.jsonl", highlight=False)
    return 0 if all(r["requests"] and not r["errors"] for r in records) else 1


# --- the rollout gate --------------------------------------------------------------------------------------


class Gate:
    """`rollout --bench`: a batch passes only when each gated host serves as well as its last known-good record.

    Before a batch changes its hosts, each needs a reference: the last known-good record of the same load on
    the config it runs now, else a baseline bench taken there and then (the host is serving; a clean baseline
    is known-good). After the batch's health gate each host is benched again and compared (`compare`); the
    new records become known-good only when the whole batch passed.
    """

    def __init__(self, state: Any, hosts: dict[str, Any], endpoints: dict[str, Endpoint], load: Load,
                 tolerance: float, say: Callable[[str], None]) -> None:
        """`hosts`: the gated hosts by name (pyinfra Host objects, for reading their config over SSH)."""
        self.state, self.hosts, self.endpoints = state, hosts, endpoints
        self.load, self.tolerance, self.say = load, tolerance, say
        self.references: dict[str, dict[str, Any] | None] = {}
        self.verdicts: dict[str, Verdict] = {}
        self._pending: dict[str, dict[str, Any]] = {}
        quiet_pyinfra()

    def _configs(self, members: list[str]) -> dict[str, tuple[dict, str | None]]:
        return read_configs(self.state, [self.hosts[name] for name in members], self.endpoints)

    def _bench(self, members: list[str], run: str, configs: dict[str, tuple[dict, str | None]]) -> list[dict]:
        targets = [target(self.endpoints[name], self.hosts[name].data.get("ssh_hostname"), configs[name][1])
                   for name in members]
        self.say(f"bench ({run}) of {', '.join(members)}: {self.load.concurrency} streams for "
                 f"{self.load.duration:g} s")
        started_at = now()
        probes = run_probes(targets, self.load, None)
        return [make_record(p.target, self.load, p.figures(), configs[p.target.host][0], started_at, run)
                for p in probes]

    def prepare(self, members: list[str]) -> None:
        """Find or take each host's reference while it still runs its current config."""
        configs = self._configs(members)
        for name in members:
            self.references[name] = reference(read(name), configs[name][0], self.load)
        missing = [name for name in members if self.references[name] is None]
        for record in self._bench(missing, "baseline", configs) if missing else []:
            clean = bool(record["requests"]) and not record["errors"]
            record["known_good"] = clean and not record["config"]["error"]
            append(record)
            self.references[record["host"]] = record if clean else None

    def check(self, members: list[str]) -> dict[str, str]:
        """Bench the batch after its health gate; the hosts that failed, each with the gate's message."""
        for record in self._bench(members, "gate", self._configs(members)):
            name = record["host"]
            self._pending[name] = record
            self.verdicts[name] = compare(self.references.get(name), record, self.tolerance)
        return {name: self.verdicts[name].message() for name in members if not self.verdicts[name].passed}

    def commit(self, members: list[str], passed: bool) -> None:
        """Record the batch's gate benches; known-good only when the batch as a whole passed."""
        for name in members:
            record = self._pending.pop(name, None)
            if record is not None:
                record["known_good"] = passed and self.verdicts[name].passed
                append(record)
