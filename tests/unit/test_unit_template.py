"""The rendered vLLM unit: systemd's word splitting gives back exactly the recipe's argv."""

from __future__ import annotations

import shlex

import jinja2
import pytest

from sparkfleet.config import SparkConfig
from sparkfleet.deploys.context import TEMPLATES
from sparkfleet.deploys.service import env_file
from sparkfleet.endpoint import resolve
from sparkfleet.fleet import load_inventory
from sparkfleet.unit import UnitView, systemd_quote
from sparkfleet.vllm_flags import flag_set, to_argv
from tests.unit.resolved import resolved
from tests.unit.test_pairs import inventory

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


PAIR = {"name": "pair-a", "head": "pair-01", "interface": "enp1s0f0np0", "master_addr": "192.168.100.10",
        "ib_hca": ["rocep1s0f0", "roceP2p1s0f0"]}


def _pair_unit(host: str, **data: object) -> str:
    spark = resolved(load_inventory(inventory(**{h: data for h in ("pair-01", "pair-02")}), ()).sparks[host])
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.from_string(TEMPLATE.read_text()).render(spark=UnitView.of(spark))


def _flags(argv: list[str], image: str) -> list[str]:
    return argv[argv.index(image) + 2:]


def test_the_head_serves_with_the_multi_node_flags_of_rank_0() -> None:
    argv = _exec_start(_pair_unit("pair-01"))
    flags = _flags(argv, "vllm/vllm-openai:v0.28.0")
    assert flags[:4] == ["--host", "0.0.0.0", "--port", "8000"]
    assert flags[flags.index("--tensor-parallel-size") + 1] == "2"
    assert flags[-8:] == ["--nnodes", "2", "--node-rank", "0", "--master-addr", "192.168.100.10",
                          "--master-port", "29500"]
    assert "--headless" not in flags


def test_the_worker_runs_headless_at_rank_1_without_an_api() -> None:
    unit = _pair_unit("pair-02")
    flags = _flags(_exec_start(unit), "vllm/vllm-openai:v0.28.0")
    assert "--port" not in flags and "--host" not in flags
    assert flags[flags.index("--tensor-parallel-size") + 1] == "2"
    assert flags[-9:] == ["--nnodes", "2", "--node-rank", "1", "--master-addr", "192.168.100.10",
                          "--master-port", "29500", "--headless"]
    assert "worker of pair pair-a (serves no API)" in unit


def test_every_multi_node_flag_is_one_vllm_has() -> None:
    flags = flag_set()
    for host in ("pair-01", "pair-02"):
        for arg in _flags(_exec_start(_pair_unit(host)), "vllm/vllm-openai:v0.28.0"):
            assert not arg.startswith("--") or arg[2:] in flags.names, arg


def test_both_pin_sockets_to_the_fabric_interface() -> None:
    for host in ("pair-01", "pair-02"):
        argv = _exec_start(_pair_unit(host))
        env = [argv[i + 1] for i, word in enumerate(argv) if word == "--env"]
        assert env == ["HF_HUB_OFFLINE=1", "NCCL_SOCKET_IFNAME=enp1s0f0np0", "GLOO_SOCKET_IFNAME=enp1s0f0np0",
                       "TP_SOCKET_IFNAME=enp1s0f0np0", "NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0"]
    without = _exec_start(_pair_unit("pair-01", pair=PAIR | {"ib_hca": []}))
    assert not any(word.startswith("NCCL_IB_HCA") for word in without)


def test_the_worker_gets_no_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAIR_TEST_KEY", "k-123")
    monkeypatch.setenv("PAIR_TEST_HOOK", "http://hook.lan/x")
    keyed = {"vllm_api_key": "env:PAIR_TEST_KEY", "health_webhook_url": "env:PAIR_TEST_HOOK"}
    sparks = load_inventory(inventory(**{h: keyed for h in ("pair-01", "pair-02")}), ()).sparks
    assert "VLLM_API_KEY=k-123" in env_file(sparks["pair-01"])
    worker = env_file(sparks["pair-02"])
    assert "VLLM_API_KEY" not in worker and "SPARKFLEET_HEALTH_WEBHOOK=http://hook.lan/x" in worker
