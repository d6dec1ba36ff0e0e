"""Every sparkfleet operation, pyinfra's way: given the host's state and the arguments, the exact commands, and
the no-op case with its message (cases in tests/unit/operations/<operation>.yaml, harness in optest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkfleet import operations
from tests.unit.optest import CASES, arguments, host_state, load_cases, operation_names, run

# Operations that read the host's state (all but host_ready, which reports what the preflight found, and
# pair_step, which acts on what the run changed).
READERS = [name for name in operation_names() if name not in ("host_ready", "pair_step")]


@pytest.mark.parametrize(("operation", "case"), load_cases())
def test_operation(operation: str, case: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    outcome = run(getattr(operations, operation), host_state(case["state"], case.get("probe_errors")), monkeypatch,
                  case.get("global_arguments"), **arguments(case["args"], tmp_path))
    assert outcome.commands == case["commands"]
    assert outcome.noop == case.get("noop"), "a no-op says why, and a change says nothing"
    assert outcome.uploads == case.get("uploads", outcome.uploads)
    assert outcome.temp_files == case.get("temp_files", outcome.temp_files)


@pytest.mark.parametrize("operation", operation_names())
def test_every_operation_has_cases_with_and_without_commands(operation: str) -> None:
    path = CASES / f"{operation}.yaml"
    assert path.is_file(), f"{operation} has no cases in {path}"
    cases = yaml.safe_load(path.read_text()).values()
    assert any(case["commands"] == [] for case in cases), "no no-op case"
    assert any(case["commands"] for case in cases), "no case that changes the host"


def _first_args(operation: str, tmp_path: Path) -> dict[str, Any]:
    case = next(iter(yaml.safe_load((CASES / f"{operation}.yaml").read_text()).values()))
    return arguments(case["args"], tmp_path)


@pytest.mark.parametrize("operation", READERS)
def test_an_unanswered_host_state_fails_the_operation(operation: str, monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """pyinfra printed why the host-side script gave no answer; the operation fails with words, not a TypeError."""
    outcome = run(getattr(operations, operation), None, monkeypatch, **_first_args(operation, tmp_path))
    assert outcome.commands == [
        "echo 'the host state could not be read (see the error above); nothing was changed' >&2; exit 1"]
    assert outcome.noop is None


@pytest.mark.parametrize("operation", READERS)
def test_a_failed_state_probe_fails_the_operation(operation: str, monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    """One probe of the state failed on the host: no operation compares against a half-read state."""
    found = host_state({"files": {}, "units": {}}, {"state.units": "FileNotFoundError: [Errno 2] systemctl"})
    outcome = run(getattr(operations, operation), found, monkeypatch, **_first_args(operation, tmp_path))
    assert outcome.commands == ["echo 'could not read units on the host (FileNotFoundError: [Errno 2] systemctl); "
                                "nothing was changed' >&2; exit 1"]


def test_host_ready_does_not_read_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The preflight's refusal must not depend on the reading it may be refusing the host over."""
    outcome = run(operations.host_ready, None, monkeypatch, problems=[])
    assert (outcome.commands, outcome.noop) == ([], "the host passed its preflight")


def test_a_path_outside_the_state_query_is_a_bug_named_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    """An operation asking for a file nobody put in deploys/state.py's query fails loudly, not as "missing"."""
    with pytest.raises(KeyError, match="deploys/state.py"):
        run(operations.managed_file, host_state({"files": {}}), monkeypatch, src=__file__, dest="/etc/x", mode="644")
