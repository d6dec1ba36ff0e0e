"""The from-scratch path: a bare Debian host reached as root, with no toolkit and no nvidia runtime."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.integration.conftest import Run, fresh, on_host, pyinfra
from tests.lab import REPO, fleet

HOST = "spark-blank-01"
HEALTHY = "Wait until the endpoint is healthy"


@pytest.fixture(scope="module")
def blank() -> Iterator[fleet.LabHost]:
    """The default lab plus one blank host, for this file only (reset if a session that stopped half-way left
    it deployed to)."""
    fleet.up(blank=1)
    try:
        yield fresh(HOST).host(HOST)
    finally:
        fleet.up()  # the default shape again: the blank host and its volume are removed


@pytest.fixture(scope="module")
def deployed_blank(blank: fleet.LabHost) -> Run:
    assert on_host(blank.container, "dpkg-query -W nvidia-container-toolkit 2>/dev/null || echo none").strip() == (
        "none")
    assert "nvidia" not in on_host(blank.container, "cat /etc/docker/daemon.json")
    return pyinfra("deploy.py", "--limit", HOST)


def test_toolkit_and_runtime_are_installed_from_scratch(deployed_blank: Run, blank: fleet.LabHost) -> None:
    for operation in ("Install NVIDIA's repository key", "Add NVIDIA's container toolkit apt source",
                      "Refresh apt's lists", "Install the toolkit packages pinned to 1.19.0-1",
                      "Register the nvidia runtime in daemon.json", HEALTHY,
                      # dockerd enables --gpus only when it starts with NVIDIA's hook installed: a reload is not enough
                      "Restart dockerd: the NVIDIA Container Toolkit is being installed"):
        assert deployed_blank.changed_by(operation) == 1, operation
    assert "Reload dockerd" not in deployed_blank.output
    daemon = json.loads(on_host(blank.container, "cat /etc/docker/daemon.json"))
    assert daemon["runtimes"]["nvidia"] == {"path": "nvidia-container-runtime", "args": []}
    assert "default-runtime" not in daemon and "features" not in daemon  # unmanaged: Docker's defaults stay
    assert daemon["registry-mirrors"] == ["http://registry.lab:5000"]


def test_verify_suite_passes_on_the_blank_host(deployed_blank: Run) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/verify", "--inventory",
         "inventory/lab.py", "-k", HOST], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-5000:]
    assert int(re.search(r"(\d+) passed", result.stdout).group(1)) >= 12
    assert "skipped" not in result.stdout


def test_second_deploy_changes_nothing(deployed_blank: Run) -> None:
    assert pyinfra("deploy.py", "--limit", HOST).changed == 0

