"""`sparkfleet doctor`: every targeted host's recipe rules and host preflight, before anything changes.

The inventory is loaded exactly as the pyinfra CLI loads it (group data, `--data` overrides, `--limit`), so
doctor judges the hosts and values a deploy would use. Hosts whose inventory is bad are reported without a
connection; the others are reached over SSH and read once (SparkFacts). A pair is judged as one: targeting either
host reads both, the pair's inventory rules and the checks across its hosts (pair_checks) show on both. A gateway
(group `gateways`) is judged on its variables and the Sparks it would route, and reached over SSH.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Literal

from pyinfra.api import Host, State
from pyinfra.api.facts import get_fact
from rich.console import Console

from sparkfleet import pair_checks, pairs, rules, tables
from sparkfleet.endpoint import Endpoint
from sparkfleet.fleet import GATEWAYS, FleetError, load_endpoint, load_inventory, with_weights
from sparkfleet.generations import SourceError
from sparkfleet.memory import SPARK_MEMORY_BYTES, budget, explain
from sparkfleet.preflight import (
    Facts,
    SparkFacts,
    checkpoint_size,
    host_checks,
    host_findings,
    host_summary,
    preflight_query,
)
from sparkfleet.runner import SSH_ERRORS, cannot_connect, connected, each, load_hosts, run_shell

Status = Literal["ok", "warning", "error"]
NOMINAL_MEMORY_RULES = ("capacity.memory", "capacity.memory-tight")  # superseded by host.memory once read
COLOURS = {"ok": "green", "warning": "yellow", "error": "bold red"}
# The variable each always-run host check judges, for its `ok` row (its findings name their own field).
HOST_FIELDS = {"host.arch": "vllm_image", "host.os": "host", "host.docker": "host", "host.gpu": "host",
               "host.memory": "vllm_args.gpu-memory-utilization", "host.disk": "model_dir", "host.port": "vllm_port",
               "host.dropin": "host"}
# The same for the checks a pair's hosts add: their own fabric interface, then those across both.
PAIR_FIELDS = {"host.fabric": "pair.interface", "pair.image": "vllm_image", "pair.weights": "model_source",
               "pair.master": "pair.master_port"}
_FIELD = re.compile(r"^`([^`]+)`")


@dataclass(frozen=True)
class Row:
    rule: str
    status: Status
    field: str
    message: str

    @classmethod
    def of(cls, finding: rules.Finding) -> Row:
        return cls(finding.rule, finding.severity, finding.field, finding.message)


@dataclass
class HostReport:
    """One host's verdict: a row per check, and what the explanation and `--json` need."""

    host: str
    rows: list[Row] = field(default_factory=list)
    endpoint: Endpoint | None = None
    facts: Facts | None = None

    @property
    def status(self) -> Status:
        statuses = {row.status for row in self.rows}
        return "error" if "error" in statuses else "warning" if "warning" in statuses else "ok"

    def budget_terms(self) -> list[tuple[str, str]]:
        """The memory budget term by term, on this host's MemTotal when it was read, else a nominal Spark's."""
        if self.endpoint is None:
            return []
        memory = (self.facts or {}).get("mem_total") or SPARK_MEMORY_BYTES
        try:
            return explain(budget(self.endpoint, memory))
        except (TypeError, ValueError):
            return []  # flag.number already says which flag is not a number

    def as_dict(self, with_budget: bool) -> dict[str, object]:
        data: dict[str, object] = {"host": self.host, "status": self.status,
                                   "rows": [asdict(row) for row in self.rows], "facts": self.facts}
        if with_budget:
            data["budget"] = dict(self.budget_terms())
        return data


def inventory_row(host: str, error: str) -> Row:
    """An inventory error as a row; its field is the variable the sentence starts with (`name` ...)."""
    message = error.removeprefix(f"{host}: ")
    found = _FIELD.match(message)
    return Row("inventory", "error", found.group(1) if found else "", message)


def recipe_rows(name: str, data: dict[str, object]) -> tuple[Endpoint | None, list[Row]]:
    """The inventory and recipe verdict of one host, as `deploy.py` would reach it (fleet.load_endpoint)."""
    endpoint, errors, _ = load_endpoint(name, data)
    if endpoint is None:
        return None, [inventory_row(name, error) for error in errors]
    try:
        endpoint = with_weights(endpoint)
    except SourceError as error:  # the host checks need the generation's directory: they wait for a fix
        return None, [inventory_row(name, error) for error in errors] + [
            Row("source.resolve", "error", "model_source", str(error))]
    findings = rules.check(endpoint)
    ruled = {f"{name}: `{f.field}`: {f.message} [{f.rule}]" for f in findings}
    rows = [inventory_row(name, error) for error in errors if error not in ruled]
    rows += [Row.of(finding) for finding in findings]
    if not rows:
        rows.append(Row("recipe", "ok", "vllm_recipe", f"{endpoint.recipe.name}: flag, capacity and platform "
                        "rules pass"))
    return endpoint, rows


def host_rows(endpoint: Endpoint, facts: Facts) -> list[Row]:
    """A row per always-run check (`ok` with what it saw, or its findings), then any other finding."""
    size = checkpoint_size(endpoint)
    findings = host_findings(endpoint, facts, size)
    summary = host_summary(endpoint, facts, size)
    rows = []
    checks = host_checks(endpoint)
    for check in checks:
        mine = [Row.of(f) for f in findings if f.rule == check]
        rows += mine or [Row(check, "ok", HOST_FIELDS.get(check) or PAIR_FIELDS[check], summary[check])]
    return rows + [Row.of(f) for f in findings if f.rule not in checks]


def master_query(endpoint: Endpoint) -> dict[str, object]:
    """A pair's worker tries its head's master port (doctor's query only: a deploy never opens connections)."""
    pair = endpoint.config.pair
    if pair is None or endpoint.role != "worker":
        return {}
    return {"master": {"address": pair.master_addr, "port": pair.master_port}}


def read_host(state: State, host: Host, endpoint: Endpoint) -> Facts | str:
    """SparkFacts of one host, or why it could not be read (the message of `host.unreachable`)."""
    try:
        with connected(host):
            query = json.dumps(preflight_query(endpoint) | master_query(endpoint))
            facts = get_fact(state, host, SparkFacts, kwargs={"query": query}, apply_failed_hosts=False)
    except SSH_ERRORS as error:
        return f"{cannot_connect(error)}: check ssh_hostname, ssh_user, keys"
    if facts is None:
        return ("connected, but the preflight gave no usable answer (python3 missing, or output that is not one "
                "JSON object: the error printed above says which); run `pyinfra INVENTORY fact server.Os` to see "
                "the host's answer")
    return facts


def gateway_rows(state: State, host: Host) -> list[Row]:
    """A gateway's verdict: its variables and the Sparks it would route (fleet.load_inventory, as deploy.py
    judges them), then whether SSH reaches it."""
    everyone = list(state.inventory)
    try:
        fleet = load_inventory({h.name: h.data.dict() for h in everyone},
                               {h.name for h in everyone if GATEWAYS in h.groups}, {host.name})
    except FleetError as error:
        lines = str(error).splitlines()[1:]
        return [inventory_row(host.name, line.strip()) for line in lines]
    gateway = fleet.gateways[host.name]
    rows = [Row("gateway", "ok", "gateway_port", f"serves :{gateway.config.gateway_port} in front of "
                f"{len(gateway.servers)} Sparks ({', '.join(gateway.server_names)}), {gateway.config.gateway_balance}")]
    reply = run_shell(state, host, "true")
    if reply.error:
        rows.append(Row("host.unreachable", "error", "ssh_hostname", f"{reply.error}: check ssh_hostname, ssh_user, "
                        "keys"))
    return rows


def pair_inventory_rows(reports: dict[str, HostReport], data: dict[str, dict[str, object]]) -> set[str | None]:
    """The pair rules of the inventory (two hosts, one mapping, one model, one weights generation: pairs.py, as a
    deploy judges them) as rows on every host an error names; returns the pairs that broke one, or that have a host
    whose own variables are bad (their facts are not compared: the inventory is fixed first)."""
    sparks = {name: report.endpoint for name, report in reports.items() if report.endpoint is not None}
    bad = {pairs.raw_name(data[name]) for name in reports if name not in sparks} - {None}
    for error in pairs.problems(sparks, skip=bad) + pairs.weights_problems(sparks):
        names, _, message = error.partition(": ")
        for name in names.split(", "):
            reports[name].rows.append(inventory_row(name, message))
            bad.add(pairs.raw_name(data[name]))
    return bad


def pair_rows(reports: dict[str, HostReport], bad: set[str | None]) -> None:
    """The checks across each pair's two hosts (pair_checks), the same rows on both; a pair with one host unread
    is not compared, and its other host says so."""
    sparks = {name: report.endpoint for name, report in reports.items() if report.endpoint is not None}
    for pair, names in pairs.members(sparks).items():
        if pair in bad or len(names) != 2:
            continue
        first, second = (reports[name] for name in names)
        head, worker = (first, second) if first.endpoint.role == "head" else (second, first)  # type: ignore[union-attr]
        if head.facts is None or worker.facts is None:
            for report, other in ((head, worker), (worker, head)):
                if report.facts is not None:
                    report.rows.append(Row("pair", "warning", "pair", f"{pair}: {other.host} could not be read, so the "
                                           "pair was not compared (image, weights, master port): fix that first"))
            continue
        read = pair_checks.PairFacts(head.endpoint, head.facts, worker.endpoint, worker.facts)  # type: ignore[arg-type]
        found, seen = pair_checks.findings(read), pair_checks.summary(read)
        rows: list[Row] = []
        for check in pair_checks.CHECKS:
            rows += [Row.of(f) for f in found if f.rule == check] or [
                Row(check, "ok", PAIR_FIELDS[check], f"{pair}: {seen[check]}")]
        head.rows += rows
        worker.rows += rows


def targets(state: State, targeted: list[Host]) -> list[Host]:
    """The targeted hosts and the other host of every targeted pair, in inventory order: a pair is judged as one."""
    sparks = {host.name: host.data.dict() for host in state.inventory if GATEWAYS not in host.groups}
    wanted = set(pairs.partners(sparks, [host.name for host in targeted if host.name in sparks]))
    return [host for host in state.inventory if host.name in wanted or (host in targeted and host.name not in sparks)]


def diagnose(inventory: str, limits: Iterable[str] = (), data: Iterable[str] = ()) -> list[HostReport]:
    """Every targeted host's report (with the other host of a targeted pair); hosts with a bad inventory are never
    connected to."""
    state, targeted = load_hosts(inventory, limits, data)
    hosts = targets(state, targeted)
    reports: dict[Host, HostReport] = {}
    gateways = [host for host in hosts if GATEWAYS in host.groups]
    for host, rows in zip(gateways, each(state, gateways, lambda host: gateway_rows(state, host)), strict=True):
        reports[host] = HostReport(host.name, rows)
    for host in hosts:
        if host in gateways:
            continue
        endpoint, rows = recipe_rows(host.name, host.data.dict())
        reports[host] = HostReport(host.name, rows, endpoint)
    sparks = {host.name: report for host, report in reports.items() if host not in gateways}
    bad = pair_inventory_rows(sparks, {host.name: host.data.dict() for host in hosts})
    reachable = [host for host, report in reports.items() if report.endpoint is not None]
    read = each(state, reachable, lambda host: read_host(state, host, reports[host].endpoint))  # type: ignore[arg-type]
    for host, facts in zip(reachable, read, strict=True):
        report = reports[host]
        if isinstance(facts, str):
            report.rows.append(Row("host.unreachable", "error", "ssh_hostname", facts))
            continue
        report.facts = facts
        report.rows = [row for row in report.rows if row.rule not in NOMINAL_MEMORY_RULES]
        report.rows += host_rows(report.endpoint, facts)  # type: ignore[arg-type]  (reachable: endpoint set)
    pair_rows(sparks, bad)
    return [reports[host] for host in hosts]


def render(reports: list[HostReport], console: Console, explain_budget: bool) -> None:
    """One table per host, its memory budget when asked, then a one-line verdict.

    Each row names the variable to change (the field) with the rule id beneath it; light borders leave the
    message most of an 80-column terminal.
    """
    for report in reports:
        table = tables.table(console, f"{report.host}: {report.status}")
        table.add_column("status", no_wrap=True)
        table.add_column("field / rule", no_wrap=True)
        table.add_column("message", ratio=1)
        for row in report.rows:
            table.add_row(f"[{COLOURS[row.status]}]{row.status}[/]", f"{row.field or '-'}\n[dim]{row.rule}[/]",
                          row.message)
        console.print(table)
        terms = report.budget_terms() if explain_budget else []
        if terms:
            memory = "MemTotal" if (report.facts or {}).get("mem_total") else "a nominal 128 GB Spark"
            budget_table = tables.table(console, f"{report.host}: memory budget on {memory}")
            budget_table.add_column("term", no_wrap=True)
            budget_table.add_column("bytes and formula")
            for term, text in terms:
                budget_table.add_row(term, text)
            console.print(budget_table)
    console.print(verdict(reports))


def verdict(reports: list[HostReport]) -> str:
    """The last line: hosts a deploy would refuse, then hosts whose pair cannot serve (a deploy goes ahead with
    them: only doctor compares the two hosts of a pair)."""
    refused = [report.host for report in reports
               if any(row.status == "error" and row.rule not in pair_checks.CHECKS for row in report.rows)]
    unpaired = [report.host for report in reports if report.status == "error" and report.host not in refused]
    warned = sum(report.status == "warning" for report in reports)
    if not reports:
        return "doctor: no host matched"
    parts = [f"{len(refused)} of {len(reports)} hosts would be refused: {', '.join(refused)}"] if refused else []
    if unpaired:
        parts.append(f"{len(unpaired)} would deploy but their pair cannot serve: {', '.join(unpaired)}")
    if parts:
        return "doctor: " + "; ".join(parts)
    return f"doctor: all {len(reports)} hosts fit their endpoint" + (f" ({warned} with warnings)" if warned else "")


def exit_code(reports: list[HostReport]) -> int:
    return 1 if not reports or any(report.status == "error" for report in reports) else 0
