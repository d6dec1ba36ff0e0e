"""Drift: a re-run repairs what an operator or a fault changed, and restarts only what it must."""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import (
    STANDALONE_FLEET,
    Run,
    converge,
    invocations,
    limit,
    on_host,
    pyinfra,
    served_weights,
)
from tests.lab import LAB_DIR, fleet

HOST = "spark-02"
UNIT = "/etc/systemd/system/sparkfleet-vllm.service"


def deploy(*args: str) -> Run:
    """A deploy to the fleet `converged` made (a pair's hosts are test_90's)."""
    return pyinfra(*args, "deploy.py", *limit(*STANDALONE_FLEET))


@pytest.fixture
def spark02(lab: fleet.LabState, converged: Run) -> fleet.LabHost:
    """The host these tests change, in a converged fleet (a repair must restart nothing else)."""
    return lab.host(HOST)


def _weights_ok(container: str) -> bool:
    weights = served_weights(container)
    digest = on_host(container, f"python3 -c \"import json;print(json.load(open('{weights}/.sparkfleet-manifest.json'))"
                                "['source_digest'])\"").strip()
    out = on_host(container, f"python3 /usr/local/lib/sparkfleet/stage_weights.py check --full --dest {weights} "
                             f"--digest {digest}")
    return json.loads(out)["state"] == "ok"


def test_removed_runtime_is_restored_and_foreign_keys_survive(spark02: fleet.LabHost) -> None:
    daemon = json.loads(on_host(spark02.container, "cat /etc/docker/daemon.json"))
    del daemon["runtimes"]
    daemon["log-level"] = "warn"
    on_host(spark02.container, f"echo '{json.dumps(daemon)}' > /etc/docker/daemon.json")
    run = deploy()
    assert run.changed >= 2  # daemon.json written, dockerd reloaded
    repaired = json.loads(on_host(spark02.container, "cat /etc/docker/daemon.json"))
    assert repaired["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    assert repaired["log-level"] == "warn"
    assert repaired["registry-mirrors"] == ["http://registry.lab:5000"]
    assert "nvidia" in on_host(spark02.container, "docker info --format '{{json .Runtimes}}'")


def test_deleted_and_truncated_shards_are_repaired(spark02: fleet.LabHost) -> None:
    weights = served_weights(spark02.container)
    try:
        on_host(spark02.container, f"rm {weights}/model-00001-of-00004.safetensors && "
                                   f"truncate -s 1000 {weights}/model-00003-of-00004.safetensors")
        assert not _weights_ok(spark02.container)
    finally:
        deploy()  # the repair under test
    assert _weights_ok(spark02.container)


def test_same_size_corruption_needs_full_verify(spark02: fleet.LabHost) -> None:
    shard = f"{served_weights(spark02.container)}/model-00002-of-00004.safetensors"
    try:
        on_host(spark02.container, f"t=$(stat -c %y {shard}); printf XXXX | dd of={shard} bs=1 seek=4096 "
                                   f"conv=notrunc 2>/dev/null; touch -d \"$t\" {shard}")
        assert deploy().changed == 0  # fast verify trusts sizes and mtimes, by design
        assert not _weights_ok(spark02.container)
    finally:
        # The repair under test, and the cleanup: later deploys' fast verify would never notice this shard.
        repaired = deploy("--data", "weights_verify=full")
    assert repaired.changed >= 1
    assert _weights_ok(spark02.container)


def test_edited_unit_and_stopped_timer_are_restored(spark02: fleet.LabHost) -> None:
    original = on_host(spark02.container, f"cat {UNIT}")
    try:
        on_host(spark02.container, f"sed -i 's/--max-num-seqs 4/--max-num-seqs 64/' {UNIT} && "
                                   "systemctl daemon-reload && systemctl stop sparkfleet-health.timer")
    finally:
        deploy()  # the repair under test
    assert on_host(spark02.container, f"cat {UNIT}") == original
    assert on_host(spark02.container, "systemctl is-active sparkfleet-health.timer").strip() == "active"


def test_one_flag_for_one_host_restarts_only_that_host(lab: fleet.LabState, spark02: fleet.LabHost) -> None:
    overrides = LAB_DIR / "host_data.json"
    before = invocations(lab.hosts)
    overrides.write_text(json.dumps({HOST: {"vllm_args": {"max-num-seqs": 2}}}))
    try:
        deploy()
        after = invocations(lab.hosts)
        assert after[HOST] != before[HOST]
        assert {k: v for k, v in after.items() if k != HOST} == {k: v for k, v in before.items() if k != HOST}
        assert "--max-num-seqs 2" in on_host(spark02.container, f"cat {UNIT}")
    finally:
        overrides.unlink(missing_ok=True)
        converge(HOST)  # the inventory's own flags again
    assert deploy().changed == 0
