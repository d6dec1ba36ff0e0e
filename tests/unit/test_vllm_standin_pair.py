"""The vLLM stand-in across two nodes (`--nnodes 2`, the worker `--headless`), run as two local processes on
127.0.0.1: the head serves only once its worker joined, and each dies the way vLLM does when the other goes."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.lab.standins.model import generate_checkpoint
from tests.unit.test_vllm_standin import Standin, free_port, http, run_to_exit, standin_argv, standin_env

HEARTBEAT = 0.2  # seconds; a peer silent for five of them is gone
Pair = Callable[..., Standin]


def node_flags(rank: int, master_port: int) -> list[str]:
    """What a pair's unit gives each node: TP 2 across two nodes, the worker headless."""
    return ["--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1",
            "--master-port", str(master_port), *(["--headless"] if rank else [])]


@pytest.fixture
def node(data_dir: Path, model_dir: Path, tmp_path: Path) -> Iterator[Pair]:
    """Start one node of a pair; every node started is killed at the end of the test."""
    started: list[Standin] = []

    def start(rank: int, master_port: int, model: Path | None = None, **env: str) -> Standin:
        port = free_port()
        log = tmp_path / f"node-{len(started)}-rank{rank}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                standin_argv(model or model_dir, tuple(node_flags(rank, master_port)), port), stdout=out,
                stderr=subprocess.STDOUT,
                env=standin_env(data_dir, 0.3, VLLM_STANDIN_HEARTBEAT_SECONDS=str(HEARTBEAT), **env))
        started.append(Standin(proc, port, log))
        return started[-1]

    yield start
    for standin in started:
        if standin.proc.poll() is None:
            standin.proc.send_signal(signal.SIGCONT)
            standin.proc.kill()
        standin.proc.wait()


def refused(port: int) -> bool:
    try:
        http(port, "/health", timeout=1)
    except urllib.error.URLError as err:
        return isinstance(err.reason, ConnectionRefusedError)
    return False


def exit_code(standin: Standin, timeout: float = 10) -> int:
    try:
        return standin.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running after {timeout}s:\n{standin.output()}") from None


@pytest.fixture
def serving(node: Pair) -> tuple[Standin, Standin]:
    """A head and its worker, joined and serving."""
    master = free_port()
    head, worker = node(0, master), node(1, master)
    head.wait_ready(timeout=15)
    return head, worker


def test_head_refuses_connections_until_its_worker_joined(node: Pair, model_dir: Path) -> None:
    master = free_port()
    head = node(0, master)
    head.wait_for_log("DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=127.0.0.1")
    time.sleep(1.5)  # five times its load time: it waits for the worker, not for weights
    assert refused(head.port) and head.proc.poll() is None
    assert "Loading safetensors" not in head.output()  # the engine loads only once the world has joined
    node(1, master)
    head.wait_ready(timeout=15)
    status, body = http(head.port, "/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == str(model_dir)
    assert "rank 0 in world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0" in head.output()


def test_worker_serves_no_http_and_says_where_its_head_is(serving: tuple[Standin, Standin]) -> None:
    _, worker = serving
    worker.wait_for_log("rank 1 in world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 1")
    out = worker.output()
    assert "Launching vLLM (v0.28.0) headless multiproc executor, with head node address 127.0.0.1:" in out
    assert "Loading weights took" in out
    assert refused(worker.port) and worker.proc.poll() is None


def test_worker_retries_while_the_head_is_not_up(node: Pair) -> None:
    master = free_port()
    worker = node(1, master)
    worker.wait_for_log(f"[c10d] The client socket has failed to connect to [127.0.0.1]:{master} (errno: 111 - "
                        "Connection refused).")
    head = node(0, master)
    head.wait_ready(timeout=15)
    assert worker.proc.poll() is None


def test_a_worker_that_goes_away_kills_the_heads_engine(serving: tuple[Standin, Standin]) -> None:
    head, worker = serving
    worker.proc.kill()
    assert exit_code(head) == 1
    out = head.output()
    assert "(Worker_TP0 pid=" in out and "WorkerProc hit an exception." in out
    assert "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer " \
           "[127.0.0.1]:" in out
    assert "EngineCore encountered a fatal error." in out
    assert "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue." in out


def test_a_silent_worker_is_lost_by_its_heartbeat(serving: tuple[Standin, Standin]) -> None:
    head, worker = serving
    worker.proc.send_signal(signal.SIGSTOP)  # alive, connected, saying nothing (a hung or unplugged node)
    assert exit_code(head) == 1
    assert f"Timed out waiting {int(HEARTBEAT * 5000)}ms for recv operation to complete" in head.output()
    assert "EngineDeadError" in head.output()


def test_a_worker_stops_when_its_head_goes_away(serving: tuple[Standin, Standin]) -> None:
    head, worker = serving
    head.proc.kill()
    assert exit_code(worker) == 1
    out = worker.output()
    assert "[c10d] recvValue failed on SocketImpl(" in out
    assert "Connection was likely closed. Did the remote server shutdown or crash?" in out
    assert "Worker proc VllmWorker-1 died unexpectedly, shutting down executor." in out


def test_sigterm_stops_a_worker_cleanly_and_its_head_with_an_error(serving: tuple[Standin, Standin]) -> None:
    head, worker = serving
    worker.proc.send_signal(signal.SIGTERM)
    assert exit_code(worker) == 0
    assert exit_code(head) == 1


def test_a_worker_that_cannot_load_fails_the_heads_startup(node: Pair, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    generate_checkpoint(broken, total_bytes=64 << 10, shards=2)
    next(broken.glob("*.safetensors")).unlink()
    master = free_port()
    head, worker = node(0, master), node(1, master, model=broken)
    assert exit_code(worker) == 1
    assert "FileNotFoundError: No such file or directory" in worker.output()
    assert exit_code(head) == 1
    out = head.output()
    assert "EngineCore failed to start." in out and "Connection closed by peer [127.0.0.1]:" in out
    assert "RuntimeError: Engine core initialization failed. See root cause above." in out
    assert refused(head.port)


def test_a_head_alone_gives_up_after_the_store_timeout(node: Pair) -> None:
    head = node(0, free_port(), VLLM_STANDIN_JOIN_SECONDS="1")
    assert exit_code(head) == 1
    assert "torch.distributed.DistStoreError: Timed out after" in head.output()
    assert "waiting for clients. 1/2 clients joined." in head.output()


def test_a_worker_alone_gives_up_after_the_store_timeout(node: Pair) -> None:
    master = free_port()
    worker = node(1, master, VLLM_STANDIN_JOIN_SECONDS="1")
    assert exit_code(worker) == 1
    assert (f"torch.distributed.DistNetworkError: The client socket has timed out after 1000ms while trying to "
            f"connect to (127.0.0.1, {master}).") in worker.output()


@pytest.mark.parametrize(("flags", "code", "expected"), [
    (["--nnodes", "2", "--node-rank", "0"], 1, "AssertionError: world_size=1 must be divisible by nnodes=2."),
    (["-tp", "2", "--nnodes", "2", "--node-rank", "2", "--headless"], 1,
     "AssertionError: node_rank=2 must be less than nnodes=2."),
    (["-tp", "2", "--nnodes", "2", "--node-rank", "1"], 1,
     "AssertionError: collective_rpc should not be called on follower node"),
    (["-tp", "2", "--nnodes", "2", "--node-rank", "1", "--headless=yes"], 2,
     "argument --headless: ignored explicit argument 'yes'"),
    (["-tp", "2", "--nnodes", "2", "--master-addr", "203.0.113.77", "--master-port", "29555"], 1,
     "torch.distributed.DistNetworkError: The server socket has failed to bind to [203.0.113.77]:29555 (errno: 99"),
])
def test_rejects_what_vllm_rejects_across_nodes(data_dir: Path, model_dir: Path, flags: list[str], code: int,
                                                 expected: str) -> None:
    result = run_to_exit(data_dir, model_dir, *flags)
    assert result.returncode == code, result.stdout + result.stderr
    assert expected in result.stderr


def test_a_port_probe_is_not_a_worker_and_the_store_keeps_its_port(node: Pair) -> None:
    """doctor connects to the master port and closes at once: the head neither takes it for its worker nor dies
    of it, and its store keeps listening once the pair is up, as torch's TCPStore does."""
    master = free_port()
    head = node(0, master)
    head.wait_for_log("DP group leader: node_rank=0")
    socket.create_connection(("127.0.0.1", master), timeout=2).close()
    node(1, master)
    head.wait_ready(timeout=30)
    socket.create_connection(("127.0.0.1", master), timeout=2).close()
    time.sleep(HEARTBEAT * 3)
    status, _ = http(head.port, "/health")
    assert status == 200 and head.proc.poll() is None
