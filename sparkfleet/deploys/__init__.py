"""The five steps of a Spark's convergence, one module each, in the order deploy.py calls them."""

from sparkfleet.deploys.context import endpoint_for
from sparkfleet.deploys.health import install_healthcheck
from sparkfleet.deploys.runtime import register_runtime
from sparkfleet.deploys.service import install_service
from sparkfleet.deploys.toolkit import install_toolkit
from sparkfleet.deploys.weights import stage_weights

__all__ = [
    "endpoint_for", "install_healthcheck", "install_service", "install_toolkit", "register_runtime",
    "stage_weights",
]
