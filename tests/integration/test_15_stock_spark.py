"""A stock DGX OS Spark as its owner left it: reached as a sudo user, toolkit and runtime adopted, the owner's
container and the endpoint never restarted by a change that a dockerd reload can apply."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from tests.integration.conftest import Run, converge, fresh, on_host, pyinfra
from tests.lab import fleet

HOST = "spark-01"  # stock, with `default-runtime: nvidia` and the owner's container `owner-webui`
DAEMON_JSON = "/etc/docker/daemon.json"
REPO_URL = "http://nvidia.lab/libnvidia-container"
HEALTHY = "Wait until the endpoint is healthy"


def _started(container: str) -> dict[str, str]:
    """Start time of every container on the host, and dockerd's PID: what a dockerd restart would change."""
    started = on_host(container, "docker ps -q | xargs docker inspect -f '{{.Name}} {{.State.StartedAt}}'")
    return {**dict(line.split() for line in started.splitlines()),
            "dockerd": on_host(container, "systemctl show -p MainPID --value docker.service").strip()}


def _toolkit_files(container: str) -> str:
    """When dpkg last unpacked each toolkit package: a reinstall changes it."""
    return on_host(container, "stat -c '%n %Y' /var/lib/dpkg/info/*nvidia-container*.list")


@pytest.fixture(scope="module")
def spark01(lab: fleet.LabState) -> fleet.LabHost:
    """spark-01 as new, shaped like a stock Spark and never deployed to (reset if another file deployed to it)."""
    return fresh(HOST).host(HOST)


@pytest.fixture(scope="module")
def adopted(spark01: fleet.LabHost) -> Iterator[tuple[Run, dict[str, str], str, str]]:
    """The first deploy to the stock host, with what it looked like before; spark-01 is left converged at the
    end, whatever a failed test left."""
    before = (_started(spark01.container), on_host(spark01.container, f"cat {DAEMON_JSON}"),
              _toolkit_files(spark01.container))
    yield (pyinfra("deploy.py", "--limit", HOST), *before)
    converge(HOST)


def test_root_cannot_log_in_and_admin_has_sudo(spark01: fleet.LabHost) -> None:
    ssh = ["ssh", "-i", str(fleet.SSH_KEY), "-p", str(spark01.ssh_port), "-o", "StrictHostKeyChecking=no",
           "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]
    root = subprocess.run([*ssh, "root@127.0.0.1", "true"], capture_output=True, text=True)
    assert root.returncode == 255 and "Permission denied" in root.stderr
    admin = subprocess.run([*ssh, "admin@127.0.0.1", "id -u; sudo -n id -u"], capture_output=True, text=True)
    assert admin.stdout.split() == ["1000", "0"], admin.stderr


def test_first_deploy_adopts_the_stock_toolkit_and_runtime(adopted: tuple, spark01: fleet.LabHost) -> None:
    run, started, daemon_json, toolkit = adopted
    assert run.changed > 0  # weights, unit, health: a new endpoint
    for operation in ("Install NVIDIA's repository key", "Add NVIDIA's container toolkit apt source",
                      "Install the toolkit packages", "Refresh apt's lists",
                      "Register the nvidia runtime in daemon.json", "Reload dockerd", "Restart dockerd"):
        assert run.changed_by(operation) == 0, operation
    assert _toolkit_files(spark01.container) == toolkit  # not reinstalled
    assert on_host(spark01.container, f"cat {DAEMON_JSON}") == daemon_json  # byte for byte
    assert json.loads(daemon_json)["default-runtime"] == "nvidia"  # the owner's other containers keep the GPU
    after = _started(spark01.container)
    assert {name: after[name] for name in started} == started  # owner-webui and dockerd untouched
    sources = on_host(spark01.container, f"grep -lrF {REPO_URL} /etc/apt/sources.list.d").split()
    assert sources == ["/etc/apt/sources.list.d/nvidia-container-toolkit.list"]
    on_host(spark01.container, "apt-get update -qq")  # one source, one signed-by: no "Conflicting values"


def test_toolkit_is_held_and_secrets_arrived_through_sudo(adopted: tuple, spark01: fleet.LabHost) -> None:
    policy = on_host(spark01.container, "apt-cache policy nvidia-container-toolkit")
    assert "Candidate: 1.19.0-1" in policy and "1.19.1-1" in policy  # newer in the lists, still held
    assert on_host(spark01.container, "apt-get -s upgrade | grep -c nvidia-container || true").strip() == "0"
    assert on_host(spark01.container, "stat -c '%U:%G %a' /etc/sparkfleet/vllm.env").strip() == "root:root 600"
    # The upload directory belongs to the SSH user, is private, and keeps nothing once the copy is made.
    assert on_host(spark01.container, "stat -c '%U %a' /var/lib/sparkfleet/uploads").strip() == "admin 700"
    assert on_host(spark01.container, "ls -A /var/lib/sparkfleet/uploads") == ""
    key = (fleet.LAB_DIR / "secrets" / "vllm_api_key").read_text().strip()
    assert f"VLLM_API_KEY={key}" in on_host(spark01.container, "cat /etc/sparkfleet/vllm.env")


def test_second_deploy_changes_nothing(adopted: tuple) -> None:
    assert pyinfra("deploy.py", "--limit", HOST).changed == 0


def test_runtime_restored_by_a_reload_that_restarts_no_container(adopted: tuple, spark01: fleet.LabHost) -> None:
    # Drift that dockerd has loaded: the nvidia runtime now runs plain runc (containers would lose the GPU).
    daemon = json.loads(on_host(spark01.container, f"cat {DAEMON_JSON}"))
    daemon["runtimes"]["nvidia"] = {"path": "/usr/sbin/runc"}
    daemon["log-level"] = "warn"
    on_host(spark01.container, f"echo '{json.dumps(daemon)}' > {DAEMON_JSON} && systemctl reload docker")
    assert "/usr/sbin/runc" in on_host(spark01.container, "docker info --format '{{json .Runtimes.nvidia}}'")
    started = _started(spark01.container)
    assert {"/owner-webui", "/sparkfleet-vllm"} <= set(started)

    run = pyinfra("deploy.py", "--limit", HOST)
    assert run.changed_by("Register the nvidia runtime in daemon.json") == 1
    assert run.changed_by("Reload dockerd") == 1 and "Restart dockerd" not in run.output
    assert _started(spark01.container) == started  # same start times, same dockerd
    repaired = json.loads(on_host(spark01.container, f"cat {DAEMON_JSON}"))
    assert repaired["runtimes"]["nvidia"] == {"path": "nvidia-container-runtime", "args": []}
    assert repaired["log-level"] == "warn" and repaired["default-runtime"] == "nvidia"
    assert repaired["registry-mirrors"] == ["http://registry.lab:5000"]
    assert "nvidia-container-runtime" in on_host(spark01.container,
                                                 "docker info --format '{{json .Runtimes.nvidia}}'")
    assert pyinfra("deploy.py", "--limit", HOST).changed == 0


def test_a_restart_is_refused_while_the_owners_containers_run(adopted: tuple, spark01: fleet.LabHost) -> None:
    before = (_started(spark01.container), on_host(spark01.container, f"sha256sum {DAEMON_JSON}"))
    run = pyinfra("deploy.py", "--limit", HOST, "--data", "nvidia_cdi=false", check=False)
    assert run.returncode != 0
    assert "features in /etc/docker/daemon.json cannot be reloaded), which would stop containers sparkfleet does " \
           "not own: owner-webui" in run.output
    assert "nvidia_docker_restart=true" in run.output and "Traceback" not in run.output
    assert (_started(spark01.container), on_host(spark01.container, f"sha256sum {DAEMON_JSON}")) == before


def test_cdi_off_with_the_restart_allowed(adopted: tuple, spark01: fleet.LabHost) -> None:
    before = _started(spark01.container)
    data = ["--data", "nvidia_cdi=false", "--data", "nvidia_docker_restart=true"]
    run = pyinfra("deploy.py", "--limit", HOST, *data)
    assert run.changed_by("Restart dockerd: features in /etc/docker/daemon.json cannot be reloaded") == 1
    assert run.changed_by(HEALTHY) == 1  # the endpoint the restart took down was waited for
    daemon = json.loads(on_host(spark01.container, f"cat {DAEMON_JSON}"))
    assert daemon["features"] == {"cdi": False} and daemon["default-runtime"] == "nvidia"
    mode = on_host(spark01.container, "python3 -c \"import tomllib;print(tomllib.load(open("
                                      "'/etc/nvidia-container-runtime/config.toml','rb'))['nvidia-container-runtime']"
                                      "['mode'])\"").strip()
    assert mode == "legacy"
    after = _started(spark01.container)
    assert after["dockerd"] != before["dockerd"]
    assert after["/owner-webui"] != before["/owner-webui"]  # restarted by its own restart policy
    assert pyinfra("deploy.py", "--limit", HOST, *data).changed == 0
    assert pyinfra("deploy.py", "--limit", HOST).changed == 0  # unmanaged again: the host's choice stays
