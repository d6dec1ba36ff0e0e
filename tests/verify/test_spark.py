"""What a converged Spark looks like: packages, runtime, weights, unit, secrets, health, and answers."""

from __future__ import annotations

import json
import shlex

import pytest

from sparkfleet.deploys.health import STATE_DIR
from sparkfleet.deploys.toolkit import PACKAGES
from sparkfleet.endpoint import CONTAINER, ENV_FILE, UNIT, UNIT_FILE
from sparkfleet.secrets import resolve
from sparkfleet.unit import UnitView
from tests.verify.conftest import Spark


def _running(spark: Spark) -> None:
    if not spark.endpoint.config.vllm_start:
        pytest.skip(f"{spark.name} is deployed with vllm_start=false: the endpoint is installed, not started")


def _serving(spark: Spark) -> None:
    _running(spark)
    if spark.endpoint.role == "worker":
        pytest.skip(f"{spark.name} is a pair's worker: headless, its head {spark.endpoint.config.pair.head} serves")


def _api(spark: Spark, path: str, body: dict | None = None) -> dict:
    """Call the endpoint from the Spark itself, the key read from the root-only env file (never argv)."""
    url = f"http://127.0.0.1:{spark.endpoint.config.vllm_port}{path}"
    script = (
        "import json,sys,urllib.request;"
        "env=dict(l.split('=',1) for l in open(sys.argv[1]).read().split('\\n') if '=' in l and l[0]!='#');"
        "data=sys.stdin.read().encode() or None;"
        "req=urllib.request.Request(sys.argv[2],data=data,headers={'Authorization':'Bearer '+env['VLLM_API_KEY'],"
        "'Content-Type':'application/json'});"
        "print(urllib.request.urlopen(req,timeout=60).read().decode())"
    )
    stdin = shlex.quote(json.dumps(body)) if body else "''"
    result = spark.host.run(f"printf %s {stdin} | python3 -c {shlex.quote(script)} {ENV_FILE} {shlex.quote(url)}")
    assert result.rc == 0, result.stderr
    return json.loads(result.stdout)


def test_toolkit_packages_pinned(spark: Spark) -> None:
    version = spark.endpoint.config.nvidia_toolkit_version
    for package in PACKAGES:
        assert spark.host.package(package).is_installed
        assert spark.host.package(package).version == version, package


def test_toolkit_held_at_its_version(spark: Spark) -> None:
    """An upgrade (unattended or by hand) keeps the pinned version, even when a newer one is in the lists."""
    version = spark.endpoint.config.nvidia_toolkit_version
    for package in PACKAGES:
        policy = spark.host.check_output(f"apt-cache policy {package}")
        assert f"Candidate: {version}" in policy, policy


def test_nvidia_runtime_registered(spark: Spark) -> None:
    runtimes = json.loads(spark.host.check_output("docker info --format '{{json .Runtimes}}'"))
    assert "nvidia" in runtimes
    daemon = json.loads(spark.host.file("/etc/docker/daemon.json").content_string)
    # By name or by full path, the entry runs NVIDIA's runtime binary with no extra args.
    resolve = "readlink -f \"$(command -v {})\""
    assert spark.host.check_output(resolve.format(shlex.quote(daemon["runtimes"]["nvidia"]["path"]))) == (
        spark.host.check_output(resolve.format("nvidia-container-runtime")))
    assert daemon["runtimes"]["nvidia"].get("args", []) == []


def test_foreign_daemon_json_keys_kept(spark: Spark) -> None:
    if "lab_container" not in spark.data:
        pytest.skip("foreign keys are known only for lab hosts (their image ships a registry mirror)")
    daemon = json.loads(spark.host.file("/etc/docker/daemon.json").content_string)
    assert daemon["registry-mirrors"] == ["http://registry.lab:5000"]
    assert daemon["insecure-registries"] == ["registry.lab:5000"]


def test_weights_are_the_sources_generation(spark: Spark) -> None:
    """Every file re-hashed against the SHA256SUMS the source gives now (the Hub's metadata, a mirror's list or the
    controller directory), in the directory named by that generation, which the unit mounts."""
    generation = spark.endpoint.weights
    assert generation is not None
    weights = spark.endpoint.weights_dir
    assert weights.endswith(f"/{generation.id}")
    sums = spark.host.file(f"/var/lib/sparkfleet/weights/{spark.endpoint.model_slug}/{generation.id}.SHA256SUMS")
    assert sums.content_string == generation.sums
    check = spark.host.run(f"python3 /usr/local/lib/sparkfleet/stage_weights.py check --dest {weights} --full "
                           f"--sums-file {sums.path}")
    assert check.rc == 0, check.stderr
    verdict = json.loads(check.stdout)
    assert verdict["state"] == "ok" and verdict["files"] == len(generation.sums.splitlines()), check.stdout
    assert f"--volume {weights}:" in spark.host.file(UNIT_FILE).content_string


def test_unit_rendered_from_recipe(spark: Spark) -> None:
    unit = spark.host.file(UNIT_FILE)
    assert unit.exists and unit.mode == 0o644
    text = unit.content_string
    view = UnitView.of(spark.endpoint)
    assert view.image in text
    port = f"--port {spark.endpoint.config.vllm_port}"
    if spark.endpoint.role == "worker":
        assert port not in text and "--headless" in text and "--node-rank 1" in text
    else:
        assert port in text
    for arg in view.vllm_args:
        assert arg in text
    for option in ("--runtime nvidia", "--gpus all", "--ipc host", "--ulimit memlock=-1",
                   "--ulimit stack=67108864", ":ro", "HF_HUB_OFFLINE=1", "--pull never"):
        assert option in text
    assert "StartLimitBurst=" in text and "Restart=on-failure" in text


def test_secrets_only_in_root_env_file(spark: Spark) -> None:
    env = spark.host.file(ENV_FILE)
    assert env.user == "root" and env.group == "root" and env.mode == 0o600
    key = resolve(spark.endpoint.config.vllm_api_key)
    # A pair's worker serves no API: the key is only where it is needed.
    assert (f"VLLM_API_KEY={key}" in env.content_string) == (spark.endpoint.role != "worker")
    assert key not in spark.host.file(UNIT_FILE).content_string
    assert key not in spark.host.check_output("ps -eo args")
    assert key not in spark.host.check_output("cat /etc/systemd/system/sparkfleet-health.* /etc/sparkfleet/health.json")


def test_unit_active_and_enabled(spark: Spark) -> None:
    _running(spark)
    service = spark.host.service(f"{UNIT}.service")
    assert service.is_running and service.is_enabled


def test_container_runs_recipe_flags(spark: Spark) -> None:
    _running(spark)
    args = json.loads(spark.host.check_output(f"docker inspect -f '{{{{json .Args}}}}' {CONTAINER}"))
    for name, value in spark.endpoint.args.items():
        assert f"--{name}" in args or (value is False and f"--no-{name}" in args), name
    assert args[args.index(spark.endpoint.container_model_path) - 1] == "serve"  # `vllm serve MODEL`


def test_health_timer_active_with_passing_run(spark: Spark) -> None:
    _running(spark)
    assert spark.host.service("sparkfleet-health.timer").is_running
    result = spark.host.check_output("systemctl show sparkfleet-health.service -p Result --value")
    assert result == "success"
    state = json.loads(spark.host.file(f"{STATE_DIR}/state.json").content_string)
    assert state["last_result"]["state"] == "healthy", state


def test_models_lists_served_name(spark: Spark) -> None:
    _serving(spark)
    models = _api(spark, "/v1/models")
    assert spark.endpoint.served_name in [model["id"] for model in models["data"]]


def test_chat_completion_returns_choices(spark: Spark) -> None:
    _serving(spark)
    reply = _api(spark, "/v1/chat/completions", {
        "model": spark.endpoint.served_name, "max_tokens": 16,
        "messages": [{"role": "user", "content": "Say hello."}],
    })
    assert reply["choices"][0]["message"]["content"]


def test_tool_call_get_weather(spark: Spark) -> None:
    """Seed 000 §4: the endpoint must turn a tool request into a well-formed tool call."""
    _serving(spark)
    tool = {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }}
    reply = _api(spark, "/v1/chat/completions", {
        "model": spark.endpoint.served_name, "tools": [tool], "tool_choice": "auto",
        "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
    })
    call = reply["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert "city" in json.loads(call["function"]["arguments"])
