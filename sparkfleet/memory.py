"""Will an endpoint fit in a Spark's unified memory? A budget worked out before anything starts.

An estimate, not vLLM's profiler: weights + attention KV cache (times a safety factor) + DeltaNet state
+ MTP drafter + overhead, against gpu-memory-utilization x memory. It budgets every sequence at full
length (vLLM only checks that one does), so a recipe that passes cannot run out of KV cache at its own
limits. Once an endpoint runs, vLLM's logged "GPU KV cache size" is the better number.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from sparkfleet.endpoint import Endpoint
from sparkfleet.recipes import FlagValue, ModelShape
from sparkfleet.vllm_flags import read_number

GiB = 2**30
KiB = 2**10
# The nominal "128 GB" NVIDIA quotes for a Spark, in decimal bytes (slightly under a real MemTotal, so
# conservative); the host preflight passes the real MemTotal instead.
SPARK_MEMORY_BYTES = 128 * 10**9
# DOMAIN.md: vLLM's hybrid allocator measured ~4x the attention-only figure on Spark, so the attention KV
# arithmetic is multiplied by this.
SAFETY_FACTOR = 4.0
# vLLM's own defaults when a flag is unset. GB10 reports its whole unified memory (>= 70 GiB) to vLLM, so
# get_batch_defaults() picks the large-GPU values: 1024 sequences and, in vLLM 0.28, 16384 batched tokens.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_MAX_NUM_SEQS = 1024
DEFAULT_MAX_NUM_BATCHED_TOKENS = 16384
# CUDA context, torch and NCCL runtime, CUDA graphs for every captured batch size, allocator slack.
OVERHEAD_BYTES = 5 * GiB
# vLLM's profile run pushes max-num-batched-tokens through one forward pass. Per token, Qwen3.6 holds a few
# bf16 hidden-state copies (2048 x 2 B = 4 KiB each), 8 routed experts' gate/up/down intermediates
# (8 x 3 x 512 x 2 B = 24 KiB), fp32 norm upcasts, router logits and DeltaNet chunk buffers: a few tens of
# KiB. 128 KiB bounds it with margin (1 GiB at the recipes' 8192 tokens, 6 GiB overhead in all).
ACTIVATION_BYTES_PER_BATCHED_TOKEN = 128 * KiB
# Suggested max-model-len and max-num-batched-tokens values are rounded down to this, as operators write them.
CONTEXT_STEP = 1024


@dataclass(frozen=True)
class Budget:
    """Every term in bytes, with the inputs `explain` shows the formulas with."""

    weights: int
    kv_cache: int
    linear_state: int
    mtp: int
    overhead: int
    available: int
    kv_per_token_raw: int  # attention K and V of one token, before the safety factor
    kv_per_token: int  # with the safety factor
    linear_state_per_seq: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_dtype: str
    gpu_memory_utilization: float
    memory_bytes: int
    model: ModelShape = field(hash=False)
    split: int = 1  # GPUs the model is split across (tensor x pipeline parallel: 2 for a pair), one per Spark

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.linear_state + self.mtp + self.overhead

    @property
    def fits(self) -> bool:
        return self.total <= self.available

    @property
    def headroom(self) -> float:
        """Share of the available memory left over (negative when over budget)."""
        return (self.available - self.total) / self.available

    @property
    def fixed(self) -> int:
        """Terms that do not grow with sequences or context (weights, MTP drafter, overhead)."""
        return self.weights + self.mtp + self.overhead

    @property
    def activations(self) -> int:
        """The part of the overhead that grows with max-num-batched-tokens (vLLM's profile run)."""
        return ACTIVATION_BYTES_PER_BATCHED_TOKEN * self.max_num_batched_tokens

    def max_num_seqs_that_fit(self, max_model_len: int | None = None) -> int:
        """Most sequences of `max_model_len` (default: the budget's) tokens that fit; 0 when not even one does."""
        length = self.max_model_len if max_model_len is None else max_model_len
        per_seq = self.kv_per_token * length + self.linear_state_per_seq
        return max(0, (self.available - self.fixed) // per_seq)

    def max_model_len_that_fits(self, max_num_seqs: int | None = None) -> int:
        """Longest context that fits with `max_num_seqs` (default: the budget's) sequences; 0 when not even one
        token does."""
        seqs = self.max_num_seqs if max_num_seqs is None else max_num_seqs
        room = self.available - self.fixed - self.linear_state_per_seq * seqs
        return max(0, room // (self.kv_per_token * seqs))

    def max_num_batched_tokens_that_fit(self) -> int:
        """Most batched tokens whose activations still fit beside everything else; 0 when none do."""
        room = self.available - (self.total - self.activations)
        return max(0, room // ACTIVATION_BYTES_PER_BATCHED_TOKEN)


def kv_bytes_per_value(kv_cache_dtype: str) -> int:
    """`auto` keeps the checkpoint's bf16 activations; fp8* stores one byte; turboquant_* stores fewer bits
    plus scales, budgeted at one byte (an upper bound)."""
    return 1 if kv_cache_dtype.startswith(("fp8", "turboquant")) else 2


def mtp_enabled(args: dict[str, FlagValue]) -> bool:
    """MTP weights are loaded only when --speculative-config selects an MTP method."""
    value = args.get("speculative-config")
    try:
        config = json.loads(value) if isinstance(value, str) else None
    except json.JSONDecodeError:
        return False  # flag.json reports it; vLLM would not start
    return isinstance(config, dict) and "mtp" in str(config.get("method", ""))


def _flag(args: dict[str, FlagValue], name: str, default: FlagValue) -> int | float:
    """A flag as vLLM reads it, range-checked; ValueError when the flag rules (flag.number, flag.range) refuse it."""
    return read_number(name, args.get(name, default))


def budget(endpoint: Endpoint, memory_bytes: int = SPARK_MEMORY_BYTES) -> Budget:
    """The endpoint's memory budget on a host with `memory_bytes` of unified memory: one node's share when the
    model is split across a pair (weights, KV heads, DeltaNet heads and the drafter are sharded by tensor
    parallel, layers by pipeline parallel; each node keeps its own overhead and activations).

    Raises ValueError when a flag it reads is not a number vLLM accepts (flag.number and flag.range report
    those, with the same parser: a value the budget cannot read is never silently skipped).
    """
    args, model = endpoint.args, endpoint.recipe.model
    max_model_len = int(_flag(args, "max-model-len", model.native_context))
    max_num_seqs = int(_flag(args, "max-num-seqs", DEFAULT_MAX_NUM_SEQS))
    batched = int(_flag(args, "max-num-batched-tokens", DEFAULT_MAX_NUM_BATCHED_TOKENS))
    gmu = float(_flag(args, "gpu-memory-utilization", DEFAULT_GPU_MEMORY_UTILIZATION))
    kv_dtype = str(args.get("kv-cache-dtype", "auto"))
    split = int(_flag(args, "tensor-parallel-size", 1)) * int(_flag(args, "pipeline-parallel-size", 1))
    kv_raw = model.full_attention_layers * 2 * model.kv_heads * model.head_dim * kv_bytes_per_value(kv_dtype)
    kv_per_token = math.ceil(kv_raw * SAFETY_FACTOR / split)
    linear_per_seq = math.ceil(model.linear_state_bytes_per_seq / split)
    # The MTP drafter is one more decoder layer (plus its KV and CUDA graphs): an average layer's share of the
    # checkpoint. Its tensors are already in checkpoint_bytes, so this errs on the high side.
    layers = model.full_attention_layers + model.linear_attention_layers
    mtp = model.checkpoint_bytes * model.mtp_layers // layers // split if mtp_enabled(args) else 0
    return Budget(
        weights=math.ceil(model.checkpoint_bytes / split),
        kv_cache=kv_per_token * max_model_len * max_num_seqs,
        linear_state=linear_per_seq * max_num_seqs,
        mtp=mtp,
        overhead=OVERHEAD_BYTES + ACTIVATION_BYTES_PER_BATCHED_TOKEN * batched,
        available=int(gmu * memory_bytes),
        kv_per_token_raw=kv_raw,
        kv_per_token=kv_per_token,
        linear_state_per_seq=linear_per_seq,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=batched,
        kv_dtype=kv_dtype,
        gpu_memory_utilization=gmu,
        memory_bytes=memory_bytes,
        model=model,
        split=split,
    )


def gb(size: int) -> str:
    """Decimal gigabytes, as memory is sold and as `free -g` readers compare."""
    return f"{size / 1e9:.1f} GB"


def explain(b: Budget) -> list[tuple[str, str]]:
    """Term by term, each with the formula that produced it (`sparkfleet doctor --explain`)."""
    m = b.model
    kv = (f"{m.full_attention_layers} attention layers x 2 (K,V) x {m.kv_heads} KV heads x {m.head_dim} "
          f"head dim x {kv_bytes_per_value(b.kv_dtype)} B ({b.kv_dtype}) = {b.kv_per_token_raw / KiB:g} "
          f"KiB/token, x {SAFETY_FACTOR:g} safety x {b.max_model_len} tokens x {b.max_num_seqs} seqs")
    layers = m.full_attention_layers + m.linear_attention_layers
    mtp = (f"{gb(m.checkpoint_bytes)} / {layers} layers x {m.mtp_layers} MTP layer(s)" if b.mtp
           else "MTP not enabled in --speculative-config")
    per_token = ACTIVATION_BYTES_PER_BATCHED_TOKEN // KiB
    overhead = (f"{OVERHEAD_BYTES // GiB} GiB (CUDA context, graphs) + {per_token} KiB x "
                f"{b.max_num_batched_tokens} batched tokens")
    left, state = b.available - b.total, b.linear_state_per_seq / 2**20
    share = f" / {b.split} (split across {b.split} Sparks)" if b.split > 1 else ""
    kv += share
    node = " (this Spark's share)" if share else ""
    mtp += share if b.mtp else ""
    return [
        ("weights", f"{gb(b.weights)}  checkpoint of {m.id} ({m.quantization}){share}"),
        ("kv_cache", f"{gb(b.kv_cache)}  {kv}"),
        ("linear_state", f"{gb(b.linear_state)}  {state:.1f} MiB DeltaNet state{node} x {b.max_num_seqs} seqs"),
        ("mtp", f"{gb(b.mtp)}  {mtp}"),
        ("overhead", f"{gb(b.overhead)}  {overhead}"),
        ("total", gb(b.total)),
        ("available", f"{gb(b.available)}  {b.gpu_memory_utilization:g} x {gb(b.memory_bytes)}"),
        ("headroom", f"{gb(left)} ({b.headroom:.0%})" if b.fits else f"over by {gb(-left)}"),
    ]
