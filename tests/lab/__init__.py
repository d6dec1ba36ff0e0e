"""The Spark lab: simulated DGX Sparks (systemd, sshd, dockerd) in containers, for tests and the demo.

Test code only: product code never imports this package.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[2]
LAB_DIR = REPO / ".lab"
STATE_FILE = LAB_DIR / "state.json"


def log(message: str) -> None:
    """Progress for the person running the lab, on stderr so stdout stays parseable."""
    print(f"lab: {message}", file=sys.stderr, flush=True)


def run(
    args: list[str], *, quiet: bool = False, check: bool = True, stdin: IO[bytes] | None = None,
    input: bytes | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run a command; on failure raise with its output so the cause is visible."""
    result = subprocess.run(args, stdin=stdin, input=input, capture_output=quiet)
    if check and result.returncode != 0:
        output = (result.stdout or b"").decode(errors="replace")[-3000:] + (result.stderr or b"").decode(
            errors="replace"
        )[-3000:]
        raise RuntimeError(f"command failed ({result.returncode}): {' '.join(args)}\n{output}")
    return result
