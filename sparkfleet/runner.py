"""How the fleet commands run pyinfra: which hosts they target, a shell command on hosts, and deploy.py.

- Targeting: the inventory loaded by pyinfra_cli's own loader, `--data` parsed by pyinfra's own parser, and
  `--limit` matched as the pyinfra CLI matches it; every command (doctor, status, drift, bench, rollout) starts
  with `load_hosts`.
- A shell command (rollout's snapshot, restore and health gate) runs over pyinfra's Python API, with the sudo
  and environment each host's inventory data asks for, and answers per host with a typed `Reply`.
- deploy.py runs as the pyinfra CLI runs it (`pyinfra --json`), in a process of its own: the deploy code keeps
  per-host state at module level (deploys/context.py), so two runs must not share an interpreter. Which hosts
  failed comes from the exit code and pyinfra's JSON report; why comes from the lines pyinfra printed for each
  host, because its report holds no error text and is not printed at all when the run stops early (every
  host failed).
"""

from __future__ import annotations

import fnmatch
import glob
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from paramiko import SSHException
from pyinfra.api import Config, Host, Inventory, State
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments
from pyinfra.api.command import StringCommand
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import ctx_config, ctx_inventory, ctx_state

from sparkfleet.config import InventoryError

REPO = Path(__file__).resolve().parents[1]  # the checkout, for an editable install
SSH_ERRORS = (PyinfraError, OSError, SSHException)
T = TypeVar("T")


# --- targeting -----------------------------------------------------------------------------------------


class TargetError(ValueError):
    """`--limit` or `--data` selects no host or cannot be read: nothing was checked or changed."""


def split_limits(limits: Iterable[str]) -> list[str]:
    """`--limit a,b` is `--limit a --limit b`; the pyinfra CLI itself takes one pattern per flag."""
    return [part for limit in limits for part in limit.split(",") if part]


def select(inventory: Inventory, patterns: Sequence[str]) -> list[Host]:
    """The hosts `--limit` targets, in inventory order, as the pyinfra CLI matches each pattern: the name of a
    group means that group (even an empty one), anything else is a glob over host names. pyinfra's own matcher
    is private (pyinfra_cli.cli._get_inventory_pattern_matches); this follows it line for line."""
    chosen: set[Host] = set()
    for pattern in patterns:
        group = inventory.get_group(pattern, default=None)
        chosen.update(group if group is not None else [h for h in inventory if fnmatch.fnmatch(h.name, pattern)])
    return [host for host in inventory if host in chosen]


def host_patterns(inventory: Inventory, names: Iterable[str]) -> list[str]:
    """`--limit` patterns that each match one host by its exact name, for handing a target list to the CLI.

    Glob characters are escaped; a name that is also a group's (group names are Python names or the
    inventory file's stem) gets its first letter bracketed, so pyinfra reads it as a glob and not the group.
    """
    patterns = []
    for name in names:
        pattern = glob.escape(name)
        if inventory.get_group(pattern, default=None) is not None:
            pattern = f"[{pattern[0]}]{pattern[1:]}"
        patterns.append(pattern)
    return patterns


def _names(names: Iterable[str], most: int = 8) -> str:
    names = sorted(names)
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def no_target(inventory: str, patterns: list[str], hosts: list[str], groups: list[str]) -> str:
    """One paragraph: why no host is targeted, and what would target one."""
    if not hosts:
        return (f"{inventory} defines no hosts: list them in it as pyinfra inventories do (see "
                "inventory/sparks.py), or check the path; nothing was changed on any host")
    known = f"hosts: {_names(hosts)}" + (f"; groups: {_names(groups)}" if groups else "")
    return (f"--limit {','.join(patterns)} matches no host in {inventory} ({known}): give a host name, group or "
            "glob from it; nothing was changed on any host")


def parse_data(items: Iterable[str]) -> dict[str, Any]:
    """`--data KEY=VALUE` overrides, each value read by pyinfra's own parser (true/false, integers, JSON, text).

    The pyinfra CLI stops with a traceback on an item without `=`; here it is one message."""
    from pyinfra_cli.util import parse_cli_arg  # importing pyinfra_cli patches the process with gevent

    overrides = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not key or not equals:
            raise TargetError(f"--data {item!r} is not KEY=VALUE: give e.g. --data vllm_port=8001; nothing was "
                              "changed on any host")
        overrides[key] = parse_cli_arg(value)
    return overrides


def load_hosts(inventory: str, limits: Iterable[str], data: Iterable[str]) -> tuple[State, list[Host]]:
    """The targeted hosts, from the inventory as pyinfra_cli loads it, with `--data` applied and `--limit`
    (also comma-separated) matched as the pyinfra CLI does.

    Importing pyinfra_cli monkey-patches the process with gevent (as the pyinfra CLI runs), which is why it
    happens here and not at import time. Raises InventoryError when the inventory file cannot be loaded and
    TargetError when no host is targeted or `--data` cannot be read.
    """
    import click
    from pyinfra_cli.exceptions import UnexpectedExternalError
    from pyinfra_cli.inventory import make_inventory

    overrides = parse_data(data)
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)  # inventories may import modules beside them, as under the pyinfra CLI
    state, config = State(), Config()
    state.cwd = cwd
    ctx_state.set(state)
    ctx_config.set(config)
    try:
        hosts = make_inventory(inventory, override_data=overrides, cwd=cwd)
    except UnexpectedExternalError as error:  # the inventory file's own code raised
        raise InventoryError(f"{inventory} cannot be loaded ({type(error.exception).__name__}: {error.exception}): "
                             f"fix it (`python {inventory}` shows where); nothing was changed on any host") from None
    except (SyntaxError, TypeError, click.ClickException) as error:
        why = error.format_message() if isinstance(error, click.ClickException) else f"{type(error).__name__}: {error}"
        raise InventoryError(f"{inventory} is not a usable pyinfra inventory ({why}): fix it; nothing was "
                             "changed on any host") from None
    ctx_inventory.set(hosts)
    patterns = split_limits(limits)
    targeted = select(hosts, patterns) if patterns else list(hosts)
    # A typo beside a good pattern would quietly drop a host from a rollout: every pattern must match.
    unmatched = [pattern for pattern in patterns if not select(hosts, [pattern])]
    if not targeted or unmatched:
        groups = [name for name, members in hosts.groups.items() if members]
        raise TargetError(no_target(inventory, unmatched or patterns, [host.name for host in hosts], groups))
    state.init(hosts, config, initial_limit=targeted if patterns else None)
    return state, targeted


# --- commands on hosts, over the API -------------------------------------------------------------------


def each(state: State, hosts: Sequence[Host], work: Callable[[Host], T]) -> list[T]:
    """`work` on every host at once in pyinfra's greenlet pool; the results in host order."""
    greenlets = [state.pool.spawn(work, host) for host in hosts]
    state.pool.join()
    return [greenlet.get() for greenlet in greenlets]


@contextmanager
def connected(host: Host) -> Iterator[Host]:
    """The host connected for the block, disconnected after; raises one of SSH_ERRORS when it cannot connect."""
    host.connect(show_errors=False, raise_exceptions=True)
    try:
        yield host
    finally:
        if host.connected:
            host.disconnect()


def cannot_connect(error: BaseException) -> str:
    return f"cannot connect over SSH ({error or type(error).__name__})"


def quiet_pyinfra() -> None:
    """Keep pyinfra's and paramiko's SSH chatter (host keys, banner tracebacks) off stderr, for commands whose
    per-host answers say what failed. Without handlers of their own, Python prints them through its
    last-resort handler."""
    for name in ("pyinfra", "paramiko"):
        logging.getLogger(name).addHandler(logging.NullHandler())


def connector_arguments(state: State, host: Host) -> dict[str, Any]:
    """What `pyinfra exec` hands the connector for this host: `_sudo`, `_sudo_user`, `_env` and the rest from
    its inventory data, else pyinfra's defaults."""
    arguments, _ = pop_global_arguments(state, host, {})
    return {key: value for key, value in arguments.items() if key in CONNECTOR_ARGUMENT_KEYS}


@dataclass(frozen=True)
class Reply:
    """One host's answer to a shell command. pyinfra's connectors tell success (exit status 0), not the status."""

    host: str
    ok: bool
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    error: str | None = None  # the command did not run to the end: no connection, or the SSH session failed


def run_shell(state: State, host: Host, command: str) -> Reply:
    """`command` on one host, connected for it alone."""
    try:
        host.connect(show_errors=False, raise_exceptions=True)
    except SSH_ERRORS as error:
        return Reply(host.name, False, error=cannot_connect(error))
    try:
        ok, output = host.run_shell_command(StringCommand(command), **connector_arguments(state, host))
    except SSH_ERRORS as error:
        return Reply(host.name, False, error=f"the SSH session failed ({error or type(error).__name__})")
    finally:
        host.disconnect()
    return Reply(host.name, ok, output.stdout_lines, output.stderr_lines)


# --- deploy.py, through the pyinfra CLI ----------------------------------------------------------------


def deploy_command(inventory: str, limits: Iterable[str], data: Iterable[str], dry: bool) -> list[str]:
    """`pyinfra --json` on deploy.py, from the pyinfra beside this Python.

    A real run needs `-y` (without it `--json` only prints the plan); a dry run must not have it: `-y` turns
    pyinfra's change detection off, and the plan then lists only the operations the deploy itself asked
    `will_change` about. `--json` never prompts."""
    command = [str(Path(sys.executable).with_name("pyinfra")), "--json", "--dry" if dry else "-y"]
    for pattern in limits:
        command += ["--limit", pattern]
    for item in data:
        command += ["--data", item]
    return [*command, inventory, str(deploy_file())]


def deploy_file() -> Path:
    """deploy.py of the repository the command runs from, as `pyinfra INVENTORY deploy.py` finds it there; else
    the one beside an editable install (a `pip install .` copy of sparkfleet has no deploy.py of its own)."""
    here = Path.cwd() / "deploy.py"
    return here if here.is_file() else REPO / "deploy.py"


def environment() -> dict[str, str]:
    """The deploy imports sparkfleet from this checkout, wherever the command runs from."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def read_report(stdout: str) -> dict[str, Any] | None:
    """pyinfra's `--json` report (`{"plan": [...], "results": ...}`, its last line); None when it printed none."""
    for line in reversed(stdout.splitlines()):
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict) and isinstance(report.get("plan"), list):
            return report
    return None


# What pyinfra prints for a host that is getting on (info level; the level itself is only a colour, and
# colours are off when stderr is not a terminal).
_PROGRESS = ("Connected", "Ready: ", "Success", "No changes", "Skipped", "noop: ")
_FINAL = ("--> pyinfra error", "--> An exception", "--> An internal exception")
_OPERATION = "operation: "


@dataclass(frozen=True)
class HostError:
    """What pyinfra printed for one host since its last sign of progress, and the operation it was in."""

    lines: list[str]
    operation: str | None = None


def read_errors(stderr: str) -> tuple[dict[str, HostError], list[str]]:
    """Per host, the lines pyinfra printed for it after its last progress line (a failed command's output and
    pyinfra's `Error: ...`, a connection failure); then the run's own final error, to the end."""
    lines = [line.rstrip() for line in stderr.splitlines() if line.strip()]
    final = next((i for i, line in enumerate(lines) if line.startswith(_FINAL)), len(lines))
    errors: dict[str, HostError] = {}
    operation = None
    for line in lines[:final]:
        if line.startswith("--> "):
            operation = line.partition(_OPERATION)[2].strip() or None
            continue
        host, bracket, text = line.strip().removeprefix("[").partition("]")
        if not line.startswith("    [") or not bracket:
            continue
        text = text.strip()
        if text.startswith(_PROGRESS):
            errors.pop(host, None)
        else:
            previous = errors.get(host, HostError([], operation))
            errors[host] = HostError([*previous.lines, text], previous.operation)
    return errors, lines[final:]


@dataclass(frozen=True)
class DeployRun:
    """One run of deploy.py on `hosts`: its exit code, pyinfra's JSON report and what it printed on stderr."""

    hosts: list[str]
    dry: bool
    returncode: int
    report: dict[str, Any] | None
    stderr: str

    @property
    def ok(self) -> bool:
        """Exit 0 with the report: pyinfra prints none when it stops early (and Ctrl-C there exits 0)."""
        return self.returncode == 0 and self.report is not None and (self.dry or bool(self.report.get("results")))

    @property
    def failed(self) -> list[str]:
        """The hosts pyinfra's results list as failed; every host when it gave no results and did not succeed
        (a run that stopped early, or a dry run, whose report has no results)."""
        results = (self.report or {}).get("results")
        if results:
            return list(results.get("failed_hosts") or [])
        return [] if self.ok else list(self.hosts)

    def why(self, host: str) -> str:
        """One line on why `host` failed: the operation and pyinfra's last lines for it, else the run's error."""
        errors, final = read_errors(self.stderr)
        error = errors.get(host)
        if error is None:
            return "; ".join(final[:2]) or f"pyinfra exited {self.returncode} and said nothing about {host}"
        words = "; ".join(error.lines[-3:])
        return f"{error.operation}: {words}" if error.operation else words

    def message(self) -> list[str]:
        """pyinfra's own words on what failed: each host's error lines, then its final error to the end."""
        errors, final = read_errors(self.stderr)
        said = [f"[{host}] {line}" for host, error in errors.items() for line in error.lines] + final
        return said or [line for line in self.stderr.splitlines() if line.strip()][-10:]


class Pending:
    """deploy.py running in the background; `result()` waits for it, `running()` asks (its output is read all the
    while, so a chatty run never blocks on a full pipe)."""

    def __init__(self, hosts: list[str], command: list[str], dry: bool) -> None:
        self.hosts, self.dry = hosts, dry
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         env=environment())
        self._output: tuple[str, str] = ("", "")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        self._output = self._process.communicate()

    def running(self) -> bool:
        return self._reader.is_alive()

    def result(self) -> DeployRun:
        self._reader.join()
        stdout, stderr = self._output
        return DeployRun(self.hosts, self.dry, self._process.returncode, read_report(stdout), stderr)


class Runner:
    """The targeted hosts of one inventory and `--data`, and the two ways sparkfleet acts on them.

    Rollout takes one (its tests a fake with the same two methods)."""

    def __init__(self, inventory: str, state: State, hosts: Sequence[Host], data: Sequence[str]) -> None:
        self.inventory, self.state, self.data = inventory, state, list(data)
        self.hosts = {host.name: host for host in hosts}

    def shell(self, names: Sequence[str], command: str) -> dict[str, Reply]:
        """`command` on each named host at once."""
        replies = each(self.state, [self.hosts[name] for name in names],
                       lambda host: run_shell(self.state, host, command))
        return {reply.host: reply for reply in replies}

    def start_deploy(self, names: Sequence[str], data: Sequence[str] = (), dry: bool = False) -> Pending:
        """deploy.py on the named hosts, with the command's `--data` and then `data`, in the background."""
        limits = host_patterns(self.state.inventory, names)
        return Pending(list(names), deploy_command(self.inventory, limits, [*self.data, *data], dry), dry)

    def deploy(self, names: Sequence[str], data: Sequence[str] = (), dry: bool = False) -> DeployRun:
        return self.start_deploy(names, data, dry).result()
