"""`sparkfleet status`: every targeted Spark's endpoint in one table, read over SSH, changing nothing; then
each targeted gateway's view of each Spark (up, down, drained, requests in flight).

Each Spark runs the stdlib status reporter the deploy installed (sparkfleet/remote/status.py) through one
pyinfra fact, each gateway answers through HAProxy's runtime API (gateway.py): one SSH round trip per host, all
hosts at once. The inventory is loaded as the pyinfra CLI loads it (runner.load_hosts), so `--limit` and
`--data` mean what they mean there.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from pyinfra.api import Host, State
from pyinfra.api.facts import FactBase, get_fact
from rich.console import Console
from rich.markup import escape

from sparkfleet.deploys.health import CONFIG
from sparkfleet.deploys.health import STATUS as SCRIPT
from sparkfleet.endpoint import CONTAINER, DAEMON_JSON, ENV_FILE, LOADED_WEIGHTS, UNIT, UNIT_FILE
from sparkfleet.fleet import GATEWAYS
from sparkfleet.gateway import SHOW, GatewayError, ServerView, answers, api_command, parse_views
from sparkfleet.pairs import partners, raw_name
from sparkfleet.runner import SSH_ERRORS, cannot_connect, connected, each, load_hosts, quiet_pyinfra, run_shell
from sparkfleet.tables import Column, print_folded

MARKER = "SPARKFLEET-STATUS "  # the reporter's line prefix (remote/status.py MARKER)
# Where the endpoint's files are, told to the reporter on every call (it keeps no copy of them).
LAYOUT = shlex.join(["--unit", f"{UNIT}.service", "--container", CONTAINER, "--unit-file", UNIT_FILE,
                     "--env-file", ENV_FILE, "--daemon-json", DAEMON_JSON, "--health-config", CONFIG,
                     "--loaded-weights", LOADED_WEIGHTS])
NOT_INSTALLED = {"installed": False}
COLOURS = {"active": "green", "activating": "yellow", "reloading": "yellow", "failed": "bold red"}


def extract(lines: Iterable[str]) -> dict[str, Any] | None:
    """The reporter's JSON object from its marked line (the last one wins); None when there is none."""
    for line in reversed(list(lines)):
        if line.startswith(MARKER):
            try:
                data = json.loads(line[len(MARKER):])
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None


class EndpointStatus(FactBase):
    """The status reporter's JSON object; {"installed": false} where sparkfleet has not deployed it yet."""

    def command(self, args: str) -> str:
        missing = shlex.quote(MARKER + json.dumps(NOT_INSTALLED))
        return f"if [ -f {SCRIPT} ]; then python3 {SCRIPT} {LAYOUT} {args}; else echo {missing}; fi"

    def process(self, output: list[str]) -> dict[str, Any] | None:
        return extract(output)


@dataclass
class Answer:
    """One host's report, or why there is none (unreachable, not deployed, unreadable output). A gateway's report
    is its view of each Spark (`views`)."""

    host: str
    status: dict[str, Any] | None = None
    error: str | None = None
    deployed: bool = True  # False: reachable, but the reporter is not installed yet
    gateway: bool = False
    views: dict[str, ServerView] | None = None
    pair: str | None = None  # a pair's head: the pair's one row, its worker's report beside it
    worker: Answer | None = None

    @property
    def answered(self) -> bool:
        mine = (self.views if self.gateway else self.status) is not None
        return mine and (self.worker is None or self.worker.answered)

    def as_dict(self) -> dict[str, Any]:
        if self.gateway:
            views = {name: view.as_dict() for name, view in (self.views or {}).items()}
            return {"host": self.host, "error": self.error, "gateway": views}
        mine = {"host": self.host, "error": self.error, **(self.status or {})}
        if self.worker is not None:
            mine["pair"] = {"name": self.pair, "head": self.host, "worker": self.worker.as_dict()}
        return mine


def read_status(state: State, host: Host, args: str) -> Answer:
    try:
        with connected(host):
            status = get_fact(state, host, EndpointStatus, kwargs={"args": args}, apply_failed_hosts=False)
    except SSH_ERRORS as error:
        return Answer(host.name, error=f"unreachable: {cannot_connect(error)}")
    if status is None:
        return Answer(host.name, error=f"connected, but {SCRIPT} printed no report: run it there to see why")
    if status == NOT_INSTALLED:
        return Answer(host.name, error=f"{SCRIPT} is not installed: deploy this host first", deployed=False)
    return Answer(host.name, status)


def probe(state: State, hosts: list[Host], args_for: Callable[[Host], str] = lambda host: "") -> list[Answer]:
    """Every host's report, read in parallel; `args_for` adds reporter arguments per host."""
    return each(state, hosts, lambda host: read_status(state, host, args_for(host)))


def read_gateway(state: State, host: Host) -> Answer:
    """A gateway's view of each Spark, from HAProxy's runtime API."""
    try:
        views = parse_views(*answers(run_shell(state, host, api_command(SHOW)), SHOW))
    except GatewayError as error:
        return Answer(host.name, error=str(error).removeprefix(f"{host.name}: "), gateway=True)
    return Answer(host.name, gateway=True, views=views)


def collect(inventory: str, limits: Iterable[str] = (), data: Iterable[str] = ()) -> list[Answer]:
    """The targeted Sparks' reports (a pair's as one, whichever of its hosts is targeted), then the targeted
    gateways'."""
    quiet_pyinfra()
    state, hosts = load_hosts(inventory, limits, data)
    gateways = [host for host in hosts if GATEWAYS in host.groups]
    everyone = {host.name: host.data.dict() for host in state.inventory if GATEWAYS not in host.groups}
    wanted = set(partners(everyone, [host.name for host in hosts if host not in gateways]))
    sparks = [host for host in state.inventory if host.name in wanted]
    answers = join_pairs(probe(state, sparks), {name: everyone[name] for name in wanted})
    return answers + each(state, gateways, lambda host: read_gateway(state, host))


def join_pairs(answers: list[Answer], data: dict[str, dict[str, Any]]) -> list[Answer]:
    """A pair is one endpoint: one answer per pair, its head's (it serves the endpoint) with its worker's beside
    it, where the head stands. `data` is each host's inventory data (its `pair`, as written)."""
    by_host = {answer.host: answer for answer in answers}
    joined = []
    for answer in answers:
        pair = data.get(answer.host, {}).get("pair")
        if not isinstance(pair, dict) or raw_name(data[answer.host]) is None:
            joined.append(answer)
            continue
        name, head = pair["name"], pair.get("head")
        worker = next((other for host, other in by_host.items() if host != head and host != answer.host
                       and raw_name(data.get(host, {})) == name), None) if answer.host == head else None
        if answer.host == head and worker is not None:
            joined.append(replace(answer, pair=name, worker=worker))
        elif answer.host != head and head not in by_host:
            joined.append(answer)  # its head is not in the inventory: the inventory check says so
    return joined


# --- rendering -----------------------------------------------------------------------------------------

# What an operator looks for first is always a column; the rest are columns while the terminal is wide enough
# (in this order), else a detail line under the host's row; --wide keeps them all in the row.
COLUMNS = (
    Column("host", key=True), Column("endpoint", key=True), Column("health", key=True),
    Column("uptime", right=True), Column("restarts", right=True), Column("model", key=True), Column("weights"),
    Column("image"),
    Column("KV cache", right=True), Column("MTP accept", right=True), Column("running", right=True),
    Column("waiting", right=True), Column("served name"), Column("last alert"),
)
HEALTH_COLOURS = {"healthy": "green", "starting": "yellow", "unhealthy": "bold red"}


def duration(seconds: float | None) -> str:
    """Two units at most: 42s, 5m 03s, 3h 12m, 2d 04h."""
    if seconds is None:
        return "-"
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def text(value: object) -> str:
    """A value as a cell: hosts' words are never read as rich markup (`[oom]` stays in the text)."""
    return "-" if value is None else escape(str(value))


def short_model(model: str | None) -> str:
    """`org/name` as `name`: the served name (a column of its own) keeps the organisation."""
    return text(model.rsplit("/", 1)[-1] if model else None)


def short_image(image: str | None) -> str:
    """An image reference without its registry and organisation, a digest cut to 12 characters."""
    if not image:
        return "-"
    name, _, digest = image.rsplit("/", 1)[-1].partition("@")
    return text(f"{name}@{digest.removeprefix('sha256:')[:12]}" if digest else name)


def last_alert(alert: dict[str, Any] | None) -> str:
    """When and why the checker last alerted (the cause key, e.g. `crashloop/cutlass`)."""
    if not alert:
        return "-"
    return text(f"{alert.get('time') or '?'} {alert.get('cause') or alert.get('diagnosis') or ''}".strip())


def coloured(word: str | None, colour: str | None) -> str:
    return f"[{colour}]{text(word)}[/]" if colour else text(word)


def endpoint_state(status: dict[str, Any]) -> str:
    state, sub = status.get("state"), status.get("sub_state")
    return coloured(f"{state}/{sub}" if state and sub else state, COLOURS.get(state or ""))


def host_cell(answer: Answer) -> str:
    """The host, or a pair as its name and both hosts, head first."""
    if answer.worker is None:
        return text(answer.host)
    return text(f"{answer.pair}: {answer.host} + {answer.worker.host}")


def worker_note(answer: Answer) -> tuple[str, str]:
    """What a pair's row adds about its worker to the endpoint and health cells: nothing while it is fine."""
    worker = answer.worker
    if worker is None:
        return "", ""
    if worker.status is None:
        return ", [bold red]worker: no answer[/]", ""
    state, health = worker.status.get("state"), (worker.status.get("last_result") or {}).get("state")
    return ("" if state == "active" else f", worker {endpoint_state(worker.status)}",
            "" if health in (None, "healthy") else f", worker {coloured(health, HEALTH_COLOURS.get(health or ''))}")


def row(answer: Answer) -> list[str]:
    """One cell per COLUMNS entry, as rich markup."""
    if answer.status is None:
        return [host_cell(answer), "[bold red]no answer[/]", *("" for _ in COLUMNS[2:])]
    s = answer.status
    health = (s.get("last_result") or {}).get("state")
    state_note, health_note = worker_note(answer)
    return [
        host_cell(answer), endpoint_state(s) + state_note,
        coloured(health, HEALTH_COLOURS.get(health or "")) + health_note,
        duration(s.get("uptime_seconds")), text(s.get("restarts")), short_model(s.get("model")),
        text((s.get("weights_generation") or "")[:12] or None), short_image(s.get("image")),
        percent(s.get("kv_cache_usage")), percent(s.get("mtp_acceptance")),
        text(s.get("requests_running")), text(s.get("requests_waiting")), text(s.get("served_name")),
        last_alert(s.get("last_alert")),
    ]


GATEWAY_COLUMNS = (Column("gateway", key=True), Column("spark", key=True), Column("state", key=True),
                   Column("in flight", key=True, right=True), Column("last check"))
STATE_COLOURS = {"up": "green", "up, drain": "yellow", "maint": "yellow"}


def gateway_rows(answer: Answer) -> list[list[str]]:
    """One row per Spark the gateway routes; one row saying there is no answer when it gave none."""
    if answer.views is None:
        return [[text(answer.host), "", "[bold red]no answer[/]", "", ""]]
    return [[text(answer.host), text(name), coloured(view.state, STATE_COLOURS.get(view.state, "bold red")),
             text(view.sessions), text(view.check or None)] for name, view in answer.views.items()]


def render(answers: list[Answer], console: Console, wide: bool = False) -> None:
    """The Sparks' table, the gateways' view, then why each host without an answer has none (too long for a
    cell)."""
    sparks = [answer for answer in answers if not answer.gateway]
    gateways = [answer for answer in answers if answer.gateway]
    if sparks or not gateways:
        print_folded(console, "sparkfleet status", COLUMNS, [row(answer) for answer in sparks], wide)
    if gateways:
        print_folded(console, "gateways: each Spark as the gateway sees it", GATEWAY_COLUMNS,
                     [line for answer in gateways for line in gateway_rows(answer)], wide)
    for answer in [*answers, *(answer.worker for answer in answers if answer.worker is not None)]:
        if answer.error:
            console.print(f"[bold red]{answer.host}[/]: {answer.error}", highlight=False)


def exit_code(answers: list[Answer]) -> int:
    """0 when every targeted host answered, 1 otherwise (and when no host matched)."""
    return 0 if answers and all(answer.answered for answer in answers) else 1
