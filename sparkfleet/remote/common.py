"""What the scripts sparkfleet installs on a Spark share: a command runner, a proxy-free opener, a metrics reader.

Stdlib only, like the scripts. The deploy installs it beside them in /usr/local/lib/sparkfleet, where
`python3 SCRIPT` imports it (a script's own directory is on sys.path). Commands are found through PATH, as a
shell finds them: nothing here can be pointed elsewhere by the environment (tests put stand-ins first on PATH).
"""

from __future__ import annotations

import re
import subprocess
import urllib.request
from collections.abc import Iterator

# Local probes must not follow an http_proxy from the service or login environment.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{.*\})?\s+(\S+)")


def run(argv: list[str], timeout: float, with_stderr: bool = False) -> str | None:
    """A command's output, or None when it is missing, fails or is still running after `timeout` seconds (a
    wedged dockerd must not wedge the script); `with_stderr` keeps what it prints there too (container logs)."""
    stderr = subprocess.STDOUT if with_stderr else subprocess.DEVNULL
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=stderr, text=True, errors="replace",
                              timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def samples(text: str) -> Iterator[tuple[str, float]]:
    """(name, value) of every sample on a Prometheus text page, labels dropped; comments and junk are skipped."""
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        try:
            yield match.group(1), float(match.group(2))
        except ValueError:
            continue
