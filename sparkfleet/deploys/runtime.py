"""Step 2: the nvidia runtime in /etc/docker/daemon.json, loaded by a dockerd reload when that changed.

A reload (SIGHUP) applies `runtimes` and `default-runtime` with every container left running, as NVIDIA's own
installer does. Only a key dockerd cannot reload (CDI), or a toolkit installed under a running dockerd, takes a
restart, which stops every container on the host: it is refused in the preflight while containers sparkfleet
does not own run, unless `nvidia_docker_restart` allows it, and the endpoint it restarts is waited for by the
health gate.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import server, systemd

from sparkfleet.deploys.context import (
    activations,
    changed,
    once_per_host,
    restart_triggers,
    staging_only,
    toolkit_installs,
    will_change,
)
from sparkfleet.deploys.toolkit import PACKAGES, installed_toolkit
from sparkfleet.endpoint import CONTAINER, DAEMON_JSON, Endpoint
from sparkfleet.host_state import current
from sparkfleet.operations import docker_runtime, restart_keys, runtime_mode, wanted_daemon_json

RUNTIME_CONFIG = "/etc/nvidia-container-runtime/config.toml"


# dockerd registers its GPU device driver (what `--gpus` uses) only when it starts, and only if NVIDIA's hook
# is installed then (moby daemon/nvidia_linux.go): a toolkit installed under a running dockerd needs a restart.
FRESH_TOOLKIT = "the NVIDIA Container Toolkit is being installed (dockerd enables --gpus only when it starts)"


@dataclass(frozen=True)
class RuntimePlan:
    """What registering the runtime will do to dockerd, known before anything changes."""

    restart_reasons: tuple[str, ...]  # why dockerd must restart (empty: a reload is enough)
    blocking: tuple[str, ...]  # running containers sparkfleet does not own, which a restart would stop


@once_per_host
def runtime_plan(spark: Endpoint) -> RuntimePlan:
    """From the state before any change (the preflight and step 2 both need it)."""
    config = spark.config
    found = current()
    fact = found.get("daemon_json", None) if found else None
    reasons: list[str] = []
    if fact and not fact["error"]:  # unreadable or broken: the preflight and step 2 say so
        written = fact["config"] or {}
        keys = restart_keys(written, wanted_daemon_json(written, fact["resolved"], config.nvidia_cdi,
                                                        config.nvidia_default_runtime))
        reasons += [f"{', '.join(keys)} in {DAEMON_JSON} cannot be reloaded"] if keys else []
    if PACKAGES[0] not in installed_toolkit():
        reasons.append(FRESH_TOOLKIT)
    blocking: list[str] = []
    if reasons and not config.nvidia_docker_restart:
        blocking = [name for name in (found.get("containers", []) if found else []) if name != CONTAINER]
    return RuntimePlan(tuple(reasons), tuple(blocking))


def restart_problem(spark: Endpoint) -> str | None:
    """The preflight's refusal of a dockerd restart that would stop the owner's containers, or None."""
    plan = runtime_plan(spark)
    if not plan.blocking:
        return None
    return (f"dockerd must restart ({'; '.join(plan.restart_reasons)}), which would stop containers sparkfleet "
            f"does not own: {', '.join(plan.blocking)}. Stop them first, or set nvidia_docker_restart=true to "
            "allow the restart [host.docker-restart]")


@deploy("Register the nvidia runtime with Docker")
def register_runtime(spark: Endpoint) -> None:
    if staging_only(host):
        return  # dockerd changes wait for the host's batch
    config = spark.config
    daemon = docker_runtime(
        name="Register the nvidia runtime in daemon.json, keeping every other key",
        path=DAEMON_JSON, cdi=config.nvidia_cdi, default_runtime=config.nvidia_default_runtime,
    )
    if config.nvidia_cdi is False:
        # Docker's CDI off is not enough: the runtime's own default (jit-cdi) must give way to legacy too.
        restart_triggers[spark.host].append(runtime_mode(
            name="Run the NVIDIA runtime in legacy mode, as nvidia_cdi=false asks",
            path=RUNTIME_CONFIG, mode="legacy",
        ))
    installs = toolkit_installs[spark.host]
    if not will_change(daemon, *installs):
        return
    reasons = runtime_plan(spark).restart_reasons
    if reasons:
        activations[spark.host].append(systemd.service(
            name=f"Restart dockerd: {'; '.join(reasons)}. This restarts every container",
            service="docker.service", running=True, restarted=True, _if=changed(daemon, *installs),
        ))
    else:
        systemd.service(
            name="Reload dockerd to load the changed runtimes (containers keep running)",
            service="docker.service", reloaded=True, _if=daemon.did_change,
        )
    checks = ["docker info --format '{{json .Runtimes}}' | grep -q '\"nvidia\"'"]
    if config.nvidia_default_runtime:
        checks.append("test \"$(docker info --format '{{.DefaultRuntime}}')\" = nvidia")
    server.shell(
        name="Check that dockerd now lists the nvidia runtime", commands=checks,
        _if=changed(daemon, *installs), _retries=10, _retry_delay=2,
    )
