"""What the deploy's operations read from a host, asked for in one query (see host_state.py)."""

from __future__ import annotations

from sparkfleet import gateway
from sparkfleet.deploys import health, runtime, service, toolkit, weights
from sparkfleet.endpoint import (
    DAEMON_JSON,
    ENV_FILE,
    ETC,
    KNOWN_GOOD,
    LOADED_WEIGHTS,
    MANIFEST,
    UNIT,
    UNIT_FILE,
    Endpoint,
)
from sparkfleet.host_state import StateQuery
from sparkfleet.operations import RUNTIME


def state_query(spark: Endpoint) -> StateQuery:
    """Every file, unit and fact a step of deploy.py compares against on this host."""
    files = (
        toolkit.PIN, toolkit.source_file(), DAEMON_JSON, ETC, service.UPLOADS, ENV_FILE, UNIT_FILE,
        weights.SCRIPT, health.COMMON, health.CHECKER, health.STATUS, health.CONFIG,
        *(f"/etc/systemd/system/{health.HEALTH}.{kind}" for kind in ("service", "timer")),
        weights.sums_file(spark), weights.HUB_ENV, weights.SHARE, f"/etc/systemd/system/{weights.SHARE_UNIT}.service",
    )
    return StateQuery(
        files=files, units=(f"{UNIT}.service", f"{health.HEALTH}.timer", f"{weights.SHARE_UNIT}.service"),
        runtime=RUNTIME,
        runtime_config=runtime.RUNTIME_CONFIG, keyring=toolkit.KEYRING, apt_url=toolkit.repo_url(spark),
        packages=toolkit.PACKAGES, image=spark.image, weights_script=weights.SCRIPT,
        weights_args=tuple(weights.check_args(spark)), manifest=f"{spark.weights_dir}/{MANIFEST}",
        loaded_weights=LOADED_WEIGHTS, model_root=spark.model_root,
        unit_files=(UNIT_FILE, f"{KNOWN_GOOD}/{UNIT}.service"),
    )


def gateway_query() -> StateQuery:
    """Every file, unit and package the gateway step compares against on a gateway host."""
    return StateQuery(files=(service.UPLOADS, gateway.CONFIG), units=(gateway.SERVICE,), packages=(gateway.PACKAGE,))
