"""Rollout planning and the parsing of its health-gate verdicts."""

import pytest

from sparkfleet.rollout import MARKER, gate_lines, plan_batches

HOSTS = ["s1", "s2", "s3", "s4", "s5"]


def test_canary_first_then_batches_in_inventory_order() -> None:
    assert plan_batches(HOSTS, canary=1, batch=2) == [["s1"], ["s2", "s3"], ["s4", "s5"]]
    assert plan_batches(HOSTS, canary=2, batch=1) == [["s1", "s2"], ["s3"], ["s4"], ["s5"]]
    assert plan_batches(HOSTS[:1], canary=1, batch=1) == [["s1"]]
    assert plan_batches([], canary=1, batch=1) == []


def test_batch_sizes_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        plan_batches(HOSTS, canary=0, batch=1)


def test_gate_lines_read_each_hosts_verdict() -> None:
    output = "\n".join([
        "--> Starting operation: Server/Shell",
        f"    [spark-01] {MARKER}0 <6>sparkfleet-vllm healthy: /health ok",
        f"    [spark-02] {MARKER}1 <4>sparkfleet-vllm unhealthy: FP8 kernels crash on GB10 with this image",
        "    [spark-03] Error: executed 0 commands",
    ])
    verdicts = gate_lines(output)
    assert verdicts["spark-01"] == (True, "sparkfleet-vllm healthy: /health ok")
    assert verdicts["spark-02"] == (False, "sparkfleet-vllm unhealthy: FP8 kernels crash on GB10 with this image")
    assert "spark-03" not in verdicts
