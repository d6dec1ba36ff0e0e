"""Validate the whole inventory before any operation is queued, so bad data changes no host.

A host in the `gateways` group is a gateway (HAProxy in front of the Sparks, see gateway.py); every other host is
a Spark. A gateway's configuration is made of the Sparks it routes, so a targeted gateway validates every serving
Spark of the inventory too, targeted or not.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from pyinfra.api.exceptions import PyinfraError

from sparkfleet import generations, pairs, rules, secrets
from sparkfleet.config import InventoryError, SparkConfig, parse_gateway, parse_host
from sparkfleet.endpoint import Endpoint, endpoint_url, resolve
from sparkfleet.gateway import Gateway, Server, server_ids

SECRET_FIELDS = ("vllm_api_key", "hf_token", "health_webhook_url")
GATEWAYS = "gateways"  # the inventory group of gateway hosts
SERVER_NAME = re.compile(r"[A-Za-z0-9._:-]+")  # what HAProxy accepts as a server name
# What haproxy.cfg carries as written inside a double-quoted header value: no quote, `%` (log-format), `$`
# (environment), backslash or space.
CONFIG_TEXT = re.compile(r"[A-Za-z0-9._~+/=:@!*,;-]+")


class FleetError(PyinfraError):
    """Raised from deploy code: pyinfra prints the message without a traceback and changes nothing."""


def _secret_problems(host: str, config: SparkConfig) -> list[str]:
    problems = []
    for field in SECRET_FIELDS:
        reference = getattr(config, field)
        if reference is None:
            continue
        try:
            secrets.resolve(reference)
        except secrets.SecretError as error:
            problems.append(f"{host}: `{field}` {error}.")
    return problems


def load_endpoint(host: str, data: dict[str, object]) -> tuple[Endpoint | None, list[str], list[str]]:
    """(endpoint, errors, warnings) for one host; errors are whole sentences naming host, field and fix."""
    try:
        config = parse_host(host, data)
    except InventoryError as error:
        return None, str(error).splitlines(), []
    endpoint = resolve(host, config)
    findings = rules.check(endpoint)
    errors = _secret_problems(host, config)
    errors += [f"{host}: `{f.field}`: {f.message} [{f.rule}]" for f in findings if f.severity == "error"]
    warnings = [f"{host}: `{f.field}`: {f.message} [{f.rule}]" for f in findings if f.severity == "warning"]
    return endpoint, errors, warnings


def load_fleet(hosts: dict[str, dict[str, object]]) -> tuple[dict[str, Endpoint], list[str]]:
    """Every host's endpoint (an inventory of Sparks only) and the fleet's warnings; raises FleetError listing
    every error at once."""
    fleet = load_inventory(hosts, gateways=())
    return fleet.sparks, fleet.warnings


@dataclass(frozen=True)
class Fleet:
    """The targeted hosts, resolved: Sparks and gateways, and the warnings to print before anything runs."""

    sparks: dict[str, Endpoint]
    gateways: dict[str, Gateway]
    warnings: list[str]


def load_inventory(hosts: dict[str, dict[str, object]], gateways: Collection[str],
                   targeted: Collection[str] | None = None) -> Fleet:
    """Every targeted host resolved (all of `hosts` when `targeted` is None); raises FleetError listing every
    error at once. `hosts` is the whole inventory (name to data): a gateway routes its Sparks even when they are
    not targeted. `gateways` names the hosts of the `gateways` group."""
    names = list(hosts) if targeted is None else [name for name in hosts if name in targeted]
    spark_names = [name for name in hosts if name not in gateways]
    wanted_gateways = [name for name in names if name in gateways]
    # A Spark is validated once, whether it is targeted, routed by a targeted gateway, or both; a pair is judged
    # with both its hosts.
    with_partners = pairs.partners({name: hosts[name] for name in spark_names}, names)
    needed = [name for name in spark_names if name in with_partners or wanted_gateways]
    sparks: dict[str, Endpoint] = {}
    errors: list[str] = []
    warnings: list[str] = []
    for name in needed:
        endpoint, host_errors, host_warnings = load_endpoint(name, hosts[name])
        errors += host_errors
        warnings += host_warnings if name in names else []
        if endpoint is not None:
            sparks[name] = endpoint
    errors += [f"{name}: `pair`: a gateway is not a Spark and serves no part of a pair; remove `pair` from it"
               for name in wanted_gateways if hosts[name].get("pair") is not None]
    sparks = pairs.with_peers(sparks)
    unread = {pairs.raw_name(hosts[name]) for name in needed if name not in sparks} - {None}  # their errors say why
    errors += pairs.problems(sparks, skip=unread) + pairs.untargeted(sparks, [name for name in names if name in sparks])
    resolved: dict[str, Gateway] = {}
    if wanted_gateways:
        # A pair's worker serves no API: the gateway routes to its head.
        routed = [name for name in spark_names if name in sparks and sparks[name].serves]
        servers, key, route_errors = _routes(routed, sparks, hosts)
        errors += route_errors
        for name in wanted_gateways:
            gateway, gateway_errors = _gateway(name, hosts[name], servers, key, bool(routed))
            errors += gateway_errors
            if gateway is not None:
                resolved[name] = gateway
    if errors:
        raise FleetError("bad inventory, nothing was changed on any host:\n  " + "\n  ".join(errors))
    return Fleet({name: sparks[name] for name in names if name in sparks}, resolved, warnings)


def gateway_server(spark: Endpoint, ssh_hostname: str | None) -> tuple[str, int]:
    """(address, port) at which a gateway reaches this Spark: its `vllm_url`, else its SSH host name on
    `vllm_port` (see endpoint_url). ValueError, naming the field and the fix, when a gateway cannot use it."""
    url = endpoint_url(spark, ssh_hostname)
    parts = urlsplit(url)
    field = "vllm_url" if spark.config.vllm_url else "ssh_hostname"
    if parts.scheme != "http" or parts.path.strip("/") or parts.query:
        raise ValueError(f"`vllm_url` = {url!r}: a gateway reaches a Spark's endpoint over plain http at its root "
                         "(as vLLM serves it); give the http://host:port the gateway reaches it at")
    address = parts.hostname or ""
    if address == "localhost" or address.endswith(".localhost") or _loopback(address):
        raise ValueError(f"`{field}`: a gateway would reach this Spark at {address}, a loopback address (the "
                         "gateway's own, not this Spark's); set `vllm_url` to the address gateways and clients "
                         "reach it at, e.g. http://spark-01.lan:8000")
    return address, parts.port or 80


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name


def _routes(routed: list[str], sparks: dict[str, Endpoint], hosts: dict[str, dict[str, object]]
            ) -> tuple[tuple[Server, ...], str | None, list[str]]:
    """The servers every gateway gets (one per serving Spark), the API key they share, and why they cannot."""
    errors: list[str] = []
    places: dict[str, tuple[str, int]] = {}
    for name in routed:
        if not SERVER_NAME.fullmatch(name):
            errors.append(f"{name}: the host name cannot name a gateway's server (HAProxy takes letters, digits and "
                          "._:-): rename the host in the inventory")
            continue
        try:
            places[name] = gateway_server(sparks[name], _text(hosts[name].get("ssh_hostname")))
        except ValueError as error:
            errors.append(f"{name}: {error}.")
    keys = {name: _key(sparks[name]) for name in routed}
    for name, key in keys.items():
        if key is not None and not CONFIG_TEXT.fullmatch(key):
            errors.append(f"{name}: `vllm_api_key`: a gateway sends this key in its health checks from haproxy.cfg, "
                          "which cannot carry quotes, spaces, `%`, `$` or backslashes as written: use a key made of "
                          "letters, digits and ._~+/=-")
    sharing: dict[str | None, list[str]] = {}
    for name, key in keys.items():
        sharing.setdefault(key, []).append(name)
    if len(sharing) > 1:  # named by who shares a key, never by the key
        groups = "; ".join(", ".join(names) for names in sharing.values())
        errors.append(f"{', '.join(routed)}: `vllm_api_key` is not one key for these Sparks, which every gateway "
                      f"routes (each group accepts its own: {groups}): a gateway forwards each client's key "
                      "unchanged to whichever Spark serves the request, so every Spark behind it must accept the "
                      "same key; give them one `vllm_api_key` (group_data/all.py)")
    ids = server_ids(list(places))
    servers = tuple(Server(name, *places[name], ids[name]) for name in routed if name in places)
    return servers, next(iter(keys.values()), None), errors


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _key(spark: Endpoint) -> str | None:
    """The Spark's API key, or None without one (an unresolvable reference is already an error of its own)."""
    reference = spark.config.vllm_api_key
    try:
        return secrets.resolve(reference) if reference else None
    except secrets.SecretError:
        return None


def _gateway(name: str, data: dict[str, object], servers: tuple[Server, ...], key: str | None,
             any_spark: bool) -> tuple[Gateway | None, list[str]]:
    try:
        config = parse_gateway(name, data)
    except InventoryError as error:
        return None, str(error).splitlines()
    if not any_spark:
        return None, [f"{name}: no Spark to route to: every host outside the `{GATEWAYS}` group has `vllm_start` "
                      f"false, or there is none; add the Sparks to this inventory, or take {name} out of "
                      f"`{GATEWAYS}`"]
    return Gateway(name, config, servers, key), []


def resolve_weights(endpoints: dict[str, Endpoint]) -> dict[str, Endpoint]:
    """Each endpoint with its model source resolved to a generation (the Hub asked once per source, before any
    host is changed); raises FleetError naming every host whose source cannot be resolved, and why."""
    resolved: dict[str, Endpoint] = {}
    errors: list[str] = []
    for name, spark in endpoints.items():
        try:
            resolved[name] = with_weights(spark)
        except generations.SourceError as error:
            errors.append(f"{name}: {error}")
    errors += pairs.weights_problems(resolved)
    if errors:
        raise FleetError("model source not usable, nothing was changed on any host:\n  " + "\n  ".join(errors))
    return resolved


def with_weights(spark: Endpoint) -> Endpoint:
    """The endpoint with its model source resolved; SourceError (a sentence naming the variable) when it cannot be."""
    token = secrets.resolve(spark.config.hf_token) if spark.config.hf_token else None
    return replace(spark, weights=generations.resolve(spark.source, spark.config.hf_endpoint, token))
