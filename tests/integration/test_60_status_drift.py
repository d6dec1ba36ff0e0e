"""`sparkfleet status` and `sparkfleet drift` on the lab: every host shown (the gateway with its view of each
Spark), a converged fleet reads clean, an injected drift is named by host and item until a deploy repairs it. The
fleet `converged` deploys, every host but the pairs' (test_90_pairs reads a pair's status and drift)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from tests.integration.conftest import INVENTORY, STANDALONE_FLEET, Run, converge, on_host, routed
from tests.lab import LAB_DIR, REPO, fleet

DAEMON_JSON = "/etc/docker/daemon.json"
RUNTIME_OP = "Register the nvidia runtime in daemon.json, keeping every other key"
SETTLE_SECONDS = 300  # a dockerd restart stops the endpoint: systemd restarts it after 30 s, then it loads
FLEET = ("--limit", ",".join(STANDALONE_FLEET))


def sparkfleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sparkfleet", *args, INVENTORY], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "250"})


def drift_settles(expected: int) -> subprocess.CompletedProcess[str]:
    """Run drift until it gives `expected` (an endpoint restarted by a repair reads unhealthy until it loads)."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        result = sparkfleet("drift", *FLEET)
        if result.returncode == expected or time.monotonic() > deadline:
            return result
        time.sleep(10)


@pytest.fixture
def spark01(lab: fleet.LabState, converged: Run) -> fleet.LabHost:
    """The host these tests change."""
    return lab.host("spark-01")


def _complete(host: fleet.LabHost, served_name: str) -> None:
    """One small completion, so the MTP counters have drafts to count."""
    key = (LAB_DIR / "secrets" / "vllm_api_key").read_text().strip()
    body = json.dumps({"model": served_name, "prompt": "Say hello to the fleet.", "max_tokens": 16})
    on_host(host.container, f"curl -sf -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' "
                            f"-d {shlex.quote(body)} http://127.0.0.1:8000/v1/completions")


def test_status_shows_every_host(lab: fleet.LabState, converged: Run) -> None:
    first = sparkfleet("status", "--json", *FLEET)
    served = {row["host"]: row.get("served_name") for row in json.loads(first.stdout)}
    for host in lab.hosts:
        if host.arch == "amd64":
            _complete(host, served[host.name])
    result = sparkfleet("status", "--json", *FLEET)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {row["host"]: row for row in json.loads(result.stdout)}
    assert sorted(rows) == sorted(h.name for h in [*lab.hosts, *lab.gateways])
    for gateway in lab.gateways:  # it routes the Sparks that serve, and reads as a gateway, not an endpoint
        assert rows[gateway.name]["error"] is None
        assert sorted(rows[gateway.name]["gateway"]) == sorted(routed(lab))
    for host in lab.hosts:
        row = rows[host.name]
        assert row["error"] is None and row["served_name"] == "nvidia/Qwen3.6-35B-A3B-NVFP4", row
        if host.arch == "amd64":
            assert (row["state"], row["sub_state"]) == ("active", "running"), row
            assert row["model"] == row["served_name"] and row["image"].startswith("vllm/vllm-openai:")
            assert row["uptime_seconds"] > 0 and isinstance(row["restarts"], int)
            assert (row["requests_running"], row["requests_waiting"]) == (0, 0)
            assert 0 <= row["kv_cache_usage"] <= 1
            assert 0.5 < row["mtp_acceptance"] <= 1  # the stand-in accepts 80 % of drafts
            assert row["last_result"]["state"] == "healthy"
        else:  # emulated: staged, never started
            assert (row["state"], row["uptime_seconds"], row["image"], row["metrics"]) == ("inactive", None, None,
                                                                                          False), row
            assert row["requests_running"] is row["kv_cache_usage"] is row["mtp_acceptance"] is None
    table = sparkfleet("status", *FLEET)
    assert table.returncode == 0, table.stderr
    assert all(host.name in table.stdout for host in lab.hosts)
    assert table.stdout.count("active/running") == sum(h.arch == "amd64" for h in lab.hosts)


def test_drift_is_one_quiet_line_after_a_deploy(lab: fleet.LabState, converged: Run) -> None:
    result = drift_settles(0)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (result.stdout, result.stderr) == (f"converged: {len(lab.hosts) + len(lab.gateways)} hosts\n", "")


def test_drift_names_a_removed_runtime_until_a_deploy_restores_it(lab: fleet.LabState,
                                                                  spark01: fleet.LabHost) -> None:
    assert drift_settles(0).returncode == 0
    daemon = json.loads(on_host(spark01.container, f"cat {DAEMON_JSON}"))
    del daemon["runtimes"]["nvidia"]
    try:
        on_host(spark01.container, f"echo {shlex.quote(json.dumps(daemon, indent=4))} > {DAEMON_JSON}")
        result = sparkfleet("drift", *FLEET)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stdout.splitlines() == [f"spark-01: would change: {RUNTIME_OP}"]
        report = json.loads(sparkfleet("drift", "--json", "--limit", "spark-01").stdout)
        assert report["status"] == "drifted"
        (host,) = report["hosts"]
        assert (host["host"], host["changes"], host["drift"]) == ("spark-01", [RUNTIME_OP], [])
        assert "Reload dockerd to load the changed runtimes (containers keep running)" in host["follow_ups"]
        assert host["facts"]["nvidia_runtime"] == {"daemon_json": False, "dockerd": True}
    finally:
        converge("spark-01")
    result = drift_settles(0)
    assert (result.returncode, result.stdout) == (0, f"converged: {len(lab.hosts) + len(lab.gateways)} hosts\n"), \
        result.stderr


def test_drift_reports_an_unreachable_host_as_an_error(spark01: fleet.LabHost) -> None:
    result = sparkfleet("drift", "--limit", "spark-01", "--data", "ssh_port=1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "spark-01: error: unreachable: cannot connect over SSH" in result.stderr
    assert result.stdout == ""
