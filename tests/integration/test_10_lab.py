"""The lab itself: real hosts with systemd and dockerd, reached by pyinfra over SSH."""

from __future__ import annotations

import subprocess

from tests.integration.conftest import on_host, pyinfra
from tests.lab import fleet

PROBE_PORT = 29599  # a port no lab service uses


def test_hosts_boot_with_systemd_and_docker(lab: fleet.LabState) -> None:
    for host in [*lab.hosts, *lab.pairs]:
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
    hosts = [*lab.hosts, *lab.pairs]
    started = {h.container: on_host(h.container, "cat /proc/1/stat | cut -d' ' -f22") for h in hosts}
    again = fleet.up()
    assert [(h.name, h.ssh_port) for h in [*again.hosts, *again.pairs]] == [(h.name, h.ssh_port) for h in hosts]
    assert {h.container: on_host(h.container, "cat /proc/1/stat | cut -d' ' -f22") for h in hosts} == started


def test_gpu_driver_standin_reports_a_gb10(lab: fleet.LabState) -> None:
    query = on_host(lab.hosts[0].container, "nvidia-smi --query-gpu=name,driver_version --format=csv,noheader")
    assert query.startswith("NVIDIA GB10, 580.")


def test_pair_hosts_are_cabled_by_the_fabric(lab: fleet.LabState) -> None:
    head, worker = lab.pairs[:2]
    for host in (head, worker):
        address = on_host(host.container, f"ip -o -4 addr show dev {lab.fabric_interface}").split()[3]
        assert address == f"{host.fabric_address}/{fleet.FABRIC_SUBNET.prefixlen}", (host.name, address)
        assert on_host(host.container, "dpkg-query -W -f '${Version}' nvidia-container-toolkit") == (
            fleet.STOCK_TOOLKIT)  # stock-shaped, like the standalone Sparks
    route = on_host(worker.container, f"ip route get {head.fabric_address}")
    assert f"dev {lab.fabric_interface}" in route, route
    # The worker reaches a port on the head's fabric address, as its engine reaches the head's master port.
    serve = (f"setsid -f sh -c 'echo $$ > /run/probe.pid; exec python3 -m http.server --bind {head.fabric_address} "
             f"{PROBE_PORT}' >/dev/null 2>&1")
    on_host(head.container, serve)
    try:
        code = on_host(worker.container, f"for i in $(seq 50); do curl -s -o /dev/null -w '%{{http_code}}' "
                                         f"http://{head.fabric_address}:{PROBE_PORT}/ && break; sleep 0.2; done")
        assert code == "200"
    finally:
        on_host(head.container, "kill $(cat /run/probe.pid); rm -f /run/probe.pid", check=False)
