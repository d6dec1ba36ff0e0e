"""host_state: one reading of a Spark shared by the preflight and every operation until an operation changes the
host, then read again; and the query deploys/state.py builds covers what the operations read."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager
from types import SimpleNamespace
from typing import Any

import pytest
from pyinfra.api.operation import OperationMeta
from pyinfra.connectors.util import CommandOutput
from pyinfra.context import ctx_host, ctx_state

from sparkfleet import host_state, operations
from sparkfleet.config import SparkConfig
from sparkfleet.deploys import runtime
from sparkfleet.deploys.state import state_query
from sparkfleet.endpoint import resolve
from sparkfleet.host_state import HostState, StateQuery
from sparkfleet.preflight import SparkFacts
from tests.unit.optest import run
from tests.unit.resolved import resolved

QUERY = StateQuery(files=("/etc/sparkfleet",), units=("sparkfleet-vllm.service",), runtime="nvidia-container-runtime",
                   runtime_config="/etc/nvidia-container-runtime/config.toml", keyring="/usr/share/keyrings/k.gpg",
                   apt_url="https://nvidia.github.io/libnvidia-container/stable/deb", packages=("p1", "p2"),
                   image="vllm/vllm-openai:v0.28.0", weights_script="/usr/local/lib/sparkfleet/stage_weights.py",
                   weights_args=("--dest", "/m"), manifest="/m/.sparkfleet-manifest.json",
                   loaded_weights="/run/sparkfleet/loaded-weights.json", model_root="/models/qwen",
                   unit_files=("/etc/systemd/system/sparkfleet-vllm.service",))
PREFLIGHT = {"weights_dir": "/m", "port": 8000}


class ReadableHost:
    """A pyinfra host whose SparkFacts answers come from a list, one per read."""

    def __init__(self, name: str, *answers: dict[str, Any] | None) -> None:
        self.name = name
        self.answers = list(answers)
        self.queries: list[str] = []

    def get_fact(self, fact: type, query: str) -> dict[str, Any] | None:
        assert fact is SparkFacts
        self.queries.append(query)
        return self.answers.pop(0)


@pytest.fixture
def run_state() -> Iterator[SimpleNamespace]:
    """A pyinfra state with no operations yet, and host_state's memory of earlier runs cleared."""
    fake = SimpleNamespace(ops={})
    with ctx_state.use(fake):
        yield fake


@pytest.fixture(autouse=True)
def fresh_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_state, "_queries", {})
    monkeypatch.setattr(host_state, "_readings", {})


def _on(state: SimpleNamespace, host: ReadableHost) -> AbstractContextManager[None]:
    state.ops.setdefault(host, {})
    return ctx_host.use(host)


def _executed(state: SimpleNamespace, host: ReadableHost, success: bool = True, commands: int = 1) -> OperationMeta:
    """An operation pyinfra has run on `host`, which changed it when it succeeded with commands."""
    meta = OperationMeta(f"op{len(state.ops[host])}", None)
    meta.set_complete(success, ["command"] * commands, CommandOutput([]))
    state.ops[host][meta._hash] = SimpleNamespace(operation_meta=meta)
    return meta


def _planned(state: SimpleNamespace, host: ReadableHost) -> None:
    """An operation planned with a change, not executed yet (the prepare phase)."""
    meta = OperationMeta(f"op{len(state.ops[host])}", True)
    state.ops[host][meta._hash] = SimpleNamespace(operation_meta=meta)


def test_operations_need_the_preflight_to_say_what_they_read(run_state: SimpleNamespace) -> None:
    with _on(run_state, ReadableHost("spark-01")), pytest.raises(RuntimeError, match="preflight"):
        host_state.current()


def test_the_query_is_the_preflights_with_the_operations_state(run_state: SimpleNamespace) -> None:
    spark = ReadableHost("spark-01", {"arch": "arm64"})
    with _on(run_state, spark):
        host_state.register(QUERY, PREFLIGHT)
        host_state.current()
    (query,) = spark.queries
    assert json.loads(query) == {**PREFLIGHT, "state": {**QUERY.as_dict()}}
    assert json.loads(query)["state"]["files"] == ["/etc/sparkfleet"]  # tuples travel as JSON lists
    assert query == json.dumps(json.loads(query), sort_keys=True)  # one spelling: pyinfra keys facts by arguments


def test_one_reading_until_an_operation_changes_the_host(run_state: SimpleNamespace) -> None:
    spark = ReadableHost("spark-01", {"state": {"image_id": None}}, {"state": {"image_id": "sha256:1"}},
                         {"state": {"image_id": "sha256:2"}})
    with _on(run_state, spark):
        host_state.register(QUERY, PREFLIGHT)
        first = host_state.current()
        _planned(run_state, spark)  # planning changes nothing on the host
        _executed(run_state, spark, commands=0)  # ran, changed nothing
        _executed(run_state, spark, success=False)  # failed: pyinfra stops this host anyway
        assert host_state.current() is first and len(spark.queries) == 1
        _executed(run_state, spark)  # a change: the next operation compares against the host as it is now
        second = host_state.current()
        assert second["image_id"] == "sha256:1" and host_state.current() is second and len(spark.queries) == 2
        _executed(run_state, spark)
        assert host_state.current()["image_id"] == "sha256:2" and len(spark.queries) == 3


def test_each_host_has_its_own_reading(run_state: SimpleNamespace) -> None:
    one, two = ReadableHost("spark-01", {"state": {"image_id": "a"}}), ReadableHost("spark-02", {"state": {}})
    with _on(run_state, one):
        host_state.register(QUERY, PREFLIGHT)
    with _on(run_state, two):
        with pytest.raises(RuntimeError):
            host_state.current()  # spark-01's preflight ran, not spark-02's
        host_state.register(QUERY, {**PREFLIGHT, "port": 9000})
        assert host_state.current().get("image_id", "unread") == "unread"
    with _on(run_state, one):
        _executed(run_state, two)  # spark-02 changed: spark-01's reading still holds
        assert host_state.current()["image_id"] == "a"
        assert host_state.current()["image_id"] == "a" and len(one.queries) == 1
    assert json.loads(two.queries[0])["port"] == 9000


def test_a_host_that_gave_no_answer_is_none_and_is_not_asked_again_for_nothing(run_state: SimpleNamespace) -> None:
    """pyinfra printed why the fact failed; asking again before anything changed would only repeat it."""
    spark = ReadableHost("spark-01", None, {"state": {}})
    with _on(run_state, spark):
        host_state.register(QUERY, PREFLIGHT)
        assert host_state.current() is None and host_state.current() is None and len(spark.queries) == 1
        _executed(run_state, spark)
        assert host_state.current() is not None


# --- HostState ---------------------------------------------------------------------------------------------


def test_problem_names_each_unread_part_of_the_state_only() -> None:
    """A preflight probe that failed is the preflight's warning; a state probe that failed stops the operations."""
    assert HostState({"probe_errors": {"gpu": "TimeoutExpired"}, "state": {}}).problem is None
    assert HostState({"probe_errors": {"state.units": "FileNotFoundError: systemctl",
                                       "state.keyring": "PermissionError: [Errno 13]", "disk": "OSError"}}).problem == (
        "could not read units on the host (FileNotFoundError: systemctl); keyring on the host "
        "(PermissionError: [Errno 13])")


def test_accessors() -> None:
    found = HostState({"state": {"files": {"/etc/sparkfleet": None}, "units": {"u.service": {"active": "active",
                                                                                             "enabled": "enabled"}},
                                 "image_id": None}})
    assert found.file("/etc/sparkfleet") is None  # asked for, and not there
    assert found.unit("u.service") == {"active": "active", "enabled": "enabled"}
    assert found["image_id"] is None and found.get("weights", "unread") == "unread"
    with pytest.raises(KeyError, match="/etc/other is not in the host state query"):
        found.file("/etc/other")
    with pytest.raises(KeyError, match="other.timer is not in the host state query"):
        found.unit("other.timer")
    assert HostState({}).get("image_id", "unread") == "unread"  # a host-side script too old to read the state


# --- the deploy's query ------------------------------------------------------------------------------------------


def test_a_blank_host_gets_its_daemon_json_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """docker_runtime writes daemon.json through the file operations, which need it in the query: on a host
    without one (a blank host, or drift that removed the nvidia runtime) it must plan the write, not fail."""
    spark = resolved(resolve("spark-01", SparkConfig(model_source="http://mirror.lan/models/qwen")))
    query = state_query(spark)
    assert runtime.DAEMON_JSON in query.files
    blank = HostState({"state": {"files": dict.fromkeys(query.files), "daemon_json": {
        "config": None, "error": None, "resolved": {query.runtime: query.runtime}}}})
    outcome = run(operations.docker_runtime, blank, monkeypatch, path=runtime.DAEMON_JSON, cdi=None,
                  default_runtime=None)
    assert outcome.commands == ["mkdir -p /etc/docker", "upload /etc/docker/daemon.json",
                                "chmod 644 /etc/docker/daemon.json"]
