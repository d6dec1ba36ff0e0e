"""The steps of a Spark's convergence (a preflight, then five changes), one module each, in deploy.py's order;
and the gateway's own step for hosts in the `gateways` group."""

from sparkfleet.deploys.context import endpoint_for, gateway_for, is_gateway
from sparkfleet.deploys.gateway import install_gateway
from sparkfleet.deploys.health import install_healthcheck
from sparkfleet.deploys.preflight import check_host
from sparkfleet.deploys.runtime import register_runtime
from sparkfleet.deploys.service import install_service
from sparkfleet.deploys.toolkit import install_toolkit
from sparkfleet.deploys.weights import stage_weights

__all__ = [
    "check_host", "endpoint_for", "gateway_for", "install_gateway", "install_healthcheck", "install_service",
    "install_toolkit", "is_gateway", "register_runtime", "stage_weights",
]
