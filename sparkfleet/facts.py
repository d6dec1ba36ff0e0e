"""Facts sparkfleet reads live from a Spark, outside the one host-state reading (host_state.py): only on a path
that is changing the host anyway."""

from __future__ import annotations

import json

from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.api.exceptions import FactProcessError


class AptVersions(FactBase):
    """Versions of a package apt could install now (from its current lists)."""

    def command(self, package: str) -> StringCommand:
        return StringCommand("apt-cache madison", QuoteString(package), "2>/dev/null", "||", "true")

    def process(self, output: list[str]) -> list[str]:
        return [line.split("|")[1].strip() for line in output if line.count("|") >= 2]

    def default(self) -> list[str]:
        return []


def json_object(output: list[str], what: str, fix: str) -> dict:
    """A fact's output as one JSON object, or FactProcessError (the only error pyinfra reports as the host's
    problem rather than a traceback) saying what the host printed instead and how to see why."""
    text = "\n".join(output)
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        first = next((line.strip() for line in output if line.strip()), "nothing")
        # `from None`: pyinfra prints an exception's __cause__ instead of the exception when there is one.
        raise FactProcessError(f"{what} printed {first[:120]!r} where one JSON object was expected: {fix}") from None
    return data
