"""Inventory validation: every bad value gets one sentence naming host, variable and fix."""

from __future__ import annotations

import pytest

from sparkfleet.config import ModelSource, SparkConfig
from sparkfleet.endpoint import resolve
from sparkfleet.fleet import FleetError, load_fleet
from tests.unit.resolved import resolved

GOOD = {"model_source": "http://mirror.lan/models/qwen", "ssh_user": "admin", "_sudo": True}


def _errors(**data: object) -> str:
    with pytest.raises(FleetError) as error:
        load_fleet({"spark-07": GOOD | data})
    return str(error.value)


def test_good_inventory_loads_with_recipe_flags() -> None:
    endpoints, warnings = load_fleet({"spark-07": GOOD})
    spark = endpoints["spark-07"]
    assert spark.args["tool-call-parser"] == "qwen3_xml"
    assert spark.model_root == "/var/lib/sparkfleet/models/nvidia--Qwen3.6-35B-A3B-NVFP4"
    assert warnings == []


def test_weights_dir_is_the_resolved_generation_beneath_the_model_root() -> None:
    endpoints, _ = load_fleet({"spark-07": GOOD})
    with pytest.raises(RuntimeError, match="spark-07: the model source was not resolved"):
        _ = endpoints["spark-07"].weights_dir
    spark = resolved(endpoints["spark-07"])
    assert spark.weights is not None and spark.weights.id.startswith("sha256-")
    assert spark.weights_dir == f"/var/lib/sparkfleet/models/nvidia--Qwen3.6-35B-A3B-NVFP4/{spark.weights.id}"


def test_overrides_normalise_names_and_null_removes() -> None:
    endpoints, _ = load_fleet({"s": GOOD | {"vllm_args": {"max_num_seqs": 2, "--enable-prefix-caching": None}}})
    assert endpoints["s"].args["max-num-seqs"] == 2
    assert "enable-prefix-caching" not in endpoints["s"].args


@pytest.mark.parametrize(("data", "expected"), [
    ({"vllm_recipie": "x"}, "spark-07: `vllm_recipie` is not a sparkfleet variable. Did you mean `vllm_recipe`?"),
    ({"vllm_recipe": "qwen3.6-35b-a3b-nvfp5"}, "Did you mean `qwen3.6-35b-a3b-nvfp4`?"),
    ({"model_dir": "models"}, "spark-07: `model_dir` = 'models': 'models' is relative"),
    ({"vllm_port": 70000}, "`vllm_port` = 70000"),
    ({"vllm_api_key": "sk-abc"}, "secrets are never written into inventory"),
    ({"vllm_args": {"tool-call-parser": "qwen"}}, "for Qwen3.6 use qwen3_xml or qwen3_coder"),
    ({"vllm_args": {"disable-log-requests": True}}, "request logging is off by default"),
    ({"vllm_args": {"quantization": "a3b_fp8"}}, "'a3b_fp8' is not a valid --quantization"),
    ({"vllm_args": {"tensor-parallel-size": 2}}, "a DGX Spark has 1 GPU"),
    ({"vllm_args": {"gpu-memory-utilization": 1.2}}, "outside (0, 1]"),
    ({"vllm_args": {"max-model-len": "lots"}}, "'lots' is not a number"),
    ({"vllm_args": {"port": 9000}}, "use vllm_port"),
    ({"model_source": "s3://bucket/x"}, "is not a model source"),
])
def test_bad_value_names_host_field_and_fix(data: dict, expected: str) -> None:
    message = _errors(**data)
    assert message.startswith("bad inventory, nothing was changed on any host:")
    assert expected in message


def test_every_bad_host_is_reported_at_once() -> None:
    with pytest.raises(FleetError) as error:
        load_fleet({"a": GOOD | {"vllm_port": 0}, "b": GOOD, "c": GOOD | {"model_dir": "x"}})
    assert "a: `vllm_port`" in str(error.value) and "c: `model_dir`" in str(error.value)
    assert "b:" not in str(error.value)


def test_secret_from_missing_env_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARKFLEET_TEST_KEY", raising=False)
    assert "SPARKFLEET_TEST_KEY, which is not set" in _errors(vllm_api_key="env:SPARKFLEET_TEST_KEY")


def test_secret_with_whitespace_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKFLEET_TEST_KEY", " key")
    assert "whitespace" in _errors(vllm_api_key="env:SPARKFLEET_TEST_KEY")


# --- model_source: parsed once into a typed value ---------------------------------------------------------


@pytest.mark.parametrize(("text", "parsed"), [
    ("http://mirror.lan/models/qwen/", ModelSource("mirror", url="http://mirror.lan/models/qwen/")),
    ("https://mirror.lan:8443/m", ModelSource("mirror", url="https://mirror.lan:8443/m")),
    ("/srv/models/qwen", ModelSource("controller", path="/srv/models/qwen")),
    ("hf://nvidia/Qwen3.6-35B-A3B-NVFP4@main", ModelSource("hub", repo="nvidia/Qwen3.6-35B-A3B-NVFP4",
                                                          revision="main")),
    ("hf://gpt2@0123abcd", ModelSource("hub", repo="gpt2", revision="0123abcd")),
])
def test_every_form_of_model_source_parses(text: str, parsed: ModelSource) -> None:
    assert ModelSource.parse(text) == parsed
    assert str(parsed) == text
    assert SparkConfig(model_source=text).model_source == parsed


def test_a_mirror_names_its_sums_file() -> None:
    assert ModelSource.parse("http://mirror.lan/m/").sums_url == "http://mirror.lan/m/SHA256SUMS"
    assert ModelSource.parse("http://mirror.lan/m").sums_url == "http://mirror.lan/m/SHA256SUMS"


def test_without_model_source_the_recipes_model_comes_from_the_hub() -> None:
    spark = resolve("spark-07", SparkConfig())
    assert spark.source == ModelSource("hub", repo=spark.recipe.model.id, revision=spark.recipe.model.revision)
    assert str(spark.source) == f"hf://{spark.model_revision}"


@pytest.mark.parametrize(("value", "expected"), [
    ("s3://bucket/x", "'s3://bucket/x' is not a model source; use hf://org/name@revision, an http(s) mirror URL "
                      "or an absolute directory on the controller"),
    ("models/qwen", "'models/qwen' is not a model source"),
    ("~/models/qwen", "'~/models/qwen' is not a model source"),
    ("hf://nvidia/Qwen3.6", "'hf://nvidia/Qwen3.6' does not name a Hub repository and revision; give "
                            "hf://org/name@revision"),
    ("hf://a/b/c@main", "does not name a Hub repository and revision"),
    ("hf://nvidia/Qwen3.6@", "does not name a Hub repository and revision"),
    ("http://", "not an http(s) URL with a host"),
    ("http://mirror.lan/my models", "' ' cannot stand in a URL as written; percent-encode it"),
    (42, "give the source as a string"),
    ({"kind": "hub"}, "give the source as a string"),
])
def test_bad_model_source_is_refused_with_the_forms_it_may_take(value: object, expected: str) -> None:
    message = _errors(model_source=value)
    assert message.startswith("bad inventory, nothing was changed on any host:")
    assert f"spark-07: `model_source` = {value!r}: " in message and expected in message
