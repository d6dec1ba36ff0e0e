"""The runner: targeting as the pyinfra CLI means it, shell commands over the API, deploy.py through the CLI.

Whatever imports pyinfra_cli (load_hosts) runs in its own process: pyinfra_cli patches the interpreter with
gevent. Deploys run the real pyinfra CLI against `@fake` hosts, so its JSON and its stderr are the real ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State

from sparkfleet import runner
from tests.unit.test_vllm_standin import free_port

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
# An inventory file of fake hosts: pyinfra connects to them without a network and answers as scripted.
FLEET = """\
sparks = [("@fake/spark-01", {"fake_delay": 0}), ("@fake/spark-02", {"fake_delay": 0}),
          ("@fake/gpu-01", {"fake_delay": 0, "vllm_port": 8001})]
gpu = (["@fake/gpu-01", "@fake/spark-02"], {"vllm_port": 8002})
blank = []
"""


def _inventory() -> Inventory:
    return Inventory((["spark-01", "spark-02", "spark-10", "gpu-01", "odd[1]", "sparks"], {}),
                     sparks=(["spark-01", "spark-02", "spark-10"], {}), gpu=(["gpu-01", "spark-02"], {}),
                     blank=([], {}))


def _selected(patterns: list[str]) -> list[str]:
    return [host.name for host in runner.select(_inventory(), patterns)]


# --- targeting -----------------------------------------------------------------------------------------


def test_a_limit_names_a_group_or_globs_host_names() -> None:
    assert _selected(["gpu"]) == ["spark-02", "gpu-01"]  # inventory order, not the group's
    assert _selected(["spark-0*"]) == ["spark-01", "spark-02"]
    assert _selected(["spark-1?", "gpu"]) == ["spark-02", "spark-10", "gpu-01"]
    assert _selected(["gpu-01", "gpu-01"]) == ["gpu-01"]
    assert _selected(["sparks"]) == ["spark-01", "spark-02", "spark-10"]  # the group wins over the host
    assert _selected(["blank"]) == [] and _selected(["nope*"]) == []  # an empty group is not a glob


def test_commas_split_a_limit_into_patterns() -> None:
    assert runner.split_limits(["lab_amd64,spark-arm64-01", "x", ",y,"]) == ["lab_amd64", "spark-arm64-01", "x", "y"]


def test_host_patterns_match_each_host_alone() -> None:
    """What rollout and drift hand the pyinfra CLI: exact names, even when a name globs or is a group's."""
    inventory = _inventory()
    patterns = runner.host_patterns(inventory, ["odd[1]", "sparks", "spark-01"])
    assert patterns == ["odd[[]1]", "[s]parks", "spark-01"]
    for name, pattern in zip(["odd[1]", "sparks", "spark-01"], patterns, strict=True):
        assert [host.name for host in runner.select(inventory, [pattern])] == [name]


def _load(tmp_path: Path, cases: list[tuple[list[str], list[str]]]) -> list[dict]:
    """runner.load_hosts for each (limits, data), in one process of its own: names and data, or the error."""
    script = """
import json, sys
from sparkfleet.runner import TargetError, load_hosts
for limits, data in json.loads(sys.argv[1]):
    try:
        state, hosts = load_hosts("fleet.py", limits, data)
        print(json.dumps({"hosts": {host.name: host.data.dict() for host in hosts}}))
    except TargetError as error:
        print(json.dumps({"error": str(error)}))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", script, json.dumps(cases)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60, check=True)
    return [json.loads(line) for line in result.stdout.splitlines()]


def _pyinfra_targets(tmp_path: Path, limits: list[str]) -> list[subprocess.Popen[str]]:
    """The hosts the pyinfra CLI itself acts on for `--limit`, per pattern list (a fact, read from fake hosts)."""
    commands = [[PYINFRA, "fleet.py", *[arg for limit in limit_list for arg in ("--limit", limit)], "fact",
                 "server.Hostname", "--json"] for limit_list in limits]
    return [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            for command in commands]


def test_targets_are_the_hosts_the_pyinfra_cli_would_act_on(tmp_path: Path) -> None:
    (tmp_path / "fleet.py").write_text(FLEET)
    limits = [["gpu"], ["gpu", "*-01"], ["@fake/spark-02"], ["blank"]]
    processes = _pyinfra_targets(tmp_path, limits)
    ours = _load(tmp_path, [([",".join(limit)], []) for limit in limits])
    for limit, process, answer in zip(limits, processes, ours, strict=True):
        theirs = sorted(json.loads(process.communicate(timeout=60)[0])["server.Hostname"])
        if theirs:
            assert sorted(answer["hosts"]) == theirs, limit
        else:
            assert answer["error"].startswith(f"--limit {','.join(limit)} matches no host in fleet.py (hosts: "), limit
    assert list(ours[1]["hosts"]) == ["@fake/spark-01", "@fake/spark-02", "@fake/gpu-01"]  # inventory order


def test_a_limit_pattern_that_matches_nothing_is_an_error_beside_good_ones(tmp_path: Path) -> None:
    """pyinfra only warns; a typo in a rollout's --limit would quietly leave a host out."""
    (tmp_path / "fleet.py").write_text(FLEET)
    (answer,) = _load(tmp_path, [(["gpu,spakr-02"], [])])
    assert answer["error"].startswith("--limit spakr-02 matches no host in fleet.py (hosts: ")


def test_data_overrides_parse_as_pyinfra_parses_them(tmp_path: Path) -> None:
    (tmp_path / "fleet.py").write_text(FLEET)
    data = ["vllm_port=9000", "vllm_start=false", 'vllm_args={"max-num-seqs": 3}', "model_dir=/srv/m", "x=1.5",
            "url=http://a=b"]
    pyinfra = subprocess.run([PYINFRA, "fleet.py", "debug-inventory", "--json",
                              *[arg for item in data for arg in ("--data", item)]],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    theirs = {host["name"]: host["data"] for host in json.loads(pyinfra.stdout)}
    (answer,) = _load(tmp_path, [([], data)])
    assert answer["hosts"] == theirs
    assert answer["hosts"]["@fake/gpu-01"]["vllm_args"] == {"max-num-seqs": 3}
    assert answer["hosts"]["@fake/gpu-01"]["vllm_port"] == 9000


def test_data_without_a_value_is_one_message_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "fleet.py").write_text(FLEET)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "sparkfleet", "status", "fleet.py", "--data", "vllm_port"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == ("sparkfleet status: --data 'vllm_port' is not KEY=VALUE: give e.g. --data "
                             "vllm_port=8001; nothing was changed on any host\n")


# --- shell commands over the API -----------------------------------------------------------------------


def _state(*hosts: tuple[str, dict]) -> State:
    return State(Inventory(([name for name, _ in hosts], {}), **{f"g{i}": ([name], data)
                                                                  for i, (name, data) in enumerate(hosts)}),
                 Config())


def test_a_command_runs_with_the_sudo_the_inventory_asks_for() -> None:
    state = _state(("@fake/a", {"_sudo": True}), ("@fake/b", {}))
    arguments = {host.name: runner.connector_arguments(state, host) for host in state.inventory}
    assert arguments["@fake/a"]["_sudo"] is True and arguments["@fake/b"]["_sudo"] is False
    assert "_if" not in arguments["@fake/a"]  # operation arguments are not the connector's


def test_each_host_answers_with_its_success_and_output() -> None:
    sick = {"fake_delay": 0, "fake_responses": {"check": {"success": False, "stdout": "{}", "stderr": "down"}}}
    state = _state(("@fake/a", {"fake_delay": 0, "fake_responses": {"check": "fine"}}), ("@fake/b", sick),
                   ("dead", {"ssh_hostname": "127.0.0.1", "ssh_port": free_port()}))
    hosts = list(state.inventory)
    replies = runner.Runner("fleet.py", state, hosts, []).shell(["@fake/a", "@fake/b", "dead"], "check")
    assert replies["@fake/a"] == runner.Reply("@fake/a", True, ["fine"], [])
    assert replies["@fake/b"] == runner.Reply("@fake/b", False, ["{}"], ["down"])
    assert not replies["dead"].ok and replies["dead"].error.startswith("cannot connect over SSH (")
    assert [host.connector.executed_commands for host in hosts[:2]] == [["check"], ["check"]]
    assert not any(host.connected for host in hosts)


# --- deploy.py through the pyinfra CLI -----------------------------------------------------------------


def test_the_deploy_command_line() -> None:
    command = runner.deploy_command("inventory/lab.py", ["lab_amd64", "spark-01"], ["a=1", "b=2"], dry=False)
    assert command[1:] == ["--json", "-y", "--limit", "lab_amd64", "--limit", "spark-01", "--data", "a=1",
                           "--data", "b=2", "inventory/lab.py", str(REPO / "deploy.py")]
    assert command[0] == str(Path(sys.executable).with_name("pyinfra"))
    dry = runner.deploy_command("inventory/lab.py", [], [], dry=True)
    assert dry[1:3] == ["--json", "--dry"] and "-y" not in dry  # -y would turn change detection off
    assert runner.environment()["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)


def test_the_deploy_file_is_the_one_of_the_repository_the_command_runs_from(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A `pip install .` copy of sparkfleet has no deploy.py: fleet commands run from the repository, as pyinfra."""
    monkeypatch.chdir(tmp_path)
    assert runner.deploy_file() == REPO / "deploy.py"  # none here: the editable checkout's
    (tmp_path / "deploy.py").write_text("")
    assert runner.deploy_file() == tmp_path / "deploy.py"


DEPLOY = """\
from pyinfra import host
from pyinfra.operations import server

server.shell(name="Greet the host", commands=[f"echo {host.data.greeting}"])
server.shell(name="Say goodbye", commands=["echo bye"])
"""


@pytest.fixture
def fake_fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> runner.Runner:
    """Two fake hosts; `echo hello` fails on spark-02 with some output, the way a failed command does."""
    failing = {"echo hello": {"success": False, "stdout": "partial", "stderr": "E: no such thing"}}
    inventory = tmp_path / "fleet.py"
    inventory.write_text(f'sparks = [("@fake/spark-01", {{"fake_delay": 0}}), '
                         f'("@fake/spark-02", {{"fake_delay": 0, "fake_responses": {failing!r}}})]\n')
    (tmp_path / "deploy.py").write_text(DEPLOY)
    monkeypatch.chdir(tmp_path)  # the deploy.py of the directory the command runs from
    state = State(Inventory((["@fake/spark-01", "@fake/spark-02"], {})), Config())
    return runner.Runner(str(inventory), state, list(state.inventory), ["greeting=hello"])


def test_deploy_results_come_from_the_exit_code_and_the_json_report(fake_fleet: runner.Runner) -> None:
    both = fake_fleet.start_deploy(["@fake/spark-01", "@fake/spark-02"])
    alone = fake_fleet.start_deploy(["@fake/spark-02"])
    dry = fake_fleet.start_deploy(["@fake/spark-01", "@fake/spark-02"], dry=True)
    other = fake_fleet.start_deploy(["@fake/spark-02"], ["greeting=hi"])
    both, alone, dry, other = (run.result() for run in (both, alone, dry, other))

    assert (both.ok, both.failed) == (False, ["@fake/spark-02"])  # the report names the failed host
    assert both.report and both.report["results"]["failed_hosts"] == ["@fake/spark-02"]
    assert both.why("@fake/spark-02") == "Greet the host: partial; E: no such thing; Error: executed 0 commands"
    # Every host failed: pyinfra stops without a report, and each host's lines still say why.
    assert (alone.ok, alone.report, alone.failed) == (False, None, ["@fake/spark-02"])
    assert alone.why("@fake/spark-02") == both.why("@fake/spark-02")
    assert alone.message()[-1] == "--> pyinfra error: No hosts remaining!"
    assert dry.ok and dry.report and dry.report["results"] is None
    assert [op["name"] for op in dry.report["plan"]] == ["Greet the host", "Say goodbye"]
    assert (other.ok, other.failed, other.returncode) == (True, [], 0)  # the later --data wins: "echo hi" works


def test_a_run_that_printed_no_report_did_not_succeed() -> None:
    """pyinfra exits 0 on Ctrl-C before its report: that is not a deploy that worked."""
    interrupted = runner.DeployRun(["a"], False, 0, None, "--> Beginning operation run...\nExiting upon user request!")
    assert (interrupted.ok, interrupted.failed) == (False, ["a"])
    assert interrupted.why("a") == "pyinfra exited 0 and said nothing about a"


def test_host_errors_reset_on_progress_and_keep_the_operation() -> None:
    stderr = """\
--> Connecting to hosts...
    [spark-01] Connected
    [spark-02] Could not connect (timed out)
--> Starting operation: Install the vLLM endpoint service | Pull vllm/vllm-openai:v0.28.0 now, never on boot
    [spark-01] Error response from daemon: manifest unknown
    [spark-01] Error: executed 0 commands
    [spark-03] Success
--> Disconnecting from hosts...
"""
    errors, final = runner.read_errors(stderr)
    assert errors == {
        "spark-02": runner.HostError(["Could not connect (timed out)"], None),
        "spark-01": runner.HostError(["Error response from daemon: manifest unknown", "Error: executed 0 commands"],
                                     "Install the vLLM endpoint service | Pull vllm/vllm-openai:v0.28.0 now, never "
                                     "on boot"),
    }
    assert final == []
