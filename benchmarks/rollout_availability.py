"""Availability through the fleet's gateway: a plain client while Sparks restart, on the lab.

    .venv/bin/python -m benchmarks.rollout_availability

Two runs, each measured with one client that sends 1-token completions one after another, with no retry and no
failover of its own (what most OpenAI clients do):
1. a batch-1 rollout of a flag change to every amd64 Spark, with the client sending through the gateway, and a
   second such client pinned to the canary's own address (what a client without a gateway sees, in the same run);
2. one Spark's engine killed outright (`docker kill` of its container; systemd starts it again 30 s later),
   with the client sending through the gateway: at most the request in flight may be lost.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from tests.lab import LAB_DIR, REPO, fleet

MODEL = "nvidia/Qwen3.6-35B-A3B-NVFP4"
GATEWAY_PORT = 8080  # gateway_port in inventory/lab.py
KILL_AFTER, KILL_WATCH = 10, 60  # seconds of the client before the kill, and in all


class Client(threading.Thread):
    """Sequential completions to one URL until stopped; a failure is counted and the next request follows."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__()
        self.url, self.key, self.stop = url, key, threading.Event()
        self.ok = self.failed = 0
        self.errors: list[str] = []

    def run(self) -> None:
        body = json.dumps({"model": MODEL, "prompt": "ping", "max_tokens": 1}).encode()
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while not self.stop.is_set():
            try:
                opener.open(urllib.request.Request(self.url, data=body, headers=headers), timeout=60).read()
                self.ok += 1
            except Exception as error:  # noqa: BLE001  (every failure a client would see counts)
                self.failed += 1
                self.errors.append(f"{type(error).__name__}: {error}")
                time.sleep(0.2)

    def line(self, label: str) -> str:
        total = self.ok + self.failed
        ratio = self.failed / total if total else 0.0
        return f"{label:30} {self.ok:6} ok {self.failed:5} failed   failure ratio {ratio:.3f}"


def sparkfleet(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkfleet", *args], cwd=REPO, capture_output=True, text=True)


def converge() -> None:
    """The gateway deployed with the Sparks' current addresses, then the Sparks on the inventory's flags (one batch
    at a time, drained at the gateway)."""
    pyinfra = str(Path(sys.executable).with_name("pyinfra"))
    subprocess.run([pyinfra, "-y", "inventory/lab.py", "deploy.py", "--limit", "gateways"], cwd=REPO,
                   capture_output=True, check=True)
    sparkfleet("rollout", "inventory/lab.py", "--limit", "lab_amd64")


def all_up(names: list[str], seconds: float = 120) -> bool:
    """Wait until the gateway sees every named Spark up and ready."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = sparkfleet("status", "inventory/lab.py", "--limit", "gateways", "--json")
        answers = json.loads(result.stdout or "[]")
        seen = (answers[0].get("gateway") or {}) if answers else {}
        if all((seen.get(name) or {}).get("state") == "up" for name in names):
            return True
        time.sleep(2)
    return False


def main() -> None:
    state = fleet.up()
    sparks = [host for host in state.hosts if host.arch == "amd64"]
    names = [host.name for host in sparks]
    gateway = f"http://{state.gateways[0].address}:{GATEWAY_PORT}/v1/completions"
    key = (LAB_DIR / "secrets" / "vllm_api_key").read_text().strip()
    converge()
    assert all_up(names), "the gateway does not see every Spark up after converging"

    through, pinned = Client(gateway, key), Client(f"http://{sparks[0].address}:8000/v1/completions", key)
    for client in (through, pinned):
        client.start()
    started = time.monotonic()
    rollout = sparkfleet("rollout", "inventory/lab.py", "--limit", "lab_amd64", "--batch", "1",
                         "--data", 'vllm_args={"max-num-seqs": 3}')
    took = time.monotonic() - started
    for client in (through, pinned):
        client.stop.set()
        client.join()
    converge()  # back to the inventory's flags
    all_up(names)
    print(f"rollout exit code {rollout.returncode} (batch 1, {len(names)} Sparks, {took:.0f} s)")
    print(through.line("plain client, through gateway"))
    print(pinned.line(f"plain client, pinned {names[0]}"))

    victim = sparks[1]
    killed = Client(gateway, key)
    killed.start()
    time.sleep(KILL_AFTER)
    subprocess.run(["docker", "exec", victim.container, "docker", "kill", "sparkfleet-vllm"], capture_output=True,
                   check=True)
    time.sleep(KILL_WATCH - KILL_AFTER)
    killed.stop.set()
    killed.join()
    back = all_up(names)
    print(f"{victim.name}'s engine killed (docker kill) {KILL_AFTER} s into {KILL_WATCH} s of requests; "
          f"back in the gateway's rotation afterwards: {back}")
    print(killed.line("plain client, through gateway"))
    for error in (through.errors + killed.errors)[:5]:
        print(f"  failed: {error}")


if __name__ == "__main__":
    main()
