"""Step 3: model weights on the Spark's local NVMe: one generation per source revision, verified, resumable,
fetched from the source once per fleet.

Each generation lands in model_dir/<model>/<commit or digest> (generations.py), so staging never touches what
is being served and a rollback finds the previous generation in place. With fan-out, the Sparks that want one
generation take it in rounds: the first from the source, then each Spark holding it verified serves one more
(1, 2, 4, ... Sparks: about log2(N) rounds), every copy verified against the same SHA256SUMS.
"""

from __future__ import annotations

import io
import ipaddress
import urllib.parse
from dataclasses import replace
from typing import Any

from pyinfra import host, state
from pyinfra.api import deploy
from pyinfra.api.util import get_template
from pyinfra.operations import systemd

from sparkfleet import secrets
from sparkfleet.deploys.context import LIB, REMOTE, TEMPLATES, changed, fleet, restart_triggers, will_change
from sparkfleet.deploys.service import UPLOADS, prepare
from sparkfleet.endpoint import ETC, Endpoint
from sparkfleet.operations import Fetch, managed_file, unit_state, weights_pruned, weights_staged

SCRIPT = f"{LIB}/stage_weights.py"
SHARE = f"{LIB}/share_weights.py"
SHARE_UNIT = "sparkfleet-weights-share"
SUMS_DIR = "/var/lib/sparkfleet/weights"
HUB_ENV = f"{ETC}/hub.env"  # HF_ENDPOINT and HF_TOKEN for the download container: root-only


def sums_file(spark: Endpoint) -> str:
    """Where the generation's SHA256SUMS (written on the controller) goes on the host."""
    assert spark.weights is not None
    return f"{SUMS_DIR}/{spark.model_slug}/{spark.weights.id}.SHA256SUMS"


def check_args(spark: Endpoint) -> list[str]:
    """`stage_weights.py check` arguments for the wanted generation; the deploy and `sparkfleet drift` ask the
    same question."""
    assert spark.weights is not None
    return ["--dest", spark.weights_dir, "--digest", spark.weights.digest,
            *(["--full"] if spark.config.weights_verify == "full" else [])]


def peer_address(name: str, data: dict[str, Any]) -> str:
    """Where the other Sparks reach a host (its inventory data): peer_address, else vllm_url's host, else the SSH
    host, else its name."""
    if data.get("peer_address"):
        return str(data["peer_address"])
    if data.get("vllm_url"):
        return urllib.parse.urlsplit(str(data["vllm_url"])).hostname or name
    return str(data.get("ssh_hostname") or name)


def fanout(endpoints: dict[str, Endpoint]) -> tuple[int, dict[str, tuple[int, str | None]]]:
    """(rounds, per host: its round and the host it copies from, None for the source).

    Hosts that want the same generation, in inventory order: the first fetches from the source in round 0, and
    in round r the hosts 2^(r-1) .. 2^r - 1 copy from the host 2^(r-1) places before them, which finished in
    an earlier round. Hosts with weights_fanout off fetch from the source in round 0.
    """
    groups: dict[tuple[str, str], list[str]] = {}
    plan: dict[str, tuple[int, str | None]] = {}
    for name, spark in endpoints.items():
        if spark.config.weights_fanout and spark.weights is not None:
            groups.setdefault((spark.model_slug, spark.weights.id), []).append(name)
        else:
            plan[name] = (0, None)
    for names in groups.values():
        for index, name in enumerate(names):
            number = index.bit_length()
            plan[name] = (number, names[index - 2 ** (number - 1)] if number else None)
    return max((number for number, _ in plan.values()), default=0) + 1, plan


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return False
    return True


def hub_env(spark: Endpoint) -> str:
    config = spark.config
    values = {"HF_ENDPOINT": config.hf_endpoint, "HF_TOKEN": secrets.resolve(config.hf_token) if config.hf_token
              else None, "HF_HUB_DISABLE_TELEMETRY": "1"}
    return "# Managed by sparkfleet: the Hub download's settings.\n" + "".join(
        f"{key}={value}\n" for key, value in values.items() if value)


@deploy("Stage the model weights")
def stage_weights(spark: Endpoint) -> None:
    weights = spark.weights
    assert weights is not None  # resolved with the fleet (context.endpoint_for)
    prepare(spark)
    managed_file(name="Install the weight staging script", src=str(REMOTE / "stage_weights.py"), dest=SCRIPT,
                 mode="755")
    managed_file(name=f"Write the SHA256SUMS of {weights.label}, from the source's own metadata",
                 src=io.StringIO(weights.sums), dest=sums_file(spark), mode="644")
    fetch = Fetch(spark.source)
    if spark.source.kind == "hub":
        managed_file(name="Write the Hub download's settings (endpoint, token) to a root-only env file",
                     src=io.StringIO(hub_env(spark)), dest=HUB_ENV, user="root", group="root", mode="600",
                     private=True, _temp_dir=UPLOADS)
        fetch = Fetch(spark.source, image=spark.image, hub_env=HUB_ENV, commit=weights.commit or "")
    endpoints = fleet()
    share(spark)
    rounds, plan = fanout(endpoints)
    number, peer = plan[spark.host]
    staged = []
    for current in host.loop(range(rounds)):
        mine = current == number
        peer_url = ""
        if mine and peer is not None:
            address = peer_address(peer, state.inventory.get_host(peer).data.dict())
            port = endpoints[peer].config.weights_share_port
            peer_url = f"http://{address}:{port}/{spark.model_slug}/{weights.id}"
        how = f" from {peer}" if peer else " from the source" if mine else ""
        staged.append(weights_staged(
            name=f"Stage {weights.label} into {spark.weights_dir}, fan-out round {current + 1}/{rounds}{how}",
            script=SCRIPT, dest=spark.weights_dir, sums_file=sums_file(spark), verify=spark.config.weights_verify,
            fetch=replace(fetch, peer_url=peer_url),
            waiting="" if mine else f"stages in round {number + 1}, not {current + 1}",
        ))
    restart_triggers[spark.host].extend(staged)
    weights_pruned(name=f"Remove generations of {spark.model_slug} no unit uses, keeping {spark.config.weights_keep}",
                   root=spark.model_root, wanted=weights.id, keep=spark.config.weights_keep)


def share(spark: Endpoint) -> None:
    """The read-only share other Sparks copy from (fan-out on), or none (off). Every host of the inventory may
    connect, not only this run's targets: the unit must not change with `--limit`."""
    on = spark.config.weights_fanout
    managed_file(name="Install the weight share that other Sparks copy from", src=str(REMOTE / "share_weights.py"),
                 dest=SHARE, mode="755")
    peers = sorted({peer_address(other.name, other.data.dict()) for other in state.inventory
                    if other.name != spark.host})
    if not all(_is_ip(peer) for peer in peers):
        peers = []  # systemd filters by address only: with names in the fleet, the share takes every address
    values = {"script": SHARE, "root": spark.config.model_dir, "port": spark.config.weights_share_port,
              "peers": peers}
    unit = managed_file(
        name=f"Render the {SHARE_UNIT} unit (read-only, weights only, the fleet's Sparks only)",
        src=io.StringIO(get_template(str(TEMPLATES / "weights" / f"{SHARE_UNIT}.service.j2")).render(**values)),
        dest=f"/etc/systemd/system/{SHARE_UNIT}.service", mode="644",
    )
    if will_change(unit):
        systemd.daemon_reload(name="Reload systemd to read the changed weight share unit", _if=changed(unit))
        if on:
            systemd.service(name=f"Restart {SHARE_UNIT} with its changed unit", service=f"{SHARE_UNIT}.service",
                            restarted=True, _if=changed(unit))
    unit_state(name=f"{'Run' if on else 'Stop'} the weight share (weights_fanout is {str(on).lower()})",
               unit=f"{SHARE_UNIT}.service", running=on, enabled=on)
