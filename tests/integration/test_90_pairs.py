"""A pair on the lab: pair-01 (the head) and pair-02 (its worker) serve one endpoint with tensor parallel across the
fabric, deployed, health-checked and rolled out as one unit. The pair's first deploy from stock is whichever file's
converge comes first (test_80_gateway's in a full session): a reset here would pay for it twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from sparkfleet.endpoint import UNIT
from tests.integration.conftest import VERIFY_CHECKS, Run, converge, invocations, limit, on_host, pyinfra, verify
from tests.lab import LAB_DIR, REPO, fleet

GROUP = "lab_pair"
HEAD, WORKER = "pair-01", "pair-02"
PAIR_NAME = "lab-pair"
MASTER_PORT = "29500"
SERVED = "nvidia/Qwen3.6-35B-A3B-NVFP4"
IMAGE = "vllm/vllm-openai:v0.28.0"
UNIT_FILE = f"/etc/systemd/system/{UNIT}.service"
FABRIC_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
T = TypeVar("T")


@pytest.fixture(scope="module")
def deployed(lab: fleet.LabState) -> Run:
    """The pair deployed with the inventory's own settings, and the gateway, which routes the pair's head and drains
    it during a rollout."""
    return converge(GROUP, "gateways")


@pytest.fixture(scope="module")
def pair(lab: fleet.LabState, deployed: Run) -> tuple[fleet.LabHost, fleet.LabHost]:
    """(head, worker)."""
    return lab.host(HEAD), lab.host(WORKER)


def sparkfleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sparkfleet", args[0], "inventory/lab.py", *args[1:]], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "250"})


def container(host: fleet.LabHost, template: str) -> str:
    """A field of the endpoint's container, as `docker inspect` on the host gives it."""
    return on_host(host.container, f"docker inspect -f '{template}' sparkfleet-vllm").strip()


def args_of(host: fleet.LabHost) -> list[str]:
    return json.loads(container(host, "{{json .Args}}"))


def env_of(host: fleet.LabHost) -> dict[str, str]:
    return dict(item.split("=", 1) for item in json.loads(container(host, "{{json .Config.Env}}")))


def value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def wait_for(what: str, condition: Callable[[], T | None], timeout: float) -> T:
    """Poll until `condition()` returns something truthy; the lab's timings are bounded, so is this."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(3)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def healthy(host: fleet.LabHost) -> bool:
    probe = "curl -s -o /dev/null -m 2 -w '%{http_code}' http://127.0.0.1:8000/health"
    return on_host(host.container, probe, check=False).strip() == "200"


def test_deploy_gives_each_host_its_endpoint(deployed: Run, pair: tuple[fleet.LabHost, fleet.LabHost]) -> None:
    assert deployed.errors == 0
    for host in pair:  # one unit each, of the same name: the role decides its command
        assert on_host(host.container, f"systemctl is-enabled {UNIT}; systemctl is-active {UNIT}").split() == [
            "enabled", "active"], host.name


def test_the_head_serves_the_model_and_the_worker_serves_no_api(pair: tuple[fleet.LabHost, fleet.LabHost]) -> None:
    head, worker = pair
    key = (LAB_DIR / "secrets" / "vllm_api_key").read_text().strip()
    request = urllib.request.Request(f"http://{head.address}:8000/v1/models",
                                     headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert [model["id"] for model in json.loads(response.read())["data"]] == [SERVED]
    probe = "curl -s -o /dev/null -m 2 -w '%{http_code}' http://127.0.0.1:8000/health"
    assert on_host(worker.container, probe, check=False).strip() == "000"  # nothing listens there


def test_containers_run_with_their_node_rank(pair: tuple[fleet.LabHost, fleet.LabHost]) -> None:
    head, worker = pair
    for host, rank in ((head, "0"), (worker, "1")):
        args = args_of(host)
        assert value(args, "--nnodes") == "2" and value(args, "--node-rank") == rank, (host.name, args)
        assert value(args, "--tensor-parallel-size") == "2", (host.name, args)
        assert (value(args, "--master-addr"), value(args, "--master-port")) == (head.fabric_address, MASTER_PORT)
        assert ("--headless" in args) == (host is worker), (host.name, args)
        env = env_of(host)
        assert {name: env.get(name) for name in FABRIC_ENV} == dict.fromkeys(FABRIC_ENV, fleet.FABRIC_INTERFACE)
    assert "VLLM_API_KEY" in env_of(head) and "VLLM_API_KEY" not in env_of(worker)  # secrets only where needed
    # One model: the same image by digest, the same weights generation mounted.
    assert container(head, "{{.Image}}") == container(worker, "{{.Image}}")
    mounts = [sorted(m["Source"] for m in json.loads(container(h, "{{json .Mounts}}"))) for h in pair]
    assert mounts[0] == mounts[1]


def test_the_worker_joined_the_head_over_the_fabric(pair: tuple[fleet.LabHost, fleet.LabHost]) -> None:
    head, worker = pair
    joined = on_host(worker.container, f"ss -Htn state established '( dport = :{MASTER_PORT} )'")
    assert f"{worker.fabric_address}:" in joined and f"{head.fabric_address}:{MASTER_PORT}" in joined, joined
    logs = on_host(worker.container, "docker logs sparkfleet-vllm 2>&1")
    assert f"headless multiproc executor, with head node address {head.fabric_address}:{MASTER_PORT}" in logs


def test_verify_suite_passes_on_the_pair(pair: tuple[fleet.LabHost, fleet.LabHost], tmp_path: Path) -> None:
    outcomes = verify(tmp_path / "verify.xml", HEAD, WORKER)
    assert set(outcomes[HEAD]) == set(outcomes[WORKER]) == VERIFY_CHECKS  # every check ran on both
    assert outcomes[HEAD] == {check: "passed" for check in outcomes[HEAD]}, outcomes[HEAD]
    # The worker serves no API: a check of the endpoint skips there, with its reason; nothing fails.
    assert all(outcome == "passed" or outcome.startswith("skipped: ") for outcome in outcomes[WORKER].values()), (
        outcomes[WORKER])


def test_a_second_deploy_changes_and_restarts_nothing(pair: tuple[fleet.LabHost, fleet.LabHost]) -> None:
    before = invocations(list(pair))
    again = converge(GROUP)
    assert again.changed == 0, again.output[-4000:]
    assert invocations(list(pair)) == before


def test_drift_and_status_read_the_pair_as_one_endpoint(pair: tuple[fleet.LabHost, fleet.LabHost]) -> None:
    drift = sparkfleet("drift", "--limit", GROUP)
    assert (drift.returncode, drift.stdout) == (0, "converged: 2 hosts\n"), drift.stdout + drift.stderr
    status = sparkfleet("status", "--limit", GROUP)
    assert status.returncode == 0, status.stdout + status.stderr
    for text in (PAIR_NAME, HEAD, WORKER):
        assert text in status.stdout, status.stdout


@pytest.fixture
def stopped_worker(pair: tuple[fleet.LabHost, fleet.LabHost]) -> Iterator[str]:
    """The worker's endpoint stopped by hand (health checked every 10 s on the head); the time it was stopped. The
    pair is given back converged, both serving."""
    head, worker = pair
    pyinfra("deploy.py", *limit(GROUP), "--data", "health_interval_seconds=10")
    since = on_host(head.container, "date +%s").strip()
    on_host(worker.container, f"systemctl stop {UNIT}")
    try:
        yield since
    finally:
        converge(GROUP)
        wait_for("the head serving again", lambda: healthy(head), 300)


def test_stopping_the_worker_raises_an_alert_on_the_head(pair: tuple[fleet.LabHost, fleet.LabHost],
                                                         stopped_worker: str) -> None:
    head, worker = pair
    # The head's engine dies the way vLLM's does: the gloo error names the worker's fabric address.
    journal = f"journalctl -u {UNIT} --since @{stopped_worker} -o cat --no-pager"
    died = wait_for("the head's engine to fail", lambda: "EngineDeadError" in (text := on_host(
        head.container, journal)) and text, 60)
    assert f"Connection closed by peer [{worker.fabric_address}]" in died
    errors = f"journalctl -u sparkfleet-health -p err --since @{stopped_worker} -o cat --no-pager"
    alert = wait_for("an alert on the head", lambda: "ALERT" in (text := on_host(head.container, errors)) and text,
                     420)
    assert WORKER in alert, alert  # the diagnosis names the worker


def rollout(*args: str) -> subprocess.CompletedProcess[str]:
    return sparkfleet("rollout", "--limit", GROUP, "--json", *args)


def test_a_flag_rollout_restarts_both_as_one_batch(pair: tuple[fleet.LabHost, fleet.LabHost]) -> None:
    head, worker = pair
    before = invocations(list(pair))
    try:
        result = rollout("--data", 'vllm_args={"max-num-seqs": 3}')
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        plan = json.loads(result.stdout)
        assert [sorted(batch) for batch in plan["batches"]] == [[HEAD, WORKER]]  # a batch holds the whole pair
        assert {row["host"]: row["outcome"] for row in plan["hosts"]} == {HEAD: "updated", WORKER: "updated"}
        after = invocations(list(pair))
        for host in pair:
            assert after[host.name] != before[host.name], host.name
            assert value(args_of(host), "--max-num-seqs") == "3", host.name
        # The worker is started first, the head once it can join it.
        assert container(worker, "{{.State.StartedAt}}") <= container(head, "{{.State.StartedAt}}")
        assert healthy(head)
    finally:
        converge(GROUP)  # the inventory's own flags again


def test_a_failing_image_rolls_both_back(pair: tuple[fleet.LabHost, fleet.LabHost]) -> None:
    head, worker = pair
    units = {host.name: on_host(host.container, f"cat {UNIT_FILE}") for host in pair}
    try:
        result = rollout("--data", f"vllm_image={IMAGE}-crash-cutlass")
        output = result.stdout + result.stderr
        assert result.returncode == 1, output[-3000:]
        plan = json.loads(result.stdout)
        assert plan["failed_batch"] == 0
        assert {row["host"]: row["outcome"] for row in plan["hosts"]} == {HEAD: "rolled-back", WORKER: "rolled-back"}
        assert "cutlass" in output.lower()
        for host in pair:
            assert container(host, "{{.Config.Image}}") == IMAGE, host.name
            assert on_host(host.container, f"cat {UNIT_FILE}") == units[host.name], host.name
        assert container(head, "{{.Image}}") == container(worker, "{{.Image}}")
        assert healthy(head)
    finally:
        converge(GROUP)  # whatever the rollback left: the inventory's own image on both
