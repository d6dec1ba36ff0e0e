"""The memory budget: Qwen3.6's KV arithmetic, vLLM's size strings, and the largest settings that fit."""

import pytest

from sparkfleet.config import SparkConfig
from sparkfleet.endpoint import Endpoint, resolve
from sparkfleet.memory import (
    SAFETY_FACTOR,
    SPARK_MEMORY_BYTES,
    GiB,
    KiB,
    budget,
    explain,
    gb,
)
from sparkfleet.vllm_flags import parse_size

NVFP4 = "qwen3.6-35b-a3b-nvfp4"
FP8 = "qwen3.6-35b-a3b-fp8"


def endpoint(recipe: str = NVFP4, **args: object) -> Endpoint:
    return resolve("spark-01", SparkConfig(vllm_recipe=recipe, vllm_args=args))


@pytest.mark.parametrize(("dtype", "per_token"), [
    ("auto", 20 * KiB), ("bfloat16", 20 * KiB), ("float16", 20 * KiB),
    ("fp8", 10 * KiB), ("fp8_e5m2", 10 * KiB),
])
def test_raw_kv_per_token_is_ten_attention_layers_of_k_and_v(dtype: str, per_token: int) -> None:
    found = budget(endpoint(**{"kv-cache-dtype": dtype}))
    assert found.kv_per_token_raw == per_token  # 10 layers x 2 (K,V) x 2 heads x 256 x bytes
    assert found.kv_per_token == per_token * SAFETY_FACTOR


def test_shipped_nvfp4_recipe_terms() -> None:
    found = budget(endpoint())
    assert found.kv_per_token_raw == 10240  # the recipe's fp8 KV cache
    assert found.kv_cache == 10240 * 4 * 262144 * 4
    assert found.weights == 23_000_000_000
    assert found.linear_state == 63963136 * 4
    assert found.mtp == 23_000_000_000 // 40  # its speculative-config selects MTP
    assert found.overhead == 6 * GiB  # 5 GiB + 128 KiB x 8192 batched tokens
    assert found.available == 89_600_000_000
    assert found.total == sum((found.weights, found.kv_cache, found.linear_state, found.mtp, found.overhead))
    assert found.fits and 0.05 < found.headroom < 0.5


def test_mtp_costs_nothing_without_speculative_decoding() -> None:
    assert budget(endpoint(**{"speculative-config": None})).mtp == 0
    assert budget(endpoint(FP8)).mtp == 0


@pytest.mark.parametrize(("text", "tokens"), [
    ("128k", 128_000), ("128K", 131_072), ("25.6k", 25_600), ("1M", 2**20), (" 4096 ", 4096),
    (262144, 262144),
])
def test_sizes_are_read_as_vllm_reads_them(text: str | int, tokens: int) -> None:
    assert parse_size(text) == tokens


@pytest.mark.parametrize("text", ["1.5K", "lots", "", True, 8.0])
def test_sizes_vllm_rejects_are_rejected(text: object) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_size_string_reaches_the_budget() -> None:
    assert budget(endpoint(**{"max-model-len": "128K"})).max_model_len == 131_072


def test_unset_flags_take_vllm_defaults() -> None:
    found = budget(endpoint(**{"max-model-len": None, "max-num-seqs": None, "gpu-memory-utilization": None}))
    assert found.max_model_len == 262_144  # the model's native context
    assert found.max_num_seqs == 1024  # GB10 reports >= 70 GiB: vLLM's large-GPU default
    assert found.available == int(0.9 * SPARK_MEMORY_BYTES)
    assert not found.fits


def test_host_memory_sets_what_is_available() -> None:
    assert budget(endpoint(), memory_bytes=100 * 10**9).available == 70 * 10**9


def test_max_num_seqs_that_fit_is_the_largest_that_fits() -> None:
    most = budget(endpoint()).max_num_seqs_that_fit()
    assert most >= 4
    assert budget(endpoint(**{"max-num-seqs": most})).fits
    assert not budget(endpoint(**{"max-num-seqs": most + 1})).fits


def test_max_model_len_that_fits_is_the_largest_that_fits() -> None:
    longest = budget(endpoint(**{"max-num-seqs": 8})).max_model_len_that_fits()
    assert 0 < longest < 262_144
    assert budget(endpoint(**{"max-num-seqs": 8, "max-model-len": longest})).fits
    assert not budget(endpoint(**{"max-num-seqs": 8, "max-model-len": longest + 1})).fits


def test_nothing_fits_when_weights_and_overhead_exceed_the_budget() -> None:
    found = budget(endpoint(**{"gpu-memory-utilization": 0.2}))
    assert found.max_num_seqs_that_fit() == 0
    assert found.max_model_len_that_fits() == 0


def test_fits_up_to_and_including_every_byte_available() -> None:
    exact = budget(endpoint(**{"gpu-memory-utilization": 1.0})).total
    assert budget(endpoint(**{"gpu-memory-utilization": 1.0}), memory_bytes=exact).fits
    assert not budget(endpoint(**{"gpu-memory-utilization": 1.0}), memory_bytes=exact - 1).fits


def test_explain_shows_every_term_with_its_formula() -> None:
    found = budget(endpoint())
    rows = dict(explain(found))
    assert list(rows) == [
        "weights", "kv_cache", "linear_state", "mtp", "overhead", "total", "available", "headroom",
    ]
    assert rows["kv_cache"].startswith(gb(found.kv_cache))
    formula = "10 attention layers x 2 (K,V) x 2 KV heads x 256 head dim x 1 B (fp8) = 10 KiB/token"
    assert formula in rows["kv_cache"]
    assert "x 4 safety x 262144 tokens x 4 seqs" in rows["kv_cache"]
    assert rows["linear_state"] == "0.3 GB  61.0 MiB DeltaNet state x 4 seqs"
    assert rows["mtp"] == "0.6 GB  23.0 GB / 40 layers x 1 MTP layer(s)"
    assert rows["available"] == "89.6 GB  0.7 x 128.0 GB"
    assert rows["total"] == gb(found.total)
    assert rows["headroom"].startswith(gb(found.available - found.total))


def test_explain_says_by_how_much_a_budget_is_over() -> None:
    found = budget(endpoint(**{"max-num-seqs": 64}))
    assert dict(explain(found))["headroom"] == f"over by {gb(found.total - found.available)}"
