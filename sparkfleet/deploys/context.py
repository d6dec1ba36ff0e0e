"""The validated fleet, computed once per run, and the per-host results later steps depend on."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import TypeVar

from pyinfra import host, logger, state
from pyinfra.api import Host
from pyinfra.api.operation import OperationMeta
from pyinfra.context import ctx_state

from sparkfleet.endpoint import Endpoint
from sparkfleet.fleet import GATEWAYS, Fleet, load_inventory, resolve_weights
from sparkfleet.gateway import Gateway

# Package data, found the same way in an editable and an installed copy (templates/ is sparkfleet.templates).
TEMPLATES = Path(str(resources.files("sparkfleet.templates")))
REMOTE = Path(str(resources.files("sparkfleet") / "remote"))  # stdlib scripts that run on the Sparks
LIB = "/usr/local/lib/sparkfleet"  # where they are installed there

T = TypeVar("T")
_fleets: dict[int, Fleet] = {}
# Operations whose change means the endpoint must restart, per host (weights, image, unit, env file).
restart_triggers: dict[str, list[OperationMeta]] = {}
# Operations that (re)start the endpoint, per host: the health step waits for it after them.
activations: dict[str, list[OperationMeta]] = {}
# Operations that install the toolkit where it was missing, per host: dockerd must restart after them.
toolkit_installs: dict[str, list[OperationMeta]] = {}
# Per pair host, whether it needs a (re)start in this run (service.py); its partner asks when executing.
pair_starts: dict[str, Callable[[], bool]] = {}


def staging_only(host: Host) -> bool:
    """`--data sparkfleet_phase=stage` (rollout's first phase): weights and image everywhere, no restart."""
    return host.data.get("sparkfleet_phase") == "stage"


def will_change(*ops: OperationMeta) -> bool:
    """Whether any of `ops` plans a change (known at prepare time, from the facts).

    Follow-up operations (reloads, restarts, waits) are queued only then, so a converged host plans
    zero operations under `--dry`, and `_if=` still confirms the change at execute time.
    """
    return any(op.will_change for op in ops)


def changed(*ops: OperationMeta):  # noqa: ANN201
    """An `_if=` callable: true at execute time when any of `ops` changed the host."""
    return lambda: any(op.did_change() for op in ops)


def once_per_host(read: Callable[..., T]) -> Callable[..., T]:
    """Memoise a prepare-time reading per host and run: facts read before any change, needed by two steps
    (the preflight and the step that acts), cost one SSH round trip, not two."""
    readings: dict[tuple[int, str], T] = {}

    @functools.wraps(read)
    def cached(*args: object) -> T:
        key = (id(ctx_state.get()), host.name)
        if key not in readings:
            readings[key] = read(*args)
        return readings[key]

    return cached


def pair_restarting(spark: Endpoint) -> Callable[[], bool]:
    """Whether the pair of `spark` (re)starts in this run. When planning, only this host's own planned changes
    are known (a partner's are computed in its own context, perhaps later); when executing, both hosts' are:
    either one's change restarts both, worker first."""

    def restarting() -> bool:
        hosts = (spark.host, spark.peer) if state.is_executing else (spark.host,)
        return any(pair_starts[name]() for name in hosts if name in pair_starts)

    return restarting


def peer_failed(spark: Endpoint) -> Callable[[], str | None]:
    """A sentence when the partner of `spark` failed earlier in this run: the pair cannot serve without it, so
    this host is failed before its endpoint is touched."""

    def failed() -> str | None:
        if not state.is_executing or spark.peer not in {failed.name for failed in state.failed_hosts}:
            return None
        pair = spark.config.pair.name  # type: ignore[union-attr]
        return (f"{spark.peer}, the other host of pair {pair}, failed earlier in this run and the pair cannot serve "
                f"without it: {spark.host}'s endpoint was left as it was; fix {spark.peer} and re-run the deploy "
                "on both")

    return failed


def is_gateway(host: Host) -> bool:
    """Whether the host is in the `gateways` group: it runs the fleet's gateway, not an endpoint."""
    return GATEWAYS in host.groups


def _fleet() -> Fleet:
    """Every targeted host resolved; the first call validates them all (and the Sparks a targeted gateway routes),
    so one bad host stops every host before any operation is queued."""
    key = id(ctx_state.get())
    if key not in _fleets:
        everyone = list(state.inventory)
        loaded = load_inventory(
            {h.name: h.data.dict() for h in everyone}, {h.name for h in everyone if is_gateway(h)},
            targeted={h.name for h in state.inventory.iter_activated_hosts()},
        )
        # The weights of every Spark: each source resolved once (the Hub asked before any host is changed). Kept
        # only when it all resolves: a FleetError here stops every host, the later ones too.
        _fleets[key] = replace(loaded, sparks=resolve_weights(loaded.sparks))
        for warning in loaded.warnings:
            logger.warning(f"sparkfleet: {warning}")
    return _fleets[key]


def fleet() -> dict[str, Endpoint]:
    """The Sparks this run deploys, in inventory order (weight fan-out plans its rounds among them)."""
    targeted = {h.name for h in state.inventory.iter_activated_hosts()}
    return {name: spark for name, spark in _fleet().sparks.items() if name in targeted}


def endpoint_for(host: Host) -> Endpoint:
    """This Spark's endpoint (validating the whole inventory first)."""
    spark = _fleet().sparks[host.name]
    restart_triggers.setdefault(host.name, [])
    activations.setdefault(host.name, [])
    toolkit_installs.setdefault(host.name, [])
    return spark


def gateway_for(host: Host) -> Gateway:
    """This gateway, with the Sparks it routes (validating the whole inventory first)."""
    return _fleet().gateways[host.name]
