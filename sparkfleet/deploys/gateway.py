"""The gateway step: HAProxy from the distribution's archive, configured from the inventory, reloaded (never
restarted) when its configuration changes.

Only hosts in the `gateways` group run it, instead of a Spark's five steps. A new configuration is checked by
`haproxy -c` beside the live one before it replaces it, so a bad one never reaches the running HAProxy; a reload
starts new workers on it while the old ones finish the requests in flight.
"""

from __future__ import annotations

import io

from pyinfra.api import deploy
from pyinfra.api.util import get_template
from pyinfra.operations import apt, systemd

from sparkfleet import host_state
from sparkfleet.deploys.context import TEMPLATES, will_change
from sparkfleet.deploys.service import UPLOADS
from sparkfleet.deploys.state import gateway_query
from sparkfleet.gateway import CONFIG, PACKAGE, SERVICE, ConfigView, Gateway
from sparkfleet.operations import managed_directory, managed_file, unit_state


def render(gateway: Gateway) -> str:
    """haproxy.cfg for this gateway (it holds the Sparks' API key: written root:haproxy 0640)."""
    template = get_template(str(TEMPLATES / "gateway" / "haproxy.cfg.j2"),
                            jinja_env_kwargs={"trim_blocks": True, "lstrip_blocks": True})
    return template.render(gw=ConfigView.of(gateway))


@deploy("Install the fleet's gateway")
def install_gateway(gateway: Gateway) -> None:
    host_state.register(gateway_query(), {})  # one reading of the host serves every operation below
    found = host_state.current()
    if PACKAGE not in (found.get("installed", {}) if found else {}):
        apt.packages(name="Install HAProxy from the distribution's archive", packages=[PACKAGE], update=True)
    login = host_state.login_user(found)
    managed_directory(name=f"Create a private upload directory for secrets, owned by {login} (the SSH user)",
                      path=UPLOADS, user=login, mode="700")
    config = managed_file(
        name=f"Render HAProxy's configuration: {len(gateway.servers)} Sparks, checked by `haproxy -c` before it "
        "replaces the live one",
        src=io.StringIO(render(gateway)), dest=CONFIG, user="root", group="haproxy", mode="640", private=True,
        check="haproxy -c -q -f {}", _temp_dir=UPLOADS,
    )
    if will_change(config):
        # pyinfra reloads only a running HAProxy; a stopped one is started on the new file just below.
        systemd.service(
            name="Reload HAProxy on its new configuration (new workers; the old ones finish the requests in flight)",
            service=SERVICE, reloaded=True, _if=config.did_change,
        )
    unit_state(name="Run HAProxy, started at boot", unit=SERVICE, running=True, enabled=True)
