"""Recipe rules: what vLLM would reject or what would crash a Spark, caught before anything changes.

Each rule has a stable id, a severity and a message that names the fix. `deploy.py` refuses a fleet
with any error; `sparkfleet doctor` prints every finding.
"""

from __future__ import annotations

import difflib
import errno
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from sparkfleet.endpoint import Endpoint
from sparkfleet.manifest import SKIP
from sparkfleet.memory import (
    CONTEXT_STEP,
    OVERHEAD_BYTES,
    SPARK_MEMORY_BYTES,
    Budget,
    budget,
    gb,
)
from sparkfleet.vllm_flags import (
    NUMBERS,
    OWNED,
    REMOVED,
    FlagSet,
    flag_set,
    is_known,
    parse_number,
    range_problem,
    read_number,
    valid_choice,
)

GPUS_PER_SPARK = 1
PAIR_GPUS = 2 * GPUS_PER_SPARK
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


def _example(endpoint: Endpoint, name: str) -> str:
    """A value to suggest for a numeric flag: the recipe's when vLLM accepts it, else the smallest valid one."""
    if name == "gpu-memory-utilization":
        return "0.7-0.85 (start low on unified memory)"
    recipe = endpoint.recipe.args.get(name)
    if recipe is not None:
        try:
            return f"{read_number(name, recipe)} (the recipe's)"
        except ValueError:
            pass
    spec = NUMBERS[name]
    if spec.low is None:
        return "0"
    return f"{spec.low + 1 if spec.open_low else spec.low:g}"


def _number(endpoint: Endpoint, name: str, value: object) -> Iterator[Finding]:
    """A numeric flag vLLM cannot parse (flag.number) or whose config refuses the value (flag.range)."""
    spec = NUMBERS[name]
    if name == "max-model-len" and str(value).strip() in ("auto", "-1"):
        yield Finding("flag.number", "error", _arg(name),
                      f"{value!r} lets vLLM pick the longest context that fits, which sparkfleet cannot budget "
                      f"memory for: give the context length, e.g. {_example(endpoint, name)}")
        return
    try:
        number = parse_number(name, value)
    except ValueError as error:
        yield Finding("flag.number", "error", _arg(name),
                      f"{error}; vLLM reads --{name} as {spec.describe()} and would exit at start-up: "
                      f"give e.g. {_example(endpoint, name)}")
        return
    problem = range_problem(name, number)
    if problem:
        yield Finding("flag.range", "error", _arg(name),
                      f"{problem}: the engine would exit at start-up with a ValueError; give e.g. "
                      f"{_example(endpoint, name)}")


def flag_values(endpoint: Endpoint, flags: FlagSet) -> Iterator[Finding]:
    """Parser, quantization and backend names vLLM does not know, numbers that are not numbers, and numbers
    outside the range vLLM's config accepts (every flag of vllm_flags.NUMBERS)."""
    for name, value in endpoint.args.items():
        if name in flags.choices and not valid_choice(name, str(value), flags):
            # attention backends are matched case-insensitively but listed upper case
            typed = str(value).upper() if name == "attention-backend" else str(value)
            hint = _close(typed, flags.choices[name])
            if name == "tool-call-parser":
                hint = " (for Qwen3.6 use qwen3_xml or qwen3_coder)"
            yield Finding("flag.choice", "error", _arg(name),
                          f"{value!r} is not a valid --{name} in vLLM {endpoint.recipe.vllm_version}{hint}")
        elif name in NUMBERS:
            yield from _number(endpoint, name, value)
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


def _valid(endpoint: Endpoint, name: str, default: int | float | None = None) -> int | float | None:
    """A numeric flag's value when vLLM accepts it (else None: flag.number or flag.range reports it)."""
    value = endpoint.args.get(name, default)
    if value is None:
        return None
    try:
        return read_number(name, value)
    except ValueError:
        return None


def flag_limits(endpoint: Endpoint, flags: FlagSet) -> Iterator[Finding]:
    """Numbers vLLM checks against each other or against the model (SchedulerConfig, ModelConfig)."""
    args, model = endpoint.args, endpoint.recipe.model
    seqs, batched = _valid(endpoint, "max-num-seqs"), _valid(endpoint, "max-num-batched-tokens")
    length = _valid(endpoint, "max-model-len", model.native_context)
    if seqs is not None and batched is not None and batched < seqs:
        yield Finding("flag.batched-tokens", "error", _arg("max-num-batched-tokens"),
                      f"vLLM requires max-num-batched-tokens ({batched}) >= max-num-seqs ({seqs}) and would "
                      f"exit at start-up: raise max-num-batched-tokens to at least {seqs} or lower max-num-seqs")
    if args.get("enable-chunked-prefill") is False and batched is not None and length is not None \
            and batched < length:
        yield Finding("flag.batched-tokens", "error", _arg("max-num-batched-tokens"),
                      f"without chunked prefill vLLM requires max-num-batched-tokens ({batched}) >= "
                      f"max-model-len ({length}): raise it to {length}, lower max-model-len, or enable "
                      "chunked prefill")
    if length is not None and length > model.native_context and "hf-overrides" not in args:
        yield Finding("flag.context", "error", _arg("max-model-len"),
                      f"{length} is longer than {model.id}'s native context ({model.native_context}): vLLM "
                      f"refuses it at start-up (unless rope scaling in --hf-overrides extends it); lower "
                      f"max-model-len to {model.native_context} or less")


def parallelism(endpoint: Endpoint, flags: FlagSet) -> Iterator[Finding]:
    """A Spark has one GPU: tensor x pipeline parallel above 1 cannot start, except across a pair's two Sparks,
    whose one engine needs exactly their two GPUs."""
    tp, pp = _valid(endpoint, "tensor-parallel-size", 1), _valid(endpoint, "pipeline-parallel-size", 1)
    if tp is None or pp is None:
        return
    if endpoint.config.pair is None and tp * pp > GPUS_PER_SPARK:
        yield Finding("capacity.parallel", "error", _arg("tensor-parallel-size"),
                      f"tensor x pipeline parallel = {tp * pp:g} but a DGX Spark has {GPUS_PER_SPARK} GPU; "
                      "set tensor-parallel-size to 1, or declare a `pair` to serve across two Sparks")
    elif endpoint.config.pair is not None and tp * pp != PAIR_GPUS:
        yield Finding("capacity.parallel", "error", _arg("tensor-parallel-size"),
                      f"tensor x pipeline parallel = {tp * pp:g} but pair {endpoint.config.pair.name} runs one "
                      f"engine across {PAIR_GPUS} Sparks of {GPUS_PER_SPARK} GPU each (vLLM refuses any other "
                      "world size with --nnodes 2); leave tensor-parallel-size unset (a pair's default is 2)")


def memory_utilization(endpoint: Endpoint, flags: FlagSet) -> Iterator[Finding]:
    """Unified memory is shared with the OS: above 0.90 the startup check fails or the box swaps."""
    value = _valid(endpoint, "gpu-memory-utilization")
    if value is None:
        return  # unset (vLLM's default), or flag.number / flag.range reports it
    field = _arg("gpu-memory-utilization")
    if value > GMU_ERROR:
        yield Finding("capacity.gmu-high", "error", field,
                      f"{value:g} leaves too little of the 128 GB unified memory to the OS; use at most "
                      f"{GMU_WARN} (raise only once stable)")
    elif value > GMU_WARN:
        yield Finding("capacity.gmu-high", "warning", field,
                      f"{value:g} is above {GMU_WARN}: the edge on unified memory at long context (seed 000)")


def image_pinning(endpoint: Endpoint, flags: FlagSet) -> Iterator[Finding]:
    """Floating tags change under a converged fleet: the serving config is part of the model."""
    tag = endpoint.image.rsplit(":", 1)[-1] if ":" in endpoint.image.rsplit("/", 1)[-1] else "latest"
    if "@sha256:" not in endpoint.image and ("latest" in tag or "nightly" in tag):
        yield Finding("platform.floating-tag", "warning", "vllm_image",
                      f"{endpoint.image} is a moving target; pin a release tag or a digest (@sha256:…)")


def _same_image(image: str, reference: str) -> bool:
    """The same tag, the same digest, or a tag pinned further by a digest."""
    if image == reference or image.startswith(reference + "@"):
        return True
    return "@sha256:" in reference and image.endswith("@" + reference.split("@", 1)[1])


def image_validation(endpoint: Endpoint, flags: FlagSet) -> Iterator[Finding]:
    """Whether an image has GB10 (sm_121) kernels cannot be told from its name (vllm #40758 crashed on a cu130
    build): recipes list what a public source showed working or failing, operators add what their canary served."""
    image, recipe = endpoint.image, endpoint.recipe
    bad = next((note for note in recipe.known_bad_images if _same_image(image, note.image)), None)
    if bad is not None:
        yield Finding("platform.image-known-bad", "error", "vllm_image",
                      f"{image} is known bad for {recipe.name} on GB10 ({bad.source}): use {recipe.image}, or an "
                      "image your canary validated")
        return
    validated = [note.image for note in recipe.validated_images] + endpoint.config.vllm_validated_images
    if any(_same_image(image, reference) for reference in validated):
        return
    fp8 = recipe.model.quantization == "fp8" or endpoint.args.get("quantization") == "fp8"
    risk = ("FP8 kernels crash on GB10 in images built without sm_121 kernels (cutlass_scaled_mm: Error Internal, "
            "vllm #40758, #43367), and a name cannot tell" if fp8 else "the serving config is part of the model")
    yield Finding("platform.image-unvalidated", "warning", "vllm_image",
                  f"{image} is not validated on GB10 for {recipe.name} ({risk}): roll it out to one canary first "
                  "(`sparkfleet rollout --canary 1`), then add the digest it served to vllm_validated_images")


def _round(tokens: int) -> int:
    """Rounded down to whole K tokens as operators write them (small values kept as they are)."""
    return tokens // CONTEXT_STEP * CONTEXT_STEP or tokens


def _fitting_len(b: Budget, max_num_seqs: int | None = None) -> int:
    """The longest context that fits with `max_num_seqs` (default: the budget's), rounded down to whole K,
    and never above the model's native context (vLLM refuses longer: flag.context)."""
    return min(_round(b.max_model_len_that_fits(max_num_seqs)), b.model.native_context)


def _over_budget(b: Budget) -> tuple[str, str]:
    """(field, message) in operator language: the term that overflows, and the largest setting that fits.

    Terms are judged in the order they are paid: weights and fixed overhead, then the activations of
    max-num-batched-tokens, then what grows with sequences and context (KV cache and DeltaNet state).
    """
    where = f"{b.gpu_memory_utilization:g} x {b.memory_bytes / 1e9:g} GB"
    numbers = (f"(budget {gb(b.total)} > {gb(b.available)} available; "
               "`sparkfleet doctor --explain` shows each term)")
    if b.weights + b.mtp + OVERHEAD_BYTES > b.available:
        return _arg("gpu-memory-utilization"), (
            f"the weights and overhead alone ({gb(b.weights + b.mtp + OVERHEAD_BYTES)}) do not fit in {where}: "
            f"raise gpu-memory-utilization or use a smaller checkpoint {numbers}")
    if b.fixed + b.kv_per_token + b.linear_state_per_seq > b.available:
        # The profile run's activations leave no room for even one sequence of one token.
        fits = _round(b.max_num_batched_tokens_that_fit())
        fix = (f"lower max-num-batched-tokens to {fits}" if fits >= 1 else
               "lower max-num-batched-tokens, then max-num-seqs or max-model-len")
        return _arg("max-num-batched-tokens"), (
            f"the activations of max-num-batched-tokens {b.max_num_batched_tokens} ({gb(b.activations)} in "
            f"vLLM's profile run) leave no room for the KV cache in {where}: {fix} {numbers}")
    room = gb(b.available - b.fixed)
    seqs, length = b.max_num_seqs_that_fit(), _fitting_len(b)
    if seqs == 0:
        one = b.kv_per_token * b.max_model_len + b.linear_state_per_seq
        if length:
            fix = f"lower max-model-len to {length}"
        else:  # too many sequences for any context, and too long a context for one sequence
            fix = f"lower max-num-seqs to 1 and max-model-len to {_fitting_len(b, 1)}"
        return _arg("max-model-len"), (
            f"not even one sequence of max-model-len {b.max_model_len} fits in {where}: {fix} "
            f"(budget {gb(b.total)} > {gb(b.available)} available: the KV cache and DeltaNet state of one "
            f"sequence need {gb(one)}, the weights and overhead leave {room}; `sparkfleet doctor --explain` "
            "shows each term)")
    plural = "s" if seqs > 1 else ""
    fix = f"lower max-num-seqs to {seqs}" + (f" or max-model-len to {length}" if length else "")
    return _arg("max-num-seqs"), (
        f"at max-model-len {b.max_model_len} only {seqs} sequence{plural} fit in {where}: the KV cache of "
        f"{b.max_num_seqs} sequences ({gb(b.kv_cache)}) and their DeltaNet state ({gb(b.linear_state)}) overflow "
        f"the {room} the weights and overhead leave; {fix} {numbers}")


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
        except ValueError:
            return  # flag.number and flag.range report every flag the budget cannot read
        if not found.fits:
            field, message = _over_budget(found)
            yield Finding("capacity.memory", "error", field, message)
        elif found.headroom < MEMORY_HEADROOM_WARN:
            yield Finding("capacity.memory-tight", "warning", _arg("max-num-seqs"), _tight(found))

    return memory_budget


memory_budget = memory_budget_for(SPARK_MEMORY_BYTES)


def model_source(endpoint: Endpoint, flags: FlagSet) -> Iterator[Finding]:
    """A controller directory must hold the weights: say so before anything runs (the weights step comes after
    the toolkit and runtime steps have changed the host). Hub and mirror sources are asked when the fleet's
    generations are resolved (fleet.resolve_weights), still before any change."""
    source = endpoint.source
    if source.kind == "controller":
        yield from _controller_source(Path(source.path))


def _controller_source(path: Path) -> Iterator[Finding]:
    """A directory on the controller that exists, can be read and holds at least one file to stage."""
    try:
        if not path.is_dir():
            what = "is not a directory" if path.exists() else "does not exist"
            yield Finding("source.missing", "error", "model_source",
                          f"{path} {what} on this controller (the machine running sparkfleet): copy the "
                          "checkpoint there, or point model_source at the directory that holds it")
            return
        if not os.access(path, os.R_OK | os.X_OK):  # rglob would skip it silently
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        found = any(p.is_file() and p.name not in SKIP and not p.name.startswith(".") for p in path.rglob("*"))
    except OSError as error:
        yield Finding("source.missing", "error", "model_source",
                      f"{path} cannot be read on this controller ({error.strerror or error}): fix its "
                      "permissions for the user running sparkfleet")
        return
    if not found:
        yield Finding("source.missing", "error", "model_source",
                      f"{path} holds no files to stage: copy the checkpoint (config.json, *.safetensors, "
                      "tokenizer) into it, or point model_source at the directory that holds it")


RULES: tuple[Rule, ...] = (
    flag_names, flag_values, flag_combinations, flag_limits, parallelism, memory_utilization, image_pinning,
    image_validation, model_source,
    memory_budget,
)


def check(endpoint: Endpoint, extra: tuple[Rule, ...] = ()) -> list[Finding]:
    """Every finding of every rule for one endpoint, in rule order."""
    flags = flag_set(endpoint.recipe.vllm_version)
    return [finding for rule in (*RULES, *extra) for finding in rule(endpoint, flags)]
