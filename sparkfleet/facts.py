"""Facts sparkfleet reads from a Spark: each is one read-only command over SSH."""

from __future__ import annotations

import json

from pyinfra.api import FactBase, QuoteString, StringCommand


class DaemonJson(FactBase):
    """dockerd's daemon.json as a dict; None when the file is missing, {"__invalid__": text} when broken."""

    def command(self, path: str) -> StringCommand:
        return StringCommand("cat", QuoteString(path), "2>/dev/null", "||", "true")

    def process(self, output: list[str]) -> dict | None:
        text = "\n".join(output).strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return {"__invalid__": text}


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


class DockerDropins(FactBase):
    """The text of every docker.service drop-in, by file name."""

    def command(self) -> str:
        return (
            "for f in /etc/systemd/system/docker.service.d/*.conf; do "
            '[ -f "$f" ] && { echo "==> $f"; cat "$f"; }; done; true'
        )

    def process(self, output: list[str]) -> dict[str, str]:
        files: dict[str, list[str]] = {}
        current = None
        for line in output:
            if line.startswith("==> "):
                current = line[4:]
                files[current] = []
            elif current:
                files[current].append(line)
        return {name: "\n".join(lines) for name, lines in files.items()}

    def default(self) -> dict[str, str]:
        return {}


class WeightsCheck(FactBase):
    """The staging script's verdict on a model directory: {"state": "ok" | "stale" | "absent", ...}."""

    def command(self, script: str, args: str) -> str:
        return f"if [ -f {script} ]; then python3 {script} check {args}; else echo '{{\"state\": \"absent\"}}'; fi"

    def process(self, output: list[str]) -> dict:
        return json.loads("\n".join(output))


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
