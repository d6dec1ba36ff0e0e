"""The gateway: its configuration from the inventory, and the runtime API's answers as HAProxy 2.6 gives them.

tests/unit/haproxy/ holds real answers of HAProxy 2.6.12 (Debian 12's) to `show stat` and `show servers state`,
taken with spark-01 set to maint and spark-02 to drain while each served two requests, spark-03 drained while
refusing connections, and spark-04 answering its health check with 401 (another API key).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from sparkfleet.config import GatewayConfig
from sparkfleet.deploys.gateway import render
from sparkfleet.fleet import FleetError, load_inventory
from sparkfleet.gateway import (
    SHOW,
    Gateway,
    GatewayError,
    Gateways,
    Server,
    answers,
    parse_views,
    server_ids,
    state_commands,
)
from sparkfleet.runner import Reply

DATA = Path(__file__).parent / "haproxy"


def views() -> dict:
    return parse_views((DATA / "show-stat.csv").read_text(), (DATA / "show-servers-state.txt").read_text())


def test_each_spark_as_the_gateway_sees_it() -> None:
    seen = views()
    assert sorted(seen) == ["spark-01", "spark-02", "spark-03", "spark-04"]  # no FRONTEND, BACKEND or other proxy
    assert (seen["spark-01"].status, seen["spark-01"].admin, seen["spark-01"].sessions) == ("MAINT", "maint", 2)
    assert (seen["spark-02"].status, seen["spark-02"].admin, seen["spark-02"].sessions) == ("DRAIN", "drain", 2)
    # show stat says only DOWN for a drained server that is down: the admin state comes from show servers state
    assert (seen["spark-03"].status, seen["spark-03"].admin) == ("DOWN", "drain")
    assert seen["spark-04"].check == "L7STS 401"
    assert not any(view.up for view in seen.values())


def test_summaries_say_state_sessions_and_why_down() -> None:
    seen = views()
    assert seen["spark-02"].summary() == "up, drain, 2 in flight"
    assert seen["spark-03"].summary() == "down, drain (L4CON Connection refused), 0 in flight"
    assert seen["spark-04"].summary() == "down (L7STS 401), 0 in flight"


def test_an_up_ready_server_is_up() -> None:
    stat = (DATA / "show-stat.csv").read_text().replace("sparks,spark-02,0,0,2,2,,2,0,0,,0,,0,0,0,0,DRAIN",
                                                         "sparks,spark-02,0,0,0,2,,2,0,0,,0,,0,0,0,0,UP")
    state = (DATA / "show-servers-state.txt").read_text().replace("spark-02 127.0.0.1 2 8", "spark-02 127.0.0.1 2 0")
    view = parse_views(stat, state)["spark-02"]
    assert view.up and view.summary() == "up, 0 in flight"


def test_drain_and_ready_commands_name_backend_and_server() -> None:
    assert state_commands(["spark-01", "spark-02"], "drain") == [
        "set server sparks/spark-01 state drain", "set server sparks/spark-02 state drain"]


def test_answers_are_returned_in_order() -> None:
    reply = Reply("gw", True, ["Welcome to gw", json.dumps({"answers": ["\n", "# pxname,svname\n"]})])
    assert answers(reply, ["set server sparks/a state drain", "show stat"]) == ["\n", "# pxname,svname\n"]


@pytest.mark.parametrize(("reply", "expected"), [
    (Reply("gw", True, [json.dumps({"error": "FileNotFoundError: No such file or directory"})]),
     "gw: cannot reach HAProxy's runtime API at /run/haproxy/admin.sock (FileNotFoundError"),
    (Reply("gw", True, [json.dumps({"answers": ["No such server.\n\n"]})]),
     "gw: HAProxy refused `set server sparks/x state drain`: No such server."),
    (Reply("gw", False, [], ["sh: 1: python3: not found"]),
     "gw: the gateway's runtime API gave no answers (it said 'sh: 1: python3: not found')"),
    (Reply("gw", False, error="cannot connect over SSH (timed out)"), "gw: cannot connect over SSH (timed out)"),
])
def test_unusable_answers_name_the_gateway_and_the_fix(reply: Reply, expected: str) -> None:
    with pytest.raises(GatewayError) as error:
        answers(reply, ["set server sparks/x state drain"])
    assert str(error.value).startswith(expected)


def test_server_ids_are_stable_when_the_fleet_grows() -> None:
    before = server_ids(["spark-01", "spark-02", "spark-03"])
    after = server_ids(["spark-00", "spark-01", "spark-02", "spark-03"])
    assert all(after[name] == before[name] for name in before)
    assert len(set(after.values())) == 4


def gateway(key: str | None = "k3y", **config: object) -> Gateway:
    servers = (Server("spark-01", "10.0.0.1", 8000, 11), Server("spark-02", "fd00::2", 8001, 12))
    return Gateway("gw", GatewayConfig(**config), servers, key)


def test_config_renders_every_server_check_and_retries() -> None:
    text = render(gateway(gateway_port=8080))
    assert text.startswith("# Managed by sparkfleet: do not edit")
    assert "    bind :8080\n" in text
    assert "    balance leastconn\n" in text and "hash-type" not in text
    assert 'http-check send meth GET uri /v1/models ver HTTP/1.1 hdr Host sparkfleet-gateway hdr Authorization ' \
           '"Bearer k3y"\n' in text
    assert "    http-check expect status 200\n" in text
    assert "default-server check inter 5s fall 3 rise 2 slowstart 60s observe layer7" in text
    assert "retry-on conn-failure empty-response 503" in text and "option redispatch 1" in text
    assert "    server spark-01 10.0.0.1:8000 id 11\n    server spark-02 fd00::2:8001 id 12\n" in text
    assert "bind :8405" in text and "use-service prometheus-exporter" in text
    assert "stats socket /run/haproxy/admin.sock mode 660 group haproxy level admin" in text
    assert "\n\n\n" not in text


def test_config_hash_balancing_no_key_no_metrics_no_slowstart() -> None:
    text = render(gateway(None, gateway_balance="hash", gateway_hash_header="X-Agent", gateway_metrics_port=None,
                          gateway_slowstart_seconds=0))
    assert "    balance hdr(X-Agent)\n    hash-type consistent\n" in text
    assert "Authorization" not in text and "slowstart" not in text and "prometheus" not in text


# --- the inventory: a gateway routes every serving Spark, checked before anything runs -----------------------

SPARK = {"model_source": "http://mirror.lan/models/qwen", "vllm_api_key": "env:SPARKFLEET_TEST_KEY"}


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKFLEET_TEST_KEY", "fleet-key")
    monkeypatch.setenv("SPARKFLEET_OTHER_KEY", "other-key")


def inventory(**hosts: dict) -> dict[str, dict]:
    return {"spark-01": SPARK | {"vllm_url": "http://10.0.0.1:8000"}, "spark-02": SPARK, "gw": {}} | hosts


def errors(hosts: dict[str, dict], targeted: set[str] | None = None) -> str:
    with pytest.raises(FleetError) as error:
        load_inventory(hosts, {"gw"}, targeted)
    return str(error.value)


def test_a_gateway_routes_every_serving_spark_even_untargeted() -> None:
    hosts = inventory(**{"spark-03": SPARK | {"vllm_start": False}})
    fleet = load_inventory(hosts, {"gw"}, targeted={"gw"})
    assert fleet.sparks == {}
    gw = fleet.gateways["gw"]
    assert [(s.name, s.address, s.port) for s in gw.servers] == [("spark-01", "10.0.0.1", 8000),
                                                                 ("spark-02", "spark-02", 8000)]
    assert gw.api_key == "fleet-key" and "fleet-key" not in repr(gw)


def test_a_gateway_ignores_spark_variables_and_refuses_its_own_typos() -> None:
    fleet = load_inventory(inventory(gw={"vllm_api_key": "env:SPARKFLEET_TEST_KEY", "gateway_port": 8080}), {"gw"})
    assert fleet.gateways["gw"].config.gateway_port == 8080
    message = errors(inventory(gw={"gateway_prot": 8080}))
    assert "gw: `gateway_prot` is not a sparkfleet variable. Did you mean `gateway_port`?" in message


def test_a_spark_only_run_does_not_judge_the_gateway() -> None:
    fleet = load_inventory(inventory(gw={"gateway_port": 0}), {"gw"}, targeted={"spark-01"})
    assert list(fleet.sparks) == ["spark-01"] and fleet.gateways == {}


@pytest.mark.parametrize(("hosts", "expected"), [
    ({"spark-02": SPARK | {"ssh_hostname": "127.0.0.1"}},
     "spark-02: `ssh_hostname`: a gateway would reach this Spark at 127.0.0.1, a loopback address"),
    ({"spark-02": SPARK | {"vllm_url": "http://localhost:8000"}}, "spark-02: `vllm_url`: a gateway would reach"),
    ({"spark-02": SPARK | {"vllm_url": "https://spark-02.lan"}}, "spark-02: `vllm_url` = 'https://spark-02.lan': a "
     "gateway reaches a Spark's endpoint over plain http"),
    ({"spark-02": SPARK | {"vllm_api_key": "env:SPARKFLEET_OTHER_KEY"}},
     "spark-01, spark-02: `vllm_api_key` is not one key for these Sparks, which every gateway routes (each group "
     "accepts its own: spark-01; spark-02)"),
    ({"spark-02": SPARK | {"vllm_port": 0}}, "spark-02: `vllm_port` = 0"),
    ({"gw": {"gateway_balance": "random"}}, "gw: `gateway_balance` = 'random'"),
    ({"spark 02": SPARK}, "spark 02: the host name cannot name a gateway's server"),
])
def test_what_a_gateway_cannot_use_is_named_with_its_fix(hosts: dict, expected: str) -> None:
    message = errors(inventory(**hosts))
    assert message.startswith("bad inventory, nothing was changed on any host:")
    assert expected in message
    assert "fleet-key" not in message and "other-key" not in message


def test_a_key_haproxy_cfg_cannot_carry_is_refused_unquoted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKFLEET_TEST_KEY", 'a"b%c')
    message = errors(inventory())
    assert "spark-01: `vllm_api_key`: a gateway sends this key in its health checks from haproxy.cfg" in message
    assert 'a"b%c' not in message


def test_a_gateway_without_sparks_is_refused() -> None:
    message = errors({"gw": {}, "spark-01": SPARK | {"vllm_start": False}})
    assert "gw: no Spark to route to: every host outside the `gateways` group has `vllm_start` false" in message


def test_a_gateway_host_is_read_for_its_own_state_only(tmp_path: Path) -> None:
    """The host-side script answers a gateway's query (files, units, packages) without a Spark's preflight probes
    (GPU, Docker, weights) and without the Spark state probes the query does not ask for."""
    from sparkfleet.deploys.state import gateway_query
    from sparkfleet.remote import host_facts

    query = gateway_query().as_dict() | {"files": [str(tmp_path / "haproxy.cfg")]}
    facts = host_facts.gather({"state": query})
    assert facts["probe_errors"] == {}
    assert set(facts) == {"probe_errors", "state"}
    assert set(facts["state"]) == {"files", "units", "installed", "login_user"}
    assert facts["state"]["files"] == {str(tmp_path / "haproxy.cfg"): None}


# --- driving every gateway: drain, wait, ready ---------------------------------------------------------------


def show(servers: dict[str, tuple[str, int, int]], check: str = "L7OK,200") -> list[str]:
    """A `show stat` and `show servers state` answer pair with each server's status, sessions and admin bits."""
    stat = "# pxname,svname,scur,status,check_status,check_code,last_chk\n" + "".join(
        f"sparks,{name},{sessions},{status},{check},\n" for name, (status, sessions, _) in servers.items())
    places = {"spark-01": "10.0.0.1 8000", "spark-02": "fd00::2 8001"}
    state = "1\n# be_id be_name srv_id srv_name srv_admin_state srv_addr srv_port\n" + "".join(
        f"3 sparks {i} {name} {bits} {places.get(name, '10.9.9.9 8000')}\n"
        for i, (name, (_, _, bits)) in enumerate(servers.items()))
    return [stat, state]


class FakeShell:
    """The gateways' answers in turn: each `show` answers the next entry of `shows`; sets answer "\\n"."""

    def __init__(self, *shows: dict[str, tuple[str, int, int]]) -> None:
        self.shows, self.commands, self.check = list(shows), [], "L7OK,200"

    def shell(self, names: list[str], command: str) -> dict[str, Reply]:
        asked = shlex.split(command)[4:]
        self.commands.append(asked)
        answers = show(self.shows.pop(0), self.check) if asked == SHOW else ["\n"] * len(asked)
        return {name: Reply(name, True, [json.dumps({"answers": answers})]) for name in names}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def gateways(shell: FakeShell, **config: object) -> tuple[Gateways, Clock]:
    clock = Clock()
    return Gateways(shell, {"gw": gateway(**config)}, clock.sleep, lambda: clock.now), clock


def test_drain_waits_until_nothing_is_in_flight() -> None:
    shell = FakeShell({"spark-01": ("DRAIN", 2, 8)}, {"spark-01": ("DRAIN", 1, 8)}, {"spark-01": ("DRAIN", 0, 8)})
    drained, clock = gateways(shell)
    assert drained.drain(["spark-01"]) == ""
    assert shell.commands[0] == ["set server sparks/spark-01 state drain"]
    assert clock.now == 4.0  # two polls found requests in flight


def test_drain_gives_up_after_the_drain_timeout_and_says_what_was_in_flight() -> None:
    shell = FakeShell(*[{"spark-01": ("DRAIN", 3, 8)}] * 4)
    drained, clock = gateways(shell, gateway_drain_timeout_seconds=5)
    assert drained.drain(["spark-01"]) == ("requests still in flight after draining 5 s (3 on spark-01 at gw): "
                                           "restarted anyway")
    assert clock.now == 6.0


def test_ready_waits_for_the_gateway_to_see_the_spark_up() -> None:
    shell = FakeShell({"spark-01": ("DOWN 1/2", 0, 0)}, {"spark-01": ("UP", 0, 0)})
    ready, _ = gateways(shell)
    assert ready.ready(["spark-01"]) == {}
    assert shell.commands[0] == ["set server sparks/spark-01 state ready"]


def test_ready_reports_a_spark_the_gateway_never_sees_up() -> None:
    shell = FakeShell(*[{"spark-01": ("DOWN", 0, 0)}] * 20)
    shell.check = "L7STS,503"
    ready, _ = gateways(shell, gateway_check_interval_seconds=2, gateway_check_rise=2)
    assert ready.ready(["spark-01"]) == {
        "spark-01": "13 s after its health gate, gw still sees it down (L7STS 503): check that gw reaches its vllm_url"}


def test_check_names_a_spark_a_gateway_does_not_route() -> None:
    checked, _ = gateways(FakeShell({"spark-01": ("UP", 0, 0)}))
    with pytest.raises(GatewayError, match=r"gw: its configuration routes no requests to spark-02: deploy the "
                                           r"gateway first \(pyinfra INVENTORY deploy.py --limit gw\)"):
        checked.check(["spark-01", "spark-02"])


# --- status and drift ------------------------------------------------------------------------------------------


def test_status_shows_each_spark_as_each_gateway_sees_it() -> None:
    from sparkfleet import status

    seen = status.Answer("gw", gateway=True, views=views())
    lost = status.Answer("gw-2", error="cannot connect over SSH (timed out)", gateway=True)
    rows = status.gateway_rows(seen)
    assert rows[1] == ["gw", "spark-02", "[yellow]up, drain[/]", "2", "L7OK 200"]
    assert rows[2] == ["gw", "spark-03", "[bold red]down, drain[/]", "0", "L4CON Connection refused"]
    assert status.gateway_rows(lost) == [["gw-2", "", "[bold red]no answer[/]", "", ""]]
    assert status.exit_code([seen]) == 0 and status.exit_code([seen, lost]) == 1
    assert seen.as_dict()["gateway"]["spark-01"] == {"state": "maint", "status": "MAINT", "sessions": 2,
                                                     "served": 2, "admin": "maint", "check": ""}


def test_drift_names_a_spark_left_drained_at_a_gateway() -> None:
    from sparkfleet import drift, status

    seen = status.Answer("gw", gateway=True, views=views())
    report = drift.gateway_drift(seen, drift.Plan({}, {}))
    assert report.lines()[0] == ("gw: spark-01 is left in maint here (an interrupted rollout, or by hand): it gets no "
                                 "new requests until the next rollout or `set server sparks/spark-01 state ready`")
    assert len(report.lines()) == 3  # spark-01 maint, spark-02 and spark-03 drained; spark-04 is only down
    silent = status.Answer("gw", error="cannot reach HAProxy's runtime API", gateway=True)
    plan = drift.Plan({"gw": ["Install HAProxy from the distribution's archive"]}, {})
    assert drift.gateway_drift(silent, plan).error is None  # the plan installs it: not an error
    assert drift.gateway_drift(silent, drift.Plan({}, {})).error == "cannot reach HAProxy's runtime API"


def test_check_names_a_spark_the_gateway_sends_elsewhere() -> None:
    shell = FakeShell({"spark-01": ("UP", 0, 0), "spark-02": ("UP", 0, 0)})
    checked, _ = gateways(shell)
    checked.check(["spark-01", "spark-02"])  # where the inventory says: fd00::2 is fd00::2, however written
    stale, _ = gateways(FakeShell({"spark-01": ("UP", 0, 0), "spark-02": ("UP", 0, 0)}))
    stale.gateways["gw"] = Gateway("gw", GatewayConfig(), (Server("spark-01", "10.0.0.7", 8000, 11),
                                                           Server("spark-02", "fd00:0::2", 8001, 12)), None)
    with pytest.raises(GatewayError, match=r"gw: its configuration routes spark-01 at 10.0.0.1:8000, not where the "
                                           r"inventory says: deploy the gateway first"):
        stale.check(["spark-01", "spark-02"])
