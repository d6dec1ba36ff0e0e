"""Weights from the Hub (the lab's stand-in, through the real huggingface_hub client in the vLLM image):
generations named by commit, nothing downloaded twice, the fleet served about once, a rollback without a
download. spark-01 and spark-02 take the default source (the recipe's model on the Hub)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest
from huggingface_hub import HfApi

from tests.integration.conftest import INVENTORY, PYINFRA, converge, on_host, served_weights
from tests.lab import REPO, fleet

HUB_HOSTS = ("spark-01", "spark-02")
REPO_ID = "nvidia/Qwen3.6-35B-A3B-NVFP4"
ROOT = f"/var/lib/sparkfleet/models/{REPO_ID.replace('/', '--')}"


def hub_stats(lab: fleet.LabState) -> dict[str, int]:
    with urllib.request.urlopen(f"{lab.hf_endpoint}/_lab/stats", timeout=10) as response:
        return json.loads(response.read())


def reset_stats(lab: fleet.LabState) -> None:
    request = urllib.request.Request(f"{lab.hf_endpoint}/_lab/stats/reset", method="POST")
    urllib.request.urlopen(request, timeout=10).read()


def commit(lab: fleet.LabState, revision: str) -> str:
    return HfApi(endpoint=lab.hf_endpoint, token=False).model_info(REPO_ID, revision=revision).sha or ""


def mounted(host: fleet.LabHost) -> str:
    return served_weights(host.container)


@pytest.fixture(scope="module")
def hub_hosts(lab: fleet.LabState) -> list[fleet.LabHost]:
    converge(*HUB_HOSTS, "gateways")  # a rollout drains at the gateway, which must route these Sparks
    return [lab.host(name) for name in HUB_HOSTS]


def test_hub_hosts_serve_the_commit_main_resolves_to_and_a_rerun_downloads_nothing(
        lab: fleet.LabState, hub_hosts: list[fleet.LabHost]) -> None:
    main = commit(lab, "main")
    for host in hub_hosts:
        assert mounted(host) == f"{ROOT}/{main}"
        manifest = json.loads(on_host(host.container, f"cat {ROOT}/{main}/.sparkfleet-manifest.json"))
        assert len(manifest["files"]) >= 5
        assert on_host(host.container, f"test -f {ROOT}/{main}/config.json && echo yes").strip() == "yes"
    reset_stats(lab)
    run = converge(*HUB_HOSTS)
    assert run.changed == 0
    assert hub_stats(lab)["bytes_served"] == 0


def test_a_wiped_fleet_takes_the_model_from_the_hub_about_once(lab: fleet.LabState,
                                                               hub_hosts: list[fleet.LabHost]) -> None:
    for host in hub_hosts:
        on_host(host.container, f"rm -rf {ROOT}")
    reset_stats(lab)
    try:
        run = converge(*HUB_HOSTS)
        stats = hub_stats(lab)
        assert 0 < stats["bytes_served"] <= 1.1 * stats["model_bytes"], stats
        assert "from spark-01" in run.output  # spark-02's round copies from spark-01, verified on arrival
    finally:
        converge(*HUB_HOSTS)
    main = commit(lab, "main")
    for host in hub_hosts:
        assert mounted(host) == f"{ROOT}/{main}"


def test_a_deleted_shard_is_repaired_from_the_hub_alone(lab: fleet.LabState,
                                                        hub_hosts: list[fleet.LabHost]) -> None:
    main = commit(lab, "main")
    shard = f"{ROOT}/{main}/model-00002-of-00004.safetensors"
    size = int(on_host(hub_hosts[0].container, f"stat -c %s {shard}"))
    on_host(hub_hosts[0].container, f"rm {shard}")
    reset_stats(lab)
    try:
        run = converge("spark-01")  # alone in the deploy, it has no peer to copy from: the Hub serves it
        assert run.changed > 0
        assert hub_stats(lab)["bytes_served"] == size  # that shard, not the generation
    finally:
        converge(*HUB_HOSTS)
    assert int(on_host(hub_hosts[0].container, f"stat -c %s {shard}")) == size


def test_a_failed_rollout_to_a_new_revision_returns_to_the_previous_generation_without_a_download(
        lab: fleet.LabState, hub_hosts: list[fleet.LabHost]) -> None:
    main, nxt = commit(lab, "main"), commit(lab, "next")
    assert main != nxt
    canary = hub_hosts[0]
    try:
        rollout = subprocess.run(
            [sys.executable, "-m", "sparkfleet", "rollout", INVENTORY, "--json",
             "--limit", ",".join(HUB_HOSTS), "--data", f"model_source=hf://{REPO_ID}@next",
             "--data", "vllm_image=vllm/vllm-openai:v0.28.0-crash-cutlass"],
            cwd=REPO, capture_output=True, text=True, timeout=1800)
        plan = json.loads(rollout.stdout)
        assert rollout.returncode == 1 and plan["failed_batch"] == 0, rollout.stderr[-3000:]
        outcomes = {result["host"]: result["outcome"] for result in plan["hosts"]}
        assert outcomes == {"spark-01": "rolled-back", "spark-02": "skipped"}
        # Staged everywhere before the canary, beside the served generation; the canary went back to main's.
        for host in hub_hosts:
            assert on_host(host.container, f"test -f {ROOT}/{nxt}/.sparkfleet-manifest.json && echo yes") == "yes\n"
            assert mounted(host) == f"{ROOT}/{main}"
        reset_stats(lab)
        # The rollback needed no download: a deploy of main now changes nothing and fetches nothing.
        run = converge(*HUB_HOSTS)
        assert hub_stats(lab)["bytes_served"] == 0 and run.changed == 0
    finally:
        converge(*HUB_HOSTS)
    assert mounted(canary) == f"{ROOT}/{main}"


def test_a_gated_repository_without_a_token_changes_no_host(lab: fleet.LabState,
                                                            hub_hosts: list[fleet.LabHost]) -> None:
    before = on_host(hub_hosts[0].container, "cat /etc/systemd/system/sparkfleet-vllm.service")
    result = subprocess.run([PYINFRA, "-y", INVENTORY, "deploy.py", "--limit", "spark-01",
                             "--data", "model_source=hf://lab/gated-model@main"],
                            cwd=REPO, capture_output=True, text=True)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "spark-01: `model_source` hf://lab/gated-model@main: the repository is gated" in output
    assert "set `hf_token`" in output and "Traceback" not in output
    assert on_host(hub_hosts[0].container, "cat /etc/systemd/system/sparkfleet-vllm.service") == before
