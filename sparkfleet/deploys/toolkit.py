"""Step 1: the NVIDIA Container Toolkit from NVIDIA's apt repository, all four packages on one version, held.

A stock Spark already has it from that repository: the same keyring and source are adopted, not added twice.
Moving the version runs the packages' `systemctl daemon-reload`, which can detach GPUs from running
containers (toolkit #48), so it happens only with this host's endpoint stopped, and never in rollout's stage
phase (on every host at once).
"""

from __future__ import annotations

import io

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import apt, systemd

from sparkfleet.deploys.context import (
    activations,
    changed,
    once_per_host,
    staging_only,
    toolkit_installs,
    will_change,
)
from sparkfleet.endpoint import UNIT, Endpoint
from sparkfleet.facts import AptVersions
from sparkfleet.host_state import current
from sparkfleet.operations import apt_keyring, apt_source, managed_file

KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"  # where NVIDIA's install guide puts it
SOURCE = "nvidia-container-toolkit"  # /etc/apt/sources.list.d/<this>.list, the guide's file name too
PIN = "/etc/apt/preferences.d/nvidia-container-toolkit"
PACKAGES = (
    "nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools", "libnvidia-container1",
)


def pin_text(version: str) -> str:
    """apt preferences that hold the packages at the pinned version (unattended-upgrades obeys them too)."""
    return (f"# Managed by sparkfleet: the NVIDIA Container Toolkit stays at {version} (nvidia_toolkit_version).\n"
            f"Package: {' '.join(PACKAGES)}\nPin: version {version}\nPin-Priority: 1001\n")


def source_file() -> str:
    return f"/etc/apt/sources.list.d/{SOURCE}.list"


def repo_url(spark: Endpoint) -> str:
    """NVIDIA's repository without the per-architecture part, as any source file naming it has it."""
    return spark.config.nvidia_repo_url.split("$(ARCH)")[0].rstrip("/")


@deploy("Install the NVIDIA Container Toolkit")
def install_toolkit(spark: Endpoint) -> None:
    config = spark.config
    version = config.nvidia_toolkit_version
    ours = source_file()
    found = current()
    others = [path for path in (found.get("apt_sources", {}) if found else {}) if path != ours]
    if others:
        # A second source for one repository with another signed-by breaks `apt update` ("Conflicting values").
        logger.info(f"{host.name}: NVIDIA's repository is already an apt source in {', '.join(others)}; kept as is")
        source_ops = []
    else:
        source_ops = [
            apt_keyring(
                name="Install NVIDIA's repository key, checked against its fingerprint",
                src=config.nvidia_key_url, fingerprint=config.nvidia_key_fingerprint, dest=KEYRING,
            ),
            # apt expands $(ARCH) itself, so one line serves arm64 Sparks and amd64 hosts alike.
            apt_source(
                name="Add NVIDIA's container toolkit apt source, signed by that key",
                path=ours, line=f"deb [signed-by={KEYRING}] {config.nvidia_repo_url} /",
            ),
        ]
    installed = installed_toolkit()
    if all(installed.get(package) == version for package in PACKAGES):
        if will_change(*source_ops):
            apt.update(name="Refresh apt's lists for the changed NVIDIA source", _if=changed(*source_ops))
    elif staging_only(host):
        logger.warning(f"{host.name}: the toolkit moves to {version} in this host's batch, not while staging")
        return
    else:
        _change_version(spark, version, installed)
    managed_file(name=f"Hold the toolkit packages at {version} (apt preferences)", src=io.StringIO(pin_text(version)),
                 dest=PIN, mode="644")


@once_per_host
def installed_toolkit() -> dict[str, str]:
    """The toolkit packages installed before this run (the preflight needs them too)."""
    found = current()
    return found.get("installed", {}) if found else {}


def _change_version(spark: Endpoint, version: str, installed: dict[str, str]) -> None:
    """Install or move the toolkit, with the endpoint stopped first when it runs (started again in step 4)."""
    if version not in host.get_fact(AptVersions, package=PACKAGES[0]):
        apt.update(name="Refresh apt's lists: the pinned version is not in them yet")
    stop = systemd.service(
        name="Stop the endpoint before the toolkit changes (its package scripts reload systemd)",
        service=f"{UNIT}.service", running=False,
    )
    activations[spark.host].append(stop)  # the health gate waits for the endpoint that step 4 starts again
    packages = apt.packages(
        name=f"Install the toolkit packages pinned to {version}",
        packages=[f"{package}={version}" for package in PACKAGES],
        extra_install_args="--allow-downgrades --allow-change-held-packages",
    )
    if PACKAGES[0] not in installed:  # the hook that dockerd's --gpus driver needs arrives now
        toolkit_installs[spark.host].append(packages)
