"""Every recipe rule: what vLLM would reject or what would crash a Spark is caught, with a fix named."""

import pytest

from sparkfleet.config import SparkConfig
from sparkfleet.endpoint import Endpoint, resolve
from sparkfleet.memory import budget
from sparkfleet.recipes import load_recipes
from sparkfleet.rules import Finding, check, memory_budget_for
from sparkfleet.vllm_flags import flag_set

NVFP4 = "qwen3.6-35b-a3b-nvfp4"
FP8 = "qwen3.6-35b-a3b-fp8"
MIRROR = "http://mirror.lan/models/qwen"


def endpoint(recipe: str = NVFP4, image: str | None = None, **args: object) -> Endpoint:
    config = SparkConfig(vllm_recipe=recipe, vllm_image=image, vllm_args=args, model_source=MIRROR)
    return resolve("spark-01", config)


def found(rule: str, recipe: str = NVFP4, image: str | None = None, **args: object) -> list[Finding]:
    """The findings of one rule id for a recipe with `args` overriding its flags."""
    return [finding for finding in check(endpoint(recipe, image, **args)) if finding.rule == rule]


def only(rule: str, recipe: str = NVFP4, image: str | None = None, **args: object) -> Finding:
    (finding,) = found(rule, recipe, image, **args)
    return finding


@pytest.mark.parametrize("recipe", sorted(load_recipes()))
def test_shipped_recipes_are_clean(recipe: str) -> None:
    findings = check(endpoint(recipe))
    if recipe == FP8:  # no public source shows it serving on a GB10 with a given image: canary it first
        assert [(f.rule, f.severity) for f in findings] == [("platform.image-unvalidated", "warning")]
    else:
        assert findings == []


def test_removed_flag_names_its_replacement() -> None:
    finding = only("flag.removed", disable_log_requests=True)
    assert (finding.severity, finding.field) == ("error", "vllm_args.disable-log-requests")
    assert "enable-log-requests" in finding.message


def test_unknown_flag_suggests_the_close_one() -> None:
    finding = only("flag.unknown", **{"max-num-seq": 8})
    assert finding.severity == "error"
    assert "did you mean max-num-seqs" in finding.message
    assert "unrecognized arguments" in finding.message


def test_owned_flag_points_to_the_inventory_variable() -> None:
    finding = only("flag.owned", port=9000)
    assert finding.field == "vllm_args.port"
    assert "vllm_port" in finding.message


@pytest.mark.parametrize(("recipe", "flag", "value", "hint"), [
    (NVFP4, "tool-call-parser", "qwen", "qwen3_xml"),
    (FP8, "quantization", "a3b_fp8", "fp8"),
    (NVFP4, "attention-backend", "flash_infer", "FLASHINFER"),
])
def test_invalid_choice_is_an_error_with_a_hint(recipe: str, flag: str, value: str, hint: str) -> None:
    finding = only("flag.choice", recipe, **{flag: value})
    assert (finding.severity, finding.field) == ("error", f"vllm_args.{flag}")
    assert repr(value) in finding.message
    assert hint in finding.message


@pytest.mark.parametrize("value", ["flashinfer", "FlashInfer", "FLASHINFER", "triton_attn"])
def test_attention_backend_is_case_insensitive(value: str) -> None:
    assert found("flag.choice", **{"attention-backend": value}) == []


def test_non_number_context_is_an_error_and_the_budget_skips_it() -> None:
    findings = check(endpoint(**{"max-model-len": "lots"}))
    assert [(f.rule, f.field) for f in findings] == [("flag.number", "vllm_args.max-model-len")]


def test_size_string_context_is_a_number() -> None:
    assert found("flag.number", **{"max-model-len": "128k"}) == []


def test_speculative_config_must_be_json() -> None:
    finding = only("flag.json", **{"speculative-config": '{"method": "mtp",'})
    assert (finding.severity, finding.field) == ("error", "vllm_args.speculative-config")


def test_auto_tool_choice_needs_a_parser() -> None:
    finding = only("flag.tool-choice-parser", **{"tool-call-parser": None})
    assert "qwen3_xml" in finding.message


def test_prequantized_checkpoint_refuses_quantization() -> None:
    finding = only("flag.prequantized", quantization="modelopt_fp4")
    assert "leave --quantization unset" in finding.message
    assert found("flag.prequantized", FP8) == []  # fp8 is stored as fp8 and names its method


def test_enforce_eager_makes_compilation_config_moot() -> None:
    finding = only("flag.exclusive", **{"enforce-eager": True, "compilation-config": '{"level": 3}'})
    assert finding.severity == "warning"


@pytest.mark.parametrize(("tp", "expected"), [(2, ["error"]), (1, [])])
def test_one_gpu_per_spark(tp: int, expected: list[str]) -> None:
    severities = [f.severity for f in found("capacity.parallel", **{"tensor-parallel-size": tp})]
    assert severities == expected


def test_memory_utilization_above_one_is_out_of_range() -> None:
    # The range is one of vllm_flags.NUMBERS now (rule flag.range, formerly capacity.gmu-range).
    finding = only("flag.range", **{"gpu-memory-utilization": 1.2})
    assert finding.severity == "error"
    assert "outside (0, 1]" in finding.message
    assert found("capacity.gmu-high", **{"gpu-memory-utilization": 1.2}) == []  # one finding, not two


@pytest.mark.parametrize(("gmu", "expected"), [
    (0.85, []), (0.86, ["warning"]), (0.90, ["warning"]), (0.91, ["error"]),
])
def test_memory_utilization_boundaries(gmu: float, expected: list[str]) -> None:
    severities = [f.severity for f in found("capacity.gmu-high", **{"gpu-memory-utilization": gmu})]
    assert severities == expected


@pytest.mark.parametrize(("image", "expected"), [
    ("vllm/vllm-openai:latest", ["warning"]),
    ("vllm/vllm-openai:cu130-nightly", ["warning"]),
    ("vllm/vllm-openai", ["warning"]),
    ("vllm/vllm-openai:v0.28.0", []),
    ("vllm/vllm-openai@sha256:" + "0" * 64, []),
])
def test_floating_tags_are_flagged(image: str, expected: list[str]) -> None:
    assert [f.severity for f in found("platform.floating-tag", image=image)] == expected


def test_fp8_on_an_image_not_validated_on_gb10_warns_whatever_its_name() -> None:
    for image in ("vllm/vllm-openai:v0.28.0", "vllm/vllm-openai:v0.29.0-cu130"):
        finding = only("platform.image-unvalidated", FP8, image=image)
        assert (finding.severity, finding.field) == ("warning", "vllm_image")
        assert "sm_121" in finding.message and "vllm_validated_images" in finding.message


def test_an_image_the_operator_validated_is_accepted_by_tag_or_digest() -> None:
    digest = "vllm/vllm-openai@sha256:" + "a" * 64
    pinned = "vllm/vllm-openai:v0.28.0@sha256:" + "a" * 64
    for image, validated in ((digest, [digest]), (pinned, [digest]), (pinned, ["vllm/vllm-openai:v0.28.0"])):
        spark = resolve("spark-01", SparkConfig(vllm_recipe=FP8, vllm_image=image, vllm_validated_images=validated))
        assert [f for f in check(spark) if f.rule.startswith("platform.image")] == []
    # The recipe's own list: NVIDIA's playbook tag for the NVFP4 recipe.
    assert found("platform.image-unvalidated") == []
    assert only("platform.image-unvalidated", image="vllm/vllm-openai:v0.29.0").severity == "warning"


@pytest.mark.parametrize("image", ["vllm/vllm-openai:cu130-nightly", "vllm/vllm-openai:v0.28.0-cu130"])
def test_a_known_bad_image_is_an_error_with_its_source(image: str) -> None:
    finding = only("platform.image-known-bad", FP8, image=image)
    assert (finding.severity, finding.field) == ("error", "vllm_image")
    assert "vllm #42738" in finding.message
    assert found("platform.image-unvalidated", FP8, image=image) == []


def test_memory_at_the_limit_passes_and_one_more_sequence_fails() -> None:
    most = budget(endpoint()).max_num_seqs_that_fit()
    assert found("capacity.memory", **{"max-num-seqs": most}) == []
    over = only("capacity.memory", **{"max-num-seqs": most + 1})
    assert (over.severity, over.field) == ("error", "vllm_args.max-num-seqs")
    longest = budget(endpoint(**{"max-num-seqs": most + 1})).max_model_len_that_fits() // 1024 * 1024
    assert f"at max-model-len 262144 only {most} sequences fit in 0.7 x 128 GB" in over.message
    assert f"lower max-num-seqs to {most} or max-model-len to {longest}" in over.message


def test_memory_fix_it_names_really_fits() -> None:
    over = budget(endpoint(**{"max-num-seqs": 16}))
    longest = over.max_model_len_that_fits() // 1024 * 1024
    assert found("capacity.memory", **{"max-num-seqs": 16, "max-model-len": longest}) == []


def test_memory_when_not_one_sequence_fits() -> None:
    message = only("capacity.memory", **{"max-model-len": 2_000_000, "max-num-seqs": 1}).message
    # Suggestions stop at the model's native context, the longest vLLM accepts (flag.context).
    longest = min(budget(endpoint(**{"max-num-seqs": 1})).max_model_len_that_fits() // 1024 * 1024, 262144)
    assert message.startswith(f"not even one sequence of max-model-len 2000000 fits in 0.7 x 128 GB: "
                              f"lower max-model-len to {longest} (budget ")


def test_memory_when_weights_alone_do_not_fit() -> None:
    message = only("capacity.memory", **{"gpu-memory-utilization": 0.2}).message
    assert "weights and overhead alone" in message
    assert "raise gpu-memory-utilization" in message


def test_memory_rule_for_a_host_uses_its_memory() -> None:
    """The preflight re-runs the rule with MemTotal: the same recipe is tight on a smaller host."""
    total = budget(endpoint()).total
    tight = memory_budget_for(int(total / 0.7 / 0.97))  # 3 % headroom
    roomy = memory_budget_for(int(total / 0.7 / 0.90))
    flags = flag_set()
    (finding,) = tight(endpoint(), flags)
    assert (finding.rule, finding.severity) == ("capacity.memory-tight", "warning")
    assert "lower max-num-seqs to 3" in finding.message
    assert list(roomy(endpoint(), flags)) == []
    over = memory_budget_for(int(total / 0.7) - 10**6)
    assert [f.rule for f in over(endpoint(), flags)] == ["capacity.memory"]


def test_the_default_hub_source_passes_the_rules() -> None:
    """The Hub is asked when the fleet's generations are resolved (fleet.resolve_weights), not by a rule."""
    spark = resolve("spark-01", SparkConfig())
    assert spark.source.kind == "hub"
    assert [f for f in check(spark) if f.field == "model_source"] == []
    pinned = resolve("spark-01", SparkConfig(model_source="hf://org/other-model@0123456789abcdef"))
    assert [f for f in check(pinned) if f.field == "model_source"] == []
