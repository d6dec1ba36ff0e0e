"""The one typed object the vLLM unit template receives, and systemd's quoting rules."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkfleet.endpoint import CONTAINER, ENV_FILE, LOADED_WEIGHTS, MANIFEST, PAIR_TENSOR_PARALLEL, Endpoint
from sparkfleet.vllm_flags import flag_set, to_argv

SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
START_LIMIT_BURST = 4  # failed starts before systemd gives up (a crash loop leaks GB10 memory: #257)
RESTART_SEC = 30
# Seconds between docker's SIGTERM and its SIGKILL beyond vLLM's own --shutdown-timeout, and between that
# and systemd's stop timeout: each layer must outlast the one it waits for.
STOP_MARGIN = 15


def systemd_quote(arg: str) -> str:
    """Quote one ExecStart word: systemd expands % specifiers and $VARS, and splits on spaces."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if SAFE.match(arg) and "%" not in arg:
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class UnitView:
    """Everything `templates/vllm/sparkfleet-vllm.service.j2` prints, already quoted."""

    description: str
    container: str
    image: str
    env_file: str
    weights_dir: str
    model_path: str
    port: int
    served_name: str
    vllm_args: list[str]  # one quoted `--flag [value]` per line
    serves: bool  # the OpenAI API on --host/--port: not on a pair's worker, which runs headless
    environment: list[str]  # quoted NAME=value for `--env` (a pair's fabric interface and RoCE devices)
    node_args: list[str]  # a pair's multi-node flags, one per line, after the recipe's
    start_limit_interval: int  # long enough that START_LIMIT_BURST slow crash loops fit in it
    start_limit_burst: int
    restart_sec: int
    docker_stop_timeout: int  # above vLLM's --shutdown-timeout, so in-flight requests finish
    stop_timeout: int  # systemd's, above docker's
    manifest: str
    loaded_weights: str

    @classmethod
    def of(cls, spark: Endpoint) -> UnitView:
        argv = to_argv(spark.args, flag_set(spark.recipe.vllm_version))
        return cls(
            description=f"vLLM endpoint {spark.served_name} ({spark.recipe.name}){_role(spark)}",
            container=CONTAINER, image=systemd_quote(spark.image), env_file=ENV_FILE,
            weights_dir=systemd_quote(spark.weights_dir), model_path=systemd_quote(spark.container_model_path),
            port=spark.config.vllm_port, served_name=systemd_quote(spark.served_name),
            vllm_args=_lines(argv), serves=spark.role != "worker",
            environment=[systemd_quote(f"{name}={value}") for name, value in pair_environment(spark).items()],
            node_args=_lines(node_argv(spark)),
            start_limit_interval=START_LIMIT_BURST * (spark.recipe.load_timeout_seconds + RESTART_SEC),
            start_limit_burst=START_LIMIT_BURST, restart_sec=RESTART_SEC,
            docker_stop_timeout=shutdown_timeout(spark) + STOP_MARGIN,
            stop_timeout=shutdown_timeout(spark) + 2 * STOP_MARGIN,
            manifest=systemd_quote(f"{spark.weights_dir}/{MANIFEST}"), loaded_weights=LOADED_WEIGHTS,
        )


def _role(spark: Endpoint) -> str:
    pair = spark.config.pair
    if pair is None:
        return ""
    return f", head of pair {pair.name}" if spark.role == "head" else f", worker of pair {pair.name} (serves no API)"


def node_argv(spark: Endpoint) -> list[str]:
    """vLLM's multi-node flags for a pair host (none for a standalone Spark): both nodes meet at the head's
    master address and port; the worker (node rank 1) runs headless, without an API server."""
    pair = spark.config.pair
    if pair is None:
        return []
    rank = 0 if spark.role == "head" else 1
    argv = ["--nnodes", str(PAIR_TENSOR_PARALLEL), "--node-rank", str(rank), "--master-addr", pair.master_addr,
            "--master-port", str(pair.master_port)]
    return argv if rank == 0 else [*argv, "--headless"]


def pair_environment(spark: Endpoint) -> dict[str, str]:
    """NCCL, Gloo and vLLM's own sockets pinned to the fabric interface, and NCCL's RoCE devices: left to guess,
    they pick the first interface up (often the LAN) and the pair hangs or crawls."""
    pair = spark.config.pair
    if pair is None:
        return {}
    names = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
    environment = dict.fromkeys(names, pair.interface)
    if pair.ib_hca:
        environment["NCCL_IB_HCA"] = ",".join(pair.ib_hca)
    return environment


def shutdown_timeout(spark: Endpoint) -> int:
    """vLLM's graceful-stop window (`--shutdown-timeout`, default 0: in-flight requests are aborted)."""
    value = str(spark.args.get("shutdown-timeout", 0))
    return int(value) if value.isdigit() else 0


def _lines(argv: list[str]) -> list[str]:
    """One flag and its value per line, so the unit reads like the recipe."""
    lines: list[str] = []
    for arg in argv:
        if arg.startswith("--") or not lines:
            lines.append(systemd_quote(arg))
        else:
            lines[-1] += " " + systemd_quote(arg)
    return lines
