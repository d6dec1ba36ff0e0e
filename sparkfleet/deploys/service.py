"""Step 4: the systemd unit that runs the vLLM container, with secrets only in a root-only env file."""

from __future__ import annotations

import io

from pyinfra import host, state
from pyinfra.api import deploy
from pyinfra.api.operation import OperationMeta
from pyinfra.api.util import get_template
from pyinfra.operations import server, systemd

from sparkfleet import secrets
from sparkfleet.deploys.context import (
    TEMPLATES,
    activations,
    pair_restarting,
    pair_starts,
    peer_failed,
    restart_triggers,
    staging_only,
    will_change,
)
from sparkfleet.endpoint import ENV_FILE, ETC, UNIT, UNIT_FILE, Endpoint
from sparkfleet.host_state import current, login_user
from sparkfleet.operations import image_pulled, managed_directory, managed_file, pair_step, unit_state
from sparkfleet.unit import UnitView

# Under sudo, pyinfra uploads as the login user into a temp dir, then copies with sudo: a secret's temp dir
# is this one, owned by the login user and 0700, under a root-owned parent nobody else can pre-create.
UPLOADS = "/var/lib/sparkfleet/uploads"


def prepare(spark: Endpoint) -> None:
    """What steps 3 and 4 write into, and the image: pulled before the weights, whose Hub download runs in it."""
    found = current()
    managed_directory(name="Create sparkfleet's configuration directory", path=ETC, mode="755")
    login = login_user(found)
    managed_directory(name=f"Create a private upload directory for secrets, owned by {login} (the SSH user)",
                      path=UPLOADS, user=login, mode="700")
    restart_triggers[spark.host].append(image_pulled(name=f"Pull {spark.image} now, never on boot",
                                                     image=spark.image))


def env_file(spark: Endpoint) -> str:
    """KEY=value lines for docker --env-file and systemd EnvironmentFile (values have no whitespace)."""
    config = spark.config
    # A pair's worker serves no API: it gets no key (secrets only where needed).
    key = config.vllm_api_key if spark.serves or not config.vllm_start else None
    values = {"VLLM_API_KEY": key, "HF_TOKEN": config.hf_token,
              "SPARKFLEET_HEALTH_WEBHOOK": config.health_webhook_url}
    lines = [f"{key}={secrets.resolve(ref)}" for key, ref in values.items() if ref]
    return "# Managed by sparkfleet: do not edit. Secrets for the vLLM endpoint and its health check.\n" + "".join(
        line + "\n" for line in lines
    )


@deploy("Install the vLLM endpoint service")
def install_service(spark: Endpoint) -> None:
    triggers = restart_triggers[spark.host]
    found = current()
    if staging_only(host):
        return  # rollout stages weights and image everywhere first (step 3); the unit changes batch by batch
    # Created empty and root-only first, then filled: a copy into an existing file keeps its mode, so the
    # secrets are never readable by others, not even between the copy and the chmod.
    triggers.append(managed_file(
        name="Write the endpoint's secrets to a root-only env file",
        src=io.StringIO(env_file(spark)), dest=ENV_FILE, user="root", group="root", mode="600", private=True,
        _temp_dir=UPLOADS,
    ))
    unit = managed_file(
        name=f"Render the {UNIT} unit from the {spark.recipe.name} recipe",
        src=io.StringIO(get_template(str(TEMPLATES / "vllm" / f"{UNIT}.service.j2")).render(spark=UnitView.of(spark))),
        dest=UNIT_FILE, mode="644",
    )
    triggers.append(unit)
    # daemon-reload can detach GPUs from running containers (toolkit #48): only when the unit changed.
    if will_change(unit):
        systemd.daemon_reload(name="Reload systemd to read the changed unit", _if=unit.did_change)
    if not spark.config.vllm_start:
        unit_state(name=f"Keep {UNIT} installed but stopped (vllm_start is false)",
                   unit=f"{UNIT}.service", running=False, enabled=False)
        return
    # Every start counts toward the unit's start limit, which is there to stop crash loops: a deliberate
    # (re)start by the deploy resets the counter first, so a few config changes in an hour never hit it, and a
    # unit that gave up after its start limit starts again on the re-run after a fix.
    stopped = (found.unit(f"{UNIT}.service")["active"] if found else "") != "active"
    # Weights staged by an earlier run (rollout's stage phase) count too: the endpoint still runs the old ones.
    loaded = found.get("weights_loaded", "unknown") if found else "unknown"
    earlier = list(activations[spark.host])  # a toolkit change or dockerd restart stopped it: it starts below
    if spark.role is not None:
        start_pair(spark, stopped or loaded == "differs", [*earlier, *triggers])
        return
    restart = will_change(*triggers) or loaded == "differs"
    if stopped or restart or will_change(*earlier):
        server.shell(
            name=f"Reset {UNIT}'s start counter before a deliberate (re)start (only crashes count toward its limit)",
            # An unloaded unit (never started, or collected while stopped) has no counter: nothing to reset.
            commands=[f"systemctl reset-failed {UNIT}.service 2>/dev/null || true"],
            _if=lambda: stopped or loaded == "differs" or any(op.did_change() for op in (*earlier, *triggers)),
        )
    start = unit_state(name=f"Enable and start {UNIT}", unit=f"{UNIT}.service", running=True, enabled=True)
    activations[spark.host].append(start)
    if not will_change(start) and restart:
        activations[spark.host].append(systemd.service(
            name=f"Restart {UNIT} because its unit, secrets, image or weights changed",
            service=f"{UNIT}.service", restarted=True,
            _if=lambda: loaded == "differs" or any(op.did_change() for op in triggers),
        ))


def start_pair(spark: Endpoint, needed: bool, changes: list[OperationMeta]) -> None:
    """A pair host: when either host (re)starts, both stop, the worker starts, then the head.

    pyinfra runs each operation on every host before the next one, in the order of the deploy code: the
    worker's start comes before the head's below, so the worker's unit is active when the head's starts. vLLM
    itself waits too: its head blocks until the worker has joined at the master port, and its worker retries
    until the head listens; an order that slips (`--serial`) still meets. A restart of one host alone would
    kill the other's engine (each exits when its peer goes away): so a change on either restarts both, and a
    host stopped or failed (`needed`) restarts its pair too.
    """

    def own() -> bool:
        if needed:
            return True
        if not state.is_executing:
            return will_change(*changes)
        return any(op.is_complete() and op.did_change() for op in changes)

    pair_starts[spark.host] = own
    pair = spark.config.pair.name  # type: ignore[union-attr]
    activations[spark.host].append(pair_step(
        name=f"Stop both hosts of pair {pair} when either (re)starts, and reset their start counters",
        commands=[f"systemctl stop {UNIT}.service", f"systemctl reset-failed {UNIT}.service 2>/dev/null || true"],
        restarting=pair_restarting(spark), peer_failed=peer_failed(spark), unchanged=f"pair {pair} keeps running",
    ))
    if spark.role == "worker":
        activations[spark.host].append(unit_state(
            name=f"Enable and start {UNIT} on the worker of pair {pair} first", unit=f"{UNIT}.service",
            running=True, enabled=True))
    if spark.role == "head":
        activations[spark.host].append(unit_state(
            name=f"Enable and start {UNIT} on the head of pair {pair}, after its worker", unit=f"{UNIT}.service",
            running=True, enabled=True))
