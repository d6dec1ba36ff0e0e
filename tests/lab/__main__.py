"""`python -m tests.lab up|down|status|demo`: run the Spark lab by hand."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from rich.console import Console

from sparkfleet import tables
from tests.lab import REPO, fleet


def _status() -> int:
    console = Console()
    state = fleet.LabState.load()
    if state is None:
        console.print("lab: not up (no state file); run `python -m tests.lab up`")
        return 1
    table = tables.table(console, "sparkfleet lab")
    for column in ("host", "arch", "ssh", "fabric", "container", "systemd", "docker"):
        table.add_column(column)
    for host in state.every:
        status = fleet._container_state(host.container)
        systemd = docker = "-"
        if status and status[0] == "running":
            systemd = _exec(host.container, "systemctl", "is-system-running")
            docker = _exec(host.container, "docker", "info", "-f", "{{.ServerVersion}}")
        fabric = f"{state.fabric_interface} {host.fabric_address}" if host.fabric_address else "-"
        table.add_row(host.name, host.arch, f"127.0.0.1:{host.ssh_port}", fabric, status[0] if status else "missing",
                      systemd, docker)
    console.print(table)
    console.print(f"registry: 127.0.0.1:{state.registry_port}  model mirror: {state.model_mirror_url}")
    console.print(f"Hub stand-in: {state.hf_endpoint} on lab hosts, {state.hub_url or '-'} here "
                  f"({state.hub_model_repo or '-'} at main and next; {state.hub_gated_repo} gated)")
    return 0


def _exec(container: str, *command: str) -> str:
    result = subprocess.run(["docker", "exec", container, *command], capture_output=True, text=True)
    return result.stdout.strip() or f"error ({result.returncode})"


def _demo(args: argparse.Namespace) -> int:
    """Bring the lab up and run the real deploy against it, as a user would against their Sparks."""
    fleet.up(args.hosts, args.arm64, gateways=args.gateways, pairs=args.pairs)
    pyinfra = os.path.join(os.path.dirname(sys.executable), "pyinfra")
    return subprocess.run([pyinfra, "-y", "inventory/lab.py", "deploy.py"], cwd=REPO).returncode


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.lab", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("up", "build (or reuse) images and start the lab"),
                       ("demo", "bring the lab up and run deploy.py against it")):
        command = commands.add_parser(name, help=text)
        command.add_argument("--hosts", type=int, default=3, help="amd64 hosts (default 3)")
        command.add_argument("--arm64", type=int, default=1, help="emulated arm64 hosts (default 1)")
        command.add_argument("--gateways", type=int, default=1, help="gateway hosts (default 1)")
        command.add_argument("--pairs", type=int, default=1, help="pairs of amd64 hosts on the fabric (default 1)")
    commands.add_parser("down", help="remove everything the lab started")
    commands.add_parser("status", help="table of hosts, addresses and states")
    args = parser.parse_args()
    if args.command == "up":
        fleet.up(args.hosts, args.arm64, gateways=args.gateways, pairs=args.pairs)
        return _status()
    if args.command == "demo":
        return _demo(args)
    if args.command == "down":
        fleet.down()
        return 0
    return _status()


if __name__ == "__main__":
    sys.exit(main())
