"""What vLLM's `serve` accepts, read from the flag lists of the release the recipes pin.

The same data files feed the lab's vLLM stand-in, so the validator and the stand-in reject the same
command lines (sparkfleet/data/vllm/, read from the vLLM 0.28.0 sources).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

import yaml

DATA = Path(__file__).parent / "data" / "vllm"
VERSION = "0.28.0"

# Flags that vLLM removed or renamed: the container exits with "unrecognized arguments".
REMOVED = {
    "disable-log-requests": "it was removed in vLLM 0.12 (PR #29402): request logging is off by default; "
    "use enable-log-requests to opt in",
}
# Flags sparkfleet sets itself from inventory variables: the unit owns them.
OWNED = {"host": "set by sparkfleet (0.0.0.0)", "port": "use vllm_port", "model": "the recipe's model is mounted",
         "api-key": "use vllm_api_key (kept out of argv)", "served-model-name": "use vllm_served_model_name",
         **{name: "set by sparkfleet from the `pair` variable (serving across two Sparks)"
            for name in ("nnodes", "node-rank", "master-addr", "master-port", "headless")}}
# vLLM's human_readable_int (vllm/utils/argparse_utils.py): `k` is 1000, `K` is 1024, and decimals are
# allowed only with the decimal suffixes ("25.6k" yes, "1.5K" is rejected).
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclass(frozen=True)
class Number:
    """How vLLM reads one numeric flag (`int`, `size`: an int that also takes 128k / 128K, `float`) and the
    range its config accepts: `low` (excluded when `open_low`, as pydantic's gt) up to `high`."""

    kind: Literal["int", "size", "float"]
    low: float | None = None
    open_low: bool = False
    high: float | None = None

    def bounds(self) -> str:
        """The accepted range as written in a message: "in (0, 1]", ">= 1", "> 0", or "" when unbounded."""
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}]"
        if self.low is not None:
            return f"{'>' if self.open_low else '>='} {self.low:g}"
        return ""

    def describe(self) -> str:
        what = {"int": "an integer", "size": "an integer (or a size like 128k)", "float": "a number"}[self.kind]
        return f"{what} {self.bounds()}".rstrip()

    def contains(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return self.high is None or value <= self.high


# The one list of numeric flags: how vLLM 0.28 parses each one and the range its config classes accept
# (pydantic Field bounds in vllm/config/{scheduler,cache,parallel,offload}.py; ModelConfig for max-model-len,
# which vLLM also takes as -1/auto, "whatever fits": sparkfleet needs the number to budget memory).
# rules.py checks every one of them; memory.py reads its terms with the same parser.
NUMBERS: dict[str, Number] = {
    # SchedulerConfig
    "max-num-seqs": Number("int", 1),
    "max-num-batched-tokens": Number("size", 1),
    "stream-interval": Number("int", 1),
    "long-prefill-token-threshold": Number("int", 0),
    # ModelConfig
    "max-model-len": Number("size", 1),
    "max-logprobs": Number("int", -1),  # -1: no cap
    "seed": Number("int"),
    # CacheConfig
    "gpu-memory-utilization": Number("float", 0, open_low=True, high=1),
    "block-size": Number("int", 0, open_low=True),
    "mamba-block-size": Number("int", 0, open_low=True),
    "prefix-match-unit": Number("int", 0, open_low=True),
    "kv-cache-memory-bytes": Number("size", 1),
    # ParallelConfig
    "tensor-parallel-size": Number("int", 1),
    "pipeline-parallel-size": Number("int", 1),
    "data-parallel-size": Number("int", 1),
    "prefill-context-parallel-size": Number("int", 1),
    "decode-context-parallel-size": Number("int", 1),
    "data-parallel-size-local": Number("int", 0),
    "data-parallel-rank": Number("int", 0),
    "data-parallel-rpc-port": Number("int", 1, high=65535),
    "max-parallel-loading-workers": Number("int", 1),
    "nnodes": Number("int", 1),
    "node-rank": Number("int", 0),
    "ubatch-size": Number("int", 0),
    "dbo-decode-token-threshold": Number("int", 0),
    "dbo-prefill-token-threshold": Number("int", 0),
    # OffloadConfig
    "cpu-offload-gb": Number("float", 0),
    # ShutdownConfig: a negative wait is refused
    "shutdown-timeout": Number("int", 0),
}


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


def parse_size(value: object) -> int:
    """A count as vLLM's human_readable_int reads it: an int, or "128k" (128000), "128K" (131072), "4096".

    Raises ValueError with vLLM's reason for anything else ("1.5K", "lots", a bool, a float).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float):  # reaches vLLM as "8.0", which int() rejects
        raise ValueError(f"{value!r} is not a whole number")
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a number")
    text = value.strip()
    match = _SIZE.fullmatch(text)
    if match is None:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{value!r} is not a number") from None
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise ValueError(f"{value!r} puts a decimal before the binary suffix {suffix}, which vLLM refuses "
                         f"(write {number}{suffix.lower()} or {int(float(number) * _BINARY[suffix])})")
    return int(number) * _BINARY[suffix]


def parse_number(name: str, value: object) -> int | float:
    """`value` of the numeric flag `name` (a key of NUMBERS) as vLLM's argument parser reads `str(value)`.

    Raises ValueError saying why vLLM would refuse it as a number; the range is `range_problem`'s job.
    """
    spec = NUMBERS[name]
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number")
    if spec.kind == "float":
        try:
            number = float(value.strip() if isinstance(value, str) else value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"{value!r} is not a number") from None
        if not math.isfinite(number):
            raise ValueError(f"{value!r} is not a finite number")
        return number
    if spec.kind == "size" or isinstance(value, int | float):
        return parse_size(value)  # ints pass, floats are refused
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"{value!r} is not a number") from None


def range_problem(name: str, number: float) -> str | None:
    """Why vLLM's config refuses `number` for `name`, or None when it is in range."""
    spec = NUMBERS[name]
    if spec.contains(number):
        return None
    shown = f"{number:g}" if isinstance(number, float) else str(number)
    if spec.high is not None:
        return f"{shown} is outside {spec.bounds()[3:]}, the range vLLM accepts for --{name}"
    return f"vLLM requires --{name} {spec.bounds()}, not {shown}"


def read_number(name: str, value: object) -> int | float:
    """Parse and range-check one numeric flag; ValueError names the problem (the memory budget reads flags
    this way, so a value it cannot read is always one the flag rules report)."""
    number = parse_number(name, value)
    problem = range_problem(name, number)
    if problem:
        raise ValueError(problem)
    return number


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
