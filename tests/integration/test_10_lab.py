"""The lab itself: real hosts with systemd and dockerd, reached by pyinfra over SSH."""

from __future__ import annotations

import subprocess

from tests.integration.conftest import on_host, pyinfra
from tests.lab import fleet


def test_hosts_boot_with_systemd_and_docker(lab: fleet.LabState) -> None:
    for host in lab.hosts:
        state = subprocess.run(["docker", "exec", host.container, "systemctl", "is-system-running"],
                               capture_output=True, text=True).stdout.strip()
        assert state in ("running", "degraded"), (host.name, state)
        assert on_host(host.container, "docker info --format '{{.ServerVersion}}'").strip()


def test_pyinfra_reaches_every_host_with_its_architecture(lab: fleet.LabState) -> None:
    output = pyinfra("exec", "--", "uname", "-m").output
    assert output.count("x86_64") >= sum(h.arch == "amd64" for h in lab.hosts)
    arm64 = [h for h in lab.hosts if h.arch == "arm64"]
    assert arm64 and "aarch64" in output
    assert on_host(arm64[0].container, "dpkg --print-architecture").strip() == "arm64"


def test_up_is_idempotent(lab: fleet.LabState) -> None:
    started = {h.container: on_host(h.container, "cat /proc/1/stat | cut -d' ' -f22") for h in lab.hosts}
    again = fleet.up()
    assert [(h.name, h.ssh_port) for h in again.hosts] == [(h.name, h.ssh_port) for h in lab.hosts]
    assert {h.container: on_host(h.container, "cat /proc/1/stat | cut -d' ' -f22") for h in lab.hosts} == started


def test_gpu_driver_standin_reports_a_gb10(lab: fleet.LabState) -> None:
    query = on_host(lab.hosts[0].container, "nvidia-smi --query-gpu=name,driver_version --format=csv,noheader")
    assert query.startswith("NVIDIA GB10, 580.")
