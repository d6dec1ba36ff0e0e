"""The health check of a pair host: the head notices a lost worker and names it; the worker has no HTTP to probe,
its unit and its link to the head are its health."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparkfleet.remote import healthcheck
from tests.unit.test_healthcheck import SCRIPT, UNIT, Harness, harness  # noqa: F401  (the fixture)

MASTER, WORKER, PORT = "192.168.100.10", "192.168.100.11", 29500
HEAD = {"name": "pair-a", "role": "head", "peer": "pair-02", "master_addr": MASTER, "master_port": PORT,
        "interface": "enp1s0f0np0"}
WORKER_PAIR = HEAD | {"role": "worker", "peer": "pair-01"}
LAUNCH = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import healthcheck; "
          "healthcheck.MEMINFO = sys.argv.pop(1); healthcheck.TCP_TABLES = (sys.argv.pop(1),); "
          "sys.exit(healthcheck.main(sys.argv[1:]))")


def hex_endpoint(address: str, port: int) -> str:
    """An address and port as /proc/net/tcp writes them (each 32-bit word little-endian)."""
    packed = ipaddress.ip_address(address).packed
    words = b"".join(packed[i:i + 4][::-1] for i in range(0, len(packed), 4))
    return f"{words.hex().upper()}:{port:04X}"


def table(*connections: tuple[tuple[str, int], tuple[str, int], str]) -> str:
    lines = ["  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"]
    for n, (local, remote, state) in enumerate(connections):
        lines.append(f"   {n}: {hex_endpoint(*local)} {hex_endpoint(*remote)} {state} 00000000:00000000 00:00000000 "
                     "00000000     0        0 12345 1 0000000000000000 20 4 30 10 -1")
    return "\n".join(lines) + "\n"


LINKED_HEAD = table(((MASTER, PORT), (WORKER, 40312), "01"), (("0.0.0.0", PORT), ("0.0.0.0", 0), "0A"))
OWN_ONLY = table(((MASTER, PORT), (MASTER, 40400), "01"), ((MASTER, 40400), (MASTER, PORT), "01"),
                 (("127.0.0.1", PORT), ("127.0.0.1", 40500), "01"))
LINKED_WORKER = table(((WORKER, 40312), (MASTER, PORT), "01"))
CLOSED_WORKER = table(((WORKER, 40312), (MASTER, PORT), "06"))  # TIME_WAIT: the head went away


def run(h: Harness, tcp: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = h.tmp / "fake" / "tcp"
    path.write_text(tcp)
    done = subprocess.run([sys.executable, "-c", LAUNCH, str(SCRIPT.parent), str(h.tmp / "fake" / "meminfo"),
                           str(path), "--config", str(h.tmp / "health.json"), *args],
                          env=h.env, capture_output=True, text=True, timeout=30, check=False)
    h.outputs += [done.stdout, done.stderr]
    return done


def test_addresses_are_read_as_proc_net_tcp_writes_them(tmp_path: Path) -> None:
    assert healthcheck._endpoint("0100007F:1F90") == ("127.0.0.1", 8080)
    mapped = hex_endpoint("::ffff:192.168.100.11", 40312)
    assert healthcheck._endpoint(mapped) == (WORKER, 40312)  # IPv4 accepted on an IPv6 socket
    path = tmp_path / "tcp"
    path.write_text(LINKED_HEAD)
    assert healthcheck.connections((str(path),)) == [((MASTER, PORT), (WORKER, 40312))]
    assert healthcheck.connections((str(tmp_path / "none"),)) is None


def test_a_linked_head_is_checked_over_http_as_usual(harness: Harness) -> None:  # noqa: F811
    harness.configure(pair=HEAD)
    done = run(harness, LINKED_HEAD)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("<6>sparkfleet-vllm healthy: ")
    assert harness.backend.calls == ["/health", "/v1/models", "/v1/completions"]


def test_a_head_loading_without_its_worker_is_starting(harness: Harness) -> None:  # noqa: F811
    harness.configure(pair=HEAD)
    harness.unit(started_ago=20)
    done = run(harness, OWN_ONLY)  # its own processes at its own master port are not the worker
    assert done.returncode == 0
    assert done.stdout.startswith(f"<6>sparkfleet-vllm starting: loading: waiting for pair-02 to join at "
                                  f"{MASTER}:{PORT}, 20 s into the 900 s load window")


def test_a_serving_head_that_lost_its_worker_is_unhealthy_and_alerts_naming_it(harness: Harness) -> None:  # noqa: F811
    harness.configure(pair=HEAD, load_window_seconds=5)
    harness.unit(started_ago=600)
    for _ in range(3):
        done = run(harness, OWN_ONLY)
    assert done.returncode == 1
    assert "ALERT" in done.stdout
    assert (f"the worker pair-02 of pair pair-a is not connected to this head's master port {MASTER}:{PORT}: "
            "the engine cannot serve without it; check pair-02") in done.stdout
    assert "fabric link on enp1s0f0np0" in done.stdout
    assert harness.state()["last_result"]["cause"] == "worker_lost"
    assert harness.backend.calls == []  # no HTTP probe can say more


def test_a_head_restarted_by_systemd_after_its_worker_died_names_the_worker(harness: Harness) -> None:  # noqa: F811
    """The engine exits when its worker goes away; systemd restarts it, and its new start waits for a worker
    that is gone: not a load to wait out."""
    harness.configure(pair=HEAD)
    harness.unit(restarts=1, started_ago=20)
    harness.docker_logs(None)
    harness.journal("INFO Application startup complete.\nERROR [Gloo] Connection closed by peer [192.168.100.11]:40312"
                    "\nERROR Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.\n")
    done = run(harness, OWN_ONLY)
    assert done.returncode == 1
    verdict = harness.state()["last_result"]
    assert verdict["cause"] in ("crashing/peer_lost", "worker_lost/peer_lost")
    assert ("the engine lost the other host of its pair, pair-02 (Connection closed by peer "
            "[192.168.100.11]:40312)") in done.stdout


def test_a_standalone_engine_never_blames_a_pair(harness: Harness) -> None:  # noqa: F811
    harness.backend.health = "503"
    harness.docker_logs("ERROR Worker proc VllmWorker-0 died unexpectedly, shutting down executor.\n")
    done = run(harness, OWN_ONLY)
    assert done.returncode == 1 and "pair" not in done.stdout
    assert harness.state()["last_result"]["cause"] == "engine_dead"


def test_a_worker_is_its_unit_and_its_link_without_http(harness: Harness) -> None:  # noqa: F811
    harness.configure(pair=WORKER_PAIR, load_window_seconds=5)
    done = run(harness, LINKED_WORKER)
    assert done.returncode == 0
    assert done.stdout.startswith(f"<6>sparkfleet-vllm healthy: worker of pair pair-a: joined its head pair-01 at "
                                  f"{MASTER}:{PORT} (headless: no API of its own)")
    harness.unit(started_ago=600)
    done = run(harness, CLOSED_WORKER)
    assert done.returncode == 1
    assert f"this worker of pair pair-a is not connected to its head pair-01 at {MASTER}:{PORT}" in done.stdout
    harness.unit(active="inactive", sub="dead", result="success")
    done = run(harness, LINKED_WORKER)
    assert done.returncode == 1 and f"{UNIT} is inactive" in done.stdout
    assert harness.backend.calls == []


def test_the_deploys_pair_config_loads(tmp_path: Path) -> None:
    from sparkfleet.deploys.health import health_config
    from sparkfleet.fleet import load_inventory
    from tests.unit.test_pairs import inventory

    sparks = load_inventory(inventory(), ()).sparks
    for name, role, peer in (("pair-01", "head", "pair-02"), ("pair-02", "worker", "pair-01")):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(health_config(sparks[name])))
        pair = healthcheck.load_config(str(path)).pair
        assert pair == {"name": "pair-a", "role": role, "peer": peer, "master_addr": "192.168.100.10",
                        "master_port": 29500, "interface": "enp1s0f0np0"}
    assert health_config(sparks["spark-01"])["pair"] is None


@pytest.mark.parametrize("pair", [{"role": "head"}, HEAD | {"role": "both"}, HEAD | {"master_port": "29500"}])
def test_a_bad_pair_config_exits_2(harness: Harness, pair: dict[str, object]) -> None:  # noqa: F811
    harness.configure(pair=pair)
    done = run(harness, LINKED_HEAD)
    assert done.returncode == 2 and "bad config: pair must hold" in done.stderr
