"""`sparkfleet doctor` on the lab, and deploy.py refusing an unfit host before it changes anything."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import pytest

from sparkfleet.preflight import HOST_CHECKS
from tests.integration.conftest import INVENTORY, Run, converge, on_host, pyinfra
from tests.lab import REPO, fleet

HOST = "spark-03"
DROPIN = "/etc/systemd/system/docker.service.d/10-mirror.conf"
# What a deploy would change on a converged host: files it renders and the services it restarts.
SNAPSHOT = (
    "sha256sum /etc/docker/daemon.json /etc/systemd/system/sparkfleet-vllm.service /etc/sparkfleet/*; "
    "systemctl show -p InvocationID --value docker.service sparkfleet-vllm.service; "
    "ls -A /mnt/small 2>/dev/null; true"
)


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sparkfleet", "doctor", INVENTORY, *args], cwd=REPO,
                          capture_output=True, text=True)


def doctor_json(*args: str) -> tuple[int, dict[str, dict]]:
    result = doctor(*args, "--json")
    return result.returncode, {report["host"]: report for report in json.loads(result.stdout)}


def rows(report: dict, rule: str) -> list[dict]:
    return [row for row in report["rows"] if row["rule"] == rule]


@pytest.fixture(scope="module")
def deployed(lab: fleet.LabState) -> Run:
    """The serving hosts deployed: doctor finds each port held by its own endpoint."""
    return converge("lab_amd64")


@pytest.fixture
def spark03(lab: fleet.LabState, deployed: Run) -> fleet.LabHost:
    return lab.host(HOST)


def test_deploy_runs_the_preflight_first(deployed: Run) -> None:
    assert "Refuse the host if its preflight found a problem" in deployed.output


def test_doctor_passes_on_the_amd64_hosts(amd64: list[fleet.LabHost], deployed: Run) -> None:
    code, reports = doctor_json("--limit", "lab_amd64")
    assert code == 0, json.dumps(reports, indent=1)[-4000:]
    assert sorted(reports) == sorted(h.name for h in amd64)
    for report in reports.values():
        assert report["status"] in ("ok", "warning"), report["rows"]
        assert [row["rule"] for row in report["rows"] if row["rule"].startswith("host.")][:len(HOST_CHECKS)] == list(
            HOST_CHECKS)
        assert report["facts"]["gpu"]["name"] == "NVIDIA GB10"
        assert report["facts"]["endpoint_state"] == "active"  # the port is held, by our own endpoint
        assert "is served by sparkfleet-vllm" in rows(report, "host.port")[0]["message"]


def test_doctor_prints_tables_and_the_memory_budget(deployed: Run) -> None:
    result = doctor("--limit", "spark-01,spark-02", "--explain")
    assert result.returncode == 0, result.stdout + result.stderr
    for text in ("spark-01: ", "spark-02: ", "host.gpu", "NVIDIA GB10", "10 KiB/token", "memory budget on MemTotal",
                 "doctor: all 2 hosts fit their endpoint"):
        assert text in result.stdout, result.stdout


def test_bad_inventory_is_reported_without_connecting(lab: fleet.LabState) -> None:
    code, reports = doctor_json("--limit", HOST, "--data", "vllm_recipe=nope", "--data", "ssh_port=1")
    assert code == 1
    assert [(row["rule"], row["status"]) for row in reports[HOST]["rows"]] == [("inventory", "error")]


def test_unreachable_host_is_an_error(lab: fleet.LabState) -> None:
    code, reports = doctor_json("--limit", HOST, "--data", "ssh_port=1")
    assert code == 1
    (row,) = rows(reports[HOST], "host.unreachable")
    assert row["status"] == "error" and "cannot connect over SSH" in row["message"]


@dataclass(frozen=True)
class Fault:
    inject: str
    clean: str
    data: tuple[str, ...]  # --data for both doctor and deploy (the host's view of the fault)
    change: tuple[str, ...]  # --data that would make the deploy change this host, if it got that far
    rule: str
    message: str


FAULTS = {
    "no-gpu": Fault(
        "mkdir -p /etc/sparkfleet-lab && touch /etc/sparkfleet-lab/no-gpu", "rm -f /etc/sparkfleet-lab/no-gpu",
        (), ('vllm_args={"max-num-seqs": 2}',), "host.gpu",
        "no GPU driver answers: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
    ),
    "full-model-disk": Fault(
        "mkdir -p /mnt/small && mount -t tmpfs -o size=64m tmpfs /mnt/small",
        "umount /mnt/small; rmdir /mnt/small",
        ("model_dir=/mnt/small",), (), "host.disk", "not enough space on /mnt/small",
    ),
    "foreign-port": Fault(
        "setsid -f sh -c 'echo $$ > /run/test-port.pid; exec python3 -m http.server 9999' >/dev/null 2>&1; "
        "for i in $(seq 100); do ss -Hltn 'sport = :9999' | grep -q . && break; sleep 0.1; done",
        "kill $(cat /run/test-port.pid); rm -f /run/test-port.pid",
        ("vllm_port=9999",), (), "host.port", "port 9999 is already held by python3 (not sparkfleet-vllm)",
    ),
    "conflicting-drop-in": Fault(
        f"mkdir -p {DROPIN.rsplit('/', 1)[0]} && printf '[Service]\\nExecStart=\\nExecStart=/usr/bin/dockerd "
        f"--registry-mirror=http://registry.lab:5000\\n' > {DROPIN}",
        f"rm -f {DROPIN}; rmdir --ignore-fail-on-non-empty {DROPIN.rsplit('/', 1)[0]}",
        (), ("nvidia_cdi=true",), "host.dropin",
        f"dockerd refuses to start when a key is set both as a flag ({DROPIN}: --registry-mirror) and in "
        "daemon.json (deepops #305)",
    ),
}


@pytest.mark.parametrize("name", FAULTS)
def test_unfit_host_fails_doctor_and_deploy_leaves_it_untouched(spark03: fleet.LabHost, name: str) -> None:
    fault = FAULTS[name]
    data = [arg for item in fault.data for arg in ("--data", item)]
    try:
        on_host(spark03.container, fault.inject)
        code, reports = doctor_json("--limit", HOST, *data)
        assert code == 1
        problems = [row for row in reports[HOST]["rows"] if row["status"] == "error"]
        assert [row["rule"] for row in problems] == [fault.rule], problems
        assert fault.message in problems[0]["message"]

        before = on_host(spark03.container, SNAPSHOT)
        changes = [arg for item in fault.change for arg in ("--data", item)]
        run = pyinfra("--limit", HOST, *data, *changes, "deploy.py", check=False)
        assert run.returncode != 0
        assert "sparkfleet preflight refused this host; nothing was changed on it" in run.output
        assert fault.message in run.output
        assert on_host(spark03.container, SNAPSHOT) == before
    finally:
        on_host(spark03.container, fault.clean, check=False)
    assert doctor("--limit", HOST).returncode == 0
