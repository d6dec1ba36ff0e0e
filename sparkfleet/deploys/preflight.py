"""Step 0: check the host before changing it; a host unfit for its endpoint fails here, untouched."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy

from sparkfleet import host_state
from sparkfleet.deploys.context import staging_only
from sparkfleet.deploys.runtime import restart_problem
from sparkfleet.deploys.state import state_query
from sparkfleet.endpoint import Endpoint
from sparkfleet.operations import host_ready
from sparkfleet.preflight import checkpoint_size, host_findings, preflight_query


@deploy("Check the host before changing it")
def check_host(spark: Endpoint) -> None:
    # One read of the host serves this preflight and every later step's comparisons (host_state.py).
    host_state.register(state_query(spark), preflight_query(spark))
    found = host_state.current()
    facts = found.facts if found else None
    if facts is None:  # pyinfra printed the command's own error
        problems = ["the preflight command failed on the host (is python3 installed?) [host.facts]"]
    else:
        findings = host_findings(spark, facts, checkpoint_size(spark))
        for finding in findings:
            if finding.severity == "warning":
                logger.warning(f"{host.name}: {finding.message} [{finding.rule}]")
        problems = [f"{f.message} [{f.rule}]" for f in findings if f.severity == "error"]
        problems += [f"{found.problem} [host.facts]"] if found and found.problem else []
    if not staging_only(host) and (restart := restart_problem(spark)):
        problems.append(restart)
    # Only this host fails: the others carry on with their own steps.
    host_ready(
        name="Refuse the host if its preflight found a problem (GPU, Docker, disk, memory, port, drop-ins)",
        problems=problems,
    )
