"""The fleet's gateway on the lab: HAProxy from Debian's archive in front of every serving Spark (a pair's head
among them), converged and repaired like a Spark, and drained by rollouts so that a restart is never a client's
problem."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from sparkfleet.gateway import SHOW, ServerView, answers, api_command, parse_views
from sparkfleet.runner import Reply
from tests.integration.conftest import Run, converge, fresh, invocations, on_host, pyinfra, routed
from tests.lab import LAB_DIR, REPO, fleet

GATEWAY = "gateway-01"
PORT = 8080  # gateway_port in inventory/lab.py
CONFIG = "/etc/haproxy/haproxy.cfg"
OVERRIDES = LAB_DIR / "host_data.json"
UNIT = "/etc/systemd/system/sparkfleet-vllm.service"


@pytest.fixture(scope="module")
def serving(amd64: list[fleet.LabHost]) -> list[fleet.LabHost]:
    """The standalone amd64 Sparks, converged and serving (what the rollouts here restart), and the pair, whose
    head the gateway routes too."""
    converge("lab_amd64", "lab_pair")
    return amd64


@pytest.fixture(scope="module")
def every_endpoint(serving: list[fleet.LabHost], lab: fleet.LabState) -> list[fleet.LabHost]:
    """What the gateway routes: each serving Spark and each pair's head."""
    return [lab.host(name) for name in routed(lab)]


@pytest.fixture(scope="module")
def first_deploy(serving: list[fleet.LabHost]) -> Run:
    """The gateway host as the lab provisioned it (no HAProxy), then deployed."""
    fresh(GATEWAY)
    return converge("gateways")


@pytest.fixture(scope="module")
def gateway(first_deploy: Run) -> fleet.LabHost:
    state = fleet.LabState.load()
    assert state is not None
    return state.host(GATEWAY)


def api(gateway: fleet.LabHost, *commands: str) -> list[str]:
    """The runtime API's answers, asked on the gateway as root (as the rollout does, with sudo)."""
    result = subprocess.run(["docker", "exec", gateway.container, "sh", "-c", api_command(list(commands))],
                            capture_output=True, text=True)
    reply = Reply(GATEWAY, result.returncode == 0, result.stdout.splitlines(), result.stderr.splitlines())
    return answers(reply, list(commands))


def views(gateway: fleet.LabHost) -> dict[str, ServerView]:
    """The gateway's view of each Spark."""
    return parse_views(*api(gateway, *SHOW))


def all_up(gateway: fleet.LabHost, names: list[str], seconds: float = 90) -> dict[str, ServerView]:
    """Wait until the gateway sees every named Spark up and ready (a Spark restarted by a deploy takes a load and
    two passed checks); the last views either way."""
    deadline = time.monotonic() + seconds
    while True:
        seen = views(gateway)
        if all(seen[name].up for name in names) or time.monotonic() > deadline:
            return seen
        time.sleep(1)


def key() -> str:
    return (LAB_DIR / "secrets" / "vllm_api_key").read_text().strip()


def complete(gateway: fleet.LabHost, api_key: str | None) -> int:
    """One 1-token completion through the gateway, from this machine; its HTTP status."""
    body = json.dumps({"model": "nvidia/Qwen3.6-35B-A3B-NVFP4", "prompt": "ping", "max_tokens": 1}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    request = urllib.request.Request(f"http://{gateway.address}:{PORT}/v1/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def sparkfleet(command: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkfleet", command, "inventory/lab.py", *args],
                          cwd=REPO, capture_output=True, text=True)


def rollout(*args: str) -> subprocess.CompletedProcess:
    return sparkfleet("rollout", *args)


def test_haproxy_is_installed_from_debians_archive(first_deploy: Run, gateway: fleet.LabHost) -> None:
    assert first_deploy.changed_by("Install HAProxy from the distribution's archive") == 1
    assert on_host(gateway.container, "dpkg-query -W -f '${Status}' haproxy") == "install ok installed"
    policy = on_host(gateway.container, "apt-cache policy haproxy")
    installed = policy.split("Installed: ", 1)[1].split()[0]
    assert installed.startswith("2.6.") and "http://deb.debian.org/debian" in policy, policy
    assert on_host(gateway.container, "systemctl is-active haproxy").strip() == "active"


def test_config_routes_every_serving_spark_and_passes_haproxy_c(gateway: fleet.LabHost,
                                                               every_endpoint: list[fleet.LabHost]) -> None:
    config = on_host(gateway.container, f"cat {CONFIG}")
    servers = [line.split()[1:3] for line in config.splitlines() if line.strip().startswith("server ")]
    # Not the arm64 host, nor a pair's worker: they serve nothing.
    assert servers == [[host.name, f"{host.address}:8000"] for host in every_endpoint]
    assert on_host(gateway.container, f"haproxy -c -f {CONFIG}").strip() == "Configuration file is valid"
    # It holds the API key (its health checks send it): root and haproxy only, and in no process's argv.
    assert on_host(gateway.container, f"stat -c '%a %U %G' {CONFIG}").strip() == "640 root haproxy"
    assert key() in config
    assert key() not in on_host(gateway.container, "ps -eo args")


def test_requests_with_the_key_reach_more_than_one_spark(gateway: fleet.LabHost,
                                                         serving: list[fleet.LabHost]) -> None:
    names = [host.name for host in serving]
    before = all_up(gateway, names)
    assert all(before[name].up for name in names), {name: view.summary() for name, view in before.items()}
    assert [complete(gateway, key()) for _ in range(12)] == [200] * 12
    assert complete(gateway, None) == 401  # the gateway forwards the client's key; the Spark judges it
    after = views(gateway)
    reached = [name for name in names if after[name].served > before[name].served]
    assert len(reached) > 1, reached


def test_a_second_deploy_changes_nothing_in_one_round_trip(gateway: fleet.LabHost) -> None:
    again = pyinfra("-vv", "deploy.py", "--limit", "gateways")
    assert again.changed == 0, again.output[-3000:]
    # -vv prints every command sent to the host: one, the host-side script that reads every file, unit and package.
    sent = [line for line in again.output.splitlines() if re.match(rf"\[{GATEWAY}\]\s+>>> ", line)]
    assert len(sent) == 1, sent


def test_drift_reads_a_converged_gateway_clean_and_names_a_drained_spark(gateway: fleet.LabHost,
                                                                         serving: list[fleet.LabHost]) -> None:
    drift = sparkfleet("drift", "--limit", "gateways")
    assert (drift.returncode, drift.stdout) == (0, "converged: 1 hosts\n"), drift.stderr
    name = serving[0].name
    api(gateway, f"set server sparks/{name} state drain")
    try:
        drift = sparkfleet("drift", "--limit", "gateways")
    finally:
        api(gateway, f"set server sparks/{name} state ready")
    assert drift.returncode == 2, drift.stdout + drift.stderr
    assert drift.stdout.startswith(f"{GATEWAY}: {name} is left in drain here"), drift.stdout


def test_a_hand_edit_is_repaired_with_a_reload(gateway: fleet.LabHost) -> None:
    main_pid = on_host(gateway.container, "systemctl show -p MainPID --value haproxy").strip()
    workers = on_host(gateway.container, f"pgrep -P {main_pid}").split()
    on_host(gateway.container, f"sed -i 's/timeout check 5s/timeout check 9s/' {CONFIG}")
    try:
        repair = converge("gateways")
    finally:
        converge("gateways")
    assert repair.changed_by("Render HAProxy's configuration") == 1
    assert repair.changed_by("Reload HAProxy on its new configuration") == 1
    assert "timeout check 5s" in on_host(gateway.container, f"cat {CONFIG}")
    # A reload: the same master process, new workers (the old ones finish what they were serving).
    assert on_host(gateway.container, "systemctl show -p MainPID --value haproxy").strip() == main_pid
    assert on_host(gateway.container, f"pgrep -P {main_pid}").split() != workers
    assert on_host(gateway.container, "systemctl show -p NRestarts --value haproxy").strip() == "0"


def test_status_shows_the_gateways_view_of_each_spark(gateway: fleet.LabHost,
                                                       every_endpoint: list[fleet.LabHost]) -> None:
    all_up(gateway, [host.name for host in every_endpoint])
    result = sparkfleet("status", "--limit", "gateways", "--json")
    assert result.returncode == 0, result.stderr
    [answer] = json.loads(result.stdout)
    assert {name: view["state"] for name, view in answer["gateway"].items()} == {
        h.name: "up" for h in every_endpoint}


def test_a_rollout_drains_each_spark_before_its_restart(gateway: fleet.LabHost, serving: list[fleet.LabHost]) -> None:
    names = [host.name for host in serving]
    all_up(gateway, names)
    drained: set[str] = set()
    most = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            now = {name for name, view in views(gateway).items() if view.admin == "drain"}
            drained.update(now)
            most[0] = max(most[0], len(now))
            done.wait(0.5)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = rollout("--limit", "lab_amd64", "--batch", "1", "--data", 'vllm_args={"max-num-seqs": 3}')
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    finally:
        done.set()
        watcher.join()
        converge("lab_amd64")  # the inventory's own flags again
    assert drained == set(names)  # each was drained at the gateway during its batch
    assert most[0] == 1  # one at a time
    final = all_up(gateway, names)
    assert all(final[name].up for name in names), {name: view.summary() for name, view in final.items()}


@pytest.fixture
def unreachable_gateway() -> Iterator[None]:
    """The gateway's SSH port, as the inventory has it, leads nowhere (per-host lab overrides)."""
    saved = OVERRIDES.read_text() if OVERRIDES.exists() else None
    overrides = json.loads(saved) if saved else {}
    OVERRIDES.write_text(json.dumps(overrides | {GATEWAY: {"ssh_port": 1}}))
    try:
        yield
    finally:
        if saved is None:
            OVERRIDES.unlink()
        else:
            OVERRIDES.write_text(saved)


def test_an_unreachable_gateway_stops_a_rollout_before_any_restart(gateway: fleet.LabHost,
                                                                    serving: list[fleet.LabHost],
                                                                    unreachable_gateway: None) -> None:
    before = invocations(serving)
    units = {host.name: on_host(host.container, f"cat {UNIT}") for host in serving}
    result = rollout("--limit", "lab_amd64", "--json", "--data", 'vllm_args={"max-num-seqs": 3}')
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["failed_batch"] == -1
    for host in report["hosts"]:
        assert host["outcome"] == "skipped"
        assert host["diagnosis"].startswith(f"not touched: {GATEWAY}: cannot connect over SSH"), host
    assert invocations(serving) == before
    assert {host.name: on_host(host.container, f"cat {UNIT}") for host in serving} == units
