"""Step 5: a systemd timer that probes the endpoint, diagnoses a sick one and reports it."""

from __future__ import annotations

import io
import json

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.util import get_template
from pyinfra.operations import server, systemd

from sparkfleet.deploys.context import (
    LIB,
    REMOTE,
    TEMPLATES,
    activations,
    changed,
    pair_restarting,
    staging_only,
    will_change,
)
from sparkfleet.endpoint import CONTAINER, ENV_FILE, ETC, UNIT, Endpoint
from sparkfleet.operations import managed_file, pair_step, unit_state

CHECKER = f"{LIB}/healthcheck.py"
STATUS = f"{LIB}/status.py"  # read-only reporter that `sparkfleet status` and `drift` run
COMMON = f"{LIB}/common.py"  # what both share; each imports it from its own directory
CONFIG = f"{ETC}/health.json"
STATE_DIR = "/var/lib/sparkfleet/health"
HEALTH = "sparkfleet-health"


def health_config(spark: Endpoint) -> dict[str, object]:
    """The checker's configuration, every key of it (the checker has no defaults): no secrets, those come from
    the env file."""
    config = spark.config
    return {
        "endpoint": UNIT, "unit": f"{UNIT}.service", "container": CONTAINER,
        "url": f"http://127.0.0.1:{config.vllm_port}", "served_model_name": spark.served_name, "env_file": ENV_FILE,
        "load_window_seconds": spark.recipe.load_timeout_seconds, "interval_seconds": config.health_interval_seconds,
        "deep_every": config.health_deep_every, "timeout_seconds": 5, "deep_timeout_seconds": 60,
        "alert_after": config.health_alert_after, "textfile_dir": config.health_textfile_dir,
        "state_dir": STATE_DIR, "log_lines": 1000, "renotify_minutes": config.health_renotify_minutes,
        "min_mem_available_gib": config.health_min_mem_available_gib, "busy_sample_seconds": 5,
        "pair": pair_config(spark),
    }


def pair_config(spark: Endpoint) -> dict[str, object] | None:
    """What the checker of a pair host needs: its role, the other host's name (its diagnoses name it) and where
    the two meet (the head's master port: the worker's connection there is the pair's link)."""
    pair = spark.config.pair
    if pair is None:
        return None
    return {"name": pair.name, "role": spark.role, "peer": spark.peer, "master_addr": pair.master_addr,
            "master_port": pair.master_port, "interface": pair.interface}


@deploy("Install the endpoint health check")
def install_healthcheck(spark: Endpoint) -> None:
    if staging_only(host):
        return
    managed_file(name="Install the helpers the health checker and status reporter share",
                 src=str(REMOTE / "common.py"), dest=COMMON, mode="644")
    managed_file(name="Install the health checker", src=str(REMOTE / "healthcheck.py"), dest=CHECKER, mode="755")
    managed_file(name="Install the status reporter that `sparkfleet status` and `sparkfleet drift` run",
                 src=str(REMOTE / "status.py"), dest=STATUS, mode="755")
    managed_file(name="Write the health checker's configuration",
                 src=io.StringIO(json.dumps(health_config(spark), indent=2) + "\n"), dest=CONFIG, mode="644")
    values = {"interval": spark.config.health_interval_seconds, "checker": CHECKER, "config": CONFIG,
              "env_file": ENV_FILE}
    units = [
        managed_file(
            name=f"Render the {HEALTH}.{kind} unit", dest=f"/etc/systemd/system/{HEALTH}.{kind}", mode="644",
            src=io.StringIO(get_template(str(TEMPLATES / "health" / f"{HEALTH}.{kind}.j2")).render(**values)),
        )
        for kind in ("service", "timer")
    ]
    if will_change(*units):
        systemd.daemon_reload(name="Reload systemd to read the changed health units", _if=changed(*units))
    enabled = spark.config.vllm_start
    unit_state(name="Run the health timer where the endpoint runs (stopped when vllm_start is false)",
               unit=f"{HEALTH}.timer", running=enabled, enabled=enabled)
    started = activations[spark.host]
    if enabled and spark.role is not None:
        timeout = spark.recipe.load_timeout_seconds
        pair_step(name=f"Wait until pair {spark.config.pair.name} is healthy: the head serves with its worker "  # type: ignore[union-attr]
                  f"joined (giving up after {timeout} s)", commands=[wait_command(timeout)],
                  restarting=pair_restarting(spark), peer_failed=lambda: None, unchanged="the pair was not restarted")
    elif enabled and will_change(*started):
        wait_healthy(spark, _if=changed(*started))


def wait_command(timeout: int) -> str:
    """The health checker's wait mode, run as a transient unit so the API key comes from the env file."""
    return (f"systemd-run --quiet --wait --pipe --collect -p EnvironmentFile=-{ENV_FILE} "
            f"/usr/bin/python3 {CHECKER} --config {CONFIG} --wait {timeout}")


def wait_healthy(spark: Endpoint, **arguments: object) -> None:
    """The deploy ends with a serving endpoint, or fails this host with the checker's diagnosis."""
    timeout = spark.recipe.load_timeout_seconds
    server.shell(
        name=f"Wait until the endpoint is healthy (model loads take minutes; giving up after {timeout} s)",
        commands=[wait_command(timeout)], **arguments,
    )
