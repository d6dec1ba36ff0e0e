"""The product on the lab: converge, verify, and prove that a converged fleet stays untouched."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.integration.conftest import INVENTORY, PYINFRA, Run, invocations, pyinfra
from tests.lab import REPO, fleet


def test_first_deploy_converges(converged: Run) -> None:
    # On a fresh lab every step changes something; on a lab left converged by an earlier session, nothing.
    assert converged.returncode == 0 and converged.errors == 0


def test_verify_suite_passes(converged: Run, lab: fleet.LabState) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/verify", "--inventory",
         "inventory/lab.py", "-rs"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-5000:]
    passed = int(re.search(r"(\d+) passed", result.stdout).group(1))
    skipped = re.search(r"(\d+) skipped", result.stdout)
    arm64 = sum(h.arch == "arm64" for h in lab.hosts)
    # Serving checks skip on emulated hosts (vllm_start=false) and only there, with the reason.
    assert passed >= 12 * len(lab.hosts) - 6 * arm64
    assert (int(skipped.group(1)) if skipped else 0) == 6 * arm64
    assert "deployed with vllm_start=false" in result.stdout or not arm64


def test_second_run_changes_nothing_and_restarts_nothing(converged: Run, lab: fleet.LabState) -> None:
    before = invocations(lab.hosts)
    again = pyinfra("deploy.py")
    assert again.changed == 0, again.output[-4000:]
    assert invocations(lab.hosts) == before


def planned_changes(output: str) -> list[str]:
    """Rows of pyinfra's "Detected changes" table that plan a change or a conditional change on any host."""
    table = output.split("Detected changes:", 1)[1].split("Detected changes may", 1)[0]
    return [line.strip() for line in table.splitlines() if re.search(r"\s\d+ \([^)]*\)", line)]


def test_dry_run_plans_nothing(converged: Run) -> None:
    # Without -y, pyinfra detects changes and prints them; --dry then stops before executing anything.
    result = subprocess.run([PYINFRA, INVENTORY, "--dry", "deploy.py"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert planned_changes(result.stdout + result.stderr) == []
