"""What `sparkfleet doctor` checks across a pair's two hosts, from what each reported (SparkFacts).

vLLM's two ranks must run the same image on the same weights, and the worker must reach the head's master port
over the fabric; none of that shows on one host alone. Each host's own fabric interface (it exists, is up, has an
address, the head holds master_addr) is the preflight's `host.fabric`. Like the host checks, `findings` says
what is wrong and `summary` what each check saw when nothing is.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from sparkfleet.config import Pair
from sparkfleet.endpoint import UNIT, Endpoint
from sparkfleet.preflight import Facts, fabric
from sparkfleet.rules import Finding

CHECKS = ("pair.image", "pair.weights", "pair.master")  # in report order, on both hosts of a pair
# What a failed test connection from the worker to the head's master port most likely means.
REACH_HINTS = {
    "refused": "nothing accepts it there: check that master_addr is the head's address on the fabric and read the "
               f"head's log (`journalctl -u {UNIT}`) for how far its start got, or a firewall on the head rejects it",
    "timed out": "packets are dropped on the way: a firewall on the head (allow the port on the fabric interface), "
                 "or the cable",
}


def _short(image_id: str) -> str:
    """An image id as docker shows it short (sha256: and 12 hex digits)."""
    return image_id[:len("sha256:") + 12]


@dataclass(frozen=True)
class PairFacts:
    """A pair's two hosts as doctor read them: each endpoint with its SparkFacts."""

    head: Endpoint
    head_facts: Facts
    worker: Endpoint
    worker_facts: Facts

    @property
    def pair(self) -> Pair:
        pair = self.head.config.pair
        if pair is None:
            raise ValueError(f"{self.head.host} is not in a pair")
        return pair

    def probe(self, spark: Endpoint, key: str) -> Any:
        """A value of the pair probe on one host (None when it was not read)."""
        found = (self.head_facts if spark is self.head else self.worker_facts).get("pair")
        return found.get(key) if isinstance(found, dict) else None

    def generation(self, spark: Endpoint) -> str | None:
        """The weights generation the host's unit mounts (the mounted directory's name); None without a unit."""
        mounted = self.probe(spark, "mounted")
        return PurePosixPath(mounted).name if mounted else None

    @property
    def master(self) -> str:
        return f"{self.head.host}'s master port {self.pair.master_addr}:{self.pair.master_port}"


def findings(read: PairFacts) -> list[Finding]:
    """Every problem of the pair, each naming both hosts; the same list is shown on both."""
    return [*_image(read), *_weights(read), *_subnet(read), *_reach(read)]


def _image(read: PairFacts) -> list[Finding]:
    head, worker = read.head, read.worker
    a, b = read.probe(head, "image_id"), read.probe(worker, "image_id")
    if not a or not b or a == b:
        return []
    return [Finding("pair.image", "error", "vllm_image",
                    f"{read.pair.name}: {head.host} runs {_short(a)} and {worker.host} {_short(b)} for {head.image}: "
                    "both nodes must run the same image; pin `vllm_image` by digest (image@sha256:..., a tag pulled "
                    "at different times names different images and a deploy pulls it only when missing), then "
                    "re-deploy both")]


def _weights(read: PairFacts) -> list[Finding]:
    head, worker = read.head, read.worker
    a, b = read.generation(head), read.generation(worker)
    if not a or not b or a == b:
        return []
    wanted = head.weights.id if head.weights else "the wanted generation"
    return [Finding("pair.weights", "error", "model_source",
                    f"{read.pair.name}: {head.host}'s unit mounts weights generation {a} and {worker.host}'s {b}: both "
                    f"nodes must load the same weights; re-deploy both (both then mount {wanted})")]


def _subnet(read: PairFacts) -> list[Finding]:
    """The worker has an address in master_addr's subnet: otherwise it reaches the head another way, or not at
    all (a worker without any address is host.fabric's)."""
    pair, addresses = read.pair, (fabric(read.worker_facts) or {}).get("addresses") or []
    master = ipaddress.ip_address(pair.master_addr)
    if not addresses or any(master in ipaddress.ip_interface(address).network for address in addresses):
        return []
    return [Finding("pair.master", "error", "pair.master_addr",
                    f"{pair.name}: {read.worker.host}'s {pair.interface} has no address in the subnet of master_addr "
                    f"{master} (it has {', '.join(addresses)}): the worker would reach {read.head.host} another way, "
                    "or not at all; give both ends of the fabric addresses in one subnet")]


def _reach(read: PairFacts) -> list[Finding]:
    """Only an active head listens on its master port: a failed test is a finding then, and only then."""
    result = read.worker_facts.get("master_reach")
    if read.head_facts.get("endpoint_state") != "active" or result in (None, "ok"):
        return []
    hint = REACH_HINTS.get(result, f"check the route (`ip route get {read.pair.master_addr}` on {read.worker.host})")
    return [Finding("pair.master", "error", "pair.master_port",
                    f"{read.pair.name}: {read.worker.host} cannot connect to {read.master} ({result}) while "
                    f"{read.head.host}'s unit is active: the worker cannot join the head; {hint}")]


def summary(read: PairFacts) -> dict[str, str]:
    """What each check saw, for the `ok` rows."""
    return {"pair.image": _image_line(read), "pair.weights": _weights_line(read), "pair.master": _reach_line(read)}


def _image_line(read: PairFacts) -> str:
    image = read.head.image
    found = {spark.host: read.probe(spark, "image_id") for spark in (read.head, read.worker)}
    pulled = [host for host, image_id in found.items() if image_id]
    if not pulled:
        return f"{image} is not pulled yet on either host (a deploy pulls it on both)"
    if len(pulled) == 1:
        missing = next(host for host in found if host not in pulled)
        return f"{image} is {_short(found[pulled[0]])} on {pulled[0]}, not pulled yet on {missing} (a deploy pulls it)"
    return f"{image} is {_short(found[pulled[0]])} on both"


def _weights_line(read: PairFacts) -> str:
    sparks = (read.head, read.worker)
    mounts = {spark.host: read.generation(spark) for spark in sparks}
    if len(set(mounts.values())) == 1:
        first = mounts[read.head.host]
        mounted = f"both units mount generation {first}" if first else "no unit on either host yet"
    else:
        mounted = "; ".join(f"{host}'s unit mounts {generation}" if generation else f"{host} has no unit yet"
                            for host, generation in mounts.items())
    staged = [spark.host for spark in sparks if read.probe(spark, "staged")]
    wanted = read.head.weights.id if read.head.weights else "the wanted generation"
    where = "on both" if len(staged) == 2 else f"on {staged[0]} only" if staged else "on neither host yet"
    return f"{mounted}; {wanted} is staged {where}" + ("" if len(staged) == 2 else " (a deploy stages it)")


def _reach_line(read: PairFacts) -> str:
    state = read.head_facts.get("endpoint_state") or "unknown"
    if state != "active":
        return (f"{read.master} was not tested: {read.head.host}'s unit is {state}, and only a running head listens "
                "there (ask again once it runs)")
    if read.worker_facts.get("master_reach") is None:
        return f"{read.master} was not tested ({read.worker.host}'s host.facts row says why)"
    return f"{read.worker.host} reaches {read.master}"
