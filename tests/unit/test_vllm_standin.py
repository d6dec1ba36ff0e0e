"""The vLLM stand-in, run as the image runs it: a subprocess serving on a free localhost port."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkfleet.vllm_flags import DATA
from tests.lab.standins.model import generate_checkpoint, shard_name
from tests.lab.standins.vllm_standin import CHOICES_FILE, REPLY_WORDS, ServeArgs, decode_pace, tuned

STANDIN = Path(__file__).parents[1] / "lab" / "standins" / "vllm_standin.py"
SERVED = "qwen3.6-35b-a3b"
KEY = "test-key-123"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# NVIDIA's "Agent Ready Qwen3.6" recipe (DOMAIN.md), which vLLM 0.28.0 accepts as is.
RECIPE = [
    "--tensor-parallel-size",
    "1",
    "--trust-remote-code",
    "--kv-cache-dtype",
    "fp8",
    "--attention-backend",
    "flashinfer",
    "--moe-backend",
    "marlin",
    "--gpu-memory-utilization",
    "0.8",
    "--max-model-len",
    "262144",
    "--max-num-seqs",
    "8",
    "--max-num-batched-tokens",
    "8192",
    "--enable-chunked-prefill",
    "--async-scheduling",
    "--enable-prefix-caching",
    "--speculative-config",
    '{"method":"mtp","num_speculative_tokens":3,"moe_backend":"triton"}',
    "--load-format",
    "fastsafetensors",
    "--reasoning-parser",
    "qwen3",
    "--tool-call-parser",
    "qwen3_xml",
    "--enable-auto-tool-choice",
    "--served-model-name",
    SERVED,
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def standin_env(data_dir: Path, load: float, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "HF_"))}
    return {**env, "VLLM_STANDIN_DATA": str(data_dir), "VLLM_STANDIN_LOAD_SECONDS": str(load), **extra}


def standin_argv(model: Path | str, flags: tuple[str, ...], port: int) -> list[str]:
    """`vllm serve MODEL FLAGS` on localhost; -I -S keeps site-packages out, as on the bare image python."""
    listen = ["--host", "127.0.0.1", "--port", str(port)]
    return [sys.executable, "-I", "-S", str(STANDIN), "serve", str(model), *flags, *listen]


def http(
    port: int, path: str, body: dict[str, Any] | None = None, key: str | None = None, timeout: float = 5
) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@dataclass
class Standin:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def output(self) -> str:
        return self.log.read_text()

    def wait_for_log(self, text: str, timeout: float = 5) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            assert self.proc.poll() is None, f"stand-in exited {self.proc.returncode}:\n{self.output()}"
            assert time.monotonic() < deadline, f"no {text!r} in:\n{self.output()}"
            time.sleep(0.02)

    def wait_ready(self, timeout: float = 5) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"stand-in exited {self.proc.returncode}:\n{self.output()}"
            try:
                if http(self.port, "/health", timeout=1)[0] == 200:
                    return
            except OSError:
                assert time.monotonic() < deadline, f"not ready after {timeout}s:\n{self.output()}"
                time.sleep(0.05)

    def metric(self, name: str) -> float:
        text = http(self.port, "/metrics")[1].decode()
        match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
        assert match, f"{name} not in /metrics"
        return float(match.group(1))


Launch = Callable[..., Standin]


@pytest.fixture(scope="module")
def launch(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launch]:
    """Start stand-ins in the background; every one started is killed at the end of the module."""
    started: list[Standin] = []

    def start(model: Path | str, *flags: str, load: float = 0.3, **env: str) -> Standin:
        port = free_port()
        log = tmp_path_factory.mktemp("standin-log") / "out.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                standin_argv(model, flags, port),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=standin_env(data_dir, load, **env),
            )
        started.append(Standin(proc, port, log))
        return started[-1]

    yield start
    for standin in started:
        standin.proc.kill()
        standin.proc.wait()


def run_to_exit(
    data_dir: Path, model: Path | str, *flags: str, load: float = 0.2, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        standin_argv(model, flags, free_port()),
        capture_output=True,
        text=True,
        timeout=10,
        env=standin_env(data_dir, load, **env),
    )


@pytest.fixture(scope="module")
def server(launch: Launch, model_dir: Path) -> Standin:
    """One stand-in serving the full recipe behind an API key, shared by the endpoint tests."""
    standin = launch(model_dir, *RECIPE, VLLM_API_KEY=KEY, VLLM_STANDIN_TOKEN_SECONDS="0")
    standin.wait_ready()
    return standin


@pytest.fixture(scope="module")
def plain_server(launch: Launch, model_dir: Path) -> Standin:
    """No key, no auto tool choice, one sequence at a time and slow tokens, so queueing is observable."""
    standin = launch(model_dir, "--max-num-seqs", "1", VLLM_STANDIN_TOKEN_SECONDS="0.2")
    standin.wait_ready()
    return standin


def test_image_data_carries_the_choices_as_json(data_dir: Path) -> None:
    expected = yaml.safe_load((DATA / "choices-0.28.0.yaml").read_text())
    assert json.loads((data_dir / CHOICES_FILE).read_text()) == expected


@pytest.mark.parametrize(
    ("flags", "code", "expected"),
    [
        (
            ["--disable-log-requests"],
            2,
            ["vllm serve: error: unrecognized arguments: --disable-log-requests"],
        ),
        (["--not-a-flag", "1"], 2, ["vllm serve: error: unrecognized arguments: --not-a-flag 1"]),
        (
            ["--quantization", "a3b_fp8"],
            2,
            [
                "vllm serve: error: argument --quantization/-q: invalid choice: 'a3b_fp8' "
                "(choose from awq, auto_awq, fp8,"
            ],
        ),
        (["--attention-backend", "flash"], 2, ["argument --attention-backend: invalid choice: 'flash'"]),
        (["--speculative-config", "{method: mtp}"], 2, ["argument --speculative-config: Failed to parse"]),
        (["--enforce-eager=true"], 2, ["argument --enforce-eager: ignored explicit argument 'true'"]),
        (
            ["--enable-auto-tool-choice", "--tool-call-parser", "qwen"],
            1,
            [
                "Traceback (most recent call last):",
                "KeyError: 'invalid tool call parser: qwen (chose from { cohere_command3,",
                ",qwen3_xml,",
            ],
        ),
        (["--reasoning-parser", "qwen"], 1, ["KeyError: 'invalid reasoning parser: qwen (chose from {"]),
        (
            ["--enable-auto-tool-choice"],
            1,
            ["TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser"],
        ),
        (
            ["--max-model-len", "1M"],
            1,
            ["User-specified max_model_len (1048576) is greater than the derived"],
        ),
        (
            ["--gpu-memory-utilization", "0.04"],
            1,
            ["To serve at least one request with the models's max seq len"],
        ),
    ],
)
def test_rejects_what_vllm_rejects(
    data_dir: Path, model_dir: Path, flags: list[str], code: int, expected: list[str]
) -> None:
    result = run_to_exit(data_dir, model_dir, *flags)
    assert result.returncode == code, result.stderr
    for text in expected:
        assert text in result.stderr


def test_refuses_connections_while_loading_then_serves(launch: Launch, model_dir: Path) -> None:
    standin = launch(model_dir, load=1.5)
    standin.wait_for_log("Starting to load model")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", standin.port), timeout=1)
    standin.wait_ready()
    log = standin.output()
    assert "non-default args: {'model_tag': " in log
    assert re.search(r"GPU KV cache size: [\d,]+ tokens", log)
    assert f"Starting vLLM API server 0 on http://127.0.0.1:{standin.port}" in log


def test_models_lists_the_served_name(server: Standin) -> None:
    status, body = http(server.port, "/v1/models", key=KEY)
    assert status == 200
    assert [m["id"] for m in json.loads(body)["data"]] == [SERVED]
    assert json.loads(body)["data"][0]["max_model_len"] == 262144


def test_v1_needs_the_api_key_and_probes_do_not(server: Standin) -> None:
    assert http(server.port, "/v1/models") == (401, b'{"error": "Unauthorized"}')
    assert http(server.port, "/v1/models", key="wrong")[0] == 401
    for path in ("/health", "/ping", "/metrics", "/version"):
        assert http(server.port, path)[0] == 200, path
    assert json.loads(http(server.port, "/version")[1]) == {"version": "0.28.0"}


def test_chat_completion_has_choices(server: Standin) -> None:
    status, body = http(
        server.port,
        "/v1/chat/completions",
        key=KEY,
        body={"model": SERVED, "messages": [{"role": "user", "content": "Say hi"}]},
    )
    assert status == 200
    reply = json.loads(body)
    assert reply["choices"][0]["message"]["content"]
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["usage"]["completion_tokens"] > 0


def test_tool_request_returns_a_get_weather_call(server: Standin) -> None:
    status, body = http(
        server.port,
        "/v1/chat/completions",
        key=KEY,
        body={
            "model": SERVED,
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [WEATHER_TOOL],
            "tool_choice": "auto",
        },
    )
    assert status == 200
    choice = json.loads(body)["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str)
    assert choice["finish_reason"] == "tool_calls"


def test_completion_honours_max_tokens(server: Standin) -> None:
    status, body = http(
        server.port,
        "/v1/completions",
        key=KEY,
        body={"model": SERVED, "prompt": "Once upon a time", "max_tokens": 3},
    )
    assert status == 200
    reply = json.loads(body)
    assert len(reply["choices"][0]["text"].split()) == 3
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 3


def test_streamed_chat_ends_with_done(server: Standin) -> None:
    status, body = http(
        server.port,
        "/v1/chat/completions",
        key=KEY,
        body={
            "model": SERVED,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "stream": True,
        },
    )
    events = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
    assert status == 200
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert len(text.split()) == 2


def test_unknown_model_is_a_404_error_object(server: Standin) -> None:
    status, body = http(
        server.port,
        "/v1/chat/completions",
        key=KEY,
        body={"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert status == 404
    assert json.loads(body)["error"]["message"] == "The model `gpt-4` does not exist."


def test_metrics_count_tokens_and_speculative_acceptance(server: Standin) -> None:
    before = server.metric("vllm:generation_tokens_total")
    http(server.port, "/v1/completions", key=KEY, body={"model": SERVED, "prompt": "x", "max_tokens": 5})
    text = http(server.port, "/metrics")[1].decode()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    ):
        assert re.search(rf'^{name}{{[^}}]*model_name="{SERVED}"[^}}]*}} ', text, re.M), name
    assert server.metric("vllm:generation_tokens_total") == before + 5
    acceptance = server.metric("vllm:spec_decode_num_accepted_tokens_total") / server.metric(
        "vllm:spec_decode_num_draft_tokens_total"
    )
    assert 0.7 <= acceptance <= 0.9


def test_ignore_eos_runs_on_to_max_tokens(server: Standin) -> None:
    """vLLM's `ignore_eos` (which `vllm bench` sends) makes a reply exactly max_tokens long, so benches compare."""
    body = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40}
    natural = json.loads(http(server.port, "/v1/chat/completions", key=KEY, body=body)[1])
    assert natural["usage"]["completion_tokens"] == len(REPLY_WORDS)
    assert natural["choices"][0]["finish_reason"] == "stop"
    status, raw = http(server.port, "/v1/chat/completions", key=KEY, body={**body, "ignore_eos": True})
    reply = json.loads(raw)
    words = reply["choices"][0]["message"]["content"].split()
    assert status == 200 and len(words) == reply["usage"]["completion_tokens"] == 40
    assert words[: len(REPLY_WORDS)] == words[len(REPLY_WORDS): 2 * len(REPLY_WORDS)] == list(REPLY_WORDS)
    assert reply["choices"][0]["finish_reason"] == "length"


def test_kernel_flags_set_the_acceptance_band(launch: Launch, model_dir: Path) -> None:
    """Seed 004: 78-89 % MTP acceptance with marlin, fp8 KV and flashinfer; 46-65 % with any of them missing."""
    flags = [flag for flag in RECIPE if flag not in ("--attention-backend", "flashinfer")]
    standin = launch(model_dir, *flags, VLLM_STANDIN_TOKEN_SECONDS="0")
    standin.wait_ready()
    for _ in range(5):
        http(standin.port, "/v1/completions", body={"model": SERVED, "prompt": "x", "max_tokens": 50})
    acceptance = standin.metric("vllm:spec_decode_num_accepted_tokens_total") / standin.metric(
        "vllm:spec_decode_num_draft_tokens_total"
    )
    assert 0.44 <= acceptance <= 0.67


def test_which_flags_count_as_tuned() -> None:
    recipe = {"moe-backend": "marlin", "kv-cache-dtype": "fp8_e4m3", "attention-backend": "FLASHINFER"}
    assert tuned(ServeArgs(None, recipe | {"attention-backend": "flashinfer"}))
    for name in recipe:
        assert not tuned(ServeArgs(None, {k: v for k, v in recipe.items() if k != name})), name
    assert not tuned(ServeArgs(None, recipe | {"kv-cache-dtype": "auto"}))


def test_decode_pace_holds_with_the_kernel_flags_and_drops_without() -> None:
    """Without the flags one sequence is faster (seed 004: ~60 against ~45 tokens/s), several are slower."""
    assert decode_pace(True, 1) == decode_pace(True, 4) == 1.0
    assert decode_pace(False, 1) == pytest.approx(0.75)
    assert decode_pace(False, 0) == decode_pace(False, 1)
    assert 1.0 < decode_pace(False, 2) < decode_pace(False, 4)


def test_streamed_tokens_take_the_token_time(launch: Launch, model_dir: Path) -> None:
    """TTFT and tokens/s are measurable: a longer prompt takes longer to prefill, each token its time."""
    standin = launch(model_dir, *RECIPE, VLLM_STANDIN_TOKEN_SECONDS="0.02")
    standin.wait_ready()

    def timed(prompt: str, tokens: int) -> float:
        body = {"model": SERVED, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
                "ignore_eos": True, "stream": True}
        start = time.monotonic()
        http(standin.port, "/v1/chat/completions", body=body)
        return time.monotonic() - start

    assert 0.9 <= timed("hi", 50) <= 1.6  # 50 tokens at 20 ms
    assert timed("word " * 800, 1) - timed("hi", 1) >= 0.8  # 1000 more prompt tokens at 1 ms each


def test_no_spec_decode_metrics_without_speculative_config(plain_server: Standin) -> None:
    assert "vllm:spec_decode" not in http(plain_server.port, "/metrics")[1].decode()


def test_gauges_show_running_and_waiting_requests(plain_server: Standin) -> None:
    body = {"prompt": "x", "max_tokens": 3}
    requests = [
        threading.Thread(target=http, args=(plain_server.port, "/v1/completions", body)) for _ in range(2)
    ]
    for thread in requests:
        thread.start()

    def gauges() -> tuple[float, float]:
        return plain_server.metric("vllm:num_requests_running"), plain_server.metric(
            "vllm:num_requests_waiting"
        )

    deadline = time.monotonic() + 2
    while gauges() != (1.0, 1.0):
        assert time.monotonic() < deadline, "never saw one running and one waiting request"
        time.sleep(0.02)
    for thread in requests:
        thread.join()
    assert gauges() == (0.0, 0.0)


def test_auto_tool_choice_needs_the_flag(plain_server: Standin) -> None:
    body = {"messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER_TOOL]}
    status, reply = http(plain_server.port, "/v1/chat/completions", body=body)
    assert status == 400
    assert json.loads(reply)["error"]["message"] == (
        '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
    )
    named = {
        **body,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 1,
    }
    status, reply = http(plain_server.port, "/v1/chat/completions", body=named)
    assert status == 200
    assert json.loads(reply)["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize(
    ("flags", "stage"), [([], "in capture_model"), (["--enforce-eager"], "in profile_run")]
)
def test_crash_cutlass_dies_with_error_internal(
    data_dir: Path, model_dir: Path, flags: list[str], stage: str
) -> None:
    result = run_to_exit(data_dir, model_dir, *flags, VLLM_STANDIN_MODE="crash-cutlass")
    assert result.returncode == 1
    assert "cutlass_scaled_mm" in result.stdout
    assert stage in result.stdout
    assert "RuntimeError: Error Internal" in result.stdout
    assert "Engine core initialization failed" in result.stderr
    assert "Starting vLLM API server" not in result.stdout


def test_disabling_the_cutlass_kernel_avoids_the_crash(launch: Launch, model_dir: Path) -> None:
    standin = launch(
        model_dir, VLLM_STANDIN_MODE="crash-cutlass", VLLM_DISABLED_KERNELS="CutlassFp8BlockScaledMMKernel"
    )
    standin.wait_ready()


def test_hang_accepts_connections_but_never_answers(launch: Launch, model_dir: Path) -> None:
    standin = launch(model_dir, VLLM_STANDIN_MODE="hang")
    standin.wait_for_log("Application startup complete.")
    with socket.create_connection(("127.0.0.1", standin.port), timeout=0.5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        with pytest.raises(TimeoutError):
            sock.recv(1)


def test_hang_engine_answers_health_but_not_completions(launch: Launch, model_dir: Path) -> None:
    standin = launch(model_dir, VLLM_STANDIN_MODE="hang-engine")
    standin.wait_ready()
    with pytest.raises(TimeoutError):
        http(standin.port, "/v1/completions", body={"prompt": "x", "max_tokens": 1}, timeout=0.5)
    assert standin.metric("vllm:num_requests_running") == 1.0


def test_crash_after_load_serves_then_exits_non_zero(launch: Launch, model_dir: Path) -> None:
    standin = launch(model_dir, VLLM_STANDIN_MODE="crash-after-load", VLLM_STANDIN_CRASH_SECONDS="1.5")
    standin.wait_ready()
    ready = time.monotonic()
    status, body = http(standin.port, "/v1/completions", body={"prompt": "x", "max_tokens": 1})
    assert status == 200 and json.loads(body)["choices"]
    assert standin.proc.wait(timeout=5) == 1
    assert time.monotonic() - ready > 0.5  # it did serve for a while first
    log = standin.output()
    assert "Application startup complete." in log
    assert "EngineCore encountered a fatal error." in log
    assert "torch.AcceleratorError: CUDA error: an illegal memory access was encountered" in log


def test_crash_after_load_prints_a_vllm_traceback_on_stderr(data_dir: Path, model_dir: Path) -> None:
    result = run_to_exit(data_dir, model_dir, VLLM_STANDIN_MODE="crash-after-load", VLLM_STANDIN_CRASH_SECONDS="0.3")
    assert result.returncode == 1
    assert result.stderr.startswith("Traceback (most recent call last):")
    assert "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue." in result.stderr
    assert "in run_busy_loop" in result.stdout and "Starting vLLM API server" in result.stdout


def test_crash_after_load_waits_ten_seconds_by_default(launch: Launch, model_dir: Path) -> None:
    standin = launch(model_dir, VLLM_STANDIN_MODE="crash-after-load")
    standin.wait_ready()
    time.sleep(1)
    assert standin.proc.poll() is None
    assert http(standin.port, "/health")[0] == 200


def test_busy_queues_requests_while_tokens_advance(launch: Launch, model_dir: Path) -> None:
    """Longer than a probe's timeout to answer, yet /metrics shows an engine at work, not a hung one."""
    standin = launch(model_dir, VLLM_STANDIN_MODE="busy", VLLM_STANDIN_BUSY_SECONDS="2")
    standin.wait_ready()
    assert http(standin.port, "/health", timeout=0.5)[0] == 200  # the frontend answers at once
    with pytest.raises(TimeoutError):
        http(standin.port, "/v1/completions", body={"prompt": "x", "max_tokens": 1}, timeout=0.5)
    assert standin.metric("vllm:num_requests_running") >= 1
    assert standin.metric("vllm:num_requests_waiting") == 1  # the request that gave up is still queued
    before = standin.metric("vllm:generation_tokens_total")
    time.sleep(0.3)
    assert standin.metric("vllm:generation_tokens_total") > before
    started = time.monotonic()
    status, body = http(standin.port, "/v1/completions", body={"prompt": "x", "max_tokens": 1}, timeout=10)
    assert status == 200 and json.loads(body)["choices"]
    assert time.monotonic() - started >= 2
    assert "Traceback" not in standin.output()  # the client that gave up is not a server error


def _broken_copy(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    generate_checkpoint(model, total_bytes=4096, shards=2)
    return model


def test_missing_shard_fails_naming_the_file(data_dir: Path, tmp_path: Path) -> None:
    model = _broken_copy(tmp_path)
    (model / shard_name(2, 2)).unlink()
    result = run_to_exit(data_dir, model)
    assert result.returncode == 1
    assert f'No such file or directory: "{model / shard_name(2, 2)}"' in result.stderr


def test_truncated_shard_fails_like_safetensors(data_dir: Path, tmp_path: Path) -> None:
    model = _broken_copy(tmp_path)
    shard = model / shard_name(1, 2)
    shard.write_bytes(shard.read_bytes()[:-10])
    result = run_to_exit(data_dir, model)
    assert result.returncode == 1
    assert "SafetensorError: Error while deserializing header: MetadataIncompleteBuffer" in result.stderr


def test_missing_config_fails(data_dir: Path, tmp_path: Path) -> None:
    model = _broken_copy(tmp_path)
    (model / "config.json").unlink()
    result = run_to_exit(data_dir, model)
    assert result.returncode == 1
    assert "does not appear to have a file named config.json" in result.stderr


def test_uncached_repo_id_fails_offline(data_dir: Path, tmp_path: Path) -> None:
    result = run_to_exit(data_dir, "Qwen/Qwen3.6-35B-A3B", HF_HOME=str(tmp_path), HF_HUB_OFFLINE="1")
    assert result.returncode == 1
    assert "OSError: We couldn't connect to 'https://huggingface.co'" in result.stderr


def test_repo_id_is_served_from_the_hf_cache(launch: Launch, tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--Qwen--Qwen3.6-35B-A3B"
    generate_checkpoint(repo / "snapshots" / "0123abcd", total_bytes=4096, shards=1)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    standin = launch("Qwen/Qwen3.6-35B-A3B", HF_HOME=str(tmp_path), HF_HUB_OFFLINE="1")
    standin.wait_ready()
    models = json.loads(http(standin.port, "/v1/models")[1])["data"]
    assert [m["id"] for m in models] == ["Qwen/Qwen3.6-35B-A3B"]


def test_sigterm_stops_at_once_while_loading(launch: Launch, model_dir: Path) -> None:
    standin = launch(model_dir, load=30)
    standin.wait_for_log("Starting to load model")
    standin.proc.send_signal(signal.SIGTERM)
    assert standin.proc.wait(timeout=2) == 0


def test_sigterm_with_shutdown_timeout_finishes_running_requests(launch: Launch, model_dir: Path) -> None:
    """vLLM's --shutdown-timeout: SIGTERM refuses new requests, lets running ones finish, then exits 0."""
    standin = launch(model_dir, "--shutdown-timeout", "10", VLLM_STANDIN_TOKEN_SECONDS="0.2")
    standin.wait_ready()
    answer: dict[str, Any] = {}
    body = {"model": str(model_dir), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200}
    running = threading.Thread(target=lambda: answer.update(reply=http(standin.port, "/v1/chat/completions",
                                                                       body, timeout=10)))
    running.start()
    time.sleep(0.5)  # the request is generating (its reply's tokens at 200 ms each)
    standin.proc.send_signal(signal.SIGTERM)
    standin.wait_for_log("Graceful shutdown: waiting up to 10 s for 1 in-flight requests")
    assert http(standin.port, "/health", timeout=2)[0] == 503  # new requests are refused
    running.join(10)
    status, reply = answer["reply"]
    assert status == 200 and json.loads(reply)["usage"]["completion_tokens"] > 5
    assert standin.proc.wait(5) == 0


def test_sigterm_without_shutdown_timeout_aborts_running_requests(launch: Launch, model_dir: Path) -> None:
    standin = launch(model_dir, VLLM_STANDIN_TOKEN_SECONDS="0.2")
    standin.wait_ready()
    errors: list[BaseException] = []
    body = {"model": str(model_dir), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200}

    def request() -> None:
        try:
            http(standin.port, "/v1/chat/completions", body, timeout=10)
        except OSError as error:
            errors.append(error)

    running = threading.Thread(target=request)
    running.start()
    time.sleep(0.5)
    standin.proc.send_signal(signal.SIGTERM)
    running.join(10)
    assert standin.proc.wait(5) == 0 and len(errors) == 1  # the connection died with the server
