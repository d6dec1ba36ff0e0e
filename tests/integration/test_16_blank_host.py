"""The from-scratch path: a bare Debian host reached as root, with no toolkit and no nvidia runtime."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import VERIFY_CHECKS, Run, fresh, on_host, pyinfra, verify
from tests.lab import fleet

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


def test_verify_suite_passes_on_the_blank_host(deployed_blank: Run, tmp_path: Path) -> None:
    # Every check, serving ones included: the blank host is amd64 and starts its endpoint.
    assert verify(tmp_path / "verify.xml", HOST) == {HOST: dict.fromkeys(VERIFY_CHECKS, "passed")}


def test_second_deploy_changes_nothing(deployed_blank: Run) -> None:
    assert pyinfra("deploy.py", "--limit", HOST).changed == 0

