"""Lab tests: a real fleet of simulated Sparks (systemd, sshd, dockerd) reached over SSH by pyinfra.

Every file establishes the state it needs and gives back what it changed, so any file runs alone
(`pytest tests/integration -k test_30_drift`) and in any order: the lab is brought up once per session, a file
that needs endpoints converges the hosts it uses (a no-op of a few seconds when another file left them
converged), a file that needs hosts never deployed to resets them (`fresh`), and every test that changes a host
restores it in `finally` or in a fixture's teardown.
"""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkfleet.deploys.context import LIB
from sparkfleet.deploys.toolkit import PIN
from sparkfleet.endpoint import ETC
from tests.lab import REPO, fleet
from tests.verify import test_spark

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
INVENTORY = "inventory/lab.py"
# What a deploy leaves on a host: the toolkit's pin (step 1), then sparkfleet's own directories. A host with
# none of them is as the lab provisioned it.
DEPLOY_TRACES = (PIN, ETC, LIB, "/var/lib/sparkfleet")
# The testinfra suite's checks, each of which runs on every host of the inventory.
VERIFY_CHECKS = frozenset(name for name in vars(test_spark) if name.startswith("test_"))
# Every host but the pairs' (groups of inventory/lab.py): the pair hosts are in `sparks` too, and only the files
# about pairs deploy to them, so the others neither wait for a pair nor depend on one.
STANDALONE = ("lab_amd64", "lab_arm64")
STANDALONE_FLEET = (*STANDALONE, "gateways")


@dataclass
class Run:
    """One pyinfra run: its exit code, output, and the Grand total row (changed / errors / unchanged)."""

    returncode: int
    output: str

    @property
    def changed(self) -> int:
        return self._total(1)

    @property
    def errors(self) -> int:
        return self._total(2)

    def _total(self, column: int) -> int:
        return self.row("Grand total")[column]

    def row(self, operation: str) -> tuple[int, int, int, int]:
        """An operation's row of the Results table: hosts, changed (success), errors, unchanged."""
        match = re.search(re.escape(operation) + r"[^\n]*?\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*\n",
                          self.output.rsplit("--> Results:", 1)[-1])
        assert match, f"no row for {operation!r}:\n{self.output[-3000:]}"
        return tuple(0 if value == "-" else int(value) for value in match.groups())  # type: ignore[return-value]

    def changed_by(self, operation: str) -> int:
        """How many hosts an operation changed (0 when it ran as a no-op, or did not run at all)."""
        return self.row(operation)[1] if operation in self.output else 0


def pyinfra(*args: str, check: bool = True) -> Run:
    result = subprocess.run([PYINFRA, "-y", INVENTORY, *args], cwd=REPO, capture_output=True, text=True)
    run = Run(result.returncode, result.stdout + result.stderr)
    if check:
        assert result.returncode == 0, run.output[-5000:]
    return run


def limit(*names: str) -> list[str]:
    """`--limit` arguments for hosts or groups."""
    return [arg for name in names for arg in ("--limit", name)]


def converge(*names: str) -> Run:
    """Deploy the inventory's own settings to `names` (hosts or groups; every host when empty) and require
    success. A no-op on a converged host, a few seconds; on a fresh one, a first deploy (minutes)."""
    return pyinfra("deploy.py", *limit(*names))


def on_host(container: str, command: str, check: bool = True) -> str:
    """Run a shell command on a lab host as root, for injecting drift or faults the way an operator would."""
    result = subprocess.run(["docker", "exec", container, "sh", "-c", command], capture_output=True, text=True)
    if check:
        assert result.returncode == 0, result.stderr
    return result.stdout


def served_weights(container: str) -> str:
    """The weights directory (the model's generation) the host's endpoint unit mounts."""
    unit = on_host(container, "cat /etc/systemd/system/sparkfleet-vllm.service").split()
    return next(unit[i + 1].split(":")[0] for i, word in enumerate(unit)
                if word == "--volume" and unit[i + 1].startswith("/var/lib/sparkfleet/models/"))


def invocations(hosts: list[fleet.LabHost]) -> dict[str, str]:
    """systemd's InvocationID of each endpoint: it changes on every (re)start, and only then."""
    return {h.name: on_host(h.container, "systemctl show sparkfleet-vllm.service -p InvocationID --value").strip()
            for h in hosts}


def routed(lab: fleet.LabState) -> list[str]:
    """The Sparks a gateway routes, in inventory order: each standalone one that serves, then each pair's head (a
    pair is one endpoint, served by its head; the worker serves no API)."""
    return [host.name for host in lab.hosts if host.arch == "amd64"] + [head.name for head in lab.pairs[::2]]


def fresh(*names: str) -> fleet.LabState:
    """The lab with these hosts as it provisioned them, never deployed to. A host a deploy has touched is reset
    (a new container and Docker volume, provisioned again: about a minute, more for the emulated arm64 host);
    an untouched one is kept, so on a fresh lab this costs nothing."""
    state = fleet.LabState.load()
    assert state is not None, "the lab is not up"
    traces = " || ".join(f"test -e {path}" for path in DEPLOY_TRACES)
    touched = [name for name in names
               if on_host(state.host(name).container, f"if {traces}; then echo touched; fi").strip()]
    return fleet.reset(touched) if touched else state


def verify(report: Path, *hosts: str) -> dict[str, dict[str, str]]:
    """Run the testinfra suite (tests/verify) on `hosts` (every host when empty): for each host, each check's
    outcome, "passed", "failed", "error" or "skipped: <reason>"."""
    select = ["-k", " or ".join(hosts)] if hosts else []
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/verify", "--inventory", INVENTORY,
         f"--junitxml={report}", *select], cwd=REPO, capture_output=True, text=True)
    assert report.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    outcomes: dict[str, dict[str, str]] = {}
    for case in ElementTree.parse(report).iter("testcase"):
        check, _, host = case.attrib["name"].removesuffix("]").partition("[")
        found = [(word, element) for tag, word in (("failure", "failed"), ("error", "error"), ("skipped", "skipped"))
                 if (element := case.find(tag)) is not None]
        outcomes.setdefault(host, {})[check] = f"{found[0][0]}: {found[0][1].get('message')}" if found else "passed"
    return outcomes


@pytest.fixture(scope="session")
def lab_up() -> None:
    """The default lab (3 amd64 + 1 arm64 standalone host, a pair, a gateway), brought up once for the whole
    session."""
    fleet.up()


@pytest.fixture(scope="module")
def lab(lab_up: None) -> fleet.LabState:
    """The lab as this file finds it (a host another file reset is back on a new SSH port)."""
    state = fleet.LabState.load()
    assert state is not None, "the lab is not up"
    return state


@pytest.fixture(scope="module")
def amd64(lab: fleet.LabState) -> list[fleet.LabHost]:
    """The hosts that serve (group lab_amd64); the emulated arm64 host stages but never starts its endpoint."""
    return [host for host in lab.hosts if host.arch == "amd64"]


@pytest.fixture(scope="module")
def converged(lab: fleet.LabState) -> Run:
    """Every host but the pairs' deployed with the inventory's own settings, whatever other files did before this
    one."""
    return converge(*STANDALONE_FLEET)
