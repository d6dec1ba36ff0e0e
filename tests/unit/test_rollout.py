"""Rollout: its batches, its health gate's verdicts, and the whole run against a fake runner.

The fake stands in for runner.Runner: it records what the rollout asks for, in order, and answers as the
real one would (a deploy's DeployRun with pyinfra's report and stderr, a shell command's Reply per host).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import pytest

from sparkfleet import rollout
from sparkfleet.gateway import GatewayError
from sparkfleet.runner import DeployRun, Reply

HOSTS = ["s1", "s2", "s3", "s4", "s5"]
HEALTHY = {"endpoint": "sparkfleet-vllm", "state": "healthy", "diagnosis": "/health ok"}
CRASHING = {"endpoint": "sparkfleet-vllm", "state": "unhealthy",
            "diagnosis": "FP8 kernels crash on GB10 with this image (cutlass_scaled_mm: Error Internal)"}
PULL = "Install the vLLM endpoint service | Pull vllm/vllm-openai:v0.29.0 now, never on boot"


def test_canary_first_then_batches_in_inventory_order() -> None:
    assert rollout.plan_batches(HOSTS, canary=1, batch=2) == [["s1"], ["s2", "s3"], ["s4", "s5"]]
    assert rollout.plan_batches(HOSTS, canary=2, batch=1) == [["s1", "s2"], ["s3"], ["s4"], ["s5"]]
    assert rollout.plan_batches(HOSTS[:1], canary=1, batch=1) == [["s1"]]
    assert rollout.plan_batches([], canary=1, batch=1) == []


def test_batch_sizes_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        rollout.plan_batches(HOSTS, canary=0, batch=1)


# --- the health gate's verdict -------------------------------------------------------------------------


def _checker(host: str, result: dict, ok: bool, noise: Sequence[str] = ()) -> Reply:
    """The health checker's answer in --json mode: its Result on stdout, its log line on stderr."""
    return Reply(host, ok, [*noise, *json.dumps(result, indent=2).splitlines()], [f"<6>{result['diagnosis']}"])


def test_the_gate_reads_the_checkers_json_verdict() -> None:
    assert rollout.gate_verdict(_checker("s1", HEALTHY, True, ["Welcome to the Spark {lab}"])) == (
        True, "sparkfleet-vllm healthy: /health ok")
    assert rollout.gate_verdict(_checker("s1", CRASHING, False)) == (
        False, "sparkfleet-vllm unhealthy: FP8 kernels crash on GB10 with this image (cutlass_scaled_mm: Error "
               "Internal)")


def test_a_gate_without_a_verdict_fails_with_what_was_said() -> None:
    bad_config = Reply("s1", False, [], ["<3>sparkfleet health: bad config: /etc/sparkfleet/health.json: missing"])
    assert rollout.gate_verdict(bad_config) == (
        False, "the health checker gave no verdict: sparkfleet health: bad config: /etc/sparkfleet/health.json: "
               "missing")
    assert rollout.gate_verdict(Reply("s1", False, error="cannot connect over SSH (timed out)")) == (
        False, "no answer: cannot connect over SSH (timed out)")
    assert rollout.gate_verdict(Reply("s1", False)) == (False, "the health checker gave no verdict: no output")


# --- the whole run, against a fake runner --------------------------------------------------------------


def failed_run(names: Sequence[str], failing: Iterable[str]) -> DeployRun:
    """A deploy where `failing` hosts fail pulling the image, as pyinfra reports it: with its JSON report while
    some host is left, without one when none is."""
    failing = [name for name in names if name in failing]
    stderr = "--> Starting operation: " + PULL + "\n" + "".join(
        f"    [{name}] Error response from daemon: manifest unknown\n    [{name}] Error: executed 0 commands\n"
        for name in failing)
    if len(failing) == len(names):
        return DeployRun(list(names), False, 1, None, stderr + "--> pyinfra error: No hosts remaining!\n")
    report = {"plan": [], "results": {"operations": [], "totals": {}, "failed_hosts": failing}}
    return DeployRun(list(names), False, 1, report, stderr)


class FakeRunner:
    """Deploys fail on `broken` hosts (on `stage_broken` in the stage phase); gates find `sick` hosts unhealthy,
    and `still_sick` ones unhealthy again after the restore. `calls` lists what was asked, in order."""

    def __init__(self, broken: Iterable[str] = (), sick: Iterable[str] = (), still_sick: Iterable[str] = (),
                 stage_broken: Iterable[str] = (), calls: list[str] | None = None,
                 unsaved: Iterable[str] = ()) -> None:
        self.broken, self.sick, self.still_sick = set(broken), set(sick), set(still_sick)
        self.unsaved = set(unsaved)  # hosts whose snapshot fails
        self.stage_broken = set(stage_broken)
        self.calls = [] if calls is None else calls  # a list shared with other fakes keeps one order

    def deploy(self, names: Sequence[str], data: Sequence[str] = (), dry: bool = False) -> DeployRun:
        stage = f"{rollout.PHASE}=stage" in data
        self.calls.append(f"{'stage' if stage else 'deploy'} {' '.join(names)}")
        failing = self.stage_broken if stage else self.broken
        if failing & set(names):
            return failed_run(names, failing)
        return DeployRun(list(names), False, 0, {"plan": [], "results": {"failed_hosts": []}}, "")

    def shell(self, names: Sequence[str], command: str) -> dict[str, Reply]:
        kind = {rollout.snapshot_command(): "snapshot", rollout.restore_command(): "restore",
                rollout.stop_command(): "stop"}.get(command, "gate")
        restored = any(call.startswith("restore ") for call in self.calls)
        self.calls.append(f"{kind} {' '.join(names)}")
        if kind != "gate":
            return {name: Reply(name, name not in self.unsaved or kind != "snapshot", stderr=["cp: No space left"])
                    for name in names}
        sick = self.still_sick if restored else self.sick
        return {name: _checker(name, CRASHING, False) if name in sick else _checker(name, HEALTHY, True)
                for name in names}


def _run(fake: FakeRunner, hosts: list[str] = HOSTS[:4], serving: Iterable[str] = HOSTS, canary: int = 1,
         batch: int = 2) -> rollout.Rollout:
    return rollout.run(fake, hosts, set(serving), canary, batch, 60, lambda line: None)  # type: ignore[arg-type]


def _outcomes(plan: rollout.Rollout) -> dict[str, tuple[str, str]]:
    return {host: (result.outcome, result.diagnosis) for host, result in plan.results.items()}


def test_every_batch_healthy_updates_every_host() -> None:
    fake = FakeRunner()
    plan = _run(fake, serving=["s1", "s2", "s3"])
    assert fake.calls == ["stage s1 s2 s3 s4", "snapshot s1", "deploy s1", "gate s1", "snapshot s2 s3",
                          "deploy s2 s3", "gate s2 s3", "snapshot s4", "deploy s4"]  # s4 does not serve: no gate
    assert plan.failed_batch is None
    assert _outcomes(plan) == {"s1": ("updated", "sparkfleet-vllm healthy: /health ok"),
                               "s2": ("updated", "sparkfleet-vllm healthy: /health ok"),
                               "s3": ("updated", "sparkfleet-vllm healthy: /health ok"),
                               "s4": ("updated", "installed (vllm_start is false)")}


def test_a_sick_batch_rolls_back_only_itself_and_skips_the_rest() -> None:
    fake = FakeRunner(sick=["s3"])
    plan = _run(fake, hosts=HOSTS)
    assert fake.calls == ["stage s1 s2 s3 s4 s5", "snapshot s1", "deploy s1", "gate s1", "snapshot s2 s3",
                          "deploy s2 s3", "gate s2 s3", "restore s2 s3", "gate s2 s3"]
    assert plan.failed_batch == 1
    assert _outcomes(plan) == {
        "s1": ("updated", "sparkfleet-vllm healthy: /health ok"),
        "s2": ("rolled-back", "passed, rolled back with its batch"),
        "s3": ("rolled-back", f"sparkfleet-vllm unhealthy: {CRASHING['diagnosis']}"),
        "s4": ("skipped", "not touched: batch 2 failed"),
        "s5": ("skipped", "not touched: batch 2 failed"),
    }
    assert plan.as_json()["failed_batch"] == 1 and [h["outcome"] for h in plan.as_json()["hosts"]] == [
        "updated", "rolled-back", "rolled-back", "skipped", "skipped"]


def test_a_host_still_sick_after_its_restore_is_a_failed_rollback() -> None:
    plan = _run(FakeRunner(sick=["s1"], still_sick=["s1"]))
    assert plan.failed_batch == 0
    outcome, diagnosis = _outcomes(plan)["s1"]
    assert outcome == "rollback-failed"
    assert diagnosis == f"sparkfleet-vllm unhealthy: {CRASHING['diagnosis']}; after rollback: sparkfleet-vllm " \
                        f"unhealthy: {CRASHING['diagnosis']}"


def test_a_failed_deploy_says_where_and_why_while_its_healthy_batchmate_just_rolls_back() -> None:
    fake = FakeRunner(broken=["s3"])
    plan = _run(fake)
    assert fake.calls[-3:] == ["gate s2 s3", "restore s2 s3", "gate s2 s3"]  # gated even so, then restored
    assert _outcomes(plan)["s2"] == ("rolled-back", "passed, rolled back with its batch")
    assert _outcomes(plan)["s3"] == ("rolled-back", f"deploy failed: {PULL}: Error response from daemon: manifest "
                                                    "unknown; Error: executed 0 commands")


def test_a_canary_whose_deploy_failed_everywhere_is_diagnosed_from_pyinfras_lines() -> None:
    """pyinfra prints no report when every host failed; the diagnosis still names the step and its error."""
    plan = _run(FakeRunner(broken=["s1"]))
    assert plan.failed_batch == 0
    assert _outcomes(plan)["s1"] == ("rolled-back", f"deploy failed: {PULL}: Error response from daemon: manifest "
                                                    "unknown; Error: executed 0 commands")
    assert {outcome for outcome, _ in list(_outcomes(plan).values())[1:]} == {"skipped"}


def test_the_gate_verdict_wins_over_the_deploy_error_for_a_sick_host() -> None:
    plan = _run(FakeRunner(broken=["s1"], sick=["s1"]))
    assert _outcomes(plan)["s1"][1].startswith(f"sparkfleet-vllm unhealthy: {CRASHING['diagnosis']}")


def test_a_failed_stage_touches_nothing() -> None:
    fake = FakeRunner(stage_broken=["s2"])
    plan = _run(fake)
    assert fake.calls == ["stage s1 s2 s3 s4"]  # no snapshot, deploy, gate or restore anywhere
    assert plan.failed_batch == -1
    assert _outcomes(plan) == {
        "s1": ("skipped", "not touched: staging failed on s2"),
        "s2": ("skipped", f"staging failed: {PULL}: Error response from daemon: manifest unknown; Error: executed 0 "
                          "commands"),
        "s3": ("skipped", "not touched: staging failed on s2"),
        "s4": ("skipped", "not touched: staging failed on s2"),
    }


def test_a_host_whose_known_good_cannot_be_saved_is_not_deployed() -> None:
    """A rollback would restore an older known-good: the batch stops before any change, and so does the rollout."""
    fake = FakeRunner(unsaved=["s3"])
    plan = _run(fake)
    assert fake.calls == ["stage s1 s2 s3 s4", "snapshot s1", "deploy s1", "gate s1", "snapshot s2 s3"]
    assert plan.failed_batch == 1
    assert _outcomes(plan) == {
        "s1": ("updated", "sparkfleet-vllm healthy: /health ok"),
        "s2": ("skipped", "not touched: batch 2 could not save s3's known-good configuration"),
        "s3": ("skipped", "not touched: its known-good configuration could not be saved (cp: No space left)"),
        "s4": ("skipped", "not touched: batch 2 could not save s3's known-good configuration"),
    }


# --- with gateways: each batch out of rotation from before its restart until it is healthy again -----------


class FakeGateways:
    """gateway.Gateways as the rollout uses it: `unreachable` raises at that step (check, or drain of a host),
    `down` hosts are not seen up after ready. Calls go into the runner's list, so the order is one."""

    def __init__(self, calls: list[str], unreachable: str = "", down: Iterable[str] = ()) -> None:
        self.calls, self.unreachable, self.down = calls, unreachable, set(down)

    def _call(self, step: str, sparks: Sequence[str]) -> None:
        self.calls.append(f"{step} {' '.join(sparks)}")
        if self.unreachable in (step, f"{step} {sparks[0]}"):
            raise GatewayError("gateway-01: cannot connect over SSH (timed out)")

    def check(self, sparks: Sequence[str]) -> None:
        self._call("check", sparks)

    def drain(self, sparks: Sequence[str]) -> str:
        self._call("drain", sparks)
        return ""

    def ready(self, sparks: Sequence[str]) -> dict[str, str]:
        self._call("ready", sparks)
        return {spark: "gateway-01 sees it down (L4CON Connection refused), 0 in flight" for spark in sparks
                if spark in self.down}


def _run_gated(fake: FakeRunner, gateways: FakeGateways, hosts: list[str] = HOSTS[:4]) -> rollout.Rollout:
    return rollout.run(fake, hosts, {"s1", "s2", "s3"}, 1, 2, 60, lambda line: None,  # type: ignore[arg-type]
                       gateways=gateways)  # type: ignore[arg-type]


def test_each_batch_is_drained_before_its_restart_and_ready_after_its_gate() -> None:
    fake = FakeRunner()
    plan = _run_gated(fake, FakeGateways(fake.calls))
    assert fake.calls == ["check s1 s2 s3", "stage s1 s2 s3 s4", "snapshot s1", "drain s1", "deploy s1", "gate s1",
                          "ready s1", "snapshot s2 s3", "drain s2 s3", "deploy s2 s3", "gate s2 s3", "ready s2 s3",
                          "snapshot s4", "deploy s4"]  # s4 serves nothing: no gateway routes to it
    assert plan.failed_batch is None


def test_an_unreachable_gateway_stops_the_rollout_before_anything_changes() -> None:
    fake = FakeRunner()
    plan = _run_gated(fake, FakeGateways(fake.calls, unreachable="check"))
    assert fake.calls == ["check s1 s2 s3"]
    assert plan.failed_batch == -1
    assert {result.outcome for result in plan.results.values()} == {"skipped"}
    assert plan.results["s1"].diagnosis == ("not touched: gateway-01: cannot connect over SSH (timed out); a rollout "
                                            "drains each batch at every gateway first")


def test_a_gateway_lost_mid_rollout_stops_it_before_the_next_restart() -> None:
    fake = FakeRunner()
    plan = _run_gated(fake, FakeGateways(fake.calls, unreachable="drain s2"))
    assert fake.calls[-2:] == ["snapshot s2 s3", "drain s2 s3"]  # no deploy of the batch it could not drain
    assert plan.failed_batch == 1
    assert _outcomes(plan)["s1"][0] == "updated"
    assert [_outcomes(plan)[h][0] for h in ("s2", "s3", "s4")] == ["skipped"] * 3


def test_a_rolled_back_batch_is_ready_again_and_a_still_sick_host_stays_drained() -> None:
    fake = FakeRunner(sick=["s2", "s3"], still_sick=["s3"])
    plan = _run_gated(fake, FakeGateways(fake.calls))
    assert fake.calls[-6:] == ["drain s2 s3", "deploy s2 s3", "gate s2 s3", "restore s2 s3", "gate s2 s3",
                               "ready s2"]
    assert _outcomes(plan)["s2"][0] == "rolled-back"
    assert _outcomes(plan)["s3"][0] == "rollback-failed"
    assert _outcomes(plan)["s3"][1].endswith("; kept drained at the gateways (unhealthy)")


def test_a_batch_no_gateway_sees_up_stops_the_rollout() -> None:
    fake = FakeRunner()
    plan = _run_gated(fake, FakeGateways(fake.calls, down=["s1"]))
    assert fake.calls[-1] == "ready s1"
    assert plan.failed_batch == 0
    assert _outcomes(plan)["s1"] == ("updated", "sparkfleet-vllm healthy: /health ok; gateway-01 sees it down (L4CON "
                                                "Connection refused), 0 in flight")
    assert _outcomes(plan)["s2"] == ("skipped", "not touched: batch 1 is not back in service at every gateway")


# --- pairs: one endpoint, two hosts --------------------------------------------------------------------------

PAIRED = ["s1", "p1", "p2", "s2"]
HEADS = {"p2": "p1"}  # p2 is the worker of p1's pair


def _pair_run(fake: FakeRunner, canary: int = 1, batch: int = 1) -> rollout.Rollout:
    return rollout.run(fake, PAIRED, {"s1", "p1", "s2"}, canary, batch, 60, lambda line: None,  # type: ignore[arg-type]
                       heads=HEADS)


def test_a_pair_counts_as_one_endpoint_in_a_batch() -> None:
    assert rollout.plan_batches(PAIRED, canary=1, batch=1, heads=HEADS) == [["s1"], ["p1", "p2"], ["s2"]]
    assert rollout.plan_batches(PAIRED, canary=2, batch=1, heads=HEADS) == [["s1", "p1", "p2"], ["s2"]]
    assert rollout.plan_batches(["p2", "p1", "s1"], canary=1, batch=1, heads=HEADS) == [["p2", "p1"], ["s1"]]


def test_a_pair_is_deployed_together_and_gated_on_its_head() -> None:
    fake = FakeRunner()
    plan = _pair_run(fake)
    assert fake.calls == ["stage s1 p1 p2 s2", "snapshot s1", "deploy s1", "gate s1", "snapshot p1 p2",
                          "deploy p1 p2", "gate p1", "snapshot s2", "deploy s2", "gate s2"]
    assert _outcomes(plan)["p2"] == ("updated", "gated on its head p1: sparkfleet-vllm healthy: /health ok")


def test_a_sick_pair_rolls_back_both_worker_first() -> None:
    fake = FakeRunner(sick=["p1"])
    plan = _pair_run(fake)
    assert fake.calls[5:] == ["deploy p1 p2", "gate p1", "stop p1 p2", "restore p2", "restore p1", "gate p1"]
    assert plan.failed_batch == 1
    outcomes = _outcomes(plan)
    assert outcomes["p1"][0] == outcomes["p2"][0] == "rolled-back"
    assert outcomes["p2"][1] == "rolled back with its head p1"
    assert outcomes["s2"][0] == "skipped"
