"""Step 2: the nvidia runtime in /etc/docker/daemon.json, and a dockerd restart only when that changed."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import server, systemd

from sparkfleet.deploys.context import staging_only, will_change
from sparkfleet.endpoint import Endpoint
from sparkfleet.operations import docker_runtime

DAEMON_JSON = "/etc/docker/daemon.json"


@deploy("Register the nvidia runtime with Docker")
def register_runtime(spark: Endpoint) -> None:
    if staging_only(host):
        return  # a dockerd restart would stop the running endpoint
    config = spark.config
    daemon = docker_runtime(
        name="Register the nvidia runtime in daemon.json, keeping every other key",
        path=DAEMON_JSON, cdi=config.nvidia_cdi, default_runtime=config.nvidia_default_runtime,
    )
    if not will_change(daemon):
        return
    systemd.service(
        name="Restart dockerd to load the new daemon.json",
        service="docker.service", running=True, restarted=True, _if=daemon.did_change,
    )
    server.shell(
        name="Check that dockerd came back with the nvidia runtime",
        commands=["docker info --format '{{json .Runtimes}}' | grep -q '\"nvidia\"'"],
        _if=daemon.did_change, _retries=10, _retry_delay=2,
    )
