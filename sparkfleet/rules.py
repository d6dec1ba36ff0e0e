"""Recipe rules: what vLLM would reject or what would crash a Spark, caught before anything changes.

Each rule has a stable id, a severity and a message that names the fix. `deploy.py` refuses a fleet
with any error; `sparkfleet doctor` prints every finding.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Literal

from sparkfleet.endpoint import Endpoint
from sparkfleet.memory import CONTEXT_STEP, SPARK_MEMORY_BYTES, Budget, budget, gb
from sparkfleet.vllm_flags import OWNED, REMOVED, FlagSet, flag_set, is_known, is_number, valid_choice

GPUS_PER_SPARK = 1
GMU_ERROR = 0.90  # seed 000: 0.9 at 128K context is at the edge of unified memory
GMU_WARN = 0.85
MEMORY_HEADROOM_WARN = 0.05  # vLLM's profiling overshoots on unified memory (vllm #46307)


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: Literal["error", "warning"]
    field: str
    message: str


Rule = Callable[[Endpoint, FlagSet], Iterator[Finding]]


def _arg(name: str) -> str:
    return f"vllm_args.{name}"


def _close(word: str, options: list[str] | tuple[str, ...]) -> str:
    found = difflib.get_close_matches(word, list(options), n=2, cutoff=0.5)
    return f" (did you mean {' or '.join(found)}?)" if found else ""


def flag_names(endpoint: Endpoint, flags: FlagSet) -> Iterator[Finding]:
    """Unknown and removed flags make vLLM exit with `unrecognized arguments`."""
    for name in endpoint.args:
        if name in REMOVED:
            yield Finding("flag.removed", "error", _arg(name),
                          f"--{name} is not accepted by vLLM {endpoint.recipe.vllm_version}: "
                          f"{REMOVED[name]}; remove it (set it to null)")
        elif name in OWNED:
            yield Finding("flag.owned", "error", _arg(name),
                          f"--{name} is {OWNED[name]}; remove it from vllm_args")
        elif not is_known(name, flags):
            yield Finding("flag.unknown", "error", _arg(name),
                          f"vLLM {endpoint.recipe.vllm_version} has no "
                          f"--{name}{_close(name, sorted(flags.names))}; "
                          "the container would exit with `unrecognized arguments`")


def flag_values(endpoint: Endpoint, flags: FlagSet) -> Iterator[Finding]:
    """Parser, quantization and backend names vLLM does not know, and numbers that are not numbers."""
    for name, value in endpoint.args.items():
        if name in flags.choices and not valid_choice(name, str(value), flags):
            # attention backends are matched case-insensitively but listed upper case
            typed = str(value).upper() if name == "attention-backend" else str(value)
            hint = _close(typed, flags.choices[name])
            if name == "tool-call-parser":
                hint = " (for Qwen3.6 use qwen3_xml or qwen3_coder)"
            yield Finding("flag.choice", "error", _arg(name),
                          f"{value!r} is not a valid --{name} in vLLM {endpoint.recipe.vllm_version}{hint}")
        elif name in ("max-model-len", "max-num-seqs", "max-num-batched-tokens", "tensor-parallel-size",
                      "pipeline-parallel-size", "gpu-memory-utilization") and not is_number(name, value):
            yield Finding("flag.number", "error", _arg(name), f"{value!r} is not a number; give e.g. "
                          f"{endpoint.recipe.args.get(name, 1)}")
        elif name == "speculative-config" and isinstance(value, str):
            try:
                json.loads(value)
            except json.JSONDecodeError as error:
                yield Finding("flag.json", "error", _arg(name), f"is not valid JSON ({error.msg})")


def flag_combinations(endpoint: Endpoint, flags: FlagSet) -> Iterator[Finding]:
    """Flags that only make sense together, or never together."""
    args = endpoint.args
    if args.get("enable-auto-tool-choice") is True and not args.get("tool-call-parser"):
        yield Finding("flag.tool-choice-parser", "error", _arg("enable-auto-tool-choice"),
                      "--enable-auto-tool-choice needs --tool-call-parser (qwen3_xml for Qwen3.6)")
    if "quantization" in args and endpoint.recipe.model.quantization == "nvfp4":
        yield Finding("flag.prequantized", "error", _arg("quantization"),
                      f"{endpoint.recipe.model.id} is pre-quantized (NVFP4): "
                      "leave --quantization unset (null)")
    if args.get("enforce-eager") is True and "compilation-config" in args:
        yield Finding("flag.exclusive", "warning", _arg("enforce-eager"),
                      "--enforce-eager disables CUDA graphs, so --compilation-config has no effect")


def parallelism(endpoint: Endpoint, flags: FlagSet) -> Iterator[Finding]:
    """A Spark has one GPU: tensor x pipeline parallel above 1 cannot start."""
    tp, pp = endpoint.args.get("tensor-parallel-size", 1), endpoint.args.get("pipeline-parallel-size", 1)
    if isinstance(tp, int) and isinstance(pp, int) and tp * pp > GPUS_PER_SPARK:
        yield Finding("capacity.parallel", "error", _arg("tensor-parallel-size"),
                      f"tensor x pipeline parallel = {tp * pp} but a DGX Spark has {GPUS_PER_SPARK} GPU; "
                      "set tensor-parallel-size to 1 "
                      "(multi-Spark serving over ConnectX-7 is not managed here)")


def memory_utilization(endpoint: Endpoint, flags: FlagSet) -> Iterator[Finding]:
    """Unified memory is shared with the OS: above 0.90 the startup check fails or the box swaps."""
    value = endpoint.args.get("gpu-memory-utilization")
    if not isinstance(value, int | float) or isinstance(value, bool):
        return
    field = _arg("gpu-memory-utilization")
    if not 0 < value <= 1:
        yield Finding("capacity.gmu-range", "error", field, f"{value} is outside (0, 1]; start at 0.7-0.85")
    elif value > GMU_ERROR:
        yield Finding("capacity.gmu-high", "error", field,
                      f"{value} leaves too little of the 128 GB unified memory to the OS; use at most "
                      f"{GMU_WARN} (raise only once stable)")
    elif value > GMU_WARN:
        yield Finding("capacity.gmu-high", "warning", field,
                      f"{value} is above {GMU_WARN}: the edge on unified memory at long context (seed 000)")


def image_pinning(endpoint: Endpoint, flags: FlagSet) -> Iterator[Finding]:
    """Floating tags change under a converged fleet: the serving config is part of the model."""
    tag = endpoint.image.rsplit(":", 1)[-1] if ":" in endpoint.image.rsplit("/", 1)[-1] else "latest"
    if "@sha256:" not in endpoint.image and ("latest" in tag or "nightly" in tag):
        yield Finding("platform.floating-tag", "warning", "vllm_image",
                      f"{endpoint.image} is a moving target; pin a release tag or a digest (@sha256:…)")


def fp8_kernels(endpoint: Endpoint, flags: FlagSet) -> Iterator[Finding]:
    """FP8 on a stable image crashes in cutlass_scaled_mm on GB10 (vllm #40758, #43367)."""
    fp8 = endpoint.recipe.model.quantization == "fp8" or endpoint.args.get("quantization") == "fp8"
    if fp8 and "cu130" not in endpoint.image and endpoint.args.get("enforce-eager") is not True:
        yield Finding("platform.fp8-cutlass", "error", "vllm_image",
                      f"FP8 kernels crash on GB10 with {endpoint.image} (cutlass_scaled_mm: Error Internal): "
                      "use a cu130 image built with sm_121 kernels, pinned by tag or digest")


def _fitting_len(b: Budget) -> int:
    """The longest context that fits, rounded down to whole K tokens as operators write it."""
    length = b.max_model_len_that_fits()
    return length // CONTEXT_STEP * CONTEXT_STEP or length


def _over_budget(b: Budget) -> str:
    """Operator language: how many sequences fit, and the two ways back under budget."""
    seqs, length = b.max_num_seqs_that_fit(), _fitting_len(b)
    where = f"{b.gpu_memory_utilization:g} x {b.memory_bytes / 1e9:g} GB"
    numbers = (f"(budget {gb(b.total)} > {gb(b.available)} available; "
               "`sparkfleet doctor --explain` shows the terms)")
    if length == 0:
        return (f"the weights and overhead alone do not fit in {where}: raise gpu-memory-utilization "
                f"or use a smaller checkpoint {numbers}")
    if seqs == 0:
        return (f"not even one sequence of max-model-len {b.max_model_len} fits in {where}: "
                f"lower max-model-len to {length} {numbers}")
    plural = "s" if seqs > 1 else ""
    return (f"at max-model-len {b.max_model_len} only {seqs} sequence{plural} fit in {where}: "
            f"lower max-num-seqs to {seqs} or max-model-len to {length} {numbers}")


def _tight(b: Budget) -> str:
    """It fits, but vLLM's profiling can overshoot on unified memory (vllm #46307): name a safer setting."""
    safe = replace(b, available=int(b.available * (1 - MEMORY_HEADROOM_WARN)))
    seqs = safe.max_num_seqs_that_fit()
    return (f"budget {gb(b.total)} leaves {b.headroom:.1%} of {gb(b.available)} free, under "
            f"{MEMORY_HEADROOM_WARN:.0%}: vLLM's profiling can overshoot on unified memory; lower "
            f"{f'max-num-seqs to {seqs} or ' if seqs else ''}max-model-len to {_fitting_len(safe)}")

def memory_budget_for(memory_bytes: int) -> Rule:
    """The memory rule for a host with `memory_bytes` of unified memory (the preflight passes MemTotal)."""

    def memory_budget(endpoint: Endpoint, flags: FlagSet) -> Iterator[Finding]:
        """Weights, KV cache at full concurrency and context, and overhead must fit in the budget."""
        try:
            found = budget(endpoint, memory_bytes)
        except (TypeError, ValueError):
            return  # flag.number reports flags the budget cannot read
        if not found.fits:
            yield Finding("capacity.memory", "error", _arg("max-num-seqs"), _over_budget(found))
        elif found.headroom < MEMORY_HEADROOM_WARN:
            yield Finding("capacity.memory-tight", "warning", _arg("max-num-seqs"), _tight(found))

    return memory_budget


memory_budget = memory_budget_for(SPARK_MEMORY_BYTES)


def model_source(endpoint: Endpoint, flags: FlagSet) -> Iterator[Finding]:
    """Staging from the Hub is not implemented yet: say so before anything runs."""
    if endpoint.model_source.startswith("hf://"):
        yield Finding("source.hf", "error", "model_source",
                      f"{endpoint.model_source}: staging from the Hugging Face Hub is not supported yet; set "
                      "model_source to an http(s) mirror with SHA256SUMS or a directory on the controller")


RULES: tuple[Rule, ...] = (
    flag_names, flag_values, flag_combinations, parallelism, memory_utilization, image_pinning, fp8_kernels,
    model_source,
    memory_budget,
)


def check(endpoint: Endpoint, extra: tuple[Rule, ...] = ()) -> list[Finding]:
    """Every finding of every rule for one endpoint, in rule order."""
    flags = flag_set(endpoint.recipe.vllm_version)
    return [finding for rule in (*RULES, *extra) for finding in rule(endpoint, flags)]
