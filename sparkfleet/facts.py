"""Facts sparkfleet reads from a Spark: each is one read-only command over SSH."""

from __future__ import annotations

import json
from pathlib import Path

from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.api.exceptions import FactProcessError

# Reads daemon.json and resolves every runtime path the way dockerd does (PATH lookup, then symlinks), so
# `nvidia-container-runtime` and `/usr/bin/nvidia-container-runtime` compare as the one binary they are.
DAEMON_JSON_SCRIPT = Path(__file__).parent / "remote" / "daemon_json.py"


class DaemonJson(FactBase):
    """dockerd's daemon.json: {"config": dict | None (missing), "error": why it is unusable | None,
    "resolved": {runtime path: the binary it runs}}, for every runtime's path and for `runtime`."""

    def command(self, path: str, runtime: str) -> StringCommand:
        return StringCommand("python3", "-c", QuoteString(DAEMON_JSON_SCRIPT.read_text()), QuoteString(path),
                             QuoteString(runtime))

    def process(self, output: list[str]) -> dict:
        return json.loads("\n".join(output))


class RunningContainers(FactBase):
    """Names of the containers dockerd runs now (a dockerd restart stops every one of them)."""

    def command(self) -> str:
        return "docker ps --format '{{.Names}}'"

    def process(self, output: list[str]) -> list[str]:
        return sorted(line.strip() for line in output if line.strip())

    def default(self) -> list[str]:
        return []


class RuntimeMode(FactBase):
    """The NVIDIA Container Runtime's mode (auto, legacy, cdi, jit-cdi) from its config.toml; "" when unset."""

    def command(self, path: str) -> StringCommand:
        script = ("import sys,tomllib\ntry: c=tomllib.load(open(sys.argv[1],'rb'))\nexcept FileNotFoundError: c={}\n"
                  "print(c.get('nvidia-container-runtime',{}).get('mode',''))")
        return StringCommand("python3", "-c", QuoteString(script), QuoteString(path))

    def process(self, output: list[str]) -> str:
        return output[0].strip() if output else ""


class KeyringFingerprints(FactBase):
    """Primary-key fingerprints in an apt keyring file (empty when missing)."""

    requires_command = "gpg"

    def command(self, path: str) -> StringCommand:
        return StringCommand(
            "test -f", QuoteString(path), "&&", "gpg --show-keys --with-colons", QuoteString(path),
            "2>/dev/null | awk -F: '/^pub/{want=1; next} want && /^fpr/{print $10; want=0}'", "||", "true",
        )

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]

    def default(self) -> list[str]:
        return []


class AptSourceFiles(FactBase):
    """apt source files (one-line and deb822) that name a repository URL."""

    def command(self, url: str) -> StringCommand:
        return StringCommand("grep -lsF", QuoteString(url), "/etc/apt/sources.list",
                             "/etc/apt/sources.list.d/*.list", "/etc/apt/sources.list.d/*.sources", "||", "true")

    def process(self, output: list[str]) -> list[str]:
        return sorted(line.strip() for line in output if line.strip())

    def default(self) -> list[str]:
        return []


class InstalledVersions(FactBase):
    """Installed version of each package (None when not installed)."""

    def command(self, packages: tuple[str, ...]) -> StringCommand:
        return StringCommand("dpkg-query -W -f='${Package} ${db:Status-Abbrev} ${Version}\\n'",
                             *packages, "2>/dev/null", "||", "true")

    def process(self, output: list[str]) -> dict[str, str]:
        versions = {}
        for line in output:
            parts = line.split()
            if len(parts) == 3 and parts[1].startswith("ii"):
                versions[parts[0]] = parts[2]
        return versions

    def default(self) -> dict[str, str]:
        return {}


class AptVersions(FactBase):
    """Versions of a package apt could install now (from its current lists)."""

    def command(self, package: str) -> StringCommand:
        return StringCommand("apt-cache madison", QuoteString(package), "2>/dev/null", "||", "true")

    def process(self, output: list[str]) -> list[str]:
        return [line.split("|")[1].strip() for line in output if line.count("|") >= 2]

    def default(self) -> list[str]:
        return []


class DockerImageId(FactBase):
    """Local image id of an image reference; None when the image is not on the host."""

    def command(self, ref: str) -> StringCommand:
        return StringCommand("docker image inspect -f '{{.Id}}'", QuoteString(ref), "2>/dev/null", "||", "true")

    def process(self, output: list[str]) -> str | None:
        text = "\n".join(output).strip()
        return text or None


class UnitActiveState(FactBase):
    """systemd's ActiveState of a unit (`active`, `activating`, `failed`, `inactive`, ...)."""

    def command(self, unit: str) -> StringCommand:
        return StringCommand("systemctl show -p ActiveState --value", QuoteString(unit), "2>/dev/null", "||", "true")

    def process(self, output: list[str]) -> str:
        return output[0].strip() if output else ""


def json_object(output: list[str], what: str, fix: str) -> dict:
    """A fact's output as one JSON object, or FactProcessError (the only error pyinfra reports as the host's
    problem rather than a traceback) saying what the host printed instead and how to see why."""
    text = "\n".join(output)
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        first = next((line.strip() for line in output if line.strip()), "nothing")
        # `from None`: pyinfra prints an exception's __cause__ instead of the exception when there is one.
        raise FactProcessError(f"{what} printed {first[:120]!r} where one JSON object was expected: {fix}") from None
    return data


class WeightsCheck(FactBase):
    """The staging script's verdict on a model directory: {"state": "ok" | "stale" | "absent", ...}."""

    def command(self, script: str, args: str) -> str:
        return f"if [ -f {script} ]; then python3 {script} check {args}; else echo '{{\"state\": \"absent\"}}'; fi"

    def process(self, output: list[str]) -> dict:
        fix = ("run `python3 /usr/local/lib/sparkfleet/stage_weights.py check --help` on the host to see why (a "
               "broken python3, or a script from another sparkfleet version: delete it and re-run the deploy, "
               "which installs this one)")
        data = json_object(output, "the weights check", fix)
        if data.get("state") not in ("ok", "stale", "absent"):
            raise FactProcessError(f"the weights check answered {str(data)[:120]!r}, which has no known state: {fix}")
        return data


class WeightsLoaded(FactBase):
    """Whether the running endpoint started on the weights now staged: "same", "differs" or "unknown".

    The unit copies the staging manifest to /run when it starts, so weights staged by an earlier run
    (rollout's stage phase) still restart the endpoint when its batch comes.
    """

    def command(self, manifest: str, loaded: str) -> StringCommand:
        return StringCommand(
            "if [ ! -f", QuoteString(loaded), "]; then echo unknown; elif cmp -s", QuoteString(manifest),
            QuoteString(loaded), "; then echo same; else echo differs; fi",
        )

    def process(self, output: list[str]) -> str:
        return output[0].strip() if output else "unknown"
