"""The product on the lab: a first deploy converges stock Sparks, the verify suite passes, and a converged fleet
stays untouched. The standalone Sparks: test_90_pairs does the same for a pair."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from sparkfleet.endpoint import UNIT
from tests.integration.conftest import (
    INVENTORY,
    PYINFRA,
    STANDALONE,
    VERIFY_CHECKS,
    Run,
    converge,
    fresh,
    invocations,
    limit,
    verify,
)
from tests.lab import REPO, fleet

SKIPPED_WHEN_EMULATED = "deployed with vllm_start=false"


@pytest.fixture(scope="module")
def stock_hosts(lab: fleet.LabState) -> list[fleet.LabHost]:
    """Every host of the lab as provisioned, stock Sparks never deployed to. Hosts other files deployed to are
    reset: about a minute, in parallel, the emulated arm64 host the slowest. On a fresh lab nothing is, nor in a
    full session, where files run in name order and this one comes right after the lab's own checks (a saving,
    not something a test relies on). All of them, not just one: the first deploy is the product's main path,
    on every kind of host."""
    return fresh(*(host.name for host in lab.hosts)).hosts


@pytest.fixture(scope="module")
def first_deploy(stock_hosts: list[fleet.LabHost]) -> Run:
    return converge(*STANDALONE)


def test_first_deploy_converges(first_deploy: Run, stock_hosts: list[fleet.LabHost]) -> None:
    assert first_deploy.errors == 0 and first_deploy.changed > 0
    assert first_deploy.changed_by(f"Render the {UNIT} unit") == len(stock_hosts)  # every host got its endpoint


def test_verify_suite_passes(first_deploy: Run, stock_hosts: list[fleet.LabHost], tmp_path: Path) -> None:
    outcomes = verify(tmp_path / "verify.xml", *(host.name for host in stock_hosts))
    assert sorted(outcomes) == sorted(host.name for host in stock_hosts)
    for host in stock_hosts:
        results = outcomes[host.name]
        assert set(results) == VERIFY_CHECKS, host.name  # every check ran on every host
        if host.arch == "amd64":
            assert set(results.values()) == {"passed"}, (host.name, results)
        else:
            # Serving checks skip on emulated hosts (vllm_start=false), with the reason; the rest pass.
            assert "passed" in results.values(), results
            for check, outcome in results.items():
                assert outcome == "passed" or (outcome.startswith("skipped: ") and SKIPPED_WHEN_EMULATED in outcome), (
                    host.name, check, outcome)


def test_second_run_changes_nothing_and_restarts_nothing(first_deploy: Run, stock_hosts: list[fleet.LabHost]) -> None:
    before = invocations(stock_hosts)
    again = converge(*STANDALONE)
    assert again.changed == 0, again.output[-4000:]
    assert invocations(stock_hosts) == before


def planned_changes(output: str) -> list[str]:
    """Rows of pyinfra's "Detected changes" table that plan a change or a conditional change on any host."""
    table = output.split("Detected changes:", 1)[1].split("Detected changes may", 1)[0]
    return [line.strip() for line in table.splitlines() if re.search(r"\s\d+ \([^)]*\)", line)]


def test_dry_run_plans_nothing(first_deploy: Run) -> None:
    # Without -y, pyinfra detects changes and prints them; --dry then stops before executing anything.
    result = subprocess.run([PYINFRA, INVENTORY, "--dry", "deploy.py", *limit(*STANDALONE)], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert planned_changes(result.stdout + result.stderr) == []
