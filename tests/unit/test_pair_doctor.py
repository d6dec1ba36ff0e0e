"""`sparkfleet doctor` on a pair: each host's fabric interface (host.fabric), then the checks across both hosts
(pair_checks) from what each reported, and the pair's inventory rules, shown on both hosts."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyinfra.api import Config, Host, Inventory, State

from sparkfleet import doctor, pair_checks
from sparkfleet.config import SparkConfig
from sparkfleet.endpoint import Endpoint, resolve
from sparkfleet.preflight import HOST_CHECKS, host_findings, host_summary, preflight_query
from sparkfleet.remote import host_facts
from tests.unit.resolved import offline_sources, resolved
from tests.unit.test_host_facts import IP_CABLED, IP_DOWN, IP_NO_ADDRESS, IP_NO_CARRIER
from tests.unit.test_preflight import endpoint as standalone
from tests.unit.test_preflight import facts

PAIR = {"name": "pair-a", "head": "pair-01", "interface": "enp1s0f0np0", "master_addr": "192.168.100.10"}
MIRROR = "http://mirror.lan/models/qwen"
IMAGE_ID = "sha256:3b2f8e5c1a2b9d7e6f4a0c1b2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e"
OTHER_ID = "sha256:9e0c4d71ab2345f6789a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e"


def spark(name: str, **pair: object) -> Endpoint:
    return resolved(resolve(name, SparkConfig(model_source=MIRROR, pair=PAIR | pair)))


def ip(output: str, address: str = "192.168.100.10") -> dict[str, Any]:
    """The fabric probe's reading of `ip -j addr show` output, with the first address changed to `address`."""
    return host_facts.link(output.replace("192.168.100.10", address))


def pair_facts(spark: Endpoint, fabric: dict[str, Any] | None = None, image_id: str | None = IMAGE_ID,
               mounted: str | None = "", staged: bool = True, **changes: object) -> dict[str, Any]:
    """A healthy pair host as SparkFacts reads it: `mounted` "" means the unit mounts the wanted generation."""
    address = "192.168.100.10" if spark.role == "head" else "192.168.100.11"
    probe = {"fabric": fabric or ip(IP_CABLED, address), "image_id": image_id,
             "mounted": spark.weights_dir if mounted == "" else mounted, "staged": staged}
    return facts(**{"pair": probe, "endpoint_state": "active", **changes})


def head_and_worker() -> tuple[Endpoint, Endpoint]:
    return spark("pair-01"), spark("pair-02")


def fabric_findings(spark: Endpoint, fabric: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(f.severity, f.field, f.message) for f in host_findings(spark, pair_facts(spark, fabric))
            if f.rule == "host.fabric"]


# --- each host's fabric interface (the preflight: a deploy refuses the host too) --------------------------------


def test_a_cabled_interface_with_an_address_passes_on_both() -> None:
    head, worker = head_and_worker()
    assert host_findings(head, pair_facts(head)) == host_findings(worker, pair_facts(worker)) == []


@pytest.mark.parametrize(("fabric", "field", "words"), [
    ({"exists": False, "error": 'Device "enp1s0f0np0" does not exist.'}, "pair.interface",
     "there is no interface enp1s0f0np0 on this host"),
    (ip(IP_DOWN), "pair.interface", "enp1s0f0np0 is down (not brought up): bring it up (`ip link set enp1s0f0np0 up`"),
    (ip(IP_NO_CARRIER), "pair.interface", "enp1s0f0np0 is up but has no carrier (DOWN): check the QSFP cable"),
    (ip(IP_NO_ADDRESS), "pair.interface", "enp1s0f0np0 has no address: give both Sparks of pair pair-a an address"),
    (ip(IP_CABLED, "192.168.100.12"), "pair.master_addr",
     "192.168.100.10 is not an address of this head's enp1s0f0np0 (it has 192.168.100.12/24): the worker connects "
     "to master_addr"),
])
def test_the_heads_interface_must_exist_be_up_cabled_and_hold_master_addr(fabric: dict[str, Any], field: str,
                                                                          words: str) -> None:
    [(severity, found_field, message)] = fabric_findings(spark("pair-01"), fabric)
    assert (severity, found_field) == ("error", field) and words in message


def test_master_addr_is_the_heads_alone_and_an_unread_interface_is_a_warning() -> None:
    assert fabric_findings(spark("pair-02"), ip(IP_CABLED, "192.168.100.11")) == []
    [(severity, field, message)] = fabric_findings(spark("pair-02"), {"exists": None, "error": "ip is not installed"})
    assert (severity, field) == ("warning", "pair.interface") and "could not read interface enp1s0f0np0" in message


def test_doctor_shows_the_fabric_and_each_nodes_share_of_the_memory_budget() -> None:
    head = spark("pair-01")
    rows = {row.rule: row for row in doctor.host_rows(head, pair_facts(head))}
    assert list(rows) == [*HOST_CHECKS, "host.fabric"] and {row.status for row in rows.values()} == {"ok"}
    assert rows["host.fabric"].field == "pair.interface"
    assert rows["host.fabric"].message == ("enp1s0f0np0 is up with 192.168.100.10/24; master_addr 192.168.100.10 is "
                                           "this head's")
    assert "(this Spark's share of the model split across 2) fits in" in rows["host.memory"].message
    alone = doctor.host_rows(standalone(), facts())
    assert [row.rule for row in alone] == list(HOST_CHECKS) and "share" not in alone[4].message


# --- across the two hosts --------------------------------------------------------------------------------------


def across(head_facts: dict[str, Any] | None = None, worker_facts: dict[str, Any] | None = None,
           reach: str = "ok") -> dict[str, doctor.Row]:
    """doctor's pair rows for the healthy pair with `head_facts` / `worker_facts` instead; both hosts get them."""
    head, worker = head_and_worker()
    reports = {name: doctor.HostReport(name, [], spark, facts_) for name, spark, facts_ in (
        ("pair-01", head, head_facts or pair_facts(head)),
        ("pair-02", worker, (worker_facts or pair_facts(worker)) | {"master_reach": reach}))}
    doctor.pair_rows(reports, set())
    assert reports["pair-01"].rows == reports["pair-02"].rows
    rows = {row.rule: row for row in reports["pair-01"].rows}
    assert list(rows) == list(pair_checks.CHECKS)
    return rows


def test_a_healthy_pair_has_ok_rows_naming_what_was_compared() -> None:
    rows = across()
    head = spark("pair-01")
    assert {row.status for row in rows.values()} == {"ok"}
    assert rows["pair.image"].message == f"pair-a: {head.image} is sha256:3b2f8e5c1a2b on both"
    assert rows["pair.weights"].message == (f"pair-a: both units mount generation {head.weights.id}; "  # type: ignore[union-attr]
                                            f"{head.weights.id} is staged on both")  # type: ignore[union-attr]
    assert rows["pair.master"].message == "pair-a: pair-02 reaches pair-01's master port 192.168.100.10:29500"


def test_different_images_name_both_hosts_and_ids() -> None:
    worker = spark("pair-02")
    row = across(worker_facts=pair_facts(worker, image_id=OTHER_ID))["pair.image"]
    assert (row.status, row.field) == ("error", "vllm_image")
    assert row.message == (f"pair-a: pair-01 runs sha256:3b2f8e5c1a2b and pair-02 sha256:9e0c4d71ab23 for "
                           f"{worker.image}: both nodes must run the same image; pin `vllm_image` by digest "
                           "(image@sha256:..., a tag pulled at different times names different images and a deploy "
                           "pulls it only when missing), then re-deploy both")


def test_an_image_not_pulled_yet_is_said_not_blamed() -> None:
    head, worker = head_and_worker()
    row = across(pair_facts(head, image_id=None), pair_facts(worker, image_id=None))["pair.image"]
    assert (row.status, row.message) == ("ok", f"pair-a: {head.image} is not pulled yet on either host (a deploy "
                                                "pulls it on both)")
    row = across(worker_facts=pair_facts(worker, image_id=None))["pair.image"]
    assert row.status == "ok" and row.message.endswith("on pair-01, not pulled yet on pair-02 (a deploy pulls it)")


def test_different_mounted_generations_are_an_error() -> None:
    head, worker = head_and_worker()
    old = f"{head.model_root}/sha256-1111111111111111"
    row = across(worker_facts=pair_facts(worker, mounted=old))["pair.weights"]
    assert (row.status, row.field) == ("error", "model_source")
    assert row.message == (f"pair-a: pair-01's unit mounts weights generation {head.weights.id} and pair-02's "  # type: ignore[union-attr]
                           "sha256-1111111111111111: both nodes must load the same weights; re-deploy both (both then "
                           f"mount {head.weights.id})")  # type: ignore[union-attr]
    row = across(worker_facts=pair_facts(worker, mounted=None, staged=False))["pair.weights"]
    assert row.status == "ok" and row.message == (
        f"pair-a: pair-01's unit mounts {head.weights.id}; pair-02 has no unit yet; {head.weights.id} is staged "  # type: ignore[union-attr]
        "on pair-01 only (a deploy stages it)")


def test_a_worker_outside_master_addrs_subnet_is_an_error() -> None:
    worker = spark("pair-02")
    row = across(worker_facts=pair_facts(worker, ip(IP_CABLED, "10.0.0.2")))["pair.master"]
    assert (row.status, row.field) == ("error", "pair.master_addr")
    assert row.message.startswith("pair-a: pair-02's enp1s0f0np0 has no address in the subnet of master_addr "
                                  "192.168.100.10 (it has 10.0.0.2/24): the worker would reach pair-01 another way")


@pytest.mark.parametrize(("reach", "hint"), [
    ("refused", "nothing accepts it there"),
    ("timed out", "packets are dropped on the way: a firewall on the head"),
    ("no route to host", "check the route (`ip route get 192.168.100.10` on pair-02)"),
])
def test_an_active_heads_master_port_must_be_reachable_from_the_worker(reach: str, hint: str) -> None:
    row = across(reach=reach)["pair.master"]
    assert (row.status, row.field) == ("error", "pair.master_port")
    assert row.message.startswith(f"pair-a: pair-02 cannot connect to pair-01's master port 192.168.100.10:29500 "
                                  f"({reach}) while pair-01's unit is active: the worker cannot join the head; {hint}")


def test_the_master_port_is_not_judged_while_the_head_does_not_run() -> None:
    head = spark("pair-01")
    row = across(pair_facts(head, endpoint_state="inactive"), reach="refused")["pair.master"]
    assert (row.status, row.message) == ("ok", "pair-a: pair-01's master port 192.168.100.10:29500 was not tested: "
                                               "pair-01's unit is inactive, and only a running head listens there "
                                               "(ask again once it runs)")


def test_a_pair_with_one_host_unread_is_not_compared_and_says_so() -> None:
    head, worker = head_and_worker()
    reports = {"pair-01": doctor.HostReport("pair-01", [], head, pair_facts(head)),
               "pair-02": doctor.HostReport("pair-02", [], worker, None)}
    doctor.pair_rows(reports, set())
    [row] = reports["pair-01"].rows
    assert (row.rule, row.status) == ("pair", "warning") and row.message.startswith("pair-a: pair-02 could not be read")
    assert reports["pair-02"].rows == []


# --- the pair's inventory rules, and both hosts read whichever is targeted --------------------------------------


def test_the_pairs_inventory_rules_show_on_the_hosts_they_name_and_stop_the_comparison() -> None:
    head, worker = spark("pair-01"), spark("pair-02", master_port=29501)
    reports = {name: doctor.HostReport(name, [], endpoint) for name, endpoint in (("pair-01", head),
                                                                                  ("pair-02", worker))}
    data = {"pair-01": {"pair": PAIR}, "pair-02": {"pair": PAIR | {"master_port": 29501}}}
    assert doctor.pair_inventory_rows(reports, data) == {"pair-a"}
    [row] = reports["pair-02"].rows
    assert (row.rule, row.status, row.field) == ("inventory", "error", "pair")
    assert row.message.startswith("`pair` differs from pair-01's in pair 'pair-a' (master_port: 29500 on pair-01, "
                                  "29501 on pair-02)")
    assert reports["pair-01"].rows == []


def test_doctor_reads_both_hosts_of_a_targeted_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    offline_sources(monkeypatch)
    hosts = [("spark-01", {"model_source": MIRROR}), ("pair-01", {"model_source": MIRROR, "pair": PAIR}),
             ("pair-02", {"model_source": MIRROR, "pair": PAIR})]
    state = State(Inventory(([name for name, _ in hosts], {}), **{f"g{i}": ([name], data)
                                                                   for i, (name, data) in enumerate(hosts)}), Config())
    targeted = [state.inventory.get_host("pair-02")]
    monkeypatch.setattr(doctor, "load_hosts", lambda inventory, limits, data: (state, targeted))
    queries: dict[str, dict[str, Any]] = {}

    def read_host(state: State, host: Host, endpoint: Endpoint) -> dict[str, Any]:
        queries[host.name] = json.loads(json.dumps(preflight_query(endpoint) | doctor.master_query(endpoint)))
        return pair_facts(endpoint) | ({"master_reach": "ok"} if endpoint.role == "worker" else {})

    monkeypatch.setattr(doctor, "read_host", read_host)
    reports = doctor.diagnose("inventory.py", ["pair-02"])
    assert [report.host for report in reports] == ["pair-01", "pair-02"]
    assert [report.status for report in reports] == ["ok", "ok"]
    assert "master" in queries["pair-02"] and "master" not in queries["pair-01"]
    assert queries["pair-02"]["master"] == {"address": "192.168.100.10", "port": 29500}
    assert queries["pair-01"]["pair"]["interface"] == "enp1s0f0np0"
    assert [row.rule for row in reports[0].rows][-3:] == list(pair_checks.CHECKS)


def test_the_workers_api_port_is_not_needed_so_another_listener_there_is_fine() -> None:
    head, worker = head_and_worker()
    taken = {"port_listener": "nginx", "port_ours": False, "endpoint_state": "active"}
    assert [f.rule for f in host_findings(worker, pair_facts(worker, **taken)) if f.rule == "host.port"] == []
    assert [f.field for f in host_findings(head, pair_facts(head, **taken)) if f.rule == "host.port"] == ["vllm_port"]
    assert host_summary(worker, pair_facts(worker), 0)["host.port"] == (
        "a pair's worker serves no API: port 8000 is not needed here")
    ours = pair_facts(head, port_listener="vllm", port_ours=True)
    ours["pair"]["master_port"] = {"port_listener": "vllm", "port_ours": True}
    assert host_summary(head, ours, 0)["host.port"] == (
        "port 8000 is served by sparkfleet-vllm; master port 29500 is held by sparkfleet-vllm")
    assert host_summary(head, pair_facts(head), 0)["host.port"] == "port 8000 is free; master port 29500 is free"


def test_the_verdict_tells_a_refused_host_from_a_pair_that_cannot_serve() -> None:
    def report(host: str, rule: str) -> doctor.HostReport:
        return doctor.HostReport(host, [doctor.Row(rule, "error", "f", "m"), doctor.Row("host.os", "ok", "", "")])

    assert doctor.verdict([report("pair-01", "pair.image"), report("pair-02", "pair.image")]) == (
        "doctor: 2 would deploy but their pair cannot serve: pair-01, pair-02")
    assert doctor.verdict([report("spark-01", "host.disk"), report("pair-01", "pair.master")]) == (
        "doctor: 1 of 2 hosts would be refused: spark-01; 1 would deploy but their pair cannot serve: pair-01")


@pytest.mark.parametrize(("held", "refused"), [
    ({"port_listener": None, "port_ours": False}, False),
    ({"port_listener": "vllm", "port_ours": True}, False),          # the head's own engine
    ({"port_listener": "python3", "port_ours": False}, True),      # a training job's torch store
    ({"port_listener": "unknown", "port_ours": None}, False),       # not named: the unit is active, trust it
])
def test_the_heads_master_port_held_by_someone_else_refuses_the_head(held: dict[str, Any], refused: bool) -> None:
    head, worker = head_and_worker()
    assert preflight_query(head)["pair"]["master_port"] == 29500
    assert "master_port" not in preflight_query(worker)["pair"]
    found = pair_facts(head)
    found["pair"]["master_port"] = held
    errors = [f for f in host_findings(head, found) if f.field == "pair.master_port"]
    assert len(errors) == refused
    if refused:
        assert errors[0].message.startswith("port 29500 (the master port of pair pair-a) is already held by python3 "
                                            "(not sparkfleet-vllm)")
