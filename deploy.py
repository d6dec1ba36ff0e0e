"""Converge every Spark in the inventory into a verified, health-checked vLLM endpoint, and every host in the
`gateways` group into the fleet's one OpenAI address in front of them.

    pyinfra -y inventory/sparks.py deploy.py
"""

from pyinfra import host

from sparkfleet.deploys import (
    check_host,
    endpoint_for,
    gateway_for,
    install_gateway,
    install_healthcheck,
    install_service,
    install_toolkit,
    is_gateway,
    register_runtime,
    stage_weights,
)

if is_gateway(host):
    install_gateway(gateway_for(host))  # HAProxy in front of every serving Spark: health-checked, drained by rollouts
else:
    spark = endpoint_for(host)   # validates the whole inventory before any operation is queued

    check_host(spark)            # 0. read-only preflight: an unfit host fails here, before any change
    install_toolkit(spark)       # 1. NVIDIA Container Toolkit, pinned, from NVIDIA's signed apt repository
    register_runtime(spark)      # 2. nvidia runtime in daemon.json; dockerd restarts only if that changed
    stage_weights(spark)         # 3. weights on local NVMe: verified, resumable, never fetched twice
    install_service(spark)       # 4. systemd unit running the vLLM container from the recipe + overrides
    install_healthcheck(spark)   # 5. health timer: notices, diagnoses and reports a sick endpoint
