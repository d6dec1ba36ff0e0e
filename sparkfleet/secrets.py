"""Resolve secret references (`env:NAME`, `file:PATH`) on the controller.

Values never enter inventory, git, argv or logs: they travel only into the Spark's root-only env file.
"""

from __future__ import annotations

import os
from pathlib import Path


class SecretError(ValueError):
    """A reference that cannot be resolved; the message says how to provide the value."""


def resolve(reference: str) -> str:
    kind, _, where = reference.partition(":")
    if kind == "env":
        value = os.environ.get(where)
        if value is None:
            raise SecretError(f"refers to the environment variable {where}, which is not set: export it "
                              "before running")
    else:
        path = Path(where).expanduser()
        try:
            value = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            # Never echo the bytes: they are (part of) the secret.
            raise SecretError(f"refers to {path}, which is not UTF-8 text (a binary file, or another encoding): "
                              "store the bare value as text, e.g. `printf %s VALUE > FILE`") from None
        except OSError as error:
            raise SecretError(f"refers to {path}, which cannot be read ({error.strerror or error}): create it, "
                              "readable by you only") from None
        value = value.rstrip("\n")
    if not value or value != value.strip() or "\n" in value:
        # Seed 000: a key with a stray space or newline gives 401s that look like a revoked key.
        raise SecretError(f"from {reference} is empty or has whitespace around it (that gives 401s): "
                          "store the bare value")
    return value
