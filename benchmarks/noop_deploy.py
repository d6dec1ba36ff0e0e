"""A no-op re-run of deploy.py on a converged lab, against a bare `pyinfra exec -- true` on the same hosts.

    .venv/bin/python -m benchmarks.noop_deploy [--hosts 1 3 6]

Goal: the re-run costs at most 3x the bare round trip, and the ratio stays flat as hosts are added. The
lab is resized to the largest count (amd64 hosts only) and converged first; each figure is the median of
three runs, all measured in this one run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tests.lab import REPO, fleet

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


def _seconds(args: list[str], limit: list[str]) -> float:
    command = [PYINFRA, "-y", "inventory/lab.py", *[a for h in limit for a in ("--limit", h)], *args]
    runs = []
    for _ in range(3):
        started = time.monotonic()
        subprocess.run(command, cwd=REPO, capture_output=True, check=True)
        runs.append(time.monotonic() - started)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 3, 6])
    args = parser.parse_args()
    state = fleet.up(max(args.hosts), 0)
    names = [host.name for host in state.hosts]
    subprocess.run([PYINFRA, "-y", "inventory/lab.py", "deploy.py"], cwd=REPO, capture_output=True, check=True)
    print(f"{'hosts':>5} {'exec true':>10} {'deploy.py':>10} {'ratio':>6}")
    for count in args.hosts:
        bare = _seconds(["exec", "--", "true"], names[:count])
        noop = _seconds(["deploy.py"], names[:count])
        print(f"{count:>5} {bare:>9.1f}s {noop:>9.1f}s {noop / bare:>6.2f}")


if __name__ == "__main__":
    main()
