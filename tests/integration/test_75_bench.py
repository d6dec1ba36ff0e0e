"""`sparkfleet bench` and the rollout's bench gate on the lab: figures recorded with the config that produced them,
a rollout that drops a kernel flag stopped at the canary by its MTP acceptance, a harmless one let through."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkfleet.config import SparkConfig
from sparkfleet.deploys.health import wait_command
from tests.integration.conftest import INVENTORY, converge, on_host
from tests.lab import REPO, fleet

UNIT = "/etc/systemd/system/sparkfleet-vllm.service"
IMAGE = "vllm/vllm-openai:v0.28.0"
SHORT = ["--concurrency", "2", "--duration", "5", "--max-tokens", "128"]
GATE = ["--bench", "--bench-concurrency", "2", "--bench-duration", "5"]
FIGURES = ("ttft_p50", "ttft_p95", "tokens_per_second", "aggregate_tokens_per_second", "e2e_p50", "e2e_p95",
           "mtp_acceptance")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This file's own record store: no known-good record from another session decides its gates."""
    return tmp_path_factory.mktemp("sparkfleet-home")


@pytest.fixture(scope="module")
def serving(amd64: list[fleet.LabHost]) -> Iterator[list[fleet.LabHost]]:
    """The amd64 hosts deployed, each running the current vLLM stand-in (whose MTP acceptance and pace follow the
    kernel flags): a host that pulled the tag before the stand-in changed keeps its old copy, since deploys pull
    a present tag only once. Put back by a plain deploy at the end. The gateway that drains them during a rollout
    is deployed with their current addresses."""
    converge("lab_amd64", "gateways")
    for host in amd64:
        on_host(host.container, f"docker pull -q {IMAGE}")
        wanted = on_host(host.container, f"docker image inspect -f '{{{{.Id}}}}' {IMAGE}").strip()
        running = on_host(host.container, "docker inspect -f '{{.Image}}' sparkfleet-vllm", check=False).strip()
        if running != wanted:
            on_host(host.container, f"systemctl restart sparkfleet-vllm && {wait_command(600)}")
    try:
        yield amd64
    finally:
        converge("lab_amd64")  # the inventory's own flags again


def sparkfleet(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sparkfleet", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "SPARKFLEET_HOME": str(home), "COLUMNS": "250"})


def test_bench_reports_every_endpoint_with_its_config(serving: list[fleet.LabHost], home: Path) -> None:
    result = sparkfleet(home, "bench", INVENTORY, "--limit", "lab_amd64", "--json", *SHORT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = {record["host"]: record for record in json.loads(result.stdout)}
    assert sorted(records) == sorted(h.name for h in serving)
    for host in serving:
        record = records[host.name]
        assert record["errors"] == 0 and record["requests"] >= 2, record
        for name in FIGURES:
            assert record[name] > 0, (host.name, name, record)
        assert record["ttft_p50"] <= record["ttft_p95"] and record["e2e_p50"] <= record["e2e_p95"]
        assert 0.76 <= record["mtp_acceptance"] <= 0.91  # the recipe sets all three of seed 004's kernel flags
        assert record["load"] == {"concurrency": 2, "duration": 5.0, "prompt_tokens": 512, "max_tokens": 128}
        config = record["config"]
        assert config["error"] is None, config
        container = on_host(host.container, "docker inspect -f '{{json .Args}}' sparkfleet-vllm")
        assert config["argv"] == ["vllm", *json.loads(container)]
        assert "--moe-backend" in config["argv"] and config["image"] == IMAGE
        assert "sha256:" in config["image_digest"]
        loaded = json.loads(on_host(host.container, "cat /run/sparkfleet/loaded-weights.json"))
        assert config["model_revision"] == loaded["source_digest"]
        assert config["driver"].startswith("580.")
        assert config["toolkit"] == SparkConfig().nvidia_toolkit_version
        assert config["hostname"] == host.name
        assert [(row["figure"], row["meets"]) for row in record["versus_recipe"]] == [("mtp_acceptance", True)]
        kept = (home / "bench" / f"{host.name}.jsonl").read_text().splitlines()
        assert json.loads(kept[-1]) == record


def test_table_view(serving: list[fleet.LabHost], home: Path) -> None:
    result = sparkfleet(home, "bench", INVENTORY, "--limit", serving[0].name, *SHORT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert serving[0].name in result.stdout and "TTFT s" in result.stdout
    assert "MTP acceptance" in result.stdout and "meets qwen3.6-35b-a3b-nvfp4's 78.0%" in result.stdout


def test_gate_stops_a_removed_kernel_flag_at_the_canary(serving: list[fleet.LabHost], home: Path) -> None:
    canary, others = serving[0], serving[1:]
    units = {h.name: on_host(h.container, f"cat {UNIT}") for h in serving}
    result = sparkfleet(home, "rollout", INVENTORY, "--limit", "lab_amd64", "--json", *GATE,
                        "--data", 'vllm_args={"moe-backend": null}')
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    plan = json.loads(result.stdout)
    hosts = {row["host"]: row for row in plan["hosts"]}
    assert plan["failed_batch"] == 0
    row = hosts[canary.name]
    assert row["outcome"] == "rolled-back", row
    assert row["diagnosis"].startswith("bench dropped: MTP acceptance "), row
    assert "removed --moe-backend marlin" in row["diagnosis"], row
    assert row["bench"]["drops"][0].startswith("MTP acceptance ")
    assert row["bench"]["figures"]["mtp_acceptance"]["after"] < 0.7
    assert all(hosts[h.name]["outcome"] == "skipped" for h in others)
    for host in serving:
        assert on_host(host.container, f"cat {UNIT}") == units[host.name], host.name
    assert "--moe-backend" in on_host(canary.container, "docker inspect -f '{{json .Args}}' sparkfleet-vllm")
    kept = [json.loads(line) for line in (home / "bench" / f"{canary.name}.jsonl").read_text().splitlines()]
    assert [(r["run"], r["known_good"]) for r in kept[-2:]] == [("baseline", True), ("gate", False)]


def test_gate_lets_a_harmless_change_through(serving: list[fleet.LabHost], home: Path) -> None:
    result = sparkfleet(home, "rollout", INVENTORY, "--limit", "lab_amd64", "--json", *GATE,
                        "--data", 'vllm_args={"max-num-seqs": 3}')
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    hosts = {row["host"]: row for row in json.loads(result.stdout)["hosts"]}
    for host in serving:
        row = hosts[host.name]
        assert row["outcome"] == "updated" and row["bench"]["passed"], row
        assert "bench: MTP acceptance" in row["diagnosis"]
        assert "--max-num-seqs 3" in on_host(host.container, f"cat {UNIT}")
        kept = json.loads((home / "bench" / f"{host.name}.jsonl").read_text().splitlines()[-1])
        assert (kept["run"], kept["known_good"]) == ("gate", True)
