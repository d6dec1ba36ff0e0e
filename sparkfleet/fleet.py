"""Validate the whole inventory before any operation is queued, so bad data changes no host."""

from __future__ import annotations

from dataclasses import replace

from pyinfra.api.exceptions import PyinfraError

from sparkfleet import generations, rules, secrets
from sparkfleet.config import InventoryError, SparkConfig, parse_host
from sparkfleet.endpoint import Endpoint, resolve

SECRET_FIELDS = ("vllm_api_key", "hf_token", "health_webhook_url")


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
    """Every host's endpoint and the fleet's warnings; raises FleetError listing every error at once."""
    endpoints: dict[str, Endpoint] = {}
    errors: list[str] = []
    warnings: list[str] = []
    for name, data in hosts.items():
        endpoint, host_errors, host_warnings = load_endpoint(name, data)
        errors += host_errors
        warnings += host_warnings
        if endpoint is not None:
            endpoints[name] = endpoint
    if errors:
        raise FleetError("bad inventory, nothing was changed on any host:\n  " + "\n  ".join(errors))
    return endpoints, warnings


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
    if errors:
        raise FleetError("model source not usable, nothing was changed on any host:\n  " + "\n  ".join(errors))
    return resolved


def with_weights(spark: Endpoint) -> Endpoint:
    """The endpoint with its model source resolved; SourceError (a sentence naming the variable) when it cannot be."""
    token = secrets.resolve(spark.config.hf_token) if spark.config.hf_token else None
    return replace(spark, weights=generations.resolve(spark.source, spark.config.hf_endpoint, token))
