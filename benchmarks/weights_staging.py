"""Weight staging throughput on a lab host against a plain local copy of the same bytes.

    .venv/bin/python -m benchmarks.weights_staging

Stages the lab's model from its mirror into a scratch directory with the real staging script (download,
sha256 of every file, rename into place, manifest) and copies the staged bytes once more with `cp`, both
on the same host in the same run. Goal: staging throughput at least 0.8 of the plain copy.
"""

from __future__ import annotations

import subprocess
import time

from tests.lab import fleet

SCRATCH = "/var/tmp/sparkfleet-bench"


def _timed(container: str, command: str) -> float:
    started = time.monotonic()
    subprocess.run(["docker", "exec", container, "sh", "-c", command], check=True, capture_output=True)
    return time.monotonic() - started


def main() -> None:
    state = fleet.up()
    host = next(h for h in state.hosts if h.arch == "amd64")
    sums = f"{state.model_mirror_url}/SHA256SUMS"
    size = int(subprocess.run(["du", "-sb", state.model_local_dir], capture_output=True, text=True,
                              check=True).stdout.split()[0])
    _timed(host.container, f"rm -rf {SCRATCH} && mkdir -p {SCRATCH}")
    stage = _timed(host.container, f"python3 /usr/local/lib/sparkfleet/stage_weights.py stage "
                                   f"--dest {SCRATCH}/staged --sums-url {sums}")
    copy = _timed(host.container, f"cp -r {SCRATCH}/staged {SCRATCH}/copy && sync")
    _timed(host.container, f"rm -rf {SCRATCH}")
    mib = size / (1 << 20)
    print(f"model bytes     {mib:8.0f} MiB")
    print(f"staging         {stage:8.1f} s  {mib / stage:7.0f} MiB/s (download, sha256, rename, manifest)")
    print(f"plain copy      {copy:8.1f} s  {mib / copy:7.0f} MiB/s")
    print(f"throughput ratio staging / copy: {copy / stage:.2f} (goal >= 0.8)")


if __name__ == "__main__":
    main()
