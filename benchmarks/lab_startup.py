"""How long `python -m tests.lab up` takes, cold (nothing cached) and warm (images cached, lab down).

    .venv/bin/python -m benchmarks.lab_startup [--skip-cold]

Goals on the 2-core machine: warm at most 60 s for the default lab, cold at most 10 min. Cold removes the
lab's images and debootstrap cache first, so it takes as long as a first CI run.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import time

from tests.lab import fleet, images

WARM_GOAL, COLD_GOAL = 60.0, 600.0


def _timed_up() -> float:
    fleet.down()
    started = time.monotonic()
    fleet.up()
    return time.monotonic() - started


def _forget_images() -> None:
    tags = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", "sparkfleet-lab/*"],
                          capture_output=True, text=True, check=True).stdout.split()
    if tags:
        subprocess.run(["docker", "rmi", "-f", *tags], capture_output=True, check=True)
    shutil.rmtree(images.DEB_CACHE, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-cold", action="store_true", help="measure the warm start only")
    args = parser.parse_args()
    rows = []
    if not args.skip_cold:
        _forget_images()
        cold = _timed_up()
        rows.append(("cold up", cold, COLD_GOAL))
    warm = _timed_up()
    rows.append(("warm up", warm, WARM_GOAL))
    for name, seconds, goal in rows:
        print(f"{name:8} {seconds:7.1f} s   goal {goal:5.0f} s   ratio to goal {seconds / goal:.2f}")


if __name__ == "__main__":
    main()
