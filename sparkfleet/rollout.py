"""A rolling rollout: stage everywhere, then deploy batch by batch behind a health gate, rolling back a bad batch.

pyinfra alone runs each operation on every host at once and keeps going after a failure; a fleet of
one-GPU boxes needs the opposite: one canary, then small batches, and a stop at the first sick batch.
Each phase is a plain `pyinfra` run of `deploy.py` limited to the batch; snapshots, restores and health
gates are shell commands over pyinfra's API (both through runner.Runner). With `--bench` (or
`vllm_bench_gate`), a batch must also serve as fast as before it changed (bench.Gate).

When the inventory has gateways (group `gateways`), clients never see a restart: before a batch restarts, its
Sparks are drained at every gateway (no new requests; the rollout waits for those in flight), and once they
pass their health gate they are made ready again and the rollout waits until every gateway sees them up. A
gateway that cannot be reached stops the rollout before anything restarts.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from sparkfleet import bench, tables
from sparkfleet.deploys.health import CHECKER, COMMON, CONFIG, STATE_DIR, wait_command
from sparkfleet.endpoint import ENV_FILE, KNOWN_GOOD, UNIT, UNIT_FILE
from sparkfleet.gateway import GatewayError, Gateways
from sparkfleet.preflight import checkpoint_size
from sparkfleet.runner import DeployRun, Pending, Reply, Runner, load_hosts, quiet_pyinfra

# The checker goes back with its configuration: a newer checker may refuse an older health.json.
KEPT = (UNIT_FILE, ENV_FILE, CONFIG, CHECKER, COMMON)
PHASE = "sparkfleet_phase"
NOT_STARTED = "installed (vllm_start is false)"
PROGRESS_SECONDS = 3  # how often the stage phase reads each host's staged bytes


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


def plan_batches(hosts: list[str], canary: int, batch: int, heads: dict[str, str] | None = None) -> list[list[str]]:
    """Inventory order: the first `canary` endpoints alone, then batches of `batch`. A pair (`heads`: each worker's
    head) is one endpoint: its two hosts always share a batch, where the first of them stands."""
    for option, count in (("--canary", canary), ("--batch", batch)):
        if count < 1:
            raise ValueError(f"{option} {count}: a batch needs at least 1 host; give {option} 1 or more")
    units: dict[str, list[str]] = {}
    for host in hosts:
        units.setdefault((heads or {}).get(host, host), []).append(host)
    endpoints = list(units.values())
    first, rest = endpoints[:canary], endpoints[canary:]
    batches = [first] + [rest[i:i + batch] for i in range(0, len(rest), batch)] if first else []
    return [[host for unit in members for host in unit] for members in batches]


def snapshot_command() -> str:
    """Keep the running configuration as last known-good, but only while the endpoint is healthy."""
    files = " ".join(KEPT)
    return (
        f"if systemctl is-active -q {UNIT} && python3 -c \"import json,sys; "
        f"sys.exit(json.load(open('{STATE_DIR}/state.json'))['last_result']['state'] != 'healthy')\"; then "
        f"mkdir -p -m 700 {KNOWN_GOOD} && cp -p {files} {KNOWN_GOOD}/; fi"
    )


def restore_command() -> str:
    """Put the known-good unit, env file and health config back and restart (the old image is still local).

    A host that never was healthy has nothing to go back to: its endpoint is stopped rather than left looping.
    """
    # A snapshot taken by an older sparkfleet may lack a file: what it has goes back.
    copies = " && ".join(f"{{ test ! -f {KNOWN_GOOD}/{Path(path).name} || cp -p {KNOWN_GOOD}/{Path(path).name} "
                         f"{path}; }}" for path in KEPT)
    return (f"if test -f {KNOWN_GOOD}/{UNIT}.service; then {copies} && systemctl daemon-reload && "
            f"{{ systemctl reset-failed {UNIT}; systemctl restart {UNIT}; }}; else systemctl stop {UNIT}; fi")


def stop_command() -> str:
    """Stop the endpoint (a pair's two hosts stop before either is restored, so they start again in order)."""
    return f"systemctl stop {UNIT}"


def gate_command(timeout: int) -> str:
    """The health checker's wait mode; `--json` prints its verdict (a Result) on stdout, its log lines on stderr."""
    return f"{wait_command(timeout)} --json"


def gate_verdict(reply: Reply) -> tuple[bool, str]:
    """Healthy or not (the checker's exit status), and its verdict in words: endpoint, state and diagnosis."""
    if reply.error:
        return False, f"no answer: {reply.error}"
    # The Result is indented JSON: its opening brace alone on a line, after anything a login shell printed.
    starts = [i for i, line in enumerate(reply.stdout) if line == "{"]
    try:
        result = json.loads("\n".join(reply.stdout[starts[-1]:])) if starts else None
    except ValueError:
        result = None
    if not isinstance(result, dict):
        said = re.sub(r"^<\d>", "", reply.stderr[-1]) if reply.stderr else "no output"
        return False, f"the health checker gave no verdict: {said}"
    return reply.ok, f"{result.get('endpoint')} {result.get('state')}: {result.get('diagnosis')}"


def _gate(runner: Runner, hosts: list[str], timeout: int) -> dict[str, tuple[bool, str]]:
    replies = runner.shell(hosts, gate_command(timeout)) if hosts else {}
    return {host: gate_verdict(reply) for host, reply in replies.items()}


def run(runner: Runner, hosts: list[str], serving: set[str], canary: int, batch: int, timeout: int,
        say: Callable[[str], None], gate: bench.Gate | None = None, gateways: Gateways | None = None,
        watch: Callable[[Pending], DeployRun] | None = None, heads: dict[str, str] | None = None) -> Rollout:
    """Stage everywhere, then each batch: snapshot, drain, deploy, gate, ready; on a bad batch roll it back and
    stop.

    With a bench `gate`, its hosts in a batch are benched before the batch changes them (when they have no
    reference yet) and after its health gate; a drop fails the batch like a sick host. With `gateways`, a batch's
    serving hosts are out of every gateway's rotation from before their restart until they are healthy again.

    A pair (`heads` maps each worker to its head) is one endpoint: its hosts share a batch, its deploy restarts
    both (worker first, see deploys/service.py), its head's gate is the pair's, and a rollback restores both."""
    heads = heads or {}
    plan = Rollout(plan_batches(hosts, canary, batch, heads))
    for number, members in enumerate(plan.batches):
        for host in members:
            plan.results[host] = HostResult(host, number)
    if gateways:
        try:
            gateways.check([host for host in hosts if host in serving])
        except GatewayError as error:
            _stop(plan, 0, f"not touched: {error}; a rollout drains each batch at every gateway first")
            plan.failed_batch = -1
            return plan
    say(f"staging weights and images on {len(hosts)} hosts (no restart)")
    stage = watch(runner.start_deploy(hosts, [f"{PHASE}=stage"])) if watch else runner.deploy(hosts, [f"{PHASE}=stage"])
    if not stage.ok:
        _stage_failed(plan, stage)
        return plan
    for number, members in enumerate(plan.batches):
        say(f"batch {number + 1}/{len(plan.batches)}: {', '.join(members)}")
        benched = [h for h in members if h in serving and h in gate.hosts] if gate else []
        if gate and benched:
            gate.prepare(benched)
        unsaved = {host: reply.error or "; ".join(reply.stderr[-2:]) or "the command failed"
                   for host, reply in runner.shell(members, snapshot_command()).items() if not reply.ok}
        if unsaved:
            _not_saved(plan, number, unsaved)
            break
        drained = [h for h in members if h in serving] if gateways else []
        try:
            drain_note = gateways.drain(drained) if gateways and drained else ""
        except GatewayError as error:
            _stop(plan, number, f"not touched: {error}; a rollout drains each batch at every gateway first")
            plan.failed_batch = number
            break
        deploy = runner.deploy(members)
        verdicts = _gate(runner, [h for h in members if h in serving], timeout)
        sick = {h: v for h, (ok, v) in verdicts.items() if not ok}
        measured: dict[str, bench.Verdict] = {}
        if gate and benched and deploy.ok and not sick:
            sick = gate.check(benched)
            gate.commit(benched, passed=not sick)
            measured = {host: gate.verdicts[host] for host in benched}
            for host, verdict in measured.items():
                plan.results[host].bench = verdict.as_dict()
        if deploy.ok and not sick:
            for host in members:
                plan.results[host].outcome = "updated"
                plan.results[host].diagnosis = _verdict(verdicts, host, heads, (True, NOT_STARTED))[1]
                if host in measured:
                    plan.results[host].diagnosis += f"; {measured[host].message()}"
                if host in drained and drain_note:
                    plan.results[host].diagnosis += f"; {drain_note}"
            if drained and not _back_in_service(plan, gateways, drained):  # type: ignore[arg-type]
                plan.failed_batch = number
                _stop(plan, number + 1, f"not touched: batch {number + 1} is not back in service at every gateway")
                break
            continue
        plan.failed_batch = number
        _roll_back(plan, runner, members, serving, sick, deploy, timeout, say, heads)
        if drained:
            back = [h for h in drained if plan.results[h].outcome == "rolled-back"]
            _back_in_service(plan, gateways, back)  # type: ignore[arg-type]
            for host in drained:
                if host not in back:
                    plan.results[host].diagnosis += "; kept drained at the gateways (unhealthy)"
        _stop(plan, number + 1, f"not touched: batch {number + 1} failed")
        break
    return plan


def _not_saved(plan: Rollout, number: int, unsaved: dict[str, str]) -> None:
    """A host whose known-good configuration could not be saved is not deployed: a rollback would restore an
    older one. Its batch and every later one stay as they are."""
    plan.failed_batch = number
    for later in plan.batches[number:]:
        for host in later:
            plan.results[host].outcome = "skipped"
            plan.results[host].diagnosis = (
                f"not touched: its known-good configuration could not be saved ({unsaved[host]})" if host in unsaved
                else f"not touched: batch {number + 1} could not save {', '.join(sorted(unsaved))}'s known-good "
                     "configuration")


def _stop(plan: Rollout, first: int, why: str) -> None:
    """Batches from `first` on are skipped, untouched."""
    for later in plan.batches[first:]:
        for host in later:
            plan.results[host].outcome = "skipped"
            plan.results[host].diagnosis = why


def _back_in_service(plan: Rollout, gateways: Gateways, hosts: list[str]) -> bool:
    """Ready at every gateway, and seen up by each; what stands in the way goes into the host's diagnosis."""
    if not hosts:
        return True
    try:
        down = gateways.ready(hosts)
    except GatewayError as error:
        down = dict.fromkeys(hosts, f"still drained at the gateways: {error}")
    for host, why in down.items():
        plan.results[host].diagnosis += f"; {why}"
    return not down


def _stage_failed(plan: Rollout, stage: DeployRun) -> None:
    """Nothing was restarted anywhere: every host is skipped, a host that failed staging with pyinfra's why."""
    plan.failed_batch = -1
    for result in plan.results.values():
        result.outcome = "skipped"
        result.diagnosis = (f"staging failed: {stage.why(result.host)}" if result.host in stage.failed
                            else f"not touched: staging failed on {', '.join(stage.failed)}")


def _verdict(verdicts: dict[str, tuple[bool, str]], host: str, heads: dict[str, str],
             default: tuple[bool, str]) -> tuple[bool, str]:
    """A host's gate verdict; a pair's worker has its head's (the head serves only with its worker joined)."""
    head = heads.get(host)
    if head is None:
        return verdicts.get(host, default)
    healthy, verdict = verdicts.get(head, default)
    return healthy, f"gated on its head {head}: {verdict}" if verdict else ""


def _roll_back(plan: Rollout, runner: Runner, members: list[str], serving: set[str], sick: dict[str, str],
               deploy: DeployRun, timeout: int, say: Callable[[str], None], heads: dict[str, str]) -> None:
    """Restore the batch's known-good unit, env file and health config, then gate it again. A pair's two hosts
    stop first, then its worker is restored (with the standalone hosts), then its head."""
    for host in members:
        plan.results[host].diagnosis = sick.get(host) or (
            f"deploy failed: {deploy.why(host)}" if host in deploy.failed else
            f"rolled back with its head {heads[host]}" if host in heads else "passed, rolled back with its batch")
    say(f"batch {plan.failed_batch + 1} failed; restoring its last known-good configuration")
    paired = [host for host in members if host in heads or host in heads.values()]
    if paired:
        runner.shell(paired, stop_command())
    later = [host for host in members if host in heads.values()]
    runner.shell([host for host in members if host not in later], restore_command())
    if later:
        runner.shell(later, restore_command())
    verdicts = _gate(runner, [h for h in members if h in serving], timeout)
    for host in members:
        healthy, verdict = _verdict(verdicts, host, heads, (True, ""))
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

    A `--limit` that targets no host raises runner.TargetError before anything runs (the CLI prints it)."""
    from sparkfleet.fleet import GATEWAYS, FleetError, load_inventory, resolve_weights
    from sparkfleet.pairs import partners

    console = Console(stderr=args.json)
    quiet_pyinfra()
    state, targeted = load_hosts(args.inventory, args.limit, args.data)
    # Every gateway of the inventory drains the batches, targeted or not; a rollout restarts only Sparks.
    gateway_hosts = [host for host in state.inventory if GATEWAYS in host.groups]
    # A pair is one endpoint: targeting either host rolls out both.
    sparks = {host.name: host.data.dict() for host in state.inventory if host not in gateway_hosts}
    whole = set(partners(sparks, [host.name for host in targeted if host.name in sparks]))
    hosts = [host for host in state.inventory if host.name in whole]
    names = [host.name for host in hosts]
    if not hosts:
        console.print(f"rollout: no Spark targeted, only gateways: deploy those with `pyinfra {args.inventory} "
                      "deploy.py --limit gateways`; nothing was changed")
        return 1
    try:
        fleet = load_inventory({host.name: host.data.dict() for host in state.inventory},
                               {host.name for host in gateway_hosts}, {*names, *(h.name for h in gateway_hosts)})
    except FleetError as error:
        console.print(f"[red]{error}[/red]")
        return 1
    endpoints = resolve_weights(fleet.sparks)
    serving = {name for name, spark in endpoints.items() if spark.serves}
    heads = {name: spark.peer for name, spark in endpoints.items() if spark.role == "worker" and spark.peer}
    timeout = max((spark.recipe.load_timeout_seconds for spark in endpoints.values()), default=0)

    def say(line: str) -> None:
        console.print(f"rollout: {line}", highlight=False)

    gated = {host.name: host for host in hosts if args.bench or endpoints[host.name].config.vllm_bench_gate}
    gate = bench.Gate(state, gated, endpoints, bench.Load(args.bench_concurrency, args.bench_duration),
                      args.bench_tolerance, say) if gated else None
    runner = Runner(args.inventory, state, hosts, args.data)
    gateways = Gateways(Runner(args.inventory, state, gateway_hosts, args.data), fleet.gateways) if gateway_hosts \
        else None
    sizes = {name: (spark.weights_dir, checkpoint_size(spark)) for name, spark in endpoints.items()}
    watch = None if args.json else staging_progress(runner, console, sizes)
    plan = run(runner, names, serving, args.canary, args.batch, timeout, say, gate, gateways, watch, heads)
    if args.json:
        sys.stdout.write(json.dumps(plan.as_json(), indent=2) + "\n")
    else:
        console.print(summary_table(plan, console))
    return 0 if plan.failed_batch is None else 1


def staging_progress(runner: Runner, console: Console,
                     sizes: dict[str, tuple[str, int]]) -> Callable[[Pending], DeployRun]:
    """A watcher of the stage phase: per host, the bytes of its weights generation so far, rate and ETA (read
    with `du` every few seconds while the deploy runs)."""

    def watch(pending: Pending) -> DeployRun:
        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                   TimeRemainingColumn())
        with Progress(*columns, console=console) as progress:
            tasks = {name: progress.add_task(name, total=size) for name, (_, size) in sizes.items()}
            by_dir: dict[str, list[str]] = {}
            for name, (directory, _) in sizes.items():
                by_dir.setdefault(directory, []).append(name)
            while pending.running():
                for directory, names in by_dir.items():
                    command = f"du -sb {shlex.quote(directory)} 2>/dev/null | cut -f1"
                    for name, reply in runner.shell(names, command).items():
                        if reply.ok and reply.stdout and reply.stdout[0].strip().isdigit():
                            progress.update(tasks[name], completed=int(reply.stdout[0]))
                time.sleep(PROGRESS_SECONDS)
        return pending.result()

    return watch


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
