"""`sparkfleet drift`: how far each Spark is from its inventory, read-only and quiet enough for cron.

Two sources, read side by side:
- pyinfra's own dry run of deploy.py (`--dry --json`): per operation, the hosts it would change. sparkfleet
  names every operation with a sentence, so those names are the report; a converged host plans no change.
- the status reporter on each host (remote/status.py), told the wanted image and weights list: the facts an
  operator asks about, and the drift a deploy does not see because it leaves running things alone (dockerd
  without the runtime its daemon.json registers, systemd holding an older unit than the file, a container on
  another image than the one pulled, an unhealthy endpoint). What the dry run already names (toolkit
  version, daemon.json, unit and env file, weights) stays a fact in `--json`, not a second drift line.
A gateway (group `gateways`) is read through HAProxy's runtime API instead: a Spark left drained or in
maintenance there (an interrupted rollout, a hand-made change) gets no requests, and no deploy undoes that.

Exit 0 converged, 2 drifted, 1 error (unreachable host, pyinfra failure, bad inventory).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from pyinfra.api import Host

from sparkfleet import status
from sparkfleet.deploys import weights
from sparkfleet.endpoint import UNIT, Endpoint
from sparkfleet.fleet import GATEWAYS, load_endpoint, with_weights
from sparkfleet.gateway import BACKEND
from sparkfleet.generations import SourceError
from sparkfleet.pairs import partners, raw_name
from sparkfleet.runner import Runner, each, load_hosts, quiet_pyinfra

EXIT_CONVERGED, EXIT_ERROR, EXIT_DRIFTED = 0, 1, 2
# The operations that write the files the facts describe (service.py; a unit test keeps them in step).
FILE_OPS = {"unit_file": f"Render the {UNIT} unit", "env_file": "Write the endpoint's secrets"}


# --- the dry run ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Per host, the operations that would change it, and the follow-ups that run only if those do."""

    changes: dict[str, list[str]]
    follow_ups: dict[str, list[str]]


def op_name(names: Iterable[str]) -> str:
    """An operation's own sentence, without the deploy's name pyinfra puts first ("Deploy | Operation").

    Hosts may word one operation differently (another image in its name): then every wording, joined.
    """
    return " / ".join(sorted({name.rpartition(" | ")[2] for name in names}))


def parse_plan(report: dict[str, Any] | None) -> Plan | None:
    """The plan from pyinfra's `--dry --json` report (runner.read_report); None when it printed none."""
    if report is None:
        return None
    changes: dict[str, list[str]] = {}
    follow_ups: dict[str, list[str]] = {}
    for op in report["plan"]:
        name = op_name(op.get("names") or [op.get("name") or op.get("op_hash", "?")])
        for host in op.get("hosts_with_change") or []:
            changes.setdefault(host, []).append(name)
        for host in op.get("hosts_with_conditional_change") or []:
            follow_ups.setdefault(host, []).append(name)
    return Plan(changes, follow_ups)


# --- the facts -----------------------------------------------------------------------------------------


def _resolved(spark: Endpoint | None) -> Endpoint | None:
    """The endpoint with its generation; None when it has none (the dry run says why)."""
    try:
        return with_weights(spark) if spark is not None else None
    except SourceError:
        return None


def weights_args(spark: Endpoint) -> list[str] | None:
    """`stage_weights.py check` arguments for the wanted weights: the deploy's own, but by size and mtime even
    with weights_verify=full (drift runs from cron). None when the controller directory cannot be read (the dry
    run reports it)."""
    try:
        return [arg for arg in weights.check_args(spark) if arg != "--full"]
    except OSError:
        return None


def reporter_args(spark: Endpoint) -> str:
    args = ["--image", spark.image]
    weights = weights_args(spark)
    if weights is not None:
        args.append("--weights-check=" + shlex.join(weights))
    return shlex.join(args)


def facts(spark: Endpoint, report: dict[str, Any], changes: list[str]) -> dict[str, Any]:
    """What an operator asks about, each fact beside what the inventory wants."""

    def would_change(key: str) -> bool:
        return any(name.startswith(FILE_OPS[key]) for name in changes)

    return {
        "endpoint": report.get("state"),
        "toolkit_version": {"installed": report.get("toolkit_version"),
                            "wanted": spark.config.nvidia_toolkit_version},
        "nvidia_runtime": {"daemon_json": report.get("runtime_in_daemon_json"),
                           "dockerd": report.get("runtime_in_dockerd")},
        "unit_file": {"sha256": report.get("unit_sha256"), "would_change": would_change("unit_file"),
                      "need_daemon_reload": report.get("need_daemon_reload")},
        "env_file": {"sha256": report.get("env_sha256"), "would_change": would_change("env_file")},
        "image": {"running": report.get("image"), "running_id": report.get("image_id"), "wanted": spark.image,
                  "wanted_id": report.get("wanted_image_id")},
        "weights": {"check": report.get("weights"), "serving": report.get("weights_generation"),
                    "wanted": spark.weights.label if spark.weights else None},
        "last_health": report.get("last_result"),
    }


def fact_drift(spark: Endpoint, report: dict[str, Any]) -> list[str]:
    """Drift the dry run cannot name: running state that a deploy leaves alone."""
    items = []
    if report.get("runtime_in_daemon_json") and report.get("runtime_in_dockerd") is False:
        items.append("dockerd runs without the nvidia runtime its daemon.json registers (restart docker)")
    if report.get("need_daemon_reload"):
        items.append(f"systemd holds an older {UNIT} unit than the file on disk (daemon-reload, then restart it)")
    if spark.config.vllm_start:
        items += image_drift(spark.image, report)
        health = report.get("last_result") or {}
        if health.get("state") == "unhealthy":
            items.append(f"last health check unhealthy: {health.get('diagnosis') or health.get('cause')}")
    return items


def image_drift(wanted: str, report: dict[str, Any]) -> list[str]:
    """The running container against the wanted reference and the id it has on the host now."""
    running, running_id, wanted_id = report.get("image"), report.get("image_id"), report.get("wanted_image_id")
    if running is None:
        return []  # not running: the unit's state and the health check say why
    if running != wanted:
        return [f"runs image {running}, the inventory wants {wanted}"]
    if wanted_id and running_id and running_id != wanted_id:
        return [f"runs an older pull of {wanted} ({running_id[:19]}, the host has {wanted_id[:19]})"]
    return []


# --- the report ----------------------------------------------------------------------------------------


@dataclass
class HostDrift:
    host: str
    changes: list[str] = field(default_factory=list)
    follow_ups: list[str] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def lines(self) -> list[str]:
        """One line per drifted item, host first: what cron mails."""
        return [f"{self.host}: would change: {name}" for name in self.changes] + [
            f"{self.host}: {item}" for item in self.drift]


@dataclass
class Report:
    hosts: list[HostDrift]
    errors: list[str]  # pyinfra's message when its dry run failed

    @property
    def exit_code(self) -> int:
        if self.errors or not self.hosts or any(host.error for host in self.hosts):
            return EXIT_ERROR
        return EXIT_DRIFTED if any(host.lines() for host in self.hosts) else EXIT_CONVERGED

    def as_dict(self) -> dict[str, Any]:
        verdict = {EXIT_CONVERGED: "converged", EXIT_DRIFTED: "drifted", EXIT_ERROR: "error"}[self.exit_code]
        return {"status": verdict, "hosts": [asdict(host) for host in self.hosts], "errors": self.errors}


def host_drift(spark: Endpoint, answer: status.Answer, plan: Plan) -> HostDrift:
    """A host without the reporter is not an error here: the plan names its installation as a change."""
    changes = plan.changes.get(spark.host, [])
    error = answer.error if answer.deployed else None
    result = HostDrift(spark.host, changes, plan.follow_ups.get(spark.host, []), error=error)
    if answer.status is not None:
        result.facts = facts(spark, answer.status, changes)
        result.drift = fact_drift(spark, answer.status)
    return result


def gateway_drift(answer: status.Answer, plan: Plan) -> HostDrift:
    """A gateway: what its deploy would change, and each Spark it is not sending requests to on purpose. An
    unanswered runtime API is not an error when the plan installs or starts HAProxy there."""
    changes = plan.changes.get(answer.host, [])
    result = HostDrift(answer.host, changes, plan.follow_ups.get(answer.host, []),
                       error=None if changes else answer.error)
    for name, view in (answer.views or {}).items():
        if view.admin != "ready":
            result.drift.append(f"{name} is left in {view.admin} here (an interrupted rollout, or by hand): it gets no "
                                f"new requests until the next rollout or `set server {BACKEND}/{name} state ready`")
    return result


def check(inventory: str, limits: Iterable[str] = (), data: Iterable[str] = ()) -> Report:
    """Dry run and host reports at once; a host with a bad inventory is left to the dry run's message.

    A `--limit` that targets no host raises runner.TargetError (the CLI prints it and exits 1)."""
    quiet_pyinfra()
    state, targeted = load_hosts(inventory, limits, data)
    # A pair deploys as one unit (its dry run needs both hosts): either host targeted reads both.
    everyone = {host.name: host.data.dict() for host in state.inventory if GATEWAYS not in host.groups}
    wanted = set(partners(everyone, [host.name for host in targeted if host.name in everyone]))
    hosts = [host for host in state.inventory
             if host.name in wanted or (host in targeted and host.name not in everyone)]
    runner = Runner(inventory, state, hosts, list(data))
    gateways = [host for host in hosts if GATEWAYS in host.groups]
    endpoints: dict[str, Endpoint | None] = {host.name: _resolved(load_endpoint(host.name, host.data.dict())[0])
                                              for host in hosts if host not in gateways}
    reachable = [host for host in hosts if endpoints.get(host.name) is not None]
    # Hashing a controller weights directory comes first: the dry run then reads the warm cache.
    args = {host.name: reporter_args(endpoints[host.name]) for host in reachable}  # type: ignore[arg-type]
    pending = runner.start_deploy([host.name for host in hosts], dry=True)
    answers = {answer.host: answer for answer in status.probe(state, reachable, lambda host: args[host.name])}
    answers |= {answer.host: answer for answer in each(state, gateways, lambda host: status.read_gateway(state, host))}
    dry_run = pending.result()
    plan = parse_plan(dry_run.report)
    errors = [] if dry_run.ok else dry_run.message()
    report = Report([_one(host, endpoints.get(host.name), answers.get(host.name), plan) for host in hosts], errors)
    pair_drift(report.hosts, everyone)
    return report


def pair_drift(hosts: list[HostDrift], data: dict[str, dict[str, Any]]) -> None:
    """A pair restarts as one unit: a host whose partner would change is named too (the deploy restarts both)."""
    by_name = {host.host: host for host in hosts}
    for host in hosts:
        pair = raw_name(data.get(host.host, {}))
        partner = next((other for name, other in by_name.items() if name != host.host and pair is not None
                        and raw_name(data.get(name, {})) == pair), None)
        if partner is not None and partner.changes and not host.changes:
            host.drift.append(f"its pair {pair} restarts with {partner.host}, which would change: a deploy that "
                              "restarts either host restarts both")


def _one(host: Host, spark: Endpoint | None, answer: status.Answer | None, plan: Plan | None) -> HostDrift:
    if answer is not None and answer.gateway:
        return gateway_drift(answer, plan or Plan({}, {}))
    if spark is None or answer is None:
        return HostDrift(host.name, error="bad inventory (pyinfra's message says why)")
    return host_drift(spark, answer, plan or Plan({}, {}))


def render(report: Report, out: TextIO, err: TextIO) -> None:
    """Drift lines on stdout, errors on stderr, and a single line when all is well: cron mails only news."""
    for line in report.errors:
        err.write(line + "\n")
    for host in report.hosts:
        if host.error:
            err.write(f"{host.host}: error: {host.error}\n")
        for line in host.lines():
            out.write(line + "\n")
    if report.exit_code == EXIT_CONVERGED:
        out.write(f"converged: {len(report.hosts)} hosts\n")
