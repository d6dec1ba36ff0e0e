"""Pairs: two Sparks serving one model with tensor parallel across them (vLLM's --nnodes 2, without Ray).

A pair is declared by the `pair` variable, the same mapping on both hosts (config.Pair). Everything here judges
the two hosts together, before anything runs: exactly two hosts per pair name, one mapping, the head among them,
one model served the same way on both. The head serves the endpoint; the worker serves nothing over HTTP. A
deploy or a rollout treats the two as one unit, so both must be targeted.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import replace

from sparkfleet.endpoint import Endpoint

# What must be the same on both hosts of a pair (a pair serves one model, split across them): the variable an
# error names, and how to read its effective value from a host's endpoint.
SAME: tuple[tuple[str, Callable[[Endpoint], object]], ...] = (
    ("vllm_recipe", lambda spark: spark.recipe.name),
    ("vllm_image", lambda spark: spark.image),
    ("model_source", lambda spark: str(spark.source)),
    ("vllm_args", lambda spark: spark.args),
    ("vllm_served_model_name", lambda spark: spark.served_name),
    ("vllm_start", lambda spark: spark.config.vllm_start),
)
FIX = "set it once as group data for the pair's group"


def raw_name(data: dict[str, object]) -> str | None:
    """A host's pair name as written in its inventory data (before validation), to find its partner."""
    pair = data.get("pair")
    name = pair.get("name") if isinstance(pair, dict) else None
    return name if isinstance(name, str) else None


def partners(hosts: dict[str, dict[str, object]], names: Iterable[str]) -> list[str]:
    """`names` with the other host of every pair among them, in inventory order: a pair is one unit."""
    wanted = set(names)
    pairs = {raw_name(hosts[name]) for name in wanted if name in hosts} - {None}
    return [name for name in hosts if name in wanted or raw_name(hosts[name]) in pairs]


def members(sparks: dict[str, Endpoint]) -> dict[str, list[str]]:
    """Pair name to its hosts, in inventory order."""
    found: dict[str, list[str]] = {}
    for name, spark in sparks.items():
        if spark.config.pair is not None:
            found.setdefault(spark.config.pair.name, []).append(name)
    return found


def problems(sparks: dict[str, Endpoint], skip: Collection[str | None] = ()) -> list[str]:
    """Every pair's errors: one paragraph each, naming host, variable and fix. Pairs in `skip` have a host whose
    own variables are bad (reported already): judging the other alone would only add noise."""
    errors: list[str] = []
    for pair, hosts in members(sparks).items():
        if pair in skip:
            continue
        if len(hosts) != 2:
            errors.append(_count(pair, hosts))
            continue
        first, second = (sparks[name] for name in hosts)
        errors += _mapping(pair, first, second) or _head(pair, first, second)
        errors += _same(pair, first, second)
        errors += _ports(first) + _ports(second)
    return errors


def _count(pair: str, hosts: list[str]) -> str:
    if len(hosts) == 1:
        return (f"{hosts[0]}: `pair.name` = {pair!r} is carried by no other Spark: a pair is two Sparks; give the "
                f"other one the same `pair` ({FIX}), or remove `pair` from {hosts[0]}")
    return (f"{', '.join(hosts)}: `pair.name` = {pair!r} is carried by {len(hosts)} Sparks: a pair is exactly two; "
            "give each pair its own name")


def _mapping(pair: str, first: Endpoint, second: Endpoint) -> list[str]:
    a, b = first.config.pair, second.config.pair
    if a == b:
        return []
    fields = [key for key in type(a).model_fields if getattr(a, key) != getattr(b, key)]  # type: ignore[arg-type]
    shown = "; ".join(f"{key}: {getattr(a, key)!r} on {first.host}, {getattr(b, key)!r} on {second.host}"
                      for key in fields)
    return [f"{second.host}: `pair` differs from {first.host}'s in pair {pair!r} ({shown}): both hosts carry the "
            f"same mapping; {FIX}"]


def _head(pair: str, first: Endpoint, second: Endpoint) -> list[str]:
    head = first.config.pair.head  # type: ignore[union-attr]
    if head in (first.host, second.host):
        return []
    return [f"{first.host}, {second.host}: `pair.head` = {head!r} is not a host of pair {pair!r}: name the one that "
            f"serves the endpoint, {first.host} or {second.host}"]


def _same(pair: str, first: Endpoint, second: Endpoint) -> list[str]:
    errors = []
    for variable, value in SAME:
        a, b = value(first), value(second)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            keys = sorted(key for key in {*a, *b} if a.get(key) != b.get(key))
            shown = ", ".join(f"{key}: {a.get(key)!r} on {first.host}, {b.get(key)!r} on {second.host}"
                              for key in keys)
        else:
            shown = f"{a!r} on {first.host}, {b!r} on {second.host}"
        errors.append(f"{second.host}: `{variable}` differs from {first.host}'s ({shown}): pair {pair!r} serves one "
                      f"model split across both, so both need the same value; {FIX}")
    return errors


def _ports(spark: Endpoint) -> list[str]:
    pair, config = spark.config.pair, spark.config
    port = pair.master_port  # type: ignore[union-attr]
    taken = {"vllm_port": config.vllm_port, "weights_share_port": config.weights_share_port}
    return [f"{spark.host}: `pair.master_port` = {port} is also `{variable}`: the head's rendezvous needs a port of "
            f"its own; change one of the two" for variable, value in taken.items() if value == port]


def with_peers(sparks: dict[str, Endpoint]) -> dict[str, Endpoint]:
    """Each pair host with the name of the other (the head's diagnoses name its worker)."""
    found = members(sparks)
    return {name: replace(spark, peer=next(h for h in found[spark.config.pair.name] if h != name))
            if spark.config.pair is not None and len(found[spark.config.pair.name]) == 2 else spark
            for name, spark in sparks.items()}


def untargeted(sparks: dict[str, Endpoint], targeted: Collection[str]) -> list[str]:
    """A targeted pair host whose partner is not: a pair deploys, restarts and rolls back as one unit."""
    errors = []
    for name in targeted:
        spark = sparks.get(name)
        if spark is not None and spark.peer is not None and spark.peer not in targeted:
            pair = spark.config.pair.name  # type: ignore[union-attr]
            errors.append(f"{name}: `pair` {pair!r} is one unit with {spark.peer}, which is not targeted: target "
                          f"both (--limit {name},{spark.peer}, or the pair's group)")
    return errors


def weights_problems(sparks: dict[str, Endpoint]) -> list[str]:
    """Both hosts of a pair load the same generation of the weights (a branch resolved once, the same commit)."""
    errors = []
    for pair, hosts in members(sparks).items():
        if len(hosts) != 2:
            continue
        first, second = (sparks[name] for name in hosts)
        a, b = (spark.weights.id if spark.weights else None for spark in (first, second))
        if a != b:
            errors.append(f"{second.host}: `model_source` resolves to weights generation {b} but {first.host}'s to "
                          f"{a}: pair {pair!r} must load the same weights on both; give both the same model_source "
                          "pinned to a commit")
    return errors
