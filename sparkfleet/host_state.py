"""A Spark's state as the deploy's operations compare against it, read in one SSH round trip.

pyinfra reads a fact per operation, one round trip each: a converged Spark answered ~60 of them for a deploy that
changes nothing. Here one host-side script (remote/host_facts.py, the preflight's `SparkFacts`) returns every
fact the deploy needs as one JSON object, and sparkfleet's operations read it through `current()`.

A reading describes the host until the run changes it: once an operation on the host has changed something,
the next `current()` reads the host again (one round trip, then shared until the next change), so an
operation never compares against a state an earlier operation has since changed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from pyinfra import host, state
from pyinfra.api import Host, State
from pyinfra.context import ctx_state

from sparkfleet.preflight import SparkFacts

_queries: dict[tuple[int, str], dict[str, Any]] = {}
_readings: dict[tuple[int, str], tuple[int, HostState | None]] = {}


@dataclass(frozen=True)
class StateQuery:
    """What the deploy's operations will ask about one host (deploys/state.py builds it: a Spark's from its
    endpoint, a gateway's from the few files, unit and package it manages). What is left empty is not read."""

    files: tuple[str, ...] = ()  # files and directories: type, mode, owner, and a file's sha1
    units: tuple[str, ...] = ()  # systemd units: ActiveState and UnitFileState
    runtime: str = ""  # the runtime path daemon.json's nvidia entry should run (resolved like dockerd does)
    runtime_config: str = ""  # the NVIDIA runtime's config.toml
    keyring: str = ""
    apt_url: str = ""  # NVIDIA's repository: the apt source files that name it, with their lines
    packages: tuple[str, ...] = ()
    image: str = ""
    weights_script: str = ""
    weights_args: tuple[str, ...] = ()  # `stage_weights.py check` arguments
    manifest: str = ""  # the staged weights' manifest and the copy the running endpoint started with
    loaded_weights: str = ""
    model_root: str = ""  # the model's generations, and the unit files whose mounts keep one in use
    unit_files: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items()
                if value}


class HostState:
    """One reading of a host, with an accessor per kind of fact (a KeyError names a fact nobody asked for)."""

    def __init__(self, facts: dict[str, Any]) -> None:
        self.facts = facts
        self._state: dict[str, Any] = facts.get("state") or {}

    @property
    def problem(self) -> str | None:
        """Why part of the state could not be read (the preflight refuses the host, operations fail), or None."""
        errors = {key[len("state."):]: error for key, error in self.facts.get("probe_errors", {}).items()
                  if key.startswith("state.")}
        if not errors:
            return None
        return "could not read " + "; ".join(f"{key} on the host ({error})" for key, error in errors.items())

    def get(self, key: str, default: Any) -> Any:
        """A fact, or `default` when it could not be read (`problem` says why)."""
        return self._state.get(key, default)

    def _get(self, key: str) -> Any:
        return self._state[key]

    def file(self, path: str) -> dict[str, Any] | None:
        """{"type": file | directory | link | other, "mode": "644", "user", "group", "sha1" (files)} or None."""
        files = self._get("files")
        if path not in files:
            raise KeyError(f"{path} is not in the host state query (deploys/state.py)")
        return files[path]

    def unit(self, name: str) -> dict[str, str]:
        """{"active": ActiveState, "enabled": UnitFileState}; empty strings for a unit systemd does not know."""
        units = self._get("units")
        if name not in units:
            raise KeyError(f"{name} is not in the host state query (deploys/state.py)")
        return units[name]

    def __getitem__(self, key: str) -> Any:
        return self._get(key)


def login_user(found: HostState | None) -> str:
    """Who pyinfra logs in as (sudo keeps the login user's name), whom private upload directories belong to."""
    return (found.get("login_user", "") if found else "") or "root"


def register(query: StateQuery, preflight: dict[str, Any]) -> None:
    """Say what this host's operations will read (the preflight does, before any operation is queued)."""
    _queries[(id(ctx_state.get()), host.name)] = {**preflight, "state": query.as_dict()}


def changes_so_far(state: State, host: Host) -> int:
    """How many operations have changed this host in this run (0 until execution starts)."""
    return sum(1 for data in state.ops[host].values()
               if data.operation_meta.is_complete() and data.operation_meta.did_change())


def current() -> HostState | None:
    """This host's state as of now; None when the host-side script gave no usable answer (pyinfra printed why
    and failed the host).

    A re-read after a change leaves the weights verdict out and keeps the first one: only the weights step
    changes the weights, nothing reads them after it, and with `weights_verify=full` the check re-hashes tens
    of gigabytes.
    """
    key = (id(ctx_state.get()), host.name)
    if key not in _queries:
        raise RuntimeError("sparkfleet's operations need the preflight (check_host) to run first on this host")
    changes = changes_so_far(state, host)
    if key in _readings and _readings[key][0] == changes:
        return _readings[key][1]
    earlier = _readings[key][1] if key in _readings else None
    query = _queries[key]
    if key in _readings:
        query = {**query, "state": {**query["state"], "weights_args": None}}
    facts = host.get_fact(SparkFacts, query=json.dumps(query, sort_keys=True))
    if facts is not None and earlier is not None and "weights" in earlier.facts.get("state", {}):
        facts.setdefault("state", {})["weights"] = earlier.facts["state"]["weights"]
    _readings[key] = (changes, HostState(facts) if facts is not None else None)
    return _readings[key][1]
