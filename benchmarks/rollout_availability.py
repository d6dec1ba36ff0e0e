"""Availability during a rolling restart: a client loop over the lab's endpoints while `rollout` runs.

    .venv/bin/python -m benchmarks.rollout_availability

Rolls a flag change over the lab's amd64 hosts with batch 1 while two clients send 1-token completions
from inside the lab network: one retries the next endpoint on failure (goal: zero failed requests), one is
pinned to the canary (what a client without failover sees). The loop is bounded in time and count.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

from tests.lab import LAB_DIR, REPO, fleet

CLIENT = r"""
import json, sys, time, urllib.request
hosts, key, seconds, pinned = sys.argv[1].split(","), sys.argv[2], float(sys.argv[3]), sys.argv[4] == "pinned"
body = json.dumps({"model": "nvidia/Qwen3.6-35B-A3B-NVFP4", "prompt": "ping", "max_tokens": 1}).encode()
ok = failed = 0
end, turn = time.monotonic() + seconds, 0
while time.monotonic() < end and ok + failed < 100000:
    order = hosts[:1] if pinned else hosts[turn % len(hosts):] + hosts[:turn % len(hosts)]
    turn += 1
    for host in order:
        try:
            req = urllib.request.Request(f"http://{host}:8000/v1/completions", data=body,
                                         headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=5).read()
            ok += 1
            break
        except Exception:
            continue
    else:
        failed += 1
        time.sleep(0.2)
print(json.dumps({"ok": ok, "failed": failed}))
"""


def _client(hosts: list[str], key: str, seconds: int, mode: str, out: dict) -> None:
    result = subprocess.run(
        ["docker", "exec", "-i", fleet.SERVICES, "python3", "-", ",".join(hosts), key, str(seconds), mode],
        input=CLIENT, capture_output=True, text=True, check=True)
    out[mode] = json.loads(result.stdout)


def main() -> None:
    state = fleet.up()
    hosts = [h.name for h in state.hosts if h.arch == "amd64"]
    subprocess.run([sys.executable, "-m", "sparkfleet", "rollout", "inventory/lab.py", "--limit", "lab_amd64"],
                   cwd=REPO, capture_output=True)  # converge first
    key = (LAB_DIR / "secrets" / "vllm_api_key").read_text().strip()
    results: dict = {}
    clients = [threading.Thread(target=_client, args=(hosts, key, 90, mode, results)) for mode in ("failover",
                                                                                                  "pinned")]
    for client in clients:
        client.start()
    rollout = subprocess.run(
        [sys.executable, "-m", "sparkfleet", "rollout", "inventory/lab.py", "--limit", "lab_amd64", "--batch", "1",
         "--data", 'vllm_args={"max-num-seqs": 3}'], cwd=REPO, capture_output=True, text=True)
    for client in clients:
        client.join()
    subprocess.run([sys.executable, "-m", "sparkfleet", "rollout", "inventory/lab.py", "--limit", "lab_amd64"],
                   cwd=REPO, capture_output=True)  # back to the inventory's flags
    print(f"rollout exit code {rollout.returncode}")
    for mode, counts in results.items():
        total = counts["ok"] + counts["failed"]
        ratio = counts["failed"] / total
        print(f"{mode:9} {counts['ok']:6} ok {counts['failed']:5} failed   failure ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
