"""Step 1: the NVIDIA Container Toolkit from NVIDIA's apt repository, all four packages on one version."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt

from sparkfleet.deploys.context import changed, will_change
from sparkfleet.endpoint import Endpoint
from sparkfleet.facts import AptVersions
from sparkfleet.operations import apt_keyring

KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
PACKAGES = (
    "nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools", "libnvidia-container1",
)


@deploy("Install the NVIDIA Container Toolkit")
def install_toolkit(spark: Endpoint) -> None:
    config = spark.config
    version = config.nvidia_toolkit_version
    key = apt_keyring(
        name="Install NVIDIA's repository key, checked against its fingerprint",
        src=config.nvidia_key_url, fingerprint=config.nvidia_key_fingerprint, dest=KEYRING,
    )
    # apt expands $(ARCH) itself, so one line serves arm64 Sparks and amd64 hosts alike.
    repo = apt.repo(
        name="Add NVIDIA's container toolkit apt source, signed by that key",
        src=f"deb [signed-by={KEYRING}] {config.nvidia_repo_url} /",
        filename="nvidia-container-toolkit",
    )
    # Update only when the source changed or the pinned version is not in apt's lists yet:
    # an unconditional update would report a change on every run.
    if version not in host.get_fact(AptVersions, package=PACKAGES[0]):
        apt.update(name="Refresh apt's lists: the pinned version is not in them yet")
    elif will_change(key, repo):
        apt.update(name="Refresh apt's lists for the changed NVIDIA source", _if=changed(key, repo))
    apt.packages(
        name=f"Install the toolkit packages pinned to {version}",
        packages=[f"{package}={version}" for package in PACKAGES],
        extra_install_args="--allow-downgrades",
    )
