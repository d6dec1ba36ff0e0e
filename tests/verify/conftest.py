"""testinfra against any sparkfleet inventory: `pytest tests/verify --inventory inventory/lab.py`.

Hosts and their desired state come from the inventory itself (through `pyinfra debug-inventory`, which
connects to nothing), so the suite checks what the deploy promised for each host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import testinfra

from sparkfleet.endpoint import Endpoint
from sparkfleet.fleet import GATEWAYS, load_endpoint, with_weights

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Spark:
    """One inventory host: its testinfra connection and the endpoint the deploy should have built."""

    name: str
    host: testinfra.host.Host
    endpoint: Endpoint
    data: dict


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--inventory", default="inventory/lab.py", help="pyinfra inventory to verify")


def _inventory(path: str) -> dict[str, dict]:
    """The inventory's Sparks, name to data (its gateways are not endpoints: the gateway's lab test checks them)."""
    pyinfra = Path(sys.executable).with_name("pyinfra")
    out = subprocess.run([str(pyinfra), path, "debug-inventory", "--json"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    return {host["name"]: host["data"] for host in json.loads(out) if GATEWAYS not in host["groups"]}


def _ssh_config(hosts: dict[str, dict], path: Path) -> None:
    # One SSH connection per host for the whole suite, instead of one per check.
    lines = ["Host *", "  ControlMaster auto", f"  ControlPath {path.parent}/sparkfleet-verify-%C",
             "  ControlPersist 120"]
    for name, data in hosts.items():
        lines += [f"Host {name}", f"  HostName {data.get('ssh_hostname') or name}",
                  f"  Port {data.get('ssh_port') or 22}", f"  User {data.get('ssh_user') or 'root'}"]
        if data.get("ssh_key"):
            lines.append(f"  IdentityFile {data['ssh_key']}")
        if data.get("ssh_strict_host_key_checking") == "no":
            lines += ["  StrictHostKeyChecking no", "  UserKnownHostsFile /dev/null", "  LogLevel ERROR"]
    path.write_text("\n".join(lines) + "\n")


@cache
def _sparks(inventory: str) -> list[Spark]:
    hosts = _inventory(inventory)
    ssh_config = Path(os.environ.get("TMPDIR", "/tmp")) / f"sparkfleet-verify-{os.getpid()}.ssh_config"
    _ssh_config(hosts, ssh_config)
    sparks = []
    for name, data in hosts.items():
        endpoint, errors, _ = load_endpoint(name, data)
        assert endpoint is not None and not errors, errors
        endpoint = with_weights(endpoint)  # the generation the deploy resolved: the same source, asked again
        sudo = "&sudo=true" if data.get("ssh_user") not in (None, "root") else ""
        host = testinfra.get_host(f"ssh://{name}?ssh_config={ssh_config}{sudo}")
        sparks.append(Spark(name, host, endpoint, data))
    return sparks


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "spark" in metafunc.fixturenames:
        sparks = _sparks(metafunc.config.getoption("--inventory"))
        metafunc.parametrize("spark", sparks, ids=[s.name for s in sparks], scope="session")
