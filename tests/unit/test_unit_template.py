"""The rendered vLLM unit: systemd's word splitting gives back exactly the recipe's argv."""

from __future__ import annotations

import shlex

import jinja2

from sparkfleet.config import SparkConfig
from sparkfleet.deploys.context import TEMPLATES
from sparkfleet.endpoint import resolve
from sparkfleet.unit import UnitView, systemd_quote
from sparkfleet.vllm_flags import flag_set, to_argv
from tests.unit.resolved import resolved

TEMPLATE = TEMPLATES / "vllm" / "sparkfleet-vllm.service.j2"  # found as the deploy finds it


def _render(**data: object) -> str:
    spark = resolved(resolve("spark-01", SparkConfig(**data)))
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.from_string(TEMPLATE.read_text()).render(spark=UnitView.of(spark))


def _exec_start(unit: str) -> list[str]:
    """ExecStart split as systemd does for these quoting forms (then %% and $$ unescaped)."""
    text = unit.split("ExecStart=", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ")
    return [word.replace("%%", "%").replace("$$", "$") for word in shlex.split(text)]


def test_exec_start_carries_recipe_flags_verbatim() -> None:
    spark = resolved(resolve("spark-01", SparkConfig()))
    argv = _exec_start(_render())
    expected = to_argv(spark.args, flag_set())
    image = argv.index(spark.image)
    assert argv[image + 1] == spark.container_model_path
    assert f"{spark.weights_dir}:{spark.container_model_path}:ro" in argv  # the generation, at a fixed path
    assert argv[-len(expected):] == expected
    assert '{"method":"mtp","num_speculative_tokens":3,"moe_backend":"triton"}' in argv


def test_secrets_never_in_unit() -> None:
    unit = _render(vllm_api_key="env:ANY")
    assert "--api-key" not in unit and "--env-file /etc/sparkfleet/vllm.env" in unit


def test_systemd_quote_escapes_specifiers_and_variables() -> None:
    assert systemd_quote("plain-word") == "plain-word"
    assert systemd_quote("50%") == '"50%%"'
    assert systemd_quote('{"a": "$HOME"}') == '"{\\"a\\": \\"$$HOME\\"}"'


def test_null_override_removes_flag_from_unit() -> None:
    unit = _render(vllm_args={"enable-prefix-caching": None, "max-num-seqs": 2})
    assert "--enable-prefix-caching" not in unit and "--max-num-seqs 2" in unit


def _setting(unit: str, key: str) -> str:
    return next(line.split("=", 1)[1] for line in unit.splitlines() if line.startswith(f"{key}="))


def test_start_limit_interval_fits_the_allowed_starts_of_a_slow_crash_loop() -> None:
    spark = resolved(resolve("spark-01", SparkConfig()))
    unit = _render()
    burst, interval = int(_setting(unit, "StartLimitBurst")), int(_setting(unit, "StartLimitIntervalSec"))
    restart = int(_setting(unit, "RestartSec"))
    # An engine that crashes just as its load window ends still hits the limit within the interval.
    assert burst * (spark.recipe.load_timeout_seconds + restart) <= interval
    assert burst == 4


def test_stop_outlasts_vllms_graceful_shutdown() -> None:
    unit = _render(vllm_args={"shutdown-timeout": 90})
    assert "--shutdown-timeout 90" in unit
    docker_stop = int(unit.split("docker stop --time ", 1)[1].split()[0])
    assert 90 < docker_stop < int(_setting(unit, "TimeoutStopSec"))
    plain = _render(vllm_args={"shutdown-timeout": None})
    assert "--shutdown-timeout" not in plain
    assert 0 < int(plain.split("docker stop --time ", 1)[1].split()[0]) < int(_setting(plain, "TimeoutStopSec"))


def test_page_cache_dropped_before_the_engine_starts() -> None:
    unit = _render()
    pre = [line for line in unit.splitlines() if line.startswith("ExecStartPre=")]
    assert any("drop_caches" in line and line.startswith("ExecStartPre=-") for line in pre)
    assert unit.index("drop_caches") < unit.index("ExecStart=")
