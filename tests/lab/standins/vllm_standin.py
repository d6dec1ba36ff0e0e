#!/usr/bin/env python3
"""Stand-in for the `vllm/vllm-openai` image entrypoint (`vllm serve MODEL [flags]`) in the sparkfleet lab.

Lab hosts have no GPU, so the real image cannot run there. This program rejects what vLLM 0.28.0 rejects
(flags, choices, parsers, missing weights) with vLLM's own wording, refuses connections while "loading
weights", then serves the OpenAI-compatible endpoints that deploys and health checks use. Stdlib only: it
runs on Debian bookworm's python3 inside the image.

Environment:
  VLLM_STANDIN_DATA           directory with the flag data (see FLAGS_FILE, BOOL_FLAGS_FILE, CHOICES_FILE)
  VLLM_STANDIN_MODE           ok | crash-cutlass | crash-after-load | hang | hang-engine | slow | busy
                              (else the content of /etc/vllm-standin/mode, else ok)
  VLLM_STANDIN_LOAD_SECONDS   simulated weight-load time (default 5, 240 in slow mode)
  VLLM_STANDIN_TOKEN_SECONDS  simulated time per generated token of one sequence with seed 004's kernel flags
                              (default 0.01; see decode_pace), a prompt token costing PREFILL_SHARE of it
  VLLM_STANDIN_CRASH_SECONDS  crash-after-load: seconds it serves before the engine dies (default 10)
  VLLM_STANDIN_BUSY_SECONDS   busy: seconds each request queues behind other clients' long prefills before it
                              runs (default 90, above the health check's 60 s deep-probe timeout)
  VLLM_STANDIN_HEARTBEAT_SECONDS  multi-node: seconds between heartbeats on the head-worker link (default 2); a
                              peer silent for HEARTBEAT_MISSES of them is gone
  VLLM_STANDIN_JOIN_SECONDS   multi-node: how long the head waits for its worker, and a worker for its head
                              (default 600, torch.distributed's store timeout)
  VLLM_LOGGING_LEVEL          DEBUG prints the head's periodic "Waiting for ... core engine proc(s)" line

Failure modes: crash-cutlass dies at CUDA-graph capture (GB10 FP8, vllm #40758); crash-after-load loads and
answers like ok, then its engine dies mid-serving and the process exits 1 (a crash loop under Restart=); hang
accepts connections and never answers; hang-engine answers /health but never generates; slow loads for minutes;
busy serves other clients' long requests (running sequences, generated tokens advancing on /metrics) so every
new request waits in the queue longer than a probe's timeout.

Serving follows the flags the way seed 004 measured on a Spark: with `--moe-backend marlin`, `--kv-cache-dtype
fp8` and `--attention-backend flashinfer` all set, MTP draft acceptance is 78-89 % and decode keeps its pace under
concurrency; without any of them, 46-65 % and slower as sequences are added. A reply is the natural sentence,
cut at max_tokens; with `ignore_eos` (as `vllm bench` sends it) it runs on to max_tokens.

Across nodes without Ray (`--nnodes 2 --node-rank R --master-addr A --master-port P`, `--headless` on the worker,
vLLM PR #23691): the head (node rank 0) listens on A:P where torch.distributed's store would, and its engine waits
there for the worker before loading; its API port refuses connections until both nodes have loaded. The worker
serves no HTTP, retries the head while it is not up (torch's c10d warnings), and loads once joined. One TCP
connection with heartbeats stands in for the store and the gloo pairs: when the worker goes away the head's engine
dies with the gloo error that names the peer, then EngineDeadError, and the process exits 1; when the head goes
away the worker logs c10d's recvValue failure and exits 1.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NoReturn

VERSION = "0.28.0"
FLAGS_FILE = f"serve-flags-{VERSION}.txt"
BOOL_FLAGS_FILE = f"serve-bool-flags-{VERSION}.txt"
CHOICES_FILE = f"choices-{VERSION}.json"
DEFAULT_DATA_DIR = "/usr/share/vllm-standin"
MODE_FILE = Path("/etc/vllm-standin/mode")
MODES = ("ok", "crash-cutlass", "crash-after-load", "hang", "hang-engine", "slow", "busy")
BUSY_SEQUENCES = 4  # busy mode: other clients' long-context requests the engine is working through
BUSY_TOKENS_PER_SECOND = 40

USAGE = "usage: vllm serve [model_tag] [options]"
SITE = "/usr/local/lib/python3.12/dist-packages"
# Choice lists that vLLM checks after parsing (KeyError, exit 1) rather than through argparse (exit 2).
PARSER_FLAGS = {"tool-call-parser": "tool call parser", "reasoning-parser": "reasoning parser"}
SHORT_FLAGS = {
    "-q": "--quantization",
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
}
MULTI_VALUE_FLAGS = frozenset(
    {"--served-model-name", "--lora-modules", "--middleware", "--cudagraph-capture-sizes"}
)
JSON_FLAGS = frozenset({"--speculative-config", "--hf-overrides", "--override-generation-config"})
INT_FLAGS = (
    "--port",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--data-parallel-size",
    "--seed",
    "--nnodes",
    "--node-rank",
    "--master-port",
)
# `vllm serve`'s own store_true flags: no value and no --no- form (the EngineArgs booleans are in BOOL_FLAGS_FILE).
STORE_TRUE_FLAGS = frozenset({"--headless"})

UNIFIED_MEMORY_BYTES = 128 * 2**30  # one GB10: CPU and GPU share it
RESERVED_BYTES = 4 * 2**30  # activations and CUDA graphs, taken before the KV cache
HYBRID_KV_FACTOR = 4  # vLLM's hybrid allocator used ~4x the attention-only figure on Spark (DOMAIN.md)
# Seed 004: MTP draft acceptance on a Spark was 46-65 % before, 78-89 % once these three flags were all set.
TUNED_FLAGS = {"moe-backend": "marlin", "kv-cache-dtype": "fp8", "attention-backend": "FLASHINFER"}
TUNED_ACCEPTANCE = (0.78, 0.89)
UNTUNED_ACCEPTANCE = (0.46, 0.65)
# Seed 004: one request decoded at ~60 tokens/s before the fix and ~45 after it, the fix paying off under
# concurrency instead. It gives no concurrent figure: the slowdown per extra running sequence is the lab's own.
UNTUNED_SINGLE_PACE = 45 / 60
UNTUNED_PACE_PER_SEQUENCE = 0.6
PREFILL_SHARE = 0.05  # a prompt token's share of a decode token's time (prefill runs the prompt in one batch)
REPLY_WORDS = (
    "The",
    "vLLM",
    "stand-in",
    "answers",
    "every",
    "prompt",
    "with",
    "this",
    "same",
    "short",
    "sentence",
    "so",
    "that",
    "tests",
    "can",
    "count",
    "its",
    "tokens",
)
SAMPLE_STRINGS = {
    "city": "Paris",
    "location": "Paris, France",
    "country": "France",
    "date": "2025-06-01",
    "unit": "celsius",
    "query": "weather in Paris",
    "timezone": "Europe/Paris",
    "language": "en",
}
OFFLINE_ERROR = (
    "OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them "
    "in the cached files.\nCheck your internet connection or see how to run the library in offline mode "
    "at 'https://huggingface.co/docs/transformers/installation#offline-mode'."
)

# The tracebacks vLLM prints for each failure, as printed, with $S for the image's site-packages.
# fmt: off
TRACES = """
[entry]
  File "/usr/local/bin/vllm", line 10, in <module>
    sys.exit(main())
[cli]
  File "$S/vllm/entrypoints/cli/main.py", line 73, in main
    args.dispatch_function(args)
  File "$S/vllm/entrypoints/cli/serve.py", line 60, in cmd
    uvloop.run(run_server(args))
  File "$S/uvloop/__init__.py", line 109, in run
    return __asyncio.run(
[setup]
  File "$S/vllm/entrypoints/openai/api_server.py", line 2104, in run_server
    listen_address, sock = setup_server(args)
[validate]
  File "$S/vllm/entrypoints/cli/main.py", line 71, in main
    cmds[args.subparser].validate(args)
  File "$S/vllm/entrypoints/cli/serve.py", line 84, in validate
    validate_parsed_serve_args(args)
  File "$S/vllm/entrypoints/openai/cli_args.py", line 318, in validate_parsed_serve_args
    raise TypeError(
[api_args]
  File "$S/vllm/entrypoints/openai/api_server.py", line 2031, in setup_server
    validate_api_server_args(args)
  File "$S/vllm/entrypoints/openai/api_server.py", line 1998, in validate_api_server_args
    raise KeyError(
[bind]
  File "$S/vllm/entrypoints/openai/api_server.py", line 2064, in setup_server
    sock = create_server_socket(sock_addr)
  File "$S/vllm/entrypoints/openai/api_server.py", line 1975, in create_server_socket
    sock.bind(addr)
[config]
  File "$S/vllm/entrypoints/openai/api_server.py", line 2129, in run_server_worker
    async with build_async_engine_client(
  File "$S/vllm/engine/arg_utils.py", line 1366, in create_engine_config
    model_config = self.create_model_config()
  File "$S/vllm/transformers_utils/config.py", line 611, in get_config
    config_dict, _ = PretrainedConfig.get_config_dict(model, revision=revision, **kwargs)
[weights]
  File "$S/vllm/v1/worker/gpu_model_runner.py", line 3318, in load_model
    self.model = model_loader.load_model(vllm_config=self.vllm_config, model_config=self.model_config)
  File "$S/vllm/model_executor/model_loader/default_loader.py", line 284, in load_weights
    loaded_weights = model.load_weights(self.get_all_weights(model_config, model))
  File "$S/vllm/model_executor/model_loader/weight_utils.py", line 698, in safetensors_weights_iterator
    with safe_open(st_file, framework="pt") as f:
[engine]
  File "$S/vllm/v1/engine/core.py", line 834, in run_engine_core
    engine_core = EngineCoreProc(*args, **kwargs)
  File "$S/vllm/v1/engine/core.py", line 606, in __init__
    super().__init__(vllm_config, executor_class, log_stats, executor_fail_callback)
  File "$S/vllm/v1/engine/core.py", line 109, in __init__
    self._initialize_kv_caches(vllm_config)
[kv]
  File "$S/vllm/v1/engine/core.py", line 236, in _initialize_kv_caches
    kv_cache_configs = get_kv_cache_configs(vllm_config, kv_cache_specs, available_gpu_memory)
  File "$S/vllm/v1/core/kv_cache_utils.py", line 712, in check_enough_kv_cache_memory
    raise ValueError(
[capture]
  File "$S/vllm/v1/engine/core.py", line 248, in _initialize_kv_caches
    self.model_executor.initialize_from_config(kv_cache_configs)
  File "$S/vllm/v1/worker/gpu_worker.py", line 417, in compile_or_warm_up_model
    self.model_runner.capture_model()
  File "$S/vllm/v1/worker/gpu_model_runner.py", line 3601, in capture_model
    self._capture_cudagraphs(compilation_cases, cudagraph_runtime_mode=runtime_mode)
[profile]
  File "$S/vllm/v1/engine/core.py", line 223, in _initialize_kv_caches
    available_gpu_memory = self.model_executor.determine_available_memory()
  File "$S/vllm/v1/worker/gpu_worker.py", line 283, in determine_available_memory
    self.model_runner.profile_run()
  File "$S/vllm/v1/worker/gpu_model_runner.py", line 3402, in profile_run
    hidden_states, last_hidden_states = self._dummy_run(self.max_num_tokens, is_profile=True)
[kernel]
  File "$S/vllm/model_executor/layers/quantization/utils/w8a8_utils.py", line 120, in cutlass_w8a8_scaled_mm
    output = ops.cutlass_scaled_mm(qinput, weight, out_dtype=out_dtype, scale_a=scale_a, scale_b=scale_b)
  File "$S/vllm/_custom_ops.py", line 860, in cutlass_scaled_mm
    torch.ops._C.cutlass_scaled_mm(out, a, b, scale_a, scale_b, bias)
  File "$S/torch/_ops.py", line 1243, in __call__
    return self._op(*args, **kwargs)
[busy_loop]
  File "$S/vllm/v1/engine/core.py", line 701, in run_engine_core
    engine_core.run_busy_loop()
  File "$S/vllm/v1/engine/core.py", line 728, in run_busy_loop
    self._process_engine_step()
  File "$S/vllm/v1/engine/core.py", line 754, in _process_engine_step
    outputs, model_executed = self.step_fn()
  File "$S/vllm/v1/worker/gpu_model_runner.py", line 2254, in execute_model
    valid_sampled_token_ids = sampled_token_ids.tolist()
[output_handler]
  File "$S/vllm/v1/engine/async_llm.py", line 439, in output_handler
    outputs = await engine_core.get_output_async()
  File "$S/vllm/v1/engine/core_client.py", line 846, in get_output_async
    raise self._format_exception(outputs) from None
[parallel]
  File "$S/vllm/engine/arg_utils.py", line 1544, in create_engine_config
    parallel_config = ParallelConfig(
  File "$S/vllm/config/parallel.py", line 574, in __post_init__
    assert world_size % self.nnodes == 0, (
[store]
  File "$S/vllm/v1/worker/gpu_worker.py", line 235, in init_device
    init_worker_distributed_environment(self.vllm_config, self.rank, self.distributed_init_method)
  File "$S/vllm/distributed/parallel_state.py", line 1248, in init_distributed_environment
    torch.distributed.init_process_group(
  File "$S/torch/distributed/rendezvous.py", line 189, in _create_c10d_store
    return TCPStore(
[gloo]
  File "$S/vllm/v1/executor/multiproc_executor.py", line 812, in worker_busy_loop
    output = func(*args, **kwargs)
  File "$S/vllm/distributed/parallel_state.py", line 530, in broadcast_object
    torch.distributed.broadcast_object_list(recv, src=self.ranks[src], group=self.cpu_group)
  File "$S/torch/distributed/distributed_c10d.py", line 2827, in broadcast
    work.wait()
[rpc]
  File "$S/vllm/v1/executor/multiproc_executor.py", line 312, in collective_rpc
    result = get_response(w, dequeue_timeout)
  File "$S/vllm/v1/executor/multiproc_executor.py", line 296, in get_response
    raise RuntimeError(
[startup]
  File "$S/vllm/v1/engine/core_client.py", line 470, in __init__
    with launch_core_engines(vllm_config, executor_class, log_stats) as (engine_manager, coordinator):
  File "$S/vllm/v1/engine/utils.py", line 902, in wait_for_engine_startup
    raise RuntimeError(
"""
# fmt: on


def _sections(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    for line in text.replace("$S", SITE).strip().splitlines():
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
        else:
            current.append(line)
    return sections


FRAMES = _sections(TRACES)


def trace(*parts: str) -> list[str]:
    """The frames of a traceback, outermost first, from the named parts of TRACES."""
    return [line for part in parts for line in FRAMES[part]]


class UsageError(Exception):
    """An argparse-level rejection: vLLM prints its usage line and exits 2."""


class Fatal(Exception):
    """A rejection after parsing: vLLM dies with a Python traceback and exits 1."""

    def __init__(self, final: str, frames: list[str]) -> None:
        super().__init__(final)
        self.final = final
        self.frames = frames


class ApiError(Exception):
    """A request the OpenAI server answers with an error object."""

    def __init__(
        self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def body(self) -> dict[str, Any]:
        return {
            "error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}
        }


# -------------------------------------------------------------------------------------- output helpers


def log(msg: str, where: str = "api_server.py:1", proc: str = "APIServer", level: str = "INFO") -> None:
    """Print one log line in vLLM's format, prefixed with the process it would come from (none: a headless
    node's main process)."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    prefix = f"({proc} pid={os.getpid()}) " if proc else ""
    print(f"{prefix}{level} {stamp} [{where}] {msg}", flush=True)


def engine_log(msg: str, where: str, level: str = "INFO") -> None:
    log(msg, where=where, proc="EngineCore_DP0", level=level)


def format_traceback(frames: list[str], final: str) -> list[str]:
    return ["Traceback (most recent call last):", *frames, *final.splitlines()]


def die(final: str, frames: list[str]) -> NoReturn:
    print("\n".join(format_traceback(frames, final)), file=sys.stderr, flush=True)
    sys.exit(1)


# ---------------------------------------------------------------------------------------- flag parsing


def human_int(value: str) -> int:
    """vLLM's human-readable ints: 4k = 4000, 4K = 4096, 1m = 1e6, 1M = 2**20; `auto` is -1 (derive it)."""
    units = {"k": 1000, "K": 1024, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30}
    if value == "auto":
        return -1
    if value and value[-1] in units:
        return int(float(value[:-1]) * units[value[-1]])
    return int(value)


CONVERTERS: dict[str, tuple[str, Callable[[str], object]]] = {
    **{flag: ("int", int) for flag in INT_FLAGS},
    "--gpu-memory-utilization": ("float", float),
    "--max-model-len": ("human_readable_int", human_int),
}


@dataclass(frozen=True)
class FlagSpec:
    """vLLM 0.28.0's `serve` flags, read from the data directory baked into the image."""

    flags: frozenset[str]
    bools: frozenset[str]
    choices: dict[str, list[str]]

    @classmethod
    def load(cls, data_dir: Path) -> FlagSpec:
        def names(file: str) -> frozenset[str]:
            lines = (data_dir / file).read_text().splitlines()
            return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))

        choices = json.loads((data_dir / CHOICES_FILE).read_text())
        return cls(names(FLAGS_FILE), names(BOOL_FLAGS_FILE), choices)


@dataclass
class ServeArgs:
    """The parsed command line: the model plus every flag given, keyed by flag name without dashes."""

    model_tag: str | None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def model(self) -> str:
        # vLLM's EngineArgs default model, used when neither the positional nor --model is given.
        return self.model_tag or self.options.get("model") or "Qwen/Qwen3-0.6B"

    def get(self, name: str, default: Any = None) -> Any:
        return self.options.get(name, default)


def _is_option(token: str) -> bool:
    if not token.startswith("-") or token == "-":
        return False
    try:
        float(token)
    except ValueError:
        return True
    return False


def _split_flag(token: str) -> tuple[str, str | None]:
    """`--max_model_len=4k` -> (`--max-model-len`, `4k`): vLLM's parser accepts underscores in flag names."""
    if token in SHORT_FLAGS:
        return SHORT_FLAGS[token], None
    name, sep, inline = token.partition("=")
    return name.replace("_", "-"), (inline if sep else None)


def _display(flag: str) -> str:
    aliases = [short for short, long in SHORT_FLAGS.items() if long == flag]
    return "/".join([flag, *aliases])


def _take_value(argv: list[str], i: int, flag: str, inline: str | None) -> tuple[Any, int]:
    """Consume the value(s) of `flag` starting at argv[i]; return them and the next index."""
    if flag in MULTI_VALUE_FLAGS:
        if inline is not None:
            return [inline], i
        end = i
        while end < len(argv) and not _is_option(argv[end]):
            end += 1
        if end == i:
            raise UsageError(f"argument {_display(flag)}: expected at least one argument")
        return argv[i:end], end
    if inline is not None:
        return inline, i
    if i >= len(argv) or _is_option(argv[i]):
        raise UsageError(f"argument {_display(flag)}: expected one argument")
    return argv[i], i + 1


def _check_choice(flag: str, value: str, choices: list[str]) -> None:
    """argparse-style choice check; attention and MoE backends are matched the way vLLM normalises them."""
    if flag == "--attention-backend":
        ok = value.upper() in choices
    elif flag == "--moe-backend":
        ok = value.lower().replace("-", "_") in choices
    else:
        ok = value in choices
    if not ok:
        raise UsageError(
            f"argument {_display(flag)}: invalid choice: {value!r} (choose from {', '.join(choices)})"
        )


def _check_value(flag: str, value: str, spec: FlagSpec) -> None:
    key = flag[2:]
    if key in spec.choices and key not in PARSER_FLAGS:
        _check_choice(flag, value, spec.choices[key])
    if flag in JSON_FLAGS:
        try:
            json.loads(value)
        except ValueError as err:
            raise UsageError(
                f"argument {flag}: Failed to parse '{value}' as <function loads at 0x7f3c2a1b0ae0>: {err}"
            ) from err
    if flag in CONVERTERS:
        kind, convert = CONVERTERS[flag]
        try:
            convert(value)
        except ValueError as err:
            raise UsageError(f"argument {_display(flag)}: invalid {kind} value: {value!r}") from err


def _parse_option(argv: list[str], i: int, token: str, spec: FlagSpec, args: ServeArgs) -> int | None:
    """Apply the option at argv[i-1] (`token`); return the next index, or None when vLLM does not know it."""
    name, inline = _split_flag(token)
    flag = name.split(".", 1)[0]  # --speculative-config.method mtp sets one field of a config flag
    if flag == "--help":
        print(USAGE)
        sys.exit(0)
    negated = flag.startswith("--no-") and "--" + flag[5:] in spec.bools
    if flag in STORE_TRUE_FLAGS:
        if inline is not None:
            raise UsageError(f"argument {flag}: ignored explicit argument {inline!r}")
        args.options[flag[2:]] = True
        return i
    if flag in spec.bools or negated:
        if inline is not None:
            raise UsageError(f"argument {flag}: ignored explicit argument {inline!r}")
        args.options[flag[5:] if negated else flag[2:]] = not negated
        return i
    if flag not in spec.flags:
        return None
    value, i = _take_value(argv, i, flag, inline)
    for item in value if isinstance(value, list) else [value]:
        _check_value(flag, item, spec)
    args.options[name[2:]] = value
    return i


def parse_serve_args(argv: list[str], spec: FlagSpec) -> ServeArgs:
    """Parse `vllm serve` arguments as vLLM's argparse would, raising UsageError with its wording."""
    args = ServeArgs(model_tag=None)
    extras: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not _is_option(token):
            if args.model_tag is None:
                args.model_tag = token
            else:
                extras.append(token)
            continue
        after = _parse_option(argv, i, token, spec, args)
        if after is None:
            name, inline = _split_flag(token)  # vLLM rewrites --a_b to --a-b before argparse sees it
            extras.append(name if inline is None else f"{name}={inline}")
        else:
            i = after
    if extras:
        raise UsageError(f"unrecognized arguments: {' '.join(extras)}")
    return args


def validate_serve_args(args: ServeArgs) -> None:
    """The checks vLLM makes before loading anything (validate_parsed_serve_args)."""
    if args.get("enable-auto-tool-choice") and not args.get("tool-call-parser"):
        raise Fatal(
            "TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser",
            trace("entry", "validate"),
        )
    if args.get("enable-log-outputs") and not args.get("enable-log-requests"):
        raise Fatal(
            "TypeError: Error: --enable-log-outputs requires --enable-log-requests",
            trace("entry", "validate"),
        )


def validate_api_server_args(args: ServeArgs, spec: FlagSpec) -> None:
    """vLLM's validate_api_server_args: unknown parsers are a KeyError, raised after the args are logged."""
    for key, kind in PARSER_FLAGS.items():
        name = args.get(key)
        valid = spec.choices.get(key, [])
        if name is not None and name not in valid:
            raise Fatal(
                f"KeyError: 'invalid {kind}: {name} (chose from {{ {','.join(valid)} }})'",
                trace("entry", "cli", "setup", "api_args"),
            )


def _display_value(flag: str, value: Any) -> Any:
    if isinstance(value, (bool, list)):
        return value
    if "--" + flag in JSON_FLAGS:
        return json.loads(value)
    for convert in (int, float):
        try:
            return convert(value)
        except ValueError:
            pass
    return value


def non_default_args(args: ServeArgs) -> dict[str, Any]:
    shown: dict[str, Any] = {"model_tag": args.model_tag} if args.model_tag else {}
    shown.update({key.replace("-", "_"): _display_value(key, val) for key, val in args.options.items()})
    shown["model"] = args.model
    return shown


# ---------------------------------------------------------------------------------------- model checks


def hf_snapshot(repo_id: str, revision: str) -> Path:
    """Resolve a Hub repo id in the local HF cache, as an offline huggingface_hub would."""
    home = Path(os.environ.get("HF_HOME", "/root/.cache/huggingface"))
    cache = Path(os.environ.get("HF_HUB_CACHE") or home / "hub")
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    if (repo / "snapshots" / commit).is_dir():
        return repo / "snapshots" / commit
    snapshots = sorted(p for p in (repo / "snapshots").glob("*") if p.is_dir())
    if snapshots:
        return snapshots[0]
    raise Fatal(OFFLINE_ERROR, trace("entry", "cli", "config"))


def resolve_model_dir(model: str, revision: str) -> Path:
    if Path(model).is_dir():
        return Path(model)
    if model.startswith(("/", ".", "~")) or model.count("/") != 1:
        raise Fatal(
            f"ValueError: Invalid repository ID or local directory specified: '{model}'.\n"
            "Please verify the following requirements:\n"
            "1. Provide a valid Hugging Face repository ID.\n"
            "2. Specify a local directory that contains a recognized configuration file.",
            trace("entry", "cli", "config"),
        )
    return hf_snapshot(model, revision)


def load_text_config(model_dir: Path, model: str) -> dict[str, Any]:
    """config.json's language-model part (Qwen3.5/3.6 nest it under text_config)."""
    path = model_dir / "config.json"
    if not path.is_file():
        raise Fatal(
            f"OSError: {model} does not appear to have a file named config.json. Checkout "
            f"'https://huggingface.co/{model}/tree/None' for available files.",
            trace("entry", "cli", "config"),
        )
    try:
        config = json.loads(path.read_text())
    except ValueError as err:
        raise Fatal(
            f"OSError: It looks like the config file at '{path}' is not a valid JSON file.",
            trace("entry", "cli", "config"),
        ) from err
    return {"architectures": config.get("architectures", []), **config.get("text_config", config)}


def weight_files(model_dir: Path, model: str) -> list[Path]:
    """The shards vLLM will open: the index's weight_map, else a single model.safetensors."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / name for name in names]
    if (model_dir / "model.safetensors").exists():
        return [model_dir / "model.safetensors"]
    raise Fatal(
        f"RuntimeError: Cannot find any model weights with `{model}`", trace("entry", "cli", "config")
    )


def check_safetensors(path: Path) -> None:
    """Open a shard the way safetensors does: missing, truncated or garbled files fail with its messages."""
    if not path.is_file():
        raise Fatal(f'FileNotFoundError: No such file or directory: "{path}"', trace("engine", "weights"))
    size = path.stat().st_size
    prefix = "safetensors_rust.SafetensorError: Error while deserializing header: "
    with path.open("rb") as fh:
        if size < 8:
            raise Fatal(prefix + "HeaderTooSmall", trace("engine", "weights"))
        (length,) = struct.unpack("<Q", fh.read(8))
        if length > size - 8:
            raise Fatal(prefix + "InvalidHeaderLength", trace("engine", "weights"))
        try:
            header = json.loads(fh.read(length))
        except ValueError as err:
            raise Fatal(prefix + "InvalidHeaderDeserialization", trace("engine", "weights")) from err
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    if max(ends, default=0) != size - 8 - length:
        raise Fatal(prefix + "MetadataIncompleteBuffer", trace("engine", "weights"))


# --------------------------------------------------------------------------------------- engine sizing


@dataclass(frozen=True)
class Sizing:
    max_model_len: int
    kv_tokens: int


def plan_sizing(args: ServeArgs, text_config: dict[str, Any], weight_bytes: int) -> Sizing:
    """Derive max_model_len and a plausible KV-cache size from the config, as vLLM's profiler would report."""
    derived = int(text_config.get("max_position_embeddings", 8192))
    requested = human_int(args.get("max-model-len", "auto"))
    max_len = derived if requested < 0 else requested
    if max_len > derived and os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
        raise Fatal(
            f"ValueError: User-specified max_model_len ({max_len}) is greater than the derived max_model_len "
            f"(max_position_embeddings={derived} or model_max_length=None in model's config.json). To allow "
            "overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.",
            trace("entry", "cli", "config"),
        )
    heads = int(text_config.get("num_attention_heads", 32))
    layers = text_config.get("layer_types") or []
    full_layers = layers.count("full_attention") or int(text_config.get("num_hidden_layers", 32))
    kv_heads = int(text_config.get("num_key_value_heads", heads))
    head_dim = int(text_config.get("head_dim") or int(text_config.get("hidden_size", 4096)) // heads)
    dtype_bytes = 1 if str(args.get("kv-cache-dtype", "auto")).startswith("fp8") else 2
    # A tensor-parallel rank (one per Spark in a pair) holds its share of the weights and of the KV heads.
    ranks = max(1, int(args.get("tensor-parallel-size", 1)))
    per_token = full_layers * 2 * kv_heads * head_dim * dtype_bytes * HYBRID_KV_FACTOR / ranks
    budget = (
        float(args.get("gpu-memory-utilization", 0.9)) * UNIFIED_MEMORY_BYTES
        - weight_bytes / ranks
        - RESERVED_BYTES
    )
    return Sizing(max_model_len=max_len, kv_tokens=max(0, int(budget // per_token)))


def check_kv_fits(sizing: Sizing) -> None:
    if sizing.kv_tokens < sizing.max_model_len:
        raise Fatal(
            "ValueError: To serve at least one request with the models's max seq len "
            f"({sizing.max_model_len}), "
            f"more KV cache is needed than is available ({sizing.kv_tokens} tokens). Based on the available "
            f"memory, the estimated maximum model length is {sizing.kv_tokens}. Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
            trace("engine", "kv"),
        )


# --------------------------------------------------------------------------------------- serving state


def tuned(args: ServeArgs) -> bool:
    """Whether seed 004's three kernel flags are all set (vLLM normalises the backends' case)."""
    given = {
        "moe-backend": str(args.get("moe-backend", "")).lower(),
        "kv-cache-dtype": str(args.get("kv-cache-dtype", "")).split("_", 1)[0],
        "attention-backend": str(args.get("attention-backend", "")).upper(),
    }
    return given == TUNED_FLAGS


def decode_pace(is_tuned: bool, running: int) -> float:
    """A generated token's time, in units of VLLM_STANDIN_TOKEN_SECONDS, with `running` sequences decoding.

    With the kernel flags the pace holds under concurrency; without them one sequence is faster (seed 004:
    ~60 against ~45 tokens/s) and each further sequence slows every one down.
    """
    if is_tuned:
        return 1.0
    return UNTUNED_SINGLE_PACE * (1 + UNTUNED_PACE_PER_SEQUENCE * max(0, running - 1))


class Histogram:
    """A Prometheus histogram with vLLM's latency buckets."""

    BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)

    def __init__(self) -> None:
        self.counts = [0] * len(self.BUCKETS)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.count += 1
        self.total += value
        for k, bound in enumerate(self.BUCKETS):
            if value <= bound:
                self.counts[k] += 1

    def render(self, name: str, labels: str) -> list[str]:
        lines = [
            f'{name}_bucket{{{labels},le="{b}"}} {float(c)}'
            for b, c in zip(self.BUCKETS, self.counts, strict=True)
        ]
        return lines + [
            f'{name}_bucket{{{labels},le="+Inf"}} {float(self.count)}',
            f"{name}_count{{{labels}}} {float(self.count)}",
            f"{name}_sum{{{labels}}} {self.total}",
        ]


@dataclass
class Metrics:
    running: int = 0
    waiting: int = 0
    kv_tokens_in_use: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: float = 0.0  # exact, so the rounded counter stays true to the acceptance over many requests
    ttft: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=Histogram)


@dataclass
class Engine:
    """Everything the HTTP handlers need: served names, limits, auth, and the live metrics."""

    names: list[str]
    root: str
    sizing: Sizing
    api_key: str | None
    auto_tools: bool
    spec_tokens: int
    token_seconds: float
    stuck: bool
    access_log: bool
    slots: threading.Semaphore
    lock: threading.Lock = field(default_factory=threading.Lock)
    metrics: Metrics = field(default_factory=Metrics)
    queue_seconds: float = 0.0  # busy mode: time a request waits behind other clients' prefills
    tuned: bool = True  # seed 004's three kernel flags are all set
    draws: random.Random = field(default_factory=random.Random)

    @contextmanager
    def admitted(self, tokens: int) -> Iterator[None]:
        """Hold a scheduler slot (--max-num-seqs) for one request, keeping running/waiting gauges true."""
        with self.lock:
            self.metrics.waiting += 1
        if self.queue_seconds:
            time.sleep(self.queue_seconds)
        self.slots.acquire()
        with self.lock:
            self.metrics.waiting -= 1
            self.metrics.running += 1
            self.metrics.kv_tokens_in_use += tokens
        try:
            if self.stuck:  # hang-engine: the frontend answers, the engine never does
                threading.Event().wait()
            yield
        finally:
            with self.lock:
                self.metrics.running -= 1
                self.metrics.kv_tokens_in_use -= tokens
            self.slots.release()

    def token_delay(self) -> float:
        """Seconds per generated token now, at the number of sequences running."""
        return self.token_seconds * decode_pace(self.tuned, self.metrics.running)

    def prefill_delay(self, prompt: int) -> float:
        return self.token_seconds * PREFILL_SHARE * prompt

    def record(self, prompt: int, generated: int, ttft: float, e2e: float) -> None:
        with self.lock:
            m = self.metrics
            m.prompt_tokens += prompt
            m.generation_tokens += generated
            m.ttft.observe(ttft)
            m.e2e.observe(e2e)
            if self.spec_tokens:
                acceptance = self.draws.uniform(*(TUNED_ACCEPTANCE if self.tuned else UNTUNED_ACCEPTANCE))
                steps = max(1, math.ceil(generated / (1 + acceptance * self.spec_tokens)))
                m.drafts += steps
                m.draft_tokens += steps * self.spec_tokens
                m.accepted_tokens += steps * self.spec_tokens * acceptance


METRIC_HELP = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:prompt_tokens_total": "Number of prefill tokens processed.",
    "vllm:generation_tokens_total": "Number of generation tokens processed.",
    "vllm:spec_decode_num_drafts_total": "Number of spec decoding drafts.",
    "vllm:spec_decode_num_draft_tokens_total": "Number of draft tokens.",
    "vllm:spec_decode_num_accepted_tokens_total": "Number of accepted tokens.",
    "vllm:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "vllm:e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
}


def render_metrics(engine: Engine) -> str:
    """/metrics in Prometheus text format; spec-decode counters only when --speculative-config is set."""
    labels = f'engine="0",model_name="{engine.names[0]}"'
    with engine.lock:
        m = engine.metrics
        values = {
            "vllm:num_requests_running": m.running,
            "vllm:num_requests_waiting": m.waiting,
            "vllm:kv_cache_usage_perc": m.kv_tokens_in_use / max(1, engine.sizing.kv_tokens),
            "vllm:prompt_tokens_total": m.prompt_tokens,
            "vllm:generation_tokens_total": m.generation_tokens,
        }
        if engine.spec_tokens:
            values["vllm:spec_decode_num_drafts_total"] = m.drafts
            values["vllm:spec_decode_num_draft_tokens_total"] = m.draft_tokens
            values["vllm:spec_decode_num_accepted_tokens_total"] = round(m.accepted_tokens)
        lines: list[str] = []
        for name, value in values.items():
            kind = "counter" if name.endswith("_total") else "gauge"
            lines += [f"# HELP {name} {METRIC_HELP[name]}", f"# TYPE {name} {kind}"]
            lines.append(f"{name}{{{labels}}} {float(value)}")
        for name, hist in (
            ("vllm:time_to_first_token_seconds", m.ttft),
            ("vllm:e2e_request_latency_seconds", m.e2e),
        ):
            lines += [
                f"# HELP {name} {METRIC_HELP[name]}",
                f"# TYPE {name} histogram",
                *hist.render(name, labels),
            ]
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------- OpenAI request logic


def count_tokens(text: str) -> int:
    """About four characters per token, like the Qwen tokenizer on English text."""
    return max(1, len(text) // 4)


def _message_text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def chat_prompt_tokens(body: dict[str, Any]) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages: Field required", param="messages")
    text = sum(count_tokens(_message_text(m.get("content"))) + 4 for m in messages)
    return text + (count_tokens(json.dumps(body["tools"])) if body.get("tools") else 0)


def completion_prompt_tokens(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if prompt is None:
        raise ApiError(400, "prompt: Field required", param="prompt")
    if isinstance(prompt, list):
        return sum(
            len(p) if isinstance(p, list) else 1 if isinstance(p, int) else count_tokens(p) for p in prompt
        )
    return count_tokens(str(prompt))


def planned_tokens(body: dict[str, Any], prompt: int, max_model_len: int) -> int:
    """How many tokens to generate: the reply's natural length, capped by max_tokens and the context;
    all of max_tokens with `ignore_eos` (vLLM's sampling parameter, which `vllm bench` sets)."""
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ApiError(400, f"max_tokens must be at least 1, got {limit}.", param="max_tokens")
    wanted = limit if limit is not None else len(REPLY_WORDS)
    if prompt + wanted > max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt + wanted} tokens ({prompt} in the messages, {wanted} in the completion). Please "
            "reduce the length of the messages or completion.",
        )
    return wanted if body.get("ignore_eos") and limit is not None else min(wanted, len(REPLY_WORDS))


def _sample_value(name: str, schema: dict[str, Any]) -> Any:
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    typed = {"integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}
    return typed[kind] if kind in typed else SAMPLE_STRINGS.get(name.lower(), f"example {name}")


def pick_tool(body: dict[str, Any], auto_tools: bool) -> dict[str, Any] | None:
    """The function the stand-in 'decides' to call, or None for a text answer, by vLLM's tool_choice rules."""
    tools = body.get("tools") or []
    choice = body.get("tool_choice", "auto" if tools else "none")
    if not tools or choice == "none":
        return None
    if choice == "auto" and not auto_tools:
        raise ApiError(
            400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
        )
    functions = [t.get("function", {}) for t in tools]
    if isinstance(choice, dict):
        wanted = choice.get("function", {}).get("name")
        named = [f for f in functions if f.get("name") == wanted]
        if not named:
            raise ApiError(400, f"Tool '{wanted}' has not been passed in `tools`.", param="tool_choice")
        return named[0]
    return functions[0]


def tool_call(function: dict[str, Any]) -> dict[str, Any]:
    params = function.get("parameters") or {}
    props = params.get("properties", {})
    arguments = {name: _sample_value(name, props.get(name, {})) for name in params.get("required", [])}
    return {
        "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
        "type": "function",
        "function": {"name": function.get("name", ""), "arguments": json.dumps(arguments)},
    }


def usage(prompt: int, generated: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + generated,
        "completion_tokens": generated,
        "prompt_tokens_details": None,
    }


# ------------------------------------------------------------------------------------------ HTTP layer


class Handler(BaseHTTPRequestHandler):
    """The OpenAI-compatible routes of vLLM's FastAPI app, with its API-key middleware on /v1."""

    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    server: StandinHTTPServer

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        engine = self.server.engine
        key = engine.api_key
        if (
            path.startswith("/v1")
            and key is not None
            and self.headers.get("Authorization") != f"Bearer {key}"
        ):
            return self._json(401, {"error": "Unauthorized"})
        routes = {
            "/health": {"GET": self._empty},
            "/ping": {"GET": self._empty, "POST": self._empty},
            "/version": {"GET": lambda: self._json(200, {"version": VERSION})},
            "/metrics": {"GET": lambda: self._text(200, render_metrics(engine), "text/plain; version=0.0.4")},
            "/v1/models": {"GET": self._models},
            "/v1/chat/completions": {"POST": lambda: self._generate(raw, chat=True)},
            "/v1/completions": {"POST": lambda: self._generate(raw, chat=False)},
        }
        if path not in routes:
            return self._json(404, {"detail": "Not Found"})
        if method not in routes[path]:
            return self._json(405, {"detail": "Method Not Allowed"})
        try:
            routes[path][method]()
        except ApiError as err:
            self._json(err.status, err.body())
        # A body of the wrong shape: vLLM's pydantic models reject it with a 400.
        except (AttributeError, KeyError, TypeError) as err:
            self._json(400, ApiError(400, f"Invalid request body: {err!r}").body())

    def _empty(self) -> None:
        self._text(200, "", "application/json")

    def _models(self) -> None:
        engine = self.server.engine
        cards = [
            {
                "id": name,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "vllm",
                "root": engine.root,
                "parent": None,
                "max_model_len": engine.sizing.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{uuid.uuid4().hex}",
                        "object": "model_permission",
                        "allow_sampling": True,
                        "allow_view": True,
                        "is_blocking": False,
                    }
                ],
            }
            for name in engine.names
        ]
        self._json(200, {"object": "list", "data": cards})

    def _generate(self, raw: bytes, chat: bool) -> None:
        engine = self.server.engine
        try:
            body = json.loads(raw or b"{}")
        except ValueError as err:
            raise ApiError(400, f"JSON decode error: {err}") from err
        name = body.get("model") or engine.names[0]
        if name not in engine.names:
            raise ApiError(404, f"The model `{name}` does not exist.", kind="NotFoundError", param="model")
        prompt = chat_prompt_tokens(body) if chat else completion_prompt_tokens(body)
        function = pick_tool(body, engine.auto_tools) if chat else None
        n = planned_tokens(body, prompt, engine.sizing.max_model_len)
        stops = n == len(REPLY_WORDS) and not body.get("ignore_eos")
        reply = Reply(
            name=name,
            chat=chat,
            prompt=prompt,
            tokens=n,
            call=tool_call(function) if function else None,
            finish="tool_calls" if function else ("stop" if stops else "length"),
        )
        start = time.monotonic()
        with engine.admitted(prompt + n):
            time.sleep(engine.prefill_delay(prompt))
            if body.get("stream"):
                ttft = self._stream(reply, body, engine, start)
            else:
                delay = engine.token_delay()
                time.sleep(delay * n)
                ttft = time.monotonic() - start - delay * (n - 1)
                self._json(200, reply.full())
        engine.record(prompt, n, ttft, time.monotonic() - start)

    def _stream(self, reply: Reply, body: dict[str, Any], engine: Engine, start: float) -> float:
        """Server-sent events as vLLM streams them, each token at the engine's pace; returns the time to first
        token."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        ttft = None
        for tokens, chunk in reply.chunks():
            time.sleep(engine.token_delay() * tokens)
            if tokens and ttft is None:
                ttft = time.monotonic() - start
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if (body.get("stream_options") or {}).get("include_usage"):
            self.wfile.write(f"data: {json.dumps(reply.usage_chunk())}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        return ttft or 0.0

    def _json(self, status: int, obj: Any) -> None:
        self._text(status, json.dumps(obj), "application/json")

    def _text(self, status: int, text: str, content_type: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if self.server.engine.access_log:
            status = (
                f"{int(code)} {self.responses.get(int(code), ('',))[0]}" if isinstance(code, int) else code
            )
            host, port = self.client_address[:2]
            print(
                f'(APIServer pid={os.getpid()}) INFO:     {host}:{port} - "{self.requestline}" {status}',
                flush=True,
            )

    def log_message(self, format: str, *args: Any) -> None:
        """Silence http.server's own stderr lines; log_request prints uvicorn-style access lines instead."""


@dataclass
class Reply:
    """One generated answer: text or a tool call, rendered whole or as stream chunks."""

    name: str
    chat: bool
    prompt: int
    tokens: int
    call: dict[str, Any] | None
    finish: str
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def words(self) -> tuple[str, ...]:
        """The sentence, cut at the token count or said again until it is reached."""
        return () if self.call else tuple(REPLY_WORDS[k % len(REPLY_WORDS)] for k in range(self.tokens))

    def _envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        prefix = "chatcmpl" if self.chat else "cmpl"
        return {
            "id": f"{prefix}-{self.rid}",
            "object": kind,
            "created": self.created,
            "model": self.name,
            "choices": choices,
        }

    def full(self) -> dict[str, Any]:
        text = " ".join(self.words)
        if self.chat:
            message = {
                "role": "assistant",
                "content": None if self.call else text,
                "refusal": None,
                "tool_calls": [self.call] if self.call else [],
                "reasoning_content": None,
            }
            choice = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": self.finish,
                "stop_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": self.finish,
                "stop_reason": None,
            }
        body = self._envelope("chat.completion" if self.chat else "text_completion", [choice])
        return {**body, "usage": usage(self.prompt, self.tokens)}

    def chunks(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """(tokens it carries, chunk): role chunk, a chunk per token or the whole tool call, finish chunk."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        if self.chat:
            yield 0, self._envelope(kind, [{"index": 0, "delta": {"role": "assistant", "content": ""}}])
        if self.call:
            delta = {"tool_calls": [{"index": 0, **self.call}]}
            yield self.tokens, self._envelope(kind, [{"index": 0, "delta": delta, "finish_reason": None}])
        for k, word in enumerate(self.words):
            piece = word if k == 0 else " " + word
            part = {"delta": {"content": piece}} if self.chat else {"text": piece}
            yield 1, self._envelope(kind, [{"index": 0, **part, "finish_reason": None}])
        last = {"delta": {}} if self.chat else {"text": ""}
        yield 0, self._envelope(kind, [{"index": 0, **last, "finish_reason": self.finish}])

    def usage_chunk(self) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._envelope(kind, []), "usage": usage(self.prompt, self.tokens)}


class StandinHTTPServer(ThreadingHTTPServer):
    """Bound early, listening only once 'weights are loaded': connections are refused while loading."""

    daemon_threads = True
    block_on_close = False

    engine: Engine  # set once the weights are "loaded", before the socket listens

    def __init__(self, address: tuple[str, int]) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, Handler, bind_and_activate=False)
        self.draining = False  # --shutdown-timeout: after SIGTERM, refuse new requests, finish running ones
        self.in_flight = 0
        self._count = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        if self.draining:
            request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._count:
            self.in_flight += 1
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._count:
                self.in_flight -= 1

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the FQDN, which stalls in containers without DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up (a probe's timeout while busy) is no server error: uvicorn logs none either."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def other_clients(engine: Engine) -> NoReturn:
    """busy mode: long-context requests from other clients keep sequences running and tokens coming."""
    with engine.lock:
        engine.metrics.running += BUSY_SEQUENCES
        engine.metrics.kv_tokens_in_use += engine.sizing.kv_tokens // 2
    while True:
        time.sleep(0.1)
        with engine.lock:
            engine.metrics.generation_tokens += BUSY_TOKENS_PER_SECOND // 10


def crash_after(seconds: float) -> None:
    """crash-after-load mode: the engine core dies mid-serving, the API server follows, the process exits 1."""
    time.sleep(seconds)
    engine_dead(trace("busy_loop"), "torch.AcceleratorError: CUDA error: an illegal memory access was encountered")


def engine_dead(frames: list[str], final: str) -> NoReturn:
    """The engine core dies with `final`; the API server's output handler follows with EngineDeadError."""
    where = "core.py:710"
    engine_log("EngineCore encountered a fatal error.", where, level="ERROR")
    for line in format_traceback(frames, final):
        engine_log(line, where, level="ERROR")
    log("AsyncLLM output_handler failed.", "async_llm.py:480", level="ERROR")
    lines = format_traceback(
        trace("output_handler"),
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
        "for the root cause.",
    )
    sys.stdout.flush()
    os.write(2, ("\n".join(lines) + "\n").encode())
    os._exit(1)  # from a thread: the serving loop must not outlive its engine


def hold_connections(sock: socket.socket) -> NoReturn:
    """hang mode: accept every connection and never answer, like a deadlocked server."""
    held: list[socket.socket] = []
    while True:
        conn, _ = sock.accept()
        held.append(conn)


# ------------------------------------------------------------------------------------------- multi-node

HEARTBEAT_MISSES = 5
HELLO_SECONDS = 10  # a worker says hello at once; a connection silent this long is a port probe
GLOO_PAIR = "/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534"


def heartbeat_seconds() -> float:
    return float(os.environ.get("VLLM_STANDIN_HEARTBEAT_SECONDS", "2"))


def join_seconds() -> float:
    return float(os.environ.get("VLLM_STANDIN_JOIN_SECONDS", "600"))


def torch_warning(where: str, msg: str) -> None:
    """A c10d warning as torch prints it (glog style, not vLLM's format)."""
    stamp = time.strftime("%m%d %H:%M:%S")
    print(f"[W{stamp}.000000000 {where}] [c10d] {msg}", flush=True)


@dataclass(frozen=True)
class Topology:
    """Where this process sits in a run across nodes; one node of one rank when --nnodes is not given."""

    nnodes: int
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    headless: bool

    @classmethod
    def of(cls, args: ServeArgs) -> Topology:
        # ParallelConfig's defaults: master_addr 127.0.0.1, master_port 29501.
        world = int(args.get("tensor-parallel-size", 1)) * int(args.get("pipeline-parallel-size", 1))
        return cls(int(args.get("nnodes", 1)), int(args.get("node-rank", 0)), world,
                   args.get("master-addr") or "127.0.0.1", int(args.get("master-port", 29501)),
                   bool(args.get("headless")))

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1

    @property
    def address(self) -> str:
        return f"{self.master_addr}:{self.master_port}"


def validate_topology(topo: Topology) -> None:
    """ParallelConfig's checks of --nnodes and --node-rank."""
    if topo.multi_node and topo.world_size % topo.nnodes:
        raise Fatal(f"AssertionError: world_size={topo.world_size} must be divisible by nnodes={topo.nnodes}.",
                    trace("entry", "cli", "parallel"))
    if topo.multi_node and topo.rank >= topo.nnodes:
        raise Fatal(f"AssertionError: node_rank={topo.rank} must be less than nnodes={topo.nnodes}.",
                    trace("entry", "cli", "parallel"))
    if topo.multi_node and topo.rank > 0 and not topo.headless:
        # A worker node without --headless starts an engine core of its own, which cannot lead (vllm #23691 era).
        raise Fatal("AssertionError: collective_rpc should not be called on follower node", trace("engine", "kv"))
    if topo.headless and topo.rank == 0:
        # Node rank 0 with --headless starts data-parallel engines for another head: not what a pair runs.
        print("vllm-standin: --headless is covered on a worker node (--node-rank 1 and up) only", file=sys.stderr)
        sys.exit(3)


class PeerLost(Exception):
    """The other node went away: its connection closed, or its heartbeats stopped."""

    def __init__(self, closed: bool, peer: tuple[str, int], local: tuple[str, int]) -> None:
        super().__init__("closed" if closed else "silent")
        self.closed, self.peer, self.local = closed, peer, local

    def gloo_error(self) -> str:
        """The error a gloo collective with that peer ends in."""
        if self.closed:
            return f"[{GLOO_PAIR}] Connection closed by peer [{self.peer[0]}]:{self.peer[1]}"
        waited = int(heartbeat_seconds() * HEARTBEAT_MISSES * 1000)
        return ("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                f"{waited}ms for recv operation to complete")


class Link:
    """The head-worker connection that stands in for torch.distributed's store and gloo pairs: JSON lines, and an
    empty line every heartbeat both ways from the moment the nodes joined."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.peer = sock.getpeername()[:2]
        self.local = sock.getsockname()[:2]
        self.reader = sock.makefile("rb")
        self._send = threading.Lock()
        threading.Thread(target=self._beat, daemon=True).start()

    def send(self, message: dict[str, Any]) -> None:
        with self._send:
            self.sock.sendall(json.dumps(message).encode() + b"\n")

    def _beat(self) -> None:
        while True:
            time.sleep(heartbeat_seconds())
            try:
                with self._send:
                    self.sock.sendall(b"\n")
            except OSError:
                return  # the reader notices the peer is gone

    def receive(self, timeout: float) -> dict[str, Any]:
        """The next message, skipping heartbeats; PeerLost when the peer closes or says nothing for `timeout`."""
        while True:
            self.sock.settimeout(timeout)
            try:
                line = self.reader.readline()
            except TimeoutError as err:
                raise PeerLost(False, self.peer, self.local) from err
            except OSError as err:
                raise PeerLost(True, self.peer, self.local) from err
            if not line:
                raise PeerLost(True, self.peer, self.local)
            if line.strip():
                return json.loads(line)

    def watch(self, on_lost: Callable[[PeerLost], None]) -> None:
        """From now on the peer only sends heartbeats: call `on_lost` when they stop or the connection closes."""

        def run() -> None:
            try:
                message = self.receive(heartbeat_seconds() * HEARTBEAT_MISSES)
            except PeerLost as lost:
                on_lost(lost)
                return
            raise AssertionError(f"unexpected message from the other node: {message}")

        threading.Thread(target=run, daemon=True).start()


def rank_assigned(topo: Topology) -> None:
    log(f"rank {topo.rank} in world size {topo.world_size} is assigned as DP rank 0, PP rank 0, PCP rank 0, "
        f"TP rank {topo.rank}, EP rank {topo.rank}", "parallel_state.py:1423", proc=f"Worker_TP{topo.rank}")


def accept_worker(topo: Topology) -> Link:
    """The head's engine: host the store on master_addr:master_port and wait there for the worker."""
    listener = socket.socket(socket.AF_INET6 if ":" in topo.master_addr else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((topo.master_addr, topo.master_port))
    except OSError as err:
        raise Fatal(f"torch.distributed.DistNetworkError: The server socket has failed to bind to "
                    f"[{topo.master_addr}]:{topo.master_port} (errno: {err.errno} - {err.strerror}).",
                    trace("engine", "store")) from err
    listener.listen(1)
    engine_log(f"DP group leader: node_rank=0, node_rank_within_dp=0, master_addr={topo.master_addr}, "
               f"mq_connect_ip={topo.master_addr} (local), world_size={topo.world_size}, "
               f"local_world_size={topo.world_size // topo.nnodes}", "multiproc_executor.py:150")
    waited, poll = 0.0, min(10.0, join_seconds())
    listener.settimeout(poll)
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            waited += poll
            if os.environ.get("VLLM_LOGGING_LEVEL", "").upper() == "DEBUG":
                log("Waiting for 1 local, 0 remote core engine proc(s) to start.", "v1/engine/utils.py:982",
                    level="DEBUG")
            if waited >= join_seconds():
                raise Fatal(f"torch.distributed.DistStoreError: Timed out after {int(waited) + 1} seconds waiting "
                            f"for clients. 1/{topo.world_size} clients joined.", trace("engine", "store")) from None
            continue
        link = Link(conn)
        try:
            link.receive(HELLO_SECONDS)  # the worker's hello
        except PeerLost:
            conn.close()  # a port probe (doctor's) connects and says nothing: not a worker joining
            continue
        break
    # torch's TCPStore keeps its port for the engine's life: later connections are accepted, then dropped.
    threading.Thread(target=drop_connections, args=(listener,), daemon=True).start()
    rank_assigned(Topology(topo.nnodes, 0, topo.world_size, topo.master_addr, topo.master_port, False))
    return link


def drop_connections(listener: socket.socket) -> None:
    listener.settimeout(None)
    while True:
        conn, _ = listener.accept()
        conn.close()


def connect_head(topo: Topology) -> Link:
    """A worker node: connect to the head's store, retrying while nothing listens there, as c10d does."""
    deadline = time.monotonic() + join_seconds()
    while True:
        try:
            sock = socket.create_connection((topo.master_addr, topo.master_port), timeout=5)
            break
        except OSError as err:
            torch_warning("socket.cpp:767", f"The client socket has failed to connect to [{topo.master_addr}]:"
                                            f"{topo.master_port} (errno: {err.errno} - {err.strerror}).")
            if time.monotonic() > deadline:
                raise Fatal(f"torch.distributed.DistNetworkError: The client socket has timed out after "
                            f"{int(join_seconds() * 1000)}ms while trying to connect to ({topo.master_addr}, "
                            f"{topo.master_port}).", trace("store")) from err
            time.sleep(1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    link = Link(sock)
    link.send({"rank": topo.rank})
    rank_assigned(topo)
    return link


def startup_peer_lost(lost: PeerLost) -> NoReturn:
    """The worker went away before the engine was up: the engine core fails to start, naming the gloo error."""
    engine_log("EngineCore failed to start.", "core.py:843", level="ERROR")
    for line in format_traceback(trace("engine", "rpc"), f"RuntimeError: Worker failed with error "
                                 f"'{lost.gloo_error()}', please check the stack trace above for the root cause"):
        engine_log(line, "core.py:843", level="ERROR")
    raise Fatal("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
                trace("entry", "cli", "startup"))


def worker_lost(lost: PeerLost) -> NoReturn:
    """The head's engine while serving, once its worker is gone: the gloo error in its rank-0 worker, the failed
    RPC in the engine core, EngineDeadError in the API server; exit 1."""
    where = "multiproc_executor.py:838"
    log("WorkerProc hit an exception.", where, proc="Worker_TP0", level="ERROR")
    for line in format_traceback(trace("gloo"), f"RuntimeError: {lost.gloo_error()}"):
        log(line, where, proc="Worker_TP0", level="ERROR")
    engine_dead(trace("busy_loop")[:6] + trace("rpc"), f"RuntimeError: Worker failed with error "
                f"'{lost.gloo_error()}', please check the stack trace above for the root cause")


def head_lost(lost: PeerLost) -> NoReturn:
    """A worker node once its head is gone: c10d cannot reach the store, the local worker dies; exit 1."""
    local, peer = (f"[{host}]:{port}" for host, port in (lost.local, lost.peer))
    detail = "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?" \
        if lost.closed else f"Failed to recv, timed out after {int(heartbeat_seconds() * HEARTBEAT_MISSES)} s."
    torch_warning("TCPStore.cpp:125", f"recvValue failed on SocketImpl(addr={local}, remote={peer}): {detail}")
    log("Worker proc VllmWorker-1 died unexpectedly, shutting down executor.", "multiproc_executor.py:563",
        proc="", level="ERROR")
    os._exit(1)


def run_headless(args: ServeArgs, topo: Topology, mode: str) -> NoReturn:
    """`vllm serve --headless` on a worker node: no API server; join the head, load this rank's weights, then
    hold its part of the engine until the head goes away."""
    log(f"Launching vLLM (v{VERSION}) headless multiproc executor, with head node address {topo.address} for "
        "torch.distributed process group.", "serve.py:216", proc="")
    model_dir = resolve_model_dir(args.model, args.get("revision") or "main")
    load_text_config(model_dir, args.model)
    shards = weight_files(model_dir, args.model)
    link = connect_head(topo)
    load_weights(shards, float(os.environ.get("VLLM_STANDIN_LOAD_SECONDS", "240" if mode == "slow" else "5")),
                 proc=f"Worker_TP{topo.rank}")
    link.send({"loaded": True})
    if mode == "crash-cutlass" and "CutlassFp8" not in os.environ.get("VLLM_DISABLED_KERNELS", ""):
        crash_cutlass(args)
    link.watch(head_lost)
    threading.Event().wait()
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------------------------- startup


def read_mode() -> str:
    mode = os.environ.get("VLLM_STANDIN_MODE") or (
        MODE_FILE.read_text().strip() if MODE_FILE.is_file() else "ok"
    )
    if mode not in MODES:
        print(f"vllm-standin: unknown mode {mode!r} (expected one of {', '.join(MODES)})", file=sys.stderr)
        sys.exit(3)
    return mode


# What SIGTERM needs: the serving socket and vLLM's --shutdown-timeout (0, the default, aborts at once).
SHUTDOWN: dict[str, Any] = {"server": None, "timeout": 0.0, "headless": False}


def on_signal(signum: int, frame: object) -> None:
    """docker stop sends SIGTERM to PID 1. With --shutdown-timeout N (vLLM PRs #34730, #36666) new requests are
    refused and running ones get up to N s to finish; without it the server shuts down at once, as uvicorn does."""
    server = SHUTDOWN["server"]
    if server is not None and SHUTDOWN["timeout"] > 0 and not server.draining:
        server.draining = True
        threading.Thread(target=drain, args=(server, SHUTDOWN["timeout"]), daemon=True).start()
        return
    exit_now()


def drain(server: StandinHTTPServer, timeout: float) -> None:
    os.write(1, f"(APIServer pid={os.getpid()}) INFO:     Graceful shutdown: waiting up to {timeout:g} s for "
                f"{server.in_flight} in-flight requests\n".encode())
    deadline = time.monotonic() + timeout
    while server.in_flight > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    exit_now()


def exit_now() -> None:
    if SHUTDOWN["headless"]:
        os._exit(0)  # no API server to shut down; the head sees this node go
    lines = ("Shutting down", "Waiting for application shutdown.", "Application shutdown complete.")
    os.write(1, "".join(f"(APIServer pid={os.getpid()}) INFO:     {line}\n" for line in lines).encode())
    os._exit(0)  # no buffered print from a signal handler: it may interrupt another print


def bind_server(args: ServeArgs) -> StandinHTTPServer:
    host, port = args.get("host") or "0.0.0.0", int(args.get("port", 8000))
    try:
        server = StandinHTTPServer((host, port))
        server.server_bind()
    except OSError as err:
        raise Fatal(
            f"OSError: [Errno {err.errno}] {err.strerror}", trace("entry", "cli", "setup", "bind")
        ) from err
    return server


def load_weights(shards: list[Path], seconds: float, proc: str = "EngineCore_DP0") -> float:
    """Spend the load time shard by shard, failing at the first shard safetensors cannot open."""
    start = time.monotonic()
    for k, shard in enumerate(shards, 1):
        check_safetensors(shard)
        time.sleep(seconds / len(shards))
        pct = 100 * k // len(shards)
        progress = f"Loading safetensors checkpoint shards: {pct:3d}% Completed | {k}/{len(shards)}"
        print(f"({proc} pid={os.getpid()}) {progress}", flush=True)
    took = time.monotonic() - start
    log(f"Loading weights took {took:.2f} seconds", "default_loader.py:267", proc=proc)
    return took


def crash_cutlass(args: ServeArgs) -> NoReturn:
    """GB10's FP8 failure on stable images (vllm #40758): at graph capture, or in the profile run if eager."""
    stage = "profile" if args.get("enforce-eager") else "capture"
    frames = trace("engine", stage, "kernel")
    engine_log("EngineCore failed to start.", "core.py:843", level="ERROR")
    for line in format_traceback(frames, "RuntimeError: Error Internal"):
        engine_log(line, "core.py:843", level="ERROR")
    die(
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
        trace("entry", "cli", "startup"),
    )


def build_engine(args: ServeArgs, sizing: Sizing, mode: str) -> Engine:
    spec = json.loads(args.get("speculative-config") or "{}")
    spec = spec if isinstance(spec, dict) else {}
    return Engine(
        names=args.get("served-model-name") or [args.model],
        root=args.model,
        sizing=sizing,
        api_key=args.get("api-key") or os.environ.get("VLLM_API_KEY"),
        auto_tools=bool(args.get("enable-auto-tool-choice")),
        spec_tokens=int(spec.get("num_speculative_tokens", 1)) if spec else 0,
        token_seconds=float(os.environ.get("VLLM_STANDIN_TOKEN_SECONDS", "0.01")),
        stuck=mode == "hang-engine",
        access_log=not args.get("disable-uvicorn-access-log"),
        slots=threading.Semaphore(int(args.get("max-num-seqs", 256))),
        queue_seconds=float(os.environ.get("VLLM_STANDIN_BUSY_SECONDS", "90")) if mode == "busy" else 0.0,
        tuned=tuned(args),
    )


def start_engine(args: ServeArgs, mode: str, topo: Topology) -> tuple[Sizing, Link | None]:
    """Resolve the model, wait for the worker node if there is one, 'load' this rank's weights and size the KV
    cache once every node has loaded, logging what vLLM logs on the way."""
    model_dir = resolve_model_dir(args.model, args.get("revision") or "main")
    text_config = load_text_config(model_dir, args.model)
    engine_log(f"Resolved architecture: {(text_config['architectures'] or ['?'])[0]}", "model.py:547")
    shards = weight_files(model_dir, args.model)
    weight_bytes = sum(p.stat().st_size for p in shards if p.is_file())
    sizing = plan_sizing(args, text_config, weight_bytes)
    log(f"Using max model len {sizing.max_model_len}", "model.py:1510")
    engine_log(
        f"Initializing a V1 LLM engine (v{VERSION}) with config: model='{args.model}', "
        f"speculative_config={args.get('speculative-config')}, max_seq_len={sizing.max_model_len}",
        "core.py:77",
    )
    link = accept_worker(topo) if topo.multi_node else None
    engine_log(f"Starting to load model {args.model}...", "gpu_model_runner.py:2602")
    default = "240" if mode == "slow" else "5"
    took = load_weights(shards, float(os.environ.get("VLLM_STANDIN_LOAD_SECONDS", default)))
    engine_log(
        f"Model loading took {weight_bytes / topo.world_size / 2**30:.4f} GiB and {took:.2f} seconds",
        "gpu_model_runner.py:2653",
    )
    if link is not None:
        try:
            link.receive(join_seconds())  # the worker has loaded its shard
        except PeerLost as lost:
            startup_peer_lost(lost)
    # VLLM_DISABLED_KERNELS=CutlassFp8BlockScaledMMKernel is the documented way around the crash.
    crashes = mode == "crash-cutlass" and "CutlassFp8" not in os.environ.get("VLLM_DISABLED_KERNELS", "")
    if crashes and args.get("enforce-eager"):
        crash_cutlass(args)
    check_kv_fits(sizing)
    engine_log(f"GPU KV cache size: {sizing.kv_tokens:,} tokens", "kv_cache_utils.py:1087")
    engine_log(
        f"Maximum concurrency for {sizing.max_model_len:,} tokens per request: "
        f"{sizing.kv_tokens / sizing.max_model_len:.2f}x",
        "kv_cache_utils.py:1091",
    )
    if crashes:
        engine_log("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 0%", "gpu_model_runner.py:3590")
        crash_cutlass(args)
    return sizing, link


def serve(argv: list[str]) -> None:
    spec = FlagSpec.load(Path(os.environ.get("VLLM_STANDIN_DATA", DEFAULT_DATA_DIR)))
    try:
        args = parse_serve_args(argv, spec)
    except UsageError as err:
        print(f"{USAGE}\nvllm serve: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    mode = read_mode()
    topo = Topology.of(args)
    try:
        validate_serve_args(args)
        validate_topology(topo)
        if topo.headless:
            SHUTDOWN["headless"] = True
            run_headless(args, topo, mode)
        log(f"vLLM API server version {VERSION}", "api_server.py:1896")
        log(f"non-default args: {non_default_args(args)}", "utils.py:253")
        validate_api_server_args(args, spec)
        server = bind_server(args)
        sizing, link = start_engine(args, mode, topo)
    except Fatal as err:
        die(err.final, err.frames)
    server.engine = build_engine(args, sizing, mode)
    SHUTDOWN.update(server=server, timeout=float(args.get("shutdown-timeout") or 0))
    server.server_activate()
    host, port = server.server_name, server.server_port
    log(f"Starting vLLM API server 0 on http://{host}:{port}", "api_server.py:1971")
    for line in (
        f"Started server process [{os.getpid()}]",
        "Waiting for application startup.",
        "Application startup complete.",
    ):
        print(f"(APIServer pid={os.getpid()}) INFO:     {line}", flush=True)
    if link is not None:
        link.watch(worker_lost)
    if mode == "hang":
        hold_connections(server.socket)
    if mode == "busy":
        threading.Thread(target=other_clients, args=(server.engine,), daemon=True).start()
    if mode == "crash-after-load":
        seconds = float(os.environ.get("VLLM_STANDIN_CRASH_SECONDS", "10"))
        threading.Thread(target=crash_after, args=(seconds,), daemon=True).start()
    server.serve_forever()


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if argv[:1] == ["--version"]:
        print(VERSION)
        return
    if argv[:1] != ["serve"]:
        print(
            "usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...\n"
            f"vllm: error: argument subparser: invalid choice: {(argv or [''])[0]!r}",
            file=sys.stderr,
        )
        sys.exit(2)
    serve(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
