"""A rolling rollout: stage everywhere, then deploy batch by batch behind a health gate, rolling back a bad batch.

pyinfra alone runs each operation on every host at once and keeps going after a failure; a fleet of
one-GPU boxes needs the opposite: one canary, then small batches, and a stop at the first sick batch.
Each phase is a plain `pyinfra` run (`--limit` to the batch), so what runs is exactly `deploy.py`. With
`--bench` (or `vllm_bench_gate`), a batch must also serve as fast as before it changed (bench.Gate).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sparkfleet import bench, tables
from sparkfleet.deploys.health import CONFIG, STATE_DIR, wait_command
from sparkfleet.endpoint import ENV_FILE, UNIT, UNIT_FILE

DEPLOY = str(Path(__file__).resolve().parents[1] / "deploy.py")
KNOWN_GOOD = "/var/lib/sparkfleet/known-good"
KEPT = (UNIT_FILE, ENV_FILE, CONFIG)
MARKER = "SPARKFLEET-GATE "
PHASE = "sparkfleet_phase"


@dataclass
class HostResult:
    host: str
    batch: int
    outcome: str = "pending"  # updated, rolled-back, rollback-failed, skipped
    diagnosis: str = ""
    bench: dict[str, Any] | None = None  # the bench gate's verdict, when the host was gated


@dataclass
class Rollout:
    """What happened, for the summary table and --json."""

    batches: list[list[str]]
    results: dict[str, HostResult] = field(default_factory=dict)
    failed_batch: int | None = None

    def as_json(self) -> dict:
        return {"batches": self.batches, "failed_batch": self.failed_batch,
                "hosts": [asdict(result) for result in self.results.values()]}


def host_count(text: str) -> int:
    """argparse type of --canary and --batch: a whole number of hosts, at least 1."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of hosts: give 1 or more") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"{count} hosts cannot make a batch: give 1 or more "
                                         "(every batch, the canary first, deploys at least one host)")
    return count


def tolerance(text: str) -> float:
    """argparse type of --bench-tolerance: a fraction of the known-good figure, 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction: give e.g. 0.15 for 15 %") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{value}: give a fraction from 0 to below 1, e.g. 0.15 for 15 %")
    return value


def plan_batches(hosts: list[str], canary: int, batch: int) -> list[list[str]]:
    """Inventory order: the first `canary` hosts alone, then batches of `batch`."""
    for option, count in (("--canary", canary), ("--batch", batch)):
        if count < 1:
            raise ValueError(f"{option} {count}: a batch needs at least 1 host; give {option} 1 or more")
    head, rest = hosts[:canary], hosts[canary:]
    return [head] + [rest[i:i + batch] for i in range(0, len(rest), batch)] if head else []


def _pyinfra(inventory: str, args: list[str], limit: list[str], data: list[str]) -> subprocess.CompletedProcess:
    command = [str(Path(sys.executable).with_name("pyinfra")), "-y", inventory]
    for host in limit:
        command += ["--limit", host]
    for item in data:
        command += ["--data", item]
    return subprocess.run([*command, *args], capture_output=True, text=True)


def snapshot_command() -> str:
    """Keep the running configuration as last known-good, but only while the endpoint is healthy."""
    files = " ".join(KEPT)
    return (
        f"if systemctl is-active -q {UNIT} && python3 -c \"import json,sys; "
        f"sys.exit(json.load(open('{STATE_DIR}/state.json'))['last_result']['state'] != 'healthy')\"; then "
        f"mkdir -p -m 700 {KNOWN_GOOD} && cp -p {files} {KNOWN_GOOD}/ && echo {MARKER}saved; "
        f"else echo {MARKER}none; fi"
    )


def restore_command() -> str:
    """Put the known-good unit, env file and health config back and restart (the old image is still local).

    A host that never was healthy has nothing to go back to: its endpoint is stopped rather than left looping.
    """
    copies = " && ".join(f"cp -p {KNOWN_GOOD}/{Path(path).name} {path}" for path in KEPT)
    return (f"if test -f {KNOWN_GOOD}/{UNIT}.service; then {copies} && systemctl daemon-reload && "
            f"{{ systemctl reset-failed {UNIT}; systemctl restart {UNIT}; }}; else systemctl stop {UNIT}; fi")


def gate_command(timeout: int) -> str:
    """The health checker's wait mode; one marker line per host carries its exit code and last verdict."""
    return (f"out=$({wait_command(timeout)} 2>&1); rc=$?; "
            f"echo \"{MARKER}$rc $(printf '%s' \"$out\" | tail -n 1)\"; exit $rc")


def gate_lines(output: str) -> dict[str, tuple[bool, str]]:
    """Per-host (healthy, verdict) from pyinfra exec output lines `[host] SPARKFLEET-GATE rc verdict`."""
    verdicts = {}
    for line in output.splitlines():
        if MARKER in line and line.lstrip().startswith("["):
            host = line.split("]", 1)[0].strip().lstrip("[")
            code, _, verdict = line.split(MARKER, 1)[1].partition(" ")
            verdicts[host] = (code == "0", re.sub(r"^<\d>", "", verdict.strip()))
    return verdicts


def _exec(inventory: str, hosts: list[str], command: str) -> dict[str, tuple[bool, str]]:
    result = _pyinfra(inventory, ["exec", "--", command], hosts, [])
    verdicts = gate_lines(result.stdout + result.stderr)
    return {host: verdicts.get(host, (False, "no answer (host unreachable?)")) for host in hosts}


def _gate(inventory: str, hosts: list[str], timeout: int) -> dict[str, tuple[bool, str]]:
    return _exec(inventory, hosts, gate_command(timeout)) if hosts else {}


def _tail(output: str) -> str:
    """The last error pyinfra reported, for a batch whose deploy itself failed."""
    errors = [line.strip() for line in output.splitlines() if "Error" in line or "error" in line]
    return errors[-1] if errors else "the deploy failed"


def run(inventory: str, hosts: list[str], serving: set[str], data: list[str], canary: int, batch: int,
        timeout: int, say: Callable[[str], None], gate: bench.Gate | None = None) -> Rollout:
    """Stage everywhere, then each batch: snapshot, deploy, gate; on a bad batch roll it back and stop.

    With a bench `gate`, its hosts in a batch are benched before the batch changes them (when they have no
    reference yet) and after its health gate; a drop fails the batch like a sick host."""
    plan = Rollout(plan_batches(hosts, canary, batch))
    for number, members in enumerate(plan.batches):
        for host in members:
            plan.results[host] = HostResult(host, number)
    say(f"staging weights and images on {len(hosts)} hosts (no restart)")
    stage = _pyinfra(inventory, [DEPLOY], hosts, [*data, f"{PHASE}=stage"])
    if stage.returncode != 0:
        plan.failed_batch = -1
        for result in plan.results.values():
            result.outcome, result.diagnosis = "skipped", "staging failed: " + _tail(stage.stdout + stage.stderr)
        return plan
    for number, members in enumerate(plan.batches):
        say(f"batch {number + 1}/{len(plan.batches)}: {', '.join(members)}")
        benched = [h for h in members if h in serving and h in gate.hosts] if gate else []
        if gate and benched:
            gate.prepare(benched)
        _exec(inventory, members, snapshot_command())
        deploy = _pyinfra(inventory, [DEPLOY], members, data)
        verdicts = _gate(inventory, [h for h in members if h in serving], timeout)
        sick = {h: v for h, (ok, v) in verdicts.items() if not ok}
        measured: dict[str, bench.Verdict] = {}
        if gate and benched and deploy.returncode == 0 and not sick:
            sick = gate.check(benched)
            gate.commit(benched, passed=not sick)
            measured = {host: gate.verdicts[host] for host in benched}
            for host, verdict in measured.items():
                plan.results[host].bench = verdict.as_dict()
        if deploy.returncode == 0 and not sick:
            for host in members:
                plan.results[host].outcome = "updated"
                plan.results[host].diagnosis = verdicts.get(host, (True, "installed (vllm_start is false)"))[1]
                if host in measured:
                    plan.results[host].diagnosis += f"; {measured[host].message()}"
            continue
        plan.failed_batch = number
        why = _tail(deploy.stdout + deploy.stderr) if deploy.returncode else "passed, rolled back with its batch"
        _roll_back(plan, inventory, members, serving, sick, why, timeout, say)
        for later in plan.batches[number + 1:]:
            for host in later:
                plan.results[host].outcome = "skipped"
                plan.results[host].diagnosis = f"not touched: batch {number + 1} failed"
        break
    return plan


def _roll_back(plan: Rollout, inventory: str, members: list[str], serving: set[str], sick: dict[str, str],
               deploy_error: str, timeout: int, say: Callable[[str], None]) -> None:
    """Restore the batch's known-good unit, env file and health config, then gate it again."""
    for host in members:
        plan.results[host].diagnosis = sick.get(host, deploy_error)
    say(f"batch {plan.failed_batch + 1} failed; restoring its last known-good configuration")
    _exec(inventory, members, restore_command())
    verdicts = _gate(inventory, [h for h in members if h in serving], timeout)
    for host in members:
        healthy, verdict = verdicts.get(host, (True, ""))
        plan.results[host].outcome = "rolled-back" if healthy else "rollback-failed"
        if not healthy:
            plan.results[host].diagnosis += f"; after rollback: {verdict}"


def add_parser(commands: argparse._SubParsersAction,
               add_targeting: Callable[[argparse.ArgumentParser], None]) -> None:
    rollout = commands.add_parser(
        "rollout", help="deploy batch by batch behind health gates, rolling back a failed batch",
        description="Stage weights and images on every targeted host, then deploy a canary batch and further "
        "batches in inventory order, each gated on health; stop and roll back at the first failed batch.")
    add_targeting(rollout)
    rollout.add_argument("--batch", type=host_count, default=1, help="hosts per batch after the canary (default 1)")
    rollout.add_argument("--canary", type=host_count, default=1, help="hosts in the first batch (default 1)")
    rollout.add_argument("--bench", action="store_true",
                         help="also gate each batch on a bench against each host's last known-good record "
                         "(`vllm_bench_gate` turns it on per host)")
    rollout.add_argument("--bench-tolerance", type=tolerance, default=bench.DEFAULT_TOLERANCE, metavar="FRACTION",
                         help="largest drop in tokens/s or MTP acceptance a batch may show "
                         f"(default {bench.DEFAULT_TOLERANCE})")
    bench.add_load_arguments(rollout, prefix="bench-")


def main(args: argparse.Namespace) -> int:
    """Validate first (bad inventory or arguments change nothing), then roll out; exit 1 when any batch failed.

    A `--limit` that targets no host raises doctor.TargetError before anything runs (the CLI prints it)."""
    from sparkfleet.doctor import load_hosts
    from sparkfleet.fleet import FleetError, load_fleet

    console = Console(stderr=args.json)
    state, hosts = load_hosts(args.inventory, args.limit, args.data)
    try:
        endpoints, _ = load_fleet({host.name: host.data.dict() for host in hosts})
    except FleetError as error:
        console.print(f"[red]{error}[/red]")
        return 1
    names = [host.name for host in hosts]
    serving = {name for name, spark in endpoints.items() if spark.config.vllm_start}
    timeout = max((spark.recipe.load_timeout_seconds for spark in endpoints.values()), default=0)

    def say(line: str) -> None:
        console.print(f"rollout: {line}", highlight=False)

    gated = {host.name: host for host in hosts if args.bench or endpoints[host.name].config.vllm_bench_gate}
    gate = bench.Gate(state, gated, endpoints, bench.Load(args.bench_concurrency, args.bench_duration),
                      args.bench_tolerance, say) if gated else None
    plan = run(args.inventory, names, serving, args.data, args.canary, args.batch, timeout, say, gate)
    if args.json:
        sys.stdout.write(json.dumps(plan.as_json(), indent=2) + "\n")
    else:
        console.print(summary_table(plan, console))
    return 0 if plan.failed_batch is None else 1


def summary_table(plan: Rollout, console: Console) -> Table:
    """Per host, its batch and outcome; the diagnosis is the column that wraps to fit the terminal."""
    table = tables.table(console, "sparkfleet rollout")
    for column in ("batch", "host", "outcome"):
        table.add_column(column, no_wrap=True, justify="right" if column == "batch" else "left")
    table.add_column("health / diagnosis")
    styles = {"updated": "green", "rolled-back": "yellow", "skipped": "dim"}
    for result in plan.results.values():
        style = styles.get(result.outcome, "red")
        table.add_row(str(result.batch + 1), result.host, f"[{style}]{result.outcome}[/{style}]", result.diagnosis)
    return table
