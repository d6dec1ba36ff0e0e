"""Drift: a re-run repairs what an operator or a fault changed, and restarts only what it must."""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import Run, on_host, pyinfra
from tests.integration.test_20_deploy import _invocations
from tests.lab import LAB_DIR, fleet

WEIGHTS = "/var/lib/sparkfleet/models/nvidia--Qwen3.6-35B-A3B-NVFP4"


@pytest.fixture
def spark02(lab: fleet.LabState, deployed: Run) -> fleet.LabHost:
    return next(h for h in lab.hosts if h.name == "spark-02")


def _weights_ok(container: str) -> bool:
    digest = on_host(container, f"python3 -c \"import json;print(json.load(open('{WEIGHTS}/.sparkfleet-manifest.json'))"
                                "['source_digest'])\"").strip()
    out = on_host(container, f"python3 /usr/local/lib/sparkfleet/stage_weights.py check --full --dest {WEIGHTS} "
                             f"--digest {digest}")
    return json.loads(out)["state"] == "ok"


def test_removed_runtime_is_restored_and_foreign_keys_survive(spark02: fleet.LabHost) -> None:
    daemon = json.loads(on_host(spark02.container, "cat /etc/docker/daemon.json"))
    del daemon["runtimes"]
    daemon["log-level"] = "warn"
    on_host(spark02.container, f"echo '{json.dumps(daemon)}' > /etc/docker/daemon.json")
    run = pyinfra("deploy.py")
    assert run.changed >= 2  # daemon.json written, dockerd reloaded
    repaired = json.loads(on_host(spark02.container, "cat /etc/docker/daemon.json"))
    assert repaired["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    assert repaired["log-level"] == "warn"
    assert repaired["registry-mirrors"] == ["http://registry.lab:5000"]
    assert "nvidia" in on_host(spark02.container, "docker info --format '{{json .Runtimes}}'")


def test_deleted_and_truncated_shards_are_repaired(spark02: fleet.LabHost) -> None:
    on_host(spark02.container, f"rm {WEIGHTS}/model-00001-of-00004.safetensors && "
                               f"truncate -s 1000 {WEIGHTS}/model-00003-of-00004.safetensors")
    assert not _weights_ok(spark02.container)
    pyinfra("deploy.py")
    assert _weights_ok(spark02.container)


def test_same_size_corruption_needs_full_verify(spark02: fleet.LabHost) -> None:
    shard = f"{WEIGHTS}/model-00002-of-00004.safetensors"
    on_host(spark02.container, f"t=$(stat -c %y {shard}); printf XXXX | dd of={shard} bs=1 seek=4096 conv=notrunc "
                               f"2>/dev/null; touch -d \"$t\" {shard}")
    assert pyinfra("deploy.py").changed == 0  # fast verify trusts sizes and mtimes, by design
    assert not _weights_ok(spark02.container)
    assert pyinfra("--data", "weights_verify=full", "deploy.py").changed >= 1
    assert _weights_ok(spark02.container)


def test_edited_unit_and_stopped_timer_are_restored(spark02: fleet.LabHost) -> None:
    unit = "/etc/systemd/system/sparkfleet-vllm.service"
    original = on_host(spark02.container, f"cat {unit}")
    on_host(spark02.container, f"sed -i 's/--max-num-seqs 4/--max-num-seqs 64/' {unit} && systemctl daemon-reload "
                               "&& systemctl stop sparkfleet-health.timer")
    pyinfra("deploy.py")
    assert on_host(spark02.container, f"cat {unit}") == original
    assert on_host(spark02.container, "systemctl is-active sparkfleet-health.timer").strip() == "active"


def test_one_flag_for_one_host_restarts_only_that_host(lab: fleet.LabState, spark02: fleet.LabHost) -> None:
    overrides = LAB_DIR / "host_data.json"
    before = _invocations(lab)
    overrides.write_text(json.dumps({"spark-02": {"vllm_args": {"max-num-seqs": 2}}}))
    try:
        pyinfra("deploy.py")
        after = _invocations(lab)
        assert after["spark-02"] != before["spark-02"]
        assert {k: v for k, v in after.items() if k != "spark-02"} == {
            k: v for k, v in before.items() if k != "spark-02"}
        assert "--max-num-seqs 2" in on_host(spark02.container, "cat /etc/systemd/system/sparkfleet-vllm.service")
    finally:
        overrides.unlink()
    pyinfra("deploy.py")
    assert pyinfra("deploy.py").changed == 0
