"""The fleet's gateway: HAProxy in front of every serving Spark, and the runtime API a rollout drains it through.

A gateway host (inventory group `gateways`) runs HAProxy from its distribution's archive; deploys/gateway.py
renders its configuration from a `Gateway`. The running HAProxy is driven through its admin socket (the runtime
API, root only): a rollout sets a batch's servers to `drain` before it restarts them, waits until their current
sessions (`scur`) reach 0, and sets them `ready` once they pass their health gate; `sparkfleet status` shows each
gateway's view of each Spark. The commands are built here and their answers parsed here; remote/haproxy_api.py
carries them to the socket and back in one SSH round trip.
"""

from __future__ import annotations

import csv
import io
import ipaddress
import json
import shlex
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from sparkfleet.config import GatewayConfig
from sparkfleet.runner import Reply

PACKAGE = "haproxy"
SERVICE = "haproxy.service"
CONFIG = "/etc/haproxy/haproxy.cfg"
SOCKET = "/run/haproxy/admin.sock"  # the directory is the package's (tmpfiles.d), the socket HAProxy's
BACKEND = "sparks"
API_SCRIPT = Path(__file__).parent / "remote" / "haproxy_api.py"
AdminState = Literal["ready", "drain", "maint"]
# `show servers state` srv_admin_state bits (HAProxy's SRV_ADMF_*): forced, inherited, configured, resolution.
MAINT_BITS = 0x01 | 0x02 | 0x04 | 0x20
DRAIN_BITS = 0x08 | 0x10


@dataclass(frozen=True)
class Server:
    """One Spark as the gateway reaches it: a server of the `sparks` backend named after the inventory host."""

    name: str
    address: str
    port: int
    id: int  # HAProxy's persistent server id: consistent hashing places a server by it (see server_ids)


@dataclass(frozen=True)
class Gateway:
    """What one gateway host runs, resolved from its variables and the Sparks it routes."""

    host: str
    config: GatewayConfig
    servers: tuple[Server, ...]
    api_key: str | None = field(default=None, repr=False)  # the key every routed Spark accepts: its health check's

    @property
    def server_names(self) -> list[str]:
        return [server.name for server in self.servers]


def server_ids(names: list[str]) -> dict[str, int]:
    """A persistent id per server, from its name: a consistent hash places each server by its id, so ids that
    follow the inventory's order would move every later server's requests (and prefix caches) when a Spark is
    added in the middle. Every gateway gets the same ids, so they all send a session to the same Spark."""
    ids: dict[str, int] = {}
    for name in sorted(names):
        candidate = zlib.crc32(name.encode()) % 1_000_000 + 1
        while candidate in ids.values():  # a collision moves the later name (by sort order) one up
            candidate += 1
        ids[name] = candidate
    return ids


@dataclass(frozen=True)
class ConfigView:
    """Everything templates/gateway/haproxy.cfg.j2 prints, already in HAProxy's words."""

    port: int
    metrics_port: int | None
    timeout: int
    socket: str
    backend: str
    balance: list[str]
    authorization: str  # the health check's Authorization header ("" when the Sparks take no key)
    check_interval: int
    fall: int
    rise: int
    slowstart: str
    servers: list[str]  # `name address:port id N`

    @classmethod
    def of(cls, gateway: Gateway) -> ConfigView:
        config = gateway.config
        balance = (["balance leastconn"] if config.gateway_balance == "leastconn" else
                   [f"balance hdr({config.gateway_hash_header})", "hash-type consistent"])
        # The key's characters are checked in fleet.py (no quote, `%` or `$` that HAProxy would interpret).
        authorization = f' hdr Authorization "Bearer {gateway.api_key}"' if gateway.api_key else ""
        slowstart = f" slowstart {config.gateway_slowstart_seconds}s" if config.gateway_slowstart_seconds else ""
        return cls(
            port=config.gateway_port, metrics_port=config.gateway_metrics_port,
            timeout=config.gateway_timeout_seconds, socket=SOCKET, backend=BACKEND, balance=balance,
            authorization=authorization, check_interval=config.gateway_check_interval_seconds,
            fall=config.gateway_check_fall, rise=config.gateway_check_rise, slowstart=slowstart,
            # HAProxy reads the port after an address's last colon, IPv6 addresses included.
            servers=[f"{s.name} {s.address}:{s.port} id {s.id}" for s in gateway.servers],
        )


# --- the runtime API --------------------------------------------------------------------------------------


def state_commands(servers: list[str], state: AdminState) -> list[str]:
    """`set server` for each server: drain stops new requests and keeps health checks, ready restores it."""
    return [f"set server {BACKEND}/{name} state {state}" for name in servers]


SHOW = ["show stat", f"show servers state {BACKEND}"]


def api_command(commands: list[str]) -> str:
    """The shell command that sends each command to the admin socket on the gateway and prints the answers as one
    JSON object (the script's text travels in argv, so nothing needs installing)."""
    return shlex.join(["python3", "-c", API_SCRIPT.read_text(), SOCKET, *commands])


class GatewayError(Exception):
    """A gateway that cannot be read or driven: the message names the gateway and what to check."""


def answers(reply: Reply, commands: list[str]) -> list[str]:
    """The runtime API's answer to each command, from remote/haproxy_api.py's JSON line in a gateway's reply to
    `api_command(commands)`; GatewayError when the gateway, its socket or a command failed."""
    host = reply.host
    if reply.error:
        raise GatewayError(f"{host}: {reply.error}")
    data = None
    for line in reversed(reply.stdout):
        try:
            data = json.loads(line)
            break
        except ValueError:
            continue
    if not isinstance(data, dict):
        said = (reply.stderr or reply.stdout or ["nothing"])[-1].strip()
        raise GatewayError(f"{host}: the gateway's runtime API gave no answers (it said {said[:120]!r}): check "
                           "that python3 runs there")
    if data.get("error"):
        raise GatewayError(f"{host}: cannot reach HAProxy's runtime API at {SOCKET} ({data['error']}): check "
                           f"`systemctl status {SERVICE}` there, or deploy the gateway")
    replies = data.get("answers")
    if not isinstance(replies, list) or len(replies) != len(commands):
        raise GatewayError(f"{host}: the gateway's runtime API answered {len(replies or [])} of "
                           f"{len(commands)} commands")
    for command, answer in zip(commands, replies, strict=True):
        if command.startswith("set ") and answer.strip():
            raise GatewayError(f"{host}: HAProxy refused `{command}`: {answer.strip()} (re-deploy the gateway if a "
                               "Spark is missing from its configuration)")
    return replies


@dataclass(frozen=True)
class ServerView:
    """One Spark as one gateway sees it."""

    name: str
    status: str  # HAProxy's own word: UP, DOWN, DRAIN, MAINT, NOLB, "UP 1/3" (going down), "DOWN 1/2" (going up)
    sessions: int  # scur: requests in flight through this gateway
    served: int  # stot: requests this gateway has sent it since HAProxy started
    admin: AdminState  # what the runtime API (a rollout) set
    check: str  # the last health check: status and code or reason, e.g. "L7STS 401", "L4CON Connection refused"
    address: str = ""  # where the gateway sends it (srv_addr, srv_port): an address, never a host name

    @property
    def up(self) -> bool:
        """Healthy and taking new requests."""
        return self.state == "up"

    @property
    def state(self) -> str:
        """up or down as the gateway's checks see it, with drain or maint when the runtime API set it."""
        if self.admin == "maint":
            return "maint"
        health = "down" if self.status.split()[0] == "DOWN" else "up"  # UP, DRAIN, NOLB, "no check"
        return f"{health}, drain" if self.admin == "drain" else health

    def described(self) -> str:
        """The state, with the last check when it is down: `down (L4CON Connection refused)`."""
        return f"{self.state} ({self.check})" if self.state.startswith("down") and self.check else self.state

    def summary(self) -> str:
        """The state, why it is down, and the requests in flight: one phrase for a message."""
        return f"{self.described()}, {self.sessions} in flight"

    def as_dict(self) -> dict[str, object]:
        return {"state": self.state, "status": self.status, "sessions": self.sessions, "served": self.served,
                "admin": self.admin, "check": self.check}


def _csv_rows(text: str) -> list[dict[str, str]]:
    """A `show stat` or `show servers state` answer as rows keyed by the header line (the one starting `# `)."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = next((i for i, line in enumerate(lines) if line.startswith("# ")), None)
    if header is None:
        return []
    delimiter = "," if "," in lines[header] else " "
    names = [name for name in lines[header][2:].split(delimiter) if name]
    reader = csv.reader(io.StringIO("\n".join(lines[header + 1:])), delimiter=delimiter)
    return [dict(zip(names, row, strict=False)) for row in reader if row and not row[0].startswith("#")]


def parse_views(stat: str, servers_state: str) -> dict[str, ServerView]:
    """Each server of the `sparks` backend: status and sessions from `show stat` (CSV), the administrative state
    from `show servers state` (a drained server that is also down shows only DOWN in `show stat`)."""
    admin: dict[str, AdminState] = {}
    addresses: dict[str, str] = {}
    for row in _csv_rows(servers_state):
        if row.get("be_name") == BACKEND:
            bits = int(row.get("srv_admin_state") or 0)
            admin[row["srv_name"]] = "maint" if bits & MAINT_BITS else "drain" if bits & DRAIN_BITS else "ready"
            addresses[row["srv_name"]] = f"{row.get('srv_addr', '')}:{row.get('srv_port', '')}"
    views = {}
    for row in _csv_rows(stat):
        if row.get("pxname") != BACKEND or row.get("svname") in ("FRONTEND", "BACKEND"):
            continue
        name = row["svname"]
        # The status with its HTTP code (L7STS 401) or, without one, HAProxy's reason (L4CON Connection refused).
        reason = row.get("check_code") or row.get("last_chk", "")
        check = " ".join(part for part in (row.get("check_status", "").lstrip("* "), reason) if part)
        views[name] = ServerView(name, row.get("status", ""), int(row.get("scur") or 0), int(row.get("stot") or 0),
                                 admin.get(name, "ready"), check, addresses.get(name, ""))
    return views


# --- the fleet's gateways, for a rollout ------------------------------------------------------------------


class Shell(Protocol):
    """What drives the gateways: runner.Runner (the rollout's tests give a fake)."""

    def shell(self, names: Sequence[str], command: str) -> dict[str, Reply]: ...


POLL_SECONDS = 2.0


def _same_place(address: str, server: Server) -> bool:
    """Whether HAProxy's `address:port` is the server's; a server named by host name is taken as placed (HAProxy
    shows only what the name resolved to)."""
    host, _, port = address.rpartition(":")
    try:
        return ipaddress.ip_address(host) == ipaddress.ip_address(server.address) and port == str(server.port)
    except ValueError:
        return port == str(server.port)


class Gateways:
    """Every gateway of the inventory, driven together: each batch of a rollout is drained at all of them before
    it restarts, and made ready at all of them once it passes its health gate."""

    def __init__(self, shell: Shell, gateways: dict[str, Gateway], sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.shell, self.gateways, self.sleep, self.clock = shell, gateways, sleep, clock

    def _ask(self, commands: list[str]) -> dict[str, list[str]]:
        replies = self.shell.shell(list(self.gateways), api_command(commands))
        return {name: answers(reply, commands) for name, reply in replies.items()}

    def views(self) -> dict[str, dict[str, ServerView]]:
        """Each gateway's view of each Spark."""
        return {name: parse_views(*replies) for name, replies in self._ask(SHOW).items()}

    def check(self, sparks: Sequence[str]) -> None:
        """Every gateway answers and routes each of `sparks` where the inventory says it is (a Spark added or moved
        since the gateway was last deployed is missing or elsewhere): GatewayError otherwise, before anything is
        restarted, as a rollout would otherwise wait for a Spark its gateway never sees come back."""
        for name, views in self.views().items():
            wanted = {server.name: server for server in self.gateways[name].servers}
            missing = [spark for spark in sparks if spark not in views]
            moved = [f"{spark} at {views[spark].address}" for spark in sparks
                     if spark in views and spark in wanted and not _same_place(views[spark].address, wanted[spark])]
            if missing or moved:
                what = "; ".join(filter(None, [missing and f"routes no requests to {', '.join(missing)}",
                                               moved and f"routes {', '.join(moved)}, not where the inventory says"]))
                raise GatewayError(f"{name}: its configuration {what}: deploy the gateway first (pyinfra INVENTORY "
                                   f"deploy.py --limit {name})")

    def drain(self, sparks: Sequence[str]) -> str:
        """Stop sending `sparks` new requests at every gateway, then wait until none is in flight through any of
        them, at most the longest `gateway_drain_timeout_seconds`; what was still in flight then, or ""."""
        self._ask(state_commands(list(sparks), "drain"))
        timeout = max(gateway.config.gateway_drain_timeout_seconds for gateway in self.gateways.values())
        deadline = self.clock() + timeout
        while True:
            busy = {f"{spark} at {name}": view.sessions for name, views in self.views().items()
                    for spark, view in views.items() if spark in sparks and view.sessions}
            if not busy:
                return ""
            if self.clock() >= deadline:
                said = ", ".join(f"{count} on {where}" for where, count in busy.items())
                return f"requests still in flight after draining {timeout} s ({said}): restarted anyway"
            self.sleep(POLL_SECONDS)

    def ready(self, sparks: Sequence[str]) -> dict[str, str]:
        """Send `sparks` requests again at every gateway, and wait until every gateway's checks see them up (rise
        checks after a restart); per Spark not up by then, what a gateway sees instead."""
        self._ask(state_commands(list(sparks), "ready"))
        patience = max((g.config.gateway_check_rise + 2) * g.config.gateway_check_interval_seconds + 5
                       for g in self.gateways.values())
        deadline = self.clock() + patience
        while True:
            down = {spark: f"{patience} s after its health gate, {name} still sees it {view.described()}: check that "
                           f"{name} reaches its vllm_url" for name, views in self.views().items()
                    for spark, view in views.items() if spark in sparks and not view.up}
            if not down or self.clock() >= deadline:
                return down
            self.sleep(POLL_SECONDS)
