"""Incidents a real Spark has, on the lab: an engine that crashes after every load is alerted while systemd still
restarts it, a re-deploy after the start limit starts it again, and a probe queued behind busy requests is busy."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from sparkfleet.deploys.health import CHECKER, CONFIG
from sparkfleet.endpoint import ENV_FILE, UNIT
from tests.integration.conftest import converge, on_host, pyinfra
from tests.lab import fleet

HOST = "spark-03"
IMAGE = "vllm_image=vllm/vllm-openai:v0.28.0"


@pytest.fixture(scope="module")
def spark03(lab: fleet.LabState) -> Iterator[fleet.LabHost]:
    """spark-03 serving, given back with the inventory's own image and health settings at the end."""
    host = lab.host(HOST)
    converge(HOST)
    try:
        yield host
    finally:
        on_host(host.container, "rm -rf /tmp/busy-check /tmp/busy-check.json")
        converge(HOST)


def _unit(container: str, prop: str) -> str:
    return on_host(container, f"systemctl show -p {prop} --value {UNIT}.service").strip()


def _wait_for(what: str, condition, timeout: float):  # noqa: ANN001, ANN202
    """Poll until `condition()` returns something truthy; the lab's timings are bounded, so is this."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(3)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_a_crash_loop_alerts_before_the_start_limit_and_a_redeploy_recovers(spark03: fleet.LabHost) -> None:
    since = on_host(spark03.container, "date +%s").strip()
    # Loads in 5 s, serves 10 s, exits 1; systemd restarts it 30 s later, up to its start limit.
    pyinfra("deploy.py", "--limit", HOST, "--data", f"{IMAGE}-crash-after-load",
            "--data", "health_interval_seconds=10", check=False)
    errors = f"journalctl -u sparkfleet-health -p err --since @{since} -o cat --no-pager"

    def alerted() -> tuple[str, str] | None:
        text = on_host(spark03.container, errors)
        return (text, _unit(spark03.container, "ActiveState")) if "crash loop" in text else None

    alert, state = _wait_for("a crash-loop alert", alerted, 420)
    assert state != "failed", alert  # alerted while systemd was still restarting it, before its start limit
    assert "ALERT" in alert and f"keeps restarting {UNIT}.service" in alert
    # The engine's own words, from this start's logs, not an earlier incident's cutlass trace.
    assert "cutlass" not in alert.lower()

    # systemd gives up after StartLimitBurst starts (an automatic restart refused keeps Result=exit-code).
    journal = f"journalctl -u {UNIT} --since @{since} -o cat --no-pager"
    _wait_for("systemd's start limit", lambda: _unit(spark03.container, "ActiveState") == "failed" and (
        "Start request repeated too quickly" in on_host(spark03.container, journal)), 420)
    assert int(_unit(spark03.container, "NRestarts")) >= 3
    recovered = pyinfra("deploy.py", "--limit", HOST)  # the fix: the inventory's own image
    assert recovered.changed_by(f"Reset {UNIT}'s start counter") == 1
    assert recovered.changed_by("Wait until the endpoint is healthy") == 1
    assert _unit(spark03.container, "ActiveState") == "active"
    assert pyinfra("deploy.py", "--limit", HOST).changed == 0


def test_a_probe_queued_behind_busy_requests_is_busy_not_hung(spark03: fleet.LabHost) -> None:
    pyinfra("deploy.py", "--limit", HOST, "--data", f"{IMAGE}-busy")
    # One deep check now, with a short probe timeout, in a state directory of its own.
    config = json.loads(on_host(spark03.container, f"cat {CONFIG}"))
    config |= {"deep_every": 1, "deep_timeout_seconds": 3, "busy_sample_seconds": 2,
               "state_dir": "/tmp/busy-check", "textfile_dir": None}
    on_host(spark03.container, f"echo '{json.dumps(config)}' > /tmp/busy-check.json")
    out = on_host(spark03.container, f"systemd-run --quiet --wait --pipe --collect -p EnvironmentFile={ENV_FILE} "
                                     f"/usr/bin/python3 {CHECKER} --config /tmp/busy-check.json --json", check=False)
    result = json.loads(out)
    assert result["busy"] is True and result["state"] == "healthy", result
    assert result["diagnosis"].startswith("not hung"), result
