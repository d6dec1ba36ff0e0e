"""Weights across a fleet: the fan-out plan (each file from the source about once, then Spark to Spark in about
log2(N) rounds), where peers reach each other, which generations pruning removes, and the Hub download's env."""

from __future__ import annotations

import math

import pytest

from sparkfleet.config import SparkConfig
from sparkfleet.deploys.weights import fanout, hub_env, peer_address
from sparkfleet.endpoint import Endpoint, resolve
from sparkfleet.operations import prunable
from tests.unit.resolved import SUMS, resolved

OTHER = SUMS.replace("config.json", "config2.json")  # another generation of the same model


def fleet(count: int, sums: str = SUMS, prefix: str = "spark", **config: object) -> dict[str, Endpoint]:
    names = [f"{prefix}-{number:02d}" for number in range(1, count + 1)]
    return {name: resolved(resolve(name, SparkConfig(**config)), sums) for name in names}


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8])
def test_each_spark_copies_from_one_that_finished_in_an_earlier_round(count: int) -> None:
    endpoints = fleet(count)
    rounds, plan = fanout(endpoints)
    assert rounds == math.ceil(math.log2(count)) + 1
    assert list(plan) == list(endpoints)
    names = list(endpoints)
    assert plan[names[0]] == (0, None)  # the one Spark that asks the source
    for name in names[1:]:
        number, peer = plan[name]
        assert peer is not None and 0 < number < rounds
        assert plan[peer][0] < number, f"{name} copies from {peer}, which is not done before round {number}"
    for number in range(1, rounds):  # a Spark serves at most one other per round: the tree doubles each round
        peers = [peer for round_, peer in plan.values() if round_ == number]
        assert len(peers) == len(set(peers))
    # 1, 2, 4, ... Sparks hold the generation after each round
    held = [sum(1 for round_, _ in plan.values() if round_ <= number) for number in range(rounds)]
    assert held == [min(2 ** number, count) for number in range(rounds)]


def test_the_plan_for_five_sparks() -> None:
    rounds, plan = fanout(fleet(5))
    assert rounds == 4
    assert plan == {"spark-01": (0, None), "spark-02": (1, "spark-01"), "spark-03": (2, "spark-01"),
                    "spark-04": (2, "spark-02"), "spark-05": (3, "spark-01")}


def test_sparks_copy_only_the_generation_they_want() -> None:
    """Two generations (a canary on a new revision): each has its own source fetch and its own tree."""
    endpoints = fleet(3) | fleet(2, OTHER, prefix="canary")
    rounds, plan = fanout(endpoints)
    assert rounds == 3
    assert plan["spark-01"] == (0, None) and plan["canary-01"] == (0, None)
    assert plan["canary-02"] == (1, "canary-01")
    for name, (_, peer) in plan.items():
        if peer is not None:
            assert endpoints[peer].weights == endpoints[name].weights


def test_another_model_is_another_tree() -> None:
    endpoints = fleet(2) | fleet(2, prefix="fp8", vllm_recipe="qwen3.6-35b-a3b-fp8")
    _, plan = fanout(endpoints)
    assert plan["fp8-01"] == (0, None) and plan["fp8-02"] == (1, "fp8-01")


def test_without_fanout_every_spark_asks_the_source_in_round_zero() -> None:
    rounds, plan = fanout(fleet(4, weights_fanout=False))
    assert rounds == 1 and set(plan.values()) == {(0, None)}
    mixed = fleet(3) | fleet(1, prefix="alone", weights_fanout=False)
    _, plan = fanout(mixed)
    assert plan["alone-01"] == (0, None) and "alone-01" not in {peer for _, peer in plan.values()}


def test_peer_address_prefers_the_variable_then_vllm_url_then_ssh() -> None:
    assert peer_address("spark-01", {"peer_address": "10.0.0.11", "vllm_url": "http://spark-01.lan:8000",
                                     "ssh_hostname": "ssh.lan"}) == "10.0.0.11"
    assert peer_address("spark-01", {"vllm_url": "http://10.0.0.12:8000", "ssh_hostname": "ssh.lan"}) == "10.0.0.12"
    assert peer_address("spark-01", {"ssh_hostname": "ssh.lan"}) == "ssh.lan"
    assert peer_address("spark-01", {}) == "spark-01"


def test_hub_env_carries_endpoint_and_token_and_nothing_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_HF_TOKEN", "hf_secret")
    spark = resolve("spark-01", SparkConfig(hf_endpoint="http://hub.lan", hf_token="env:SPARK_HF_TOKEN"))
    assert hub_env(spark).splitlines() == ["# Managed by sparkfleet: the Hub download's settings.",
                                           "HF_ENDPOINT=http://hub.lan", "HF_TOKEN=hf_secret",
                                           "HF_HUB_DISABLE_TELEMETRY=1"]
    assert hub_env(resolve("spark-01", SparkConfig())).splitlines()[1:] == ["HF_HUB_DISABLE_TELEMETRY=1"]


# --- pruning --------------------------------------------------------------------------------------------

A, B, C, D = (f"sha256-{digit * 16}" for digit in "abcd")
COMMIT = "4f1c2b3a5d6e7f8091a2b3c4d5e6f708192a3b4c"


def test_prunable_keeps_the_wanted_the_mounted_and_the_newest() -> None:
    dirs = {A: 1.0, B: 2.0, C: 3.0, COMMIT: 4.0}
    assert prunable(dirs, set(), COMMIT, 2) == [A, B]
    assert prunable(dirs, {A}, COMMIT, 2) == [B, C]  # a mounted generation counts toward keep
    assert prunable(dirs, {A, B}, COMMIT, 1) == [C]  # and stays beyond it
    assert prunable(dirs, set(), COMMIT, 4) == []
    assert prunable(dirs, set(), A, 1) == sorted([B, C, COMMIT])  # a rollback to an older generation keeps that one


def test_prunable_counts_the_wanted_generation_before_it_is_staged() -> None:
    assert prunable({A: 1.0, B: 2.0}, set(), C, 2) == [A]


def test_prunable_never_touches_what_is_not_a_generation() -> None:
    dirs = {"original": 0.0, "sha256-abc": 0.0, COMMIT.upper(): 0.0, A: 1.0, B: 2.0}
    assert prunable(dirs, set(), B, 1) == [A]
