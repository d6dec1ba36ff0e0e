"""Numeric vLLM flags: one list, one parser, ranges as vLLM's config checks them; memory findings that name the
term that overflows and the value that fits; the doctor's table with a field in every row."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from sparkfleet import doctor, rules, vllm_flags
from sparkfleet.config import SparkConfig
from sparkfleet.endpoint import Endpoint, resolve
from sparkfleet.fleet import FleetError, load_fleet
from sparkfleet.memory import ACTIVATION_BYTES_PER_BATCHED_TOKEN, OVERHEAD_BYTES, GiB, budget
from sparkfleet.rules import Finding, check
from sparkfleet.vllm_flags import NUMBERS, flag_set, parse_number, read_number
from tests.unit.resolved import offline_sources

MIRROR = "http://mirror.lan/models/qwen"
BUDGET_FLAGS = ("max-model-len", "max-num-seqs", "max-num-batched-tokens", "gpu-memory-utilization")


def endpoint(**args: object) -> Endpoint:
    return resolve("spark-01", SparkConfig(vllm_args=args, model_source=MIRROR))


def number_findings(**args: object) -> list[Finding]:
    return [f for f in check(endpoint(**args)) if f.rule in ("flag.number", "flag.range")]


# --- one list -----------------------------------------------------------------------------------------


def test_every_numeric_flag_is_a_vllm_flag_and_the_old_lists_are_gone() -> None:
    names = flag_set().names
    assert set(NUMBERS) <= names
    assert not hasattr(vllm_flags, "INTEGER_FLAGS") and not hasattr(vllm_flags, "FLOAT_FLAGS")
    assert not hasattr(vllm_flags, "is_number")


def test_every_numeric_flag_the_recipes_use_is_in_the_list() -> None:
    from sparkfleet.recipes import load_recipes

    for recipe in load_recipes().values():
        for name, value in recipe.args.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                assert name in NUMBERS, f"{recipe.name}: --{name} is numeric but not range-checked"


@pytest.mark.parametrize("name", sorted(NUMBERS))
def test_each_flag_is_checked_at_its_bounds(name: str) -> None:
    spec = NUMBERS[name]
    if spec.low is None:
        assert number_findings(**{name: 7}) == []
        return
    inside = spec.high if spec.high is not None else spec.low + 1 if spec.open_low else spec.low
    below = spec.low if spec.open_low else spec.low - 1
    value = float if spec.kind == "float" else int
    assert number_findings(**{name: value(inside)}) == []
    (finding,) = number_findings(**{name: value(below)})
    assert (finding.rule, finding.severity, finding.field) == ("flag.range", "error", f"vllm_args.{name}")
    assert f"--{name}" in finding.message and "give e.g." in finding.message
    if spec.high is not None:
        (over,) = number_findings(**{name: value(spec.high + 1)})
        assert over.rule == "flag.range"


def test_negative_max_num_seqs_is_refused_before_anything_runs() -> None:
    """Issue 10: `max-num-seqs: -1` passed validation, was deployed, and the engine crashed."""
    with pytest.raises(FleetError) as error:
        load_fleet({"spark-07": {"model_source": MIRROR, "vllm_args": {"max-num-seqs": -1}}})
    message = str(error.value)
    assert message.startswith("bad inventory, nothing was changed on any host:")
    assert ("spark-07: `vllm_args.max-num-seqs`: vLLM requires --max-num-seqs >= 1, not -1: the engine would "
            "exit at start-up with a ValueError; give e.g. 4 (the recipe's) [flag.range]") in message


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("gpu-memory-utilization", 0, "0 is outside (0, 1], the range vLLM accepts for --gpu-memory-utilization"),
    ("gpu-memory-utilization", 1.5, "1.5 is outside (0, 1]"),
    ("max-model-len", 0, "vLLM requires --max-model-len >= 1, not 0"),
    ("max-num-batched-tokens", "0k", "vLLM requires --max-num-batched-tokens >= 1, not 0"),
    ("tensor-parallel-size", 0, "vLLM requires --tensor-parallel-size >= 1, not 0"),
    ("block-size", 0, "vLLM requires --block-size > 0, not 0"),
    ("cpu-offload-gb", -1, "vLLM requires --cpu-offload-gb >= 0, not -1"),
    ("shutdown-timeout", -5, "vLLM requires --shutdown-timeout >= 0, not -5"),
    ("data-parallel-rpc-port", 70000, "70000 is outside [1, 65535]"),
])
def test_out_of_range_messages(name: str, value: object, expected: str) -> None:
    (finding,) = number_findings(**{name: value})
    assert finding.rule == "flag.range" and expected in finding.message


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("max-num-batched-tokens", "1.5K", "'1.5K' puts a decimal before the binary suffix K, which vLLM refuses "
                                       "(write 1.5k or 1536)"),
    ("max-model-len", "1.5K", "'1.5K' puts a decimal before the binary suffix K"),
    ("max-num-seqs", 8.0, "8.0 is not a whole number; vLLM reads --max-num-seqs as an integer >= 1"),
    ("max-num-seqs", "8k", "'8k' is not a number; vLLM reads --max-num-seqs as an integer >= 1"),
    ("max-num-seqs", True, "True is not a number"),
    ("gpu-memory-utilization", "lots", "'lots' is not a number; vLLM reads --gpu-memory-utilization as a number "
                                       "in (0, 1]"),
    ("gpu-memory-utilization", "nan", "'nan' is not a finite number"),
    ("max-model-len", "auto", "'auto' lets vLLM pick the longest context that fits, which sparkfleet cannot "
                              "budget memory for: give the context length, e.g. 262144 (the recipe's)"),
    ("max-model-len", -1, "-1 lets vLLM pick the longest context that fits"),
])
def test_values_vllm_cannot_parse(name: str, value: object, expected: str) -> None:
    (finding,) = number_findings(**{name: value})
    assert (finding.rule, finding.field) == ("flag.number", f"vllm_args.{name}")
    assert expected in finding.message


@pytest.mark.parametrize(("name", "value", "number"), [
    ("max-num-seqs", "8", 8), ("max-num-seqs", " 8 ", 8), ("gpu-memory-utilization", "0.7", 0.7),
    ("gpu-memory-utilization", 1, 1.0), ("max-model-len", "128k", 128_000), ("max-model-len", "128K", 131_072),
    ("max-num-batched-tokens", "25.6k", 25_600), ("seed", -3, -3), ("max-logprobs", -1, -1),
])
def test_values_vllm_reads(name: str, value: object, number: float) -> None:
    """What vLLM's argparse accepts from argv (`to_argv` renders str(value)) passes, with the same number."""
    assert read_number(name, value) == number
    assert number_findings(**{name: value}) == []


@pytest.mark.parametrize("args", [
    {"max-num-batched-tokens": "1.5K"}, {"max-model-len": "1.5K"}, {"max-num-seqs": -1}, {"max-num-seqs": 0},
    {"max-num-seqs": 8.0}, {"gpu-memory-utilization": 0}, {"gpu-memory-utilization": "0.7"},
    {"max-model-len": "128K"}, {"max-num-seqs": "6"}, {"max-num-batched-tokens": "16k"}, {"max-model-len": "auto"},
])
def test_the_budget_and_the_flag_rules_read_numbers_alike(args: dict) -> None:
    """A value the memory rule cannot read is always one a flag rule reports, and the other way round
    (REVIEW: "1.5K" passed the number check, then the memory rule skipped it)."""
    spark = endpoint(**args)
    reported = any(f.rule in ("flag.number", "flag.range") and f.field.removeprefix("vllm_args.") in BUDGET_FLAGS
                   for f in check(spark))
    try:
        budget(spark)
    except ValueError:
        readable = False
    else:
        readable = True
    assert readable is not reported


def test_parse_number_rejects_what_argparse_would() -> None:
    with pytest.raises(ValueError, match="is not a whole number"):
        parse_number("tensor-parallel-size", 1.0)
    with pytest.raises(ValueError, match="is not a number"):
        parse_number("seed", {"a": 1})


# --- numbers checked against each other and against the model ------------------------------------------


def test_batched_tokens_below_max_num_seqs_is_refused() -> None:
    (finding,) = [f for f in check(endpoint(**{"max-num-seqs": 9000, "max-num-batched-tokens": 8192}))
                  if f.rule == "flag.batched-tokens"]
    assert finding.field == "vllm_args.max-num-batched-tokens"
    assert finding.message == ("vLLM requires max-num-batched-tokens (8192) >= max-num-seqs (9000) and would exit "
                               "at start-up: raise max-num-batched-tokens to at least 9000 or lower max-num-seqs")


def test_without_chunked_prefill_batched_tokens_must_cover_the_context() -> None:
    (finding,) = [f for f in check(endpoint(**{"enable-chunked-prefill": False})) if f.rule == "flag.batched-tokens"]
    assert "without chunked prefill vLLM requires max-num-batched-tokens (8192) >= max-model-len (262144)" \
        in finding.message
    assert [f for f in check(endpoint(**{"enable-chunked-prefill": False, "max-model-len": 8192}))
            if f.rule == "flag.batched-tokens"] == []


def test_context_beyond_the_models_is_refused_unless_rope_scaling_extends_it() -> None:
    (finding,) = [f for f in check(endpoint(**{"max-model-len": "1M"})) if f.rule == "flag.context"]
    assert finding.message.startswith("1048576 is longer than nvidia/Qwen3.6-35B-A3B-NVFP4's native context "
                                      "(262144): vLLM refuses it")
    scaled = endpoint(**{"max-model-len": "1M", "hf-overrides": '{"rope_scaling": {"factor": 4}}'})
    assert [f for f in check(scaled) if f.rule == "flag.context"] == []


# --- memory findings ---------------------------------------------------------------------------------------


def test_default_batched_tokens_is_vllm_028s() -> None:
    found = budget(endpoint(**{"max-num-batched-tokens": None}))
    assert found.max_num_batched_tokens == 16384
    assert found.overhead == OVERHEAD_BYTES + ACTIVATION_BYTES_PER_BATCHED_TOKEN * 16384 == 7 * GiB


def _memory(**args: object) -> Finding:
    (finding,) = [f for f in check(endpoint(**args)) if f.rule == "capacity.memory"]
    return finding


def test_a_kv_cache_overflow_is_named_with_the_sequences_that_fit() -> None:
    """Issue 10: max-num-seqs 4096 was reported as "the weights and overhead alone do not fit"."""
    finding = _memory(**{"max-num-seqs": 4096})
    most = budget(endpoint(**{"max-num-seqs": 4096})).max_num_seqs_that_fit()
    assert finding.field == "vllm_args.max-num-seqs"
    assert "weights and overhead alone" not in finding.message
    assert "the KV cache of 4096 sequences (43980.5 GB) and their DeltaNet state (262.0 GB) overflow" \
        in finding.message
    assert finding.message.startswith(f"at max-model-len 262144 only {most} sequences fit in 0.7 x 128 GB")
    assert f"lower max-num-seqs to {most} (budget" in finding.message
    assert [f for f in check(endpoint(**{"max-num-seqs": most})) if f.rule == "capacity.memory"] == []


def test_a_kv_cache_overflow_names_the_context_that_fits_too() -> None:
    finding = _memory(**{"max-num-seqs": 16})
    spark = endpoint(**{"max-num-seqs": 16})
    most, longest = budget(spark).max_num_seqs_that_fit(), budget(spark).max_model_len_that_fits() // 1024 * 1024
    assert "the KV cache of 16 sequences" in finding.message
    assert f"lower max-num-seqs to {most} or max-model-len to {longest}" in finding.message
    assert [f for f in check(endpoint(**{"max-num-seqs": 16, "max-model-len": longest}))
            if f.rule == "capacity.memory"] == []


def test_batched_token_activations_are_named_when_they_overflow() -> None:
    finding = _memory(**{"max-num-batched-tokens": 600_000, "max-num-seqs": 1})
    assert finding.field == "vllm_args.max-num-batched-tokens"
    assert finding.message.startswith("the activations of max-num-batched-tokens 600000 (78.6 GB in vLLM's profile "
                                      "run) leave no room for the KV cache in 0.7 x 128 GB: lower "
                                      "max-num-batched-tokens to ")
    fits = int(finding.message.split("lower max-num-batched-tokens to ")[1].split()[0])
    assert [f for f in check(endpoint(**{"max-num-batched-tokens": fits, "max-num-seqs": 1}))
            if f.rule == "capacity.memory"] == []


def test_weights_that_do_not_fit_point_at_gpu_memory_utilization() -> None:
    finding = _memory(**{"gpu-memory-utilization": 0.2})
    assert finding.field == "vllm_args.gpu-memory-utilization"
    assert finding.message.startswith("the weights and overhead alone (28.9 GB) do not fit in 0.2 x 128 GB: raise "
                                      "gpu-memory-utilization or use a smaller checkpoint")


def test_one_sequence_too_long_points_at_max_model_len() -> None:
    finding = _memory(**{"max-num-seqs": 1, "max-model-len": 262144, "gpu-memory-utilization": 0.3})
    assert finding.field == "vllm_args.max-model-len"
    assert finding.message.startswith("not even one sequence of max-model-len 262144 fits in 0.3 x 128 GB: lower "
                                      "max-model-len to ")
    assert "the KV cache and DeltaNet state of one sequence need" in finding.message


def test_the_host_memory_rule_keeps_the_field_of_the_term() -> None:
    """The preflight re-runs the rule on MemTotal; its finding names the same field."""
    spark = endpoint(**{"max-num-seqs": 4096})
    (finding,) = rules.memory_budget_for(128 * 10**9)(spark, flag_set())
    assert finding.field == "vllm_args.max-num-seqs"


# --- the doctor's table --------------------------------------------------------------------------------


def _report(monkeypatch: pytest.MonkeyPatch) -> list[doctor.HostReport]:
    offline_sources(monkeypatch)
    data = {"model_source": MIRROR, "vllm_args": {"max-num-seqs": 4096, "gpu-memory-utilization": 0.88,
                                                  "tool-call-parser": "qwen"}}
    spark, rows = doctor.recipe_rows("spark-01", data)
    _, bad = doctor.recipe_rows("spark-02", {"vllm_port": 0, "vllm_recipie": "x"})
    unreachable = doctor.Row("host.unreachable", "error", "ssh_hostname", "cannot connect over SSH")
    return [doctor.HostReport("spark-01", rows, spark), doctor.HostReport("spark-02", bad),
            doctor.HostReport("spark-03", [unreachable], spark)]


def test_inventory_rows_name_their_variable() -> None:
    _, rows = doctor.recipe_rows("spark-02", {"vllm_port": 0, "vllm_recipie": "x"})
    assert [(r.rule, r.field) for r in rows] == [("inventory", "vllm_port"), ("inventory", "vllm_recipie")]


def test_doctor_table_shows_the_field_of_every_row_within_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    console = Console(record=True, width=80)
    reports = _report(monkeypatch)
    doctor.render(reports, console, explain_budget=False)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "field / rule" in text
    for report in reports:
        for row in report.rows:
            assert row.field and row.field in text, row
            assert row.rule in text
    assert "vllm_args.gpu-memory-utilization" in text and "capacity.gmu-high" in text
    assert "vllm_port" in text and "ssh_hostname" in text


def test_doctor_ok_rows_name_what_they_judge() -> None:
    from tests.unit.test_preflight import facts

    rows = doctor.host_rows(endpoint(), facts())
    assert {r.rule: r.field for r in rows} == doctor.HOST_FIELDS


def test_doctor_json_keeps_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    data = json.loads(json.dumps([report.as_dict(False) for report in _report(monkeypatch)]))
    assert {"rule", "status", "field", "message"} == set(data[0]["rows"][0])
    assert data[1]["rows"][0]["field"] == "vllm_port"
