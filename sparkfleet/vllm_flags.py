"""What vLLM's `serve` accepts, read from the flag lists of the release the recipes pin.

The same data files feed the lab's vLLM stand-in, so the validator and the stand-in reject the same
command lines (sparkfleet/data/vllm/, read from the vLLM 0.28.0 sources).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

DATA = Path(__file__).parent / "data" / "vllm"
VERSION = "0.28.0"

# Flags that vLLM removed or renamed: the container exits with "unrecognized arguments".
REMOVED = {
    "disable-log-requests": "it was removed in vLLM 0.12 (PR #29402): request logging is off by default; "
    "use enable-log-requests to opt in",
}
INTEGER_FLAGS = {
    "max-model-len", "max-num-seqs", "max-num-batched-tokens", "tensor-parallel-size", "pipeline-parallel-size",
    "data-parallel-size", "port", "max-logprobs", "block-size", "seed",
}
FLOAT_FLAGS = {"gpu-memory-utilization", "swap-space", "cpu-offload-gb"}
# Flags sparkfleet sets itself from inventory variables: the unit owns them.
OWNED = {"host": "set by sparkfleet (0.0.0.0)", "port": "use vllm_port", "model": "the recipe's model is mounted",
         "api-key": "use vllm_api_key (kept out of argv)", "served-model-name": "use vllm_served_model_name"}
SIZE = re.compile(r"^\d+(\.\d+)?[kKmMgG]?$")


@dataclass(frozen=True)
class FlagSet:
    """The long flag names of one vLLM release, its boolean ones and the valid values of a few."""

    names: frozenset[str]
    booleans: frozenset[str]
    choices: dict[str, tuple[str, ...]]


def _names(path: Path) -> frozenset[str]:
    return frozenset(
        line.strip()[2:] for line in path.read_text().splitlines() if line.startswith("--")
    )


@cache
def flag_set(version: str = VERSION) -> FlagSet:
    choices = yaml.safe_load((DATA / f"choices-{version}.yaml").read_text())
    return FlagSet(
        names=_names(DATA / f"serve-flags-{version}.txt"),
        booleans=_names(DATA / f"serve-bool-flags-{version}.txt"),
        choices={flag: tuple(values) for flag, values in choices.items()},
    )


def normalize(name: str) -> str:
    """`tool_call_parser`, `--tool-call-parser` and `tool-call-parser` all name one flag."""
    return name.lstrip("-").replace("_", "-")


def is_known(name: str, flags: FlagSet) -> bool:
    return name in flags.names or (name.startswith("no-") and name[3:] in flags.booleans)


def valid_choice(name: str, value: str, flags: FlagSet) -> bool:
    valid = flags.choices[name]
    if name == "attention-backend":
        return value.upper() in valid
    if name == "moe-backend":
        return value.lower().replace("-", "_") in valid
    return value in valid


def is_number(name: str, value: object) -> bool:
    """Integer flags take an int (vLLM also reads sizes like 128k); float flags any number."""
    if isinstance(value, bool):
        return False
    if name in FLOAT_FLAGS:
        return isinstance(value, int | float)
    return isinstance(value, int) or (isinstance(value, str) and bool(SIZE.match(value)) and name == "max-model-len")


def to_argv(args: dict[str, object], flags: FlagSet) -> list[str]:
    """Render validated flags as vLLM's argv: booleans bare (or --no-x), mappings as compact JSON."""
    argv: list[str] = []
    for name, value in args.items():
        if value is True:
            argv.append(f"--{name}")
        elif value is False:
            if name in flags.booleans:
                argv.append(f"--no-{name}")
        else:
            text = json.dumps(value, separators=(",", ":")) if isinstance(value, dict | list) else str(value)
            argv += [f"--{name}", text]
    return argv
