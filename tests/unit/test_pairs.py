"""Pairs in the inventory: two Sparks, one mapping, one model; judged together before anything runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparkfleet import rules
from sparkfleet.config import SparkConfig
from sparkfleet.endpoint import resolve
from sparkfleet.fleet import FleetError, load_inventory
from sparkfleet.memory import budget, explain
from sparkfleet.pairs import partners, weights_problems
from tests.unit.resolved import generation, resolved

SOURCE = {"model_source": "http://mirror.lan/models/qwen"}
PAIR = {"name": "pair-a", "head": "pair-01", "interface": "enp1s0f0np0", "master_addr": "192.168.100.10",
        "ib_hca": ["rocep1s0f0", "roceP2p1s0f0"]}


def inventory(**changes: dict[str, object]) -> dict[str, dict[str, object]]:
    """A standalone Spark and a pair; `changes` adds to a host's data."""
    hosts: dict[str, dict[str, object]] = {"spark-01": dict(SOURCE), "pair-01": SOURCE | {"pair": PAIR},
                                           "pair-02": SOURCE | {"pair": PAIR}}
    for host, data in changes.items():
        hosts[host] = hosts.get(host, {}) | data
    return hosts


def _errors(hosts: dict[str, dict[str, object]], gateways: tuple[str, ...] = (), **kwargs: object) -> list[str]:
    with pytest.raises(FleetError) as error:
        load_inventory(hosts, gateways, **kwargs)  # type: ignore[arg-type]
    lines = str(error.value).splitlines()
    assert lines[0] == "bad inventory, nothing was changed on any host:"
    return [line.strip() for line in lines[1:]]


def test_a_pair_loads_with_roles_peers_and_tensor_parallel_two() -> None:
    sparks = load_inventory(inventory(), ()).sparks
    head, worker = sparks["pair-01"], sparks["pair-02"]
    assert (head.role, head.peer, worker.role, worker.peer) == ("head", "pair-02", "worker", "pair-01")
    assert head.args["tensor-parallel-size"] == worker.args["tensor-parallel-size"] == 2
    assert head.serves and not worker.serves
    assert sparks["spark-01"].role is None and sparks["spark-01"].args["tensor-parallel-size"] == 1
    assert head.config.pair is not None and head.config.pair.master_port == 29500  # the default


def test_a_pair_needs_two_hosts() -> None:
    hosts = inventory()
    del hosts["pair-02"]
    [error] = _errors(hosts)
    assert error.startswith("pair-01: `pair.name` = 'pair-a' is carried by no other Spark")
    assert "give the other one the same `pair`" in error
    [error] = _errors(inventory(**{"pair-03": SOURCE | {"pair": PAIR}}))
    assert error.startswith("pair-01, pair-02, pair-03: `pair.name` = 'pair-a' is carried by 3 Sparks")


def test_both_hosts_carry_the_same_mapping_and_name_a_head_among_them() -> None:
    [error] = _errors(inventory(**{"pair-02": {"pair": PAIR | {"master_port": 29501}}}))
    assert error.startswith("pair-02: `pair` differs from pair-01's in pair 'pair-a' (master_port: 29500 on "
                            "pair-01, 29501 on pair-02)")
    [error] = _errors(inventory(**{"pair-01": {"pair": PAIR | {"head": "spark-01"}},
                                   "pair-02": {"pair": PAIR | {"head": "spark-01"}}}))
    assert error.startswith("pair-01, pair-02: `pair.head` = 'spark-01' is not a host of pair 'pair-a'")


@pytest.mark.parametrize(("data", "variable"), [
    ({"vllm_args": {"max-num-seqs": 2}}, "vllm_args"),
    ({"vllm_recipe": "qwen3.6-35b-a3b-fp8"}, "vllm_recipe"),
    ({"vllm_image": "vllm/vllm-openai:v0.28.1"}, "vllm_image"),
    ({"model_source": "http://other.lan/qwen"}, "model_source"),
    ({"vllm_start": False}, "vllm_start"),
])
def test_both_hosts_serve_one_model_the_same_way(data: dict[str, object], variable: str) -> None:
    errors = [e for e in _errors(inventory(**{"pair-02": data})) if f"`{variable}` differs" in e]
    assert errors and errors[0].startswith(f"pair-02: `{variable}` differs from pair-01's")
    assert "pair 'pair-a' serves one model" in errors[0] and "group data" in errors[0]


@pytest.mark.parametrize(("pair", "field", "words"), [
    ({"master_addr": "head.lan"}, "pair.master_addr", "is not an IP address"),
    ({"master_port": 80}, "pair.master_port", "greater than or equal to 1024"),
    ({"interface": "en p1"}, "pair.interface", "should match pattern"),
    ({"head": None}, "pair.head", "valid string"),
])
def test_pair_values_are_checked(pair: dict[str, object], field: str, words: str) -> None:
    mapping = PAIR | pair
    errors = _errors(inventory(**{"pair-01": {"pair": mapping}, "pair-02": {"pair": mapping}}))
    assert any(e.startswith(f"pair-01: `{field}`") and words in e for e in errors), errors


def test_a_missing_key_says_it_is_required() -> None:
    mapping = {key: value for key, value in PAIR.items() if key != "interface"}
    errors = _errors(inventory(**{"pair-01": {"pair": mapping}, "pair-02": {"pair": mapping}}))
    assert "pair-01: `pair.interface` is required and not set: give it (README: Configuration)." in errors
    assert not any("carried by no other" in e for e in errors)  # no second guess about a host that failed


def test_the_master_port_is_its_own() -> None:
    errors = _errors(inventory(**{host: {"vllm_port": 29500} for host in ("pair-01", "pair-02")}))
    assert "pair-01: `pair.master_port` = 29500 is also `vllm_port`: the head's rendezvous needs a port of its own; " \
           "change one of the two" in errors


def test_tensor_parallel_two_is_for_pairs_only() -> None:
    [error] = _errors(inventory(**{"spark-01": {"vllm_args": {"tensor-parallel-size": 2}}}))
    assert error.startswith("spark-01: `vllm_args.tensor-parallel-size`: tensor x pipeline parallel = 2 but a DGX "
                            "Spark has 1 GPU; set tensor-parallel-size to 1, or declare a `pair`")
    one = {"vllm_args": {"tensor-parallel-size": 1}}
    errors = _errors(inventory(**{"pair-01": one, "pair-02": one}))
    assert any(e.startswith("pair-01: `vllm_args.tensor-parallel-size`: tensor x pipeline parallel = 1 but pair "
                            "pair-a runs one engine across 2 Sparks") for e in errors)


def test_multi_node_flags_belong_to_sparkfleet() -> None:
    errors = _errors(inventory(**{"spark-01": {"vllm_args": {"nnodes": 2, "headless": True}}}))
    assert "spark-01: `vllm_args.nnodes`: --nnodes is set by sparkfleet from the `pair` variable" in errors[0]
    assert len(errors) == 2


def test_a_pair_deploys_as_one_unit() -> None:
    [error] = _errors(inventory(), targeted={"pair-02"})
    assert error == ("pair-02: `pair` 'pair-a' is one unit with pair-01, which is not targeted: target both "
                     "(--limit pair-02,pair-01, or the pair's group)")
    fleet = load_inventory(inventory(), (), targeted={"pair-01", "pair-02"})
    assert list(fleet.sparks) == ["pair-01", "pair-02"]
    assert partners(inventory(), ["pair-02"]) == ["pair-01", "pair-02"]
    assert partners(inventory(), ["spark-01"]) == ["spark-01"]


def test_a_gateway_routes_the_head_only() -> None:
    hosts = inventory(gw={"gateway_port": 8080}, **{"pair-01": {"vllm_url": "http://10.0.0.5:8000"},
                                                   "pair-02": {"vllm_url": "http://10.0.0.6:8000"}})
    hosts["spark-01"]["vllm_url"] = "http://10.0.0.4:8000"
    gateway = load_inventory(hosts, {"gw"}, targeted={"gw"}).gateways["gw"]
    assert gateway.server_names == ["spark-01", "pair-01"]
    hosts["gw"]["pair"] = PAIR
    assert _errors(hosts, ("gw",), targeted={"gw"})[0].startswith("gw: `pair`: a gateway is not a Spark")


def test_both_hosts_load_the_same_weights_generation() -> None:
    sparks = load_inventory(inventory(), ()).sparks
    head, worker = resolved(sparks["pair-01"]), resolved(sparks["pair-02"])
    assert weights_problems({"pair-01": head, "pair-02": worker}) == []
    moved = replace(worker, weights=generation(worker.source, "abc  config.json\n"))
    [error] = weights_problems({"pair-01": head, "pair-02": moved})
    assert error.startswith(f"pair-02: `model_source` resolves to weights generation {moved.weights.id} but "  # type: ignore[union-attr]
                            f"pair-01's to {head.weights.id}")  # type: ignore[union-attr]


def test_memory_budget_is_per_node_with_the_model_split_across_two() -> None:
    alone = budget(resolve("spark-01", SparkConfig()))
    pair = budget(resolve("pair-01", SparkConfig(pair=PAIR)))
    assert pair.split == 2 and alone.split == 1
    assert pair.weights * 2 == pytest.approx(alone.weights, abs=1)
    assert pair.kv_cache * 2 == pytest.approx(alone.kv_cache, rel=1e-6)
    assert pair.overhead == alone.overhead  # each node keeps its own CUDA context, graphs and activations
    assert "/ 2 (split across 2 Sparks)" in dict(explain(pair))["weights"]
    # A context that does not fit one Spark fits a pair.
    big = {"max-num-seqs": 8}
    assert any(f.rule == "capacity.memory" for f in rules.check(resolve("s", SparkConfig(vllm_args=big))))
    paired = resolve("pair-01", SparkConfig(pair=PAIR, vllm_args=big))
    assert not any(f.rule == "capacity.memory" for f in rules.check(paired))
