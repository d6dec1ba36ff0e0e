"""A rolling rollout: stage everywhere, then deploy batch by batch behind a health gate, rolling back a bad batch.

pyinfra alone runs each operation on every host at once and keeps going after a failure; a fleet of
one-GPU boxes needs the opposite: one canary, then small batches, and a stop at the first sick batch.
Each phase is a plain `pyinfra` run (`--limit` to the batch), so what runs is exactly `deploy.py`.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sparkfleet.deploys.health import CHECKER, CONFIG, STATE_DIR
from sparkfleet.endpoint import ENV_FILE, UNIT

DEPLOY = str(Path(__file__).resolve().parents[1] / "deploy.py")
KNOWN_GOOD = "/var/lib/sparkfleet/known-good"
KEPT = (f"/etc/systemd/system/{UNIT}.service", ENV_FILE, CONFIG)
MARKER = "SPARKFLEET-GATE "


@dataclass
class HostResult:
    host: str
    batch: int
    outcome: str = "pending"  # updated, unchanged, failed, rolled-back, rollback-failed, skipped
    diagnosis: str = ""


@dataclass
class Rollout:
    """What happened, for the summary table and --json."""

    batches: list[list[str]]
    results: dict[str, HostResult] = field(default_factory=dict)
    failed_batch: int | None = None

    def as_json(self) -> dict:
        return {"batches": self.batches, "failed_batch": self.failed_batch,
                "hosts": [asdict(result) for result in self.results.values()]}


def plan_batches(hosts: list[str], canary: int, batch: int) -> list[list[str]]:
    """Inventory order: the first `canary` hosts alone, then batches of `batch`."""
    if canary < 1 or batch < 1:
        raise ValueError("--canary and --batch must be at least 1")
    head, rest = hosts[:canary], hosts[canary:]
    return [head] + [rest[i:i + batch] for i in range(0, len(rest), batch)] if head else []


def _pyinfra(inventory: str, args: list[str], limit: list[str], data: list[str]) -> subprocess.CompletedProcess:
    command = [str(Path(sys.executable).with_name("pyinfra")), "-y", inventory]
    for host in limit:
        command += ["--limit", host]
    for item in data:
        command += ["--data", item]
    return subprocess.run([*command, *args], capture_output=True, text=True)


def snapshot_command() -> str:
    """Keep the running configuration as last known-good, but only while the endpoint is healthy."""
    files = " ".join(KEPT)
    return (
        f"if systemctl is-active -q {UNIT} && grep -q '\"state\": \"healthy\"' {STATE_DIR}/state.json; then "
        f"mkdir -p -m 700 {KNOWN_GOOD} && cp -p {files} {KNOWN_GOOD}/ && echo {MARKER}saved; "
        f"else echo {MARKER}none; fi"
    )


def restore_command() -> str:
    """Put the known-good unit, env file and health config back and restart (the old image is still local)."""
    copies = " && ".join(f"cp -p {KNOWN_GOOD}/{Path(path).name} {path}" for path in KEPT)
    return (f"test -f {KNOWN_GOOD}/{UNIT}.service && {copies} && systemctl daemon-reload && "
            f"systemctl reset-failed {UNIT} ; systemctl restart {UNIT}")


def gate_command(timeout: int) -> str:
    """Run the real health check until healthy, or until the unit gives up or the load window ends."""
    check = (f"systemd-run --quiet --wait --pipe --collect -p EnvironmentFile=-{ENV_FILE} "
             f"/usr/bin/python3 {CHECKER} --config {CONFIG} --json 2>/dev/null")
    return (
        f"end=$(( $(date +%s) + {timeout} )); while :; do out=$({check}); "
        "state=$(printf '%s' \"$out\" | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"state\"])' "
        "2>/dev/null); "
        f"if [ \"$state\" = healthy ]; then echo {MARKER}healthy; exit 0; fi; "
        "if [ \"$state\" = unhealthy ] && [ $(date +%s) -ge $end ] || "
        f"systemctl -q is-failed {UNIT}; then "
        "printf '%s' \"$out\" | python3 -c 'import json,sys; d=json.load(sys.stdin); "
        f"print(\"{MARKER}\" + (d.get(\"diagnosis\") or d[\"state\"]))'; exit 1; fi; "
        "[ $(date +%s) -ge $end ] && { echo " + shlex.quote(MARKER + "timed out") + "; exit 1; }; sleep 5; done"
    )


def gate_lines(output: str) -> dict[str, str]:
    """Per-host gate verdicts from pyinfra exec output (`[host] ... SPARKFLEET-GATE verdict`)."""
    verdicts = {}
    for line in output.splitlines():
        if MARKER in line and line.lstrip().startswith("["):
            host = line.split("]", 1)[0].strip().lstrip("[")
            verdicts[host] = line.split(MARKER, 1)[1].strip()
    return verdicts


def _exec(inventory: str, hosts: list[str], command: str) -> tuple[int, dict[str, str]]:
    result = _pyinfra(inventory, ["exec", "--", "sh", "-c", command], hosts, [])
    return result.returncode, gate_lines(result.stdout + result.stderr)
