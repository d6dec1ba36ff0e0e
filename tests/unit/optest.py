"""pyinfra-style operation tests for sparkfleet: run an operation's body against a given host state and read back
the commands it would send, as pyinfra's tests/test_operations.py does with its JSON cases.

sparkfleet's operations read the host through host_state.current() instead of pyinfra facts, so a case gives
that reading (`state`, as remote/host_facts.py reports it) where pyinfra's cases give fact values. The cases
live in tests/unit/operations/<operation>.yaml, one mapping of named cases per operation:

    case_name:
      args: {...}                 # the operation's keywords; `src: {text: ...}` is a StringIO,
                                  # `src: {file: ...}` a local file holding that text
      state: {...}                # host_state's "state" (null: the host-side script gave no answer)
      probe_errors: {...}         # optional: "state.<probe>": error, as the script reports a failed probe
      global_arguments: {...}     # optional: pyinfra's global arguments (`_temp_dir`)
      commands: [...]             # what the operation yields, rendered by `render`
      noop: "..."                 # the host.noop message; required when `commands` is empty
      uploads: {dest: text}       # optional: the content of each upload
      temp_files: {dest: path}    # optional: where each upload is staged before it is copied

A file in `state.files` may give `content:` instead of `sha1:` (the harness hashes it), so a case says
"the same content" in words a reader can check.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyinfra.api import FileUploadCommand, RsyncCommand, StringCommand
from pyinfra.context import ctx_host

from sparkfleet import operations
from sparkfleet.config import ModelSource
from sparkfleet.host_state import HostState
from sparkfleet.remote import host_facts

CASES = Path(__file__).parent / "operations"
FILE_KEYS = {"type", "mode", "user", "group", "sha1"}
DEFAULT_TEMP_DIR = "/tmp"


class FakeHost:
    """What sparkfleet's operations ask of pyinfra's `host`: noop messages, temp file names, global arguments."""

    name = "spark-01"

    def __init__(self, global_arguments: dict[str, Any] | None = None) -> None:
        self.noops: list[str] = []
        self.current_op_global_arguments = global_arguments or {}

    def noop(self, description: str) -> None:
        self.noops.append(description)

    def get_temp_filename(self, hash_key: str | None = None, hash_filename: bool = True, *,
                          temp_directory: str | None = None) -> str:
        return f"{temp_directory or DEFAULT_TEMP_DIR}/_tempfile_"


@dataclass
class Outcome:
    """What one run of an operation's body did."""

    commands: list[str]
    noop: str | None
    uploads: dict[str, str] = field(default_factory=dict)  # dest: content
    temp_files: dict[str, str] = field(default_factory=dict)  # dest: remote temp file it is staged in


def render(command: object) -> str:
    """A command as a case writes it: shell text as sent, `upload DEST`, `rsync FLAGS SRC DEST`."""
    if isinstance(command, str):
        return command
    if isinstance(command, StringCommand):
        return command.get_raw_value()
    if isinstance(command, FileUploadCommand):
        return f"upload {command.dest}"
    if isinstance(command, RsyncCommand):
        return " ".join(["rsync", *command.flags, command.src, command.dest])
    raise TypeError(f"{command!r} is not a command sparkfleet's operations yield")


def _outcome(body: Iterable[object], host: FakeHost) -> Outcome:
    commands = list(body)  # a generator: host.noop is called while it runs
    found = Outcome([], host.noops[-1] if host.noops else None)
    for command in commands:
        found.commands.append(render(command))
        if isinstance(command, FileUploadCommand):
            found.uploads[command.dest] = command.src.getvalue()
            found.temp_files[command.dest] = command.remote_temp_filename
    return found


def run(op: Callable[..., Any], found: HostState | None, monkeypatch: pytest.MonkeyPatch,
        global_arguments: dict[str, Any] | None = None, **args: Any) -> Outcome:
    """The operation's body against `found` (what host_state.current() returns).

    pyinfra runs a body twice, to plan and then to execute: so does this, and both runs must agree (a body
    that consumed its input on the first run would plan one thing and do another).
    """
    monkeypatch.setattr(operations, "current", lambda: found)
    outcomes = []
    for _ in range(2):
        host = FakeHost(global_arguments)
        with ctx_host.use(host):
            outcomes.append(_outcome(op._inner(**args), host))
    assert outcomes[0] == outcomes[1], "the planning run and the executing run differ"
    return outcomes[0]


# --- cases ---------------------------------------------------------------------------------------------


def host_state(state: dict[str, Any] | None, probe_errors: dict[str, str] | None = None) -> HostState | None:
    """The HostState a case describes, in the shape remote/host_facts.py reports (checked, so a case cannot
    test an operation against a reading the host-side script would never give)."""
    if state is None:
        return None
    unknown = set(state) - set(host_facts.deploy_state({"weights_args": []}))
    assert not unknown, f"{sorted(unknown)} are not probes of remote/host_facts.py deploy_state"
    files = {path: _file(path, entry) for path, entry in state.get("files", {}).items()}
    return HostState({"state": {**state, "files": files} if "files" in state else state,
                      "probe_errors": probe_errors or {}})


def _file(path: str, entry: dict[str, Any] | None) -> dict[str, Any] | None:
    if entry is None:
        return None
    entry = dict(entry)
    if "content" in entry:
        entry["sha1"] = hashlib.sha1(entry.pop("content").encode()).hexdigest()
    assert set(entry) <= FILE_KEYS and entry["type"] in ("file", "directory", "link", "other"), f"{path}: {entry}"
    assert ("sha1" in entry) == (entry["type"] == "file"), f"{path}: only a file has a sha1"
    return entry


def arguments(args: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """A case's `args`, with `restarting`/`peer_failed` values as the callables that answer them,
    `src: {text: ...}` as a StringIO, `src: {file: ...}` as a local file and a
    `fetch: {source: ..., ...}` as a Fetch, its source parsed as the inventory's model_source is."""
    for name in ("restarting", "peer_failed"):  # pair_step decides when called: a case gives the answer
        if name in args:
            args = {**args, name: (lambda value: lambda: value)(args[name])}
    if isinstance(args.get("fetch"), dict):
        fetch = args["fetch"]
        args = {**args, "fetch": operations.Fetch(**{**fetch, "source": ModelSource.parse(fetch["source"])})}
    src = args.get("src")
    if not isinstance(src, dict):
        return args
    if "text" in src:
        return {**args, "src": io.StringIO(src["text"])}
    local = tmp_path / "local-file"
    local.write_text(src["file"])
    return {**args, "src": str(local)}


def load_cases() -> list[Any]:
    """Every case of every operation, as pytest params with ids `operation/case`."""
    params = []
    for path in sorted(CASES.glob("*.yaml")):
        for name, case in yaml.safe_load(path.read_text()).items():
            params.append(pytest.param(path.stem, case, id=f"{path.stem}/{name}"))
    return params


def operation_names() -> list[str]:
    """Every pyinfra operation sparkfleet/operations.py defines."""
    return sorted(name for name, value in vars(operations).items()
                  if hasattr(value, "_inner") and value.__module__ == operations.__name__)
