"""Rolling rollouts on the lab: one host at a time, and a bad canary rolled back before it spreads."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from tests.integration.conftest import converge, invocations, on_host
from tests.lab import REPO, fleet

UNIT = "/etc/systemd/system/sparkfleet-vllm.service"
# A restart keeps a host unhealthy for well over this (stop, start, a 5 s load), so each is seen several times;
# one round of probes is itself a docker exec per host, which a 2-core machine also runs the rollout on.
SAMPLE_SECONDS = 2.0


@pytest.fixture(scope="module")
def serving(amd64: list[fleet.LabHost]) -> list[fleet.LabHost]:
    """The amd64 hosts, converged and serving (the arm64 host serves nothing: rollouts here are to lab_amd64), and
    the gateway that drains them during a rollout deployed with their current addresses."""
    converge("lab_amd64", "gateways")
    return amd64


def rollout(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkfleet", "rollout", "inventory/lab.py", *args],
                          cwd=REPO, capture_output=True, text=True)


def _unhealthy(hosts: list[fleet.LabHost]) -> int:
    probe = "curl -s -o /dev/null -m 2 -w '%{http_code}' http://127.0.0.1:8000/health"
    return sum(on_host(h.container, probe, check=False).strip() != "200" for h in hosts)


def test_flag_rollout_restarts_one_host_at_a_time(serving: list[fleet.LabHost]) -> None:
    before = invocations(serving)
    worst, done = [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            worst[0] = max(worst[0], _unhealthy(serving))
            done.wait(SAMPLE_SECONDS)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = rollout("--limit", "lab_amd64", "--batch", "1", "--data", 'vllm_args={"max-num-seqs": 3}')
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        after = invocations(serving)
        assert all(after[h.name] != before[h.name] for h in serving)
        for host in serving:
            assert "--max-num-seqs 3" in on_host(host.container, f"cat {UNIT}")
    finally:
        done.set()
        watcher.join()
        converge("lab_amd64")  # the inventory's own flags again
    assert worst[0] == 1  # each host went down once, never two at the same time


def test_crashing_image_stops_at_the_canary_and_rolls_back(serving: list[fleet.LabHost]) -> None:
    canary, others = serving[0], serving[1:]
    units = {h.name: on_host(h.container, f"cat {UNIT}") for h in others}
    before = invocations(serving)
    try:
        result = rollout("--limit", "lab_amd64", "--data", "vllm_image=vllm/vllm-openai:v0.28.0-crash-cutlass")
        output = result.stdout + result.stderr
        assert result.returncode == 1, output[-3000:]
        assert "rolled-back" in output and "cutlass" in output.lower()
        image = on_host(canary.container, "docker inspect -f '{{.Config.Image}}' sparkfleet-vllm").strip()
        assert image == "vllm/vllm-openai:v0.28.0"
        assert _unhealthy([canary]) == 0
        after = invocations(serving)
        for host in others:
            assert after[host.name] == before[host.name]
            assert on_host(host.container, f"cat {UNIT}") == units[host.name]
    finally:
        converge("lab_amd64")  # whatever the rollback left: the inventory's own image everywhere
