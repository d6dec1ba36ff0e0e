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
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sparkfleet.config import GatewayConfig

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


def api_command(commands: list[str]) -> tuple[str, ...]:
    """argv that sends each command to the admin socket on the gateway and prints the answers as one JSON object
    (the script's text travels in argv, so nothing needs installing)."""
    return ("python3", "-c", API_SCRIPT.read_text(), SOCKET, *commands)


class GatewayError(Exception):
    """A gateway that cannot be read or driven: the message names the gateway and what to check."""


def answers(host: str, output: str, commands: list[str]) -> list[str]:
    """The runtime API's answer to each command, from remote/haproxy_api.py's JSON; GatewayError when the socket
    could not be reached or a command was refused."""
    try:
        data = json.loads(output.strip().splitlines()[-1]) if output.strip() else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise GatewayError(f"{host}: the gateway's runtime API printed {output.strip()[:120]!r}, not its answers: "
                           "check that python3 runs there")
    if data.get("error"):
        raise GatewayError(f"{host}: cannot reach HAProxy's runtime API at {SOCKET} ({data['error']}): check "
                           f"`systemctl status {SERVICE}` there, or deploy the gateway")
    replies = data.get("answers")
    if not isinstance(replies, list) or len(replies) != len(commands):
        raise GatewayError(f"{host}: the gateway's runtime API answered {len(replies or [])} of "
                           f"{len(commands)} commands")
    for command, reply in zip(commands, replies, strict=True):
        if command.startswith("set ") and reply.strip():
            raise GatewayError(f"{host}: HAProxy refused `{command}`: {reply.strip()} (re-deploy the gateway if a "
                               "Spark is missing from its configuration)")
    return replies


@dataclass(frozen=True)
class ServerView:
    """One Spark as one gateway sees it."""

    name: str
    status: str  # HAProxy's own word: UP, DOWN, DRAIN, MAINT, NOLB, "UP 1/3" (going down), "DOWN 1/2" (going up)
    sessions: int  # scur: requests in flight through this gateway
    admin: AdminState  # what the runtime API (a rollout) set
    check: str  # the last health check: status and code or reason, e.g. "L7STS 401", "L4CON Connection refused"

    @property
    def up(self) -> bool:
        """Healthy and taking new requests."""
        return self.admin == "ready" and self.status.split()[0] == "UP"

    def summary(self) -> str:
        """up, down, drain or maint, with the sessions in flight and why it is down: for a table cell."""
        health = self.status.split()[0].lower()
        word = {"ready": "", "drain": "drain", "maint": "maint"}[self.admin]
        if health == "drain":
            health = "up"
        state = f"{health}, {word}" if word else health
        why = f" ({self.check})" if health == "down" and self.check else ""
        return f"{state}{why}, {self.sessions} in flight"

    def as_dict(self) -> dict[str, object]:
        return {"status": self.status, "sessions": self.sessions, "admin": self.admin, "check": self.check}


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
    for row in _csv_rows(servers_state):
        if row.get("be_name") == BACKEND:
            bits = int(row.get("srv_admin_state") or 0)
            admin[row["srv_name"]] = "maint" if bits & MAINT_BITS else "drain" if bits & DRAIN_BITS else "ready"
    views = {}
    for row in _csv_rows(stat):
        if row.get("pxname") != BACKEND or row.get("svname") in ("FRONTEND", "BACKEND"):
            continue
        name = row["svname"]
        # The status with its HTTP code (L7STS 401) or, without one, HAProxy's reason (L4CON Connection refused).
        reason = row.get("check_code") or row.get("last_chk", "")
        check = " ".join(part for part in (row.get("check_status", "").lstrip("* "), reason) if part)
        views[name] = ServerView(name, row.get("status", ""), int(row.get("scur") or 0), admin.get(name, "ready"),
                                 check)
    return views
