"""A toolkit version change happens in its place: never in rollout's stage phase, and with the endpoint stopped
first (the packages' scripts run `systemctl daemon-reload`), then waited for."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sparkfleet.deploys.toolkit import PACKAGES, PIN
from tests.integration.conftest import converge, on_host, pyinfra
from tests.lab import fleet

HOST = "spark-02"
NEWER = "1.19.1-1"
STOCK = fleet.STOCK_TOOLKIT
STOP = "Stop the endpoint before the toolkit changes"
HEALTHY = "Wait until the endpoint is healthy"


@pytest.fixture(scope="module")
def spark02_converged(lab: fleet.LabState) -> fleet.LabHost:
    """spark-02 with its endpoint running on the inventory's toolkit version (the stock one)."""
    converge(HOST)
    return lab.host(HOST)


@pytest.fixture
def spark02(spark02_converged: fleet.LabHost) -> Iterator[fleet.LabHost]:
    """spark-02, given back on the inventory's toolkit version whatever the test left."""
    yield spark02_converged
    converge(HOST)


def _versions(container: str) -> set[str]:
    return set(on_host(container, f"dpkg-query -W -f '${{Version}}\\n' {' '.join(PACKAGES)}").split())


def _invocation(container: str) -> str:
    return on_host(container, "systemctl show sparkfleet-vllm.service -p InvocationID --value").strip()


def test_stage_phase_leaves_the_toolkit_alone(spark02: fleet.LabHost) -> None:
    before = _invocation(spark02.container)
    run = pyinfra("deploy.py", "--limit", HOST, "--data", "sparkfleet_phase=stage",
                  "--data", f"nvidia_toolkit_version={NEWER}")
    assert f"the toolkit moves to {NEWER} in this host's batch, not while staging" in run.output
    assert run.changed_by("Install the toolkit packages") == 0 and run.changed_by(STOP) == 0
    assert _versions(spark02.container) == {STOCK}
    assert _invocation(spark02.container) == before


def test_version_change_stops_the_endpoint_then_waits_for_it(spark02: fleet.LabHost) -> None:
    before = _invocation(spark02.container)
    for version in (NEWER, STOCK):  # an upgrade, then the downgrade back
        run = pyinfra("deploy.py", "--limit", HOST, "--data", f"nvidia_toolkit_version={version}")
        for operation in (STOP, f"Install the toolkit packages pinned to {version}", HEALTHY):
            assert run.changed_by(operation) == 1, operation
        assert _versions(spark02.container) == {version}
        assert f"Pin: version {version}" in on_host(spark02.container, f"cat {PIN}")
        assert _invocation(spark02.container) not in ("", before)
        before = _invocation(spark02.container)
        assert pyinfra("deploy.py", "--limit", HOST, "--data", f"nvidia_toolkit_version={version}").changed == 0
