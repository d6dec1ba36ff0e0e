#!/usr/bin/env python3
"""Send commands to HAProxy's runtime API (its admin socket) on a gateway and print the answers as one JSON line.

The controller sends this file's text as `python3 -c SOURCE SOCKET COMMAND...` (sparkfleet/gateway.py builds the
commands and parses the answers): nothing is installed on the gateway, and one SSH round trip carries them all.
Each command gets its own connection, which HAProxy closes after answering (non-interactive mode). Stdlib only.
"""

from __future__ import annotations

import json
import socket
import sys

TIMEOUT = 10  # seconds: the API answers at once; a wedged HAProxy must not hang a rollout


def ask(path: str, command: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(TIMEOUT)
        connection.connect(path)
        connection.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def main(path: str, commands: list[str]) -> dict[str, object]:
    try:
        return {"answers": [ask(path, command) for command in commands]}
    except OSError as error:
        return {"error": f"{type(error).__name__}: {error.strerror or error}"}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:])))
