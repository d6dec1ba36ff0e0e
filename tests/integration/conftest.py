"""Lab tests: a real fleet of simulated Sparks (systemd, sshd, dockerd) reached over SSH by pyinfra."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.lab import REPO, fleet

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
INVENTORY = "inventory/lab.py"


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


def on_host(container: str, command: str, check: bool = True) -> str:
    """Run a shell command on a lab host as root, for injecting drift or faults the way an operator would."""
    result = subprocess.run(["docker", "exec", container, "sh", "-c", command], capture_output=True, text=True)
    if check:
        assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="session")
def lab() -> fleet.LabState:
    """The default lab (3 amd64 + 1 arm64 host), brought up once for the whole session."""
    return fleet.up()


@pytest.fixture(scope="session")
def deployed(lab: fleet.LabState) -> Run:
    """The fleet after one real `pyinfra inventory/lab.py deploy.py`."""
    return pyinfra("deploy.py")


@pytest.fixture(scope="session")
def amd64(lab: fleet.LabState) -> list[fleet.LabHost]:
    return [host for host in lab.hosts if host.arch == "amd64"]
