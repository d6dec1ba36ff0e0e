"""The `sparkfleet` command: fleet operations around the pyinfra deploy."""

from __future__ import annotations

import argparse
import json
import sys

import click
from pyinfra.api.exceptions import PyinfraError

from sparkfleet import bench, rollout
from sparkfleet.config import InventoryError
from sparkfleet.docs import variables_table
from sparkfleet.secrets import SecretError

# Errors a user can cause and fix (bad inventory, targeting, secrets, arguments, a file on this controller): one
# paragraph and exit 1, never a traceback. Anything else is a bug and keeps its traceback.
EXPECTED = (InventoryError, PyinfraError, SecretError, ValueError, OSError, click.ClickException)


def add_targeting(command: argparse.ArgumentParser) -> None:
    """INVENTORY, --limit, --data and --json: every fleet command targets hosts the way pyinfra does."""
    command.add_argument("inventory", help="pyinfra inventory file, e.g. inventory/sparks.py")
    command.add_argument("--limit", action="append", default=[],
                         help="group, host name or glob (repeatable, or comma-separated), as with pyinfra")
    command.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                         help="override inventory data as pyinfra does (values parse as JSON when they can)")
    command.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")


def _doctor_parser(commands: argparse._SubParsersAction) -> None:
    doctor = commands.add_parser(
        "doctor", help="check recipes against the model and hosts against the recipe, changing nothing",
        description="Run the recipe rules and the host preflight for every targeted host; exit 1 on any error.",
    )
    add_targeting(doctor)
    doctor.add_argument("--explain", action="store_true", help="also print each memory budget term by term")


def _doctor(args: argparse.Namespace) -> int:
    from rich.console import Console

    from sparkfleet import doctor

    reports = doctor.diagnose(args.inventory, args.limit, args.data)
    if args.json:
        sys.stdout.write(json.dumps([report.as_dict(args.explain) for report in reports], indent=2) + "\n")
    else:
        doctor.render(reports, Console(), args.explain)
    return doctor.exit_code(reports)


def _read_only_parsers(commands: argparse._SubParsersAction) -> None:
    """`status` and `drift` read the fleet over SSH and change nothing; both target hosts as every command does."""
    status = commands.add_parser(
        "status", help="one table of every endpoint: state, health, uptime, model, image, load, KV cache, MTP, alerts",
        description="Run the status reporter on every targeted host; exit 1 unless every host answered.")
    drift = commands.add_parser(
        "drift", help="what a deploy would change and what it cannot see, read-only; quiet enough for cron",
        description="pyinfra's dry run of deploy.py plus each host's facts; exit 0 converged, 2 drifted, 1 on error.")
    for command in (status, drift):
        add_targeting(command)
    status.add_argument("--wide", action="store_true",
                        help="every column in the host's row, however long the line (as kubectl's -o wide); by "
                        "default the columns that do not fit the terminal fold under each row")


def _status(args: argparse.Namespace) -> int:
    from rich.console import Console

    from sparkfleet import status

    answers = status.collect(args.inventory, args.limit, args.data)
    if args.json:
        sys.stdout.write(json.dumps([answer.as_dict() for answer in answers], indent=2) + "\n")
    else:
        status.render(answers, Console(), args.wide)
    return status.exit_code(answers)


def _drift(args: argparse.Namespace) -> int:
    from sparkfleet import drift

    report = drift.check(args.inventory, args.limit, args.data)
    if args.json:
        sys.stdout.write(json.dumps(report.as_dict(), indent=2) + "\n")
    else:
        drift.render(report, sys.stdout, sys.stderr)
    return report.exit_code


def explain(error: BaseException) -> str:
    """An expected error as the one paragraph the operator reads."""
    if isinstance(error, click.ClickException):
        return error.format_message()
    if isinstance(error, OSError) and error.filename:
        return (f"{error.filename}: {error.strerror or error} on this controller: check the path and its "
                "permissions; nothing was changed on any host")
    return str(error) or type(error).__name__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkfleet", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("vars", help="print README's table of inventory variables")
    _doctor_parser(commands)
    _read_only_parsers(commands)
    rollout.add_parser(commands, add_targeting)
    bench.add_parser(commands, add_targeting)
    args = parser.parse_args(argv)
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        sys.stderr.write(f"sparkfleet {args.command}: interrupted\n")
        return 130
    except EXPECTED as error:
        sys.stderr.write(f"sparkfleet {args.command}: {explain(error)}\n")
        return 1


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "rollout":
        return rollout.main(args)
    if args.command == "bench":
        return bench.main(args)
    if args.command == "doctor":
        return _doctor(args)
    if args.command == "status":
        return _status(args)
    if args.command == "drift":
        return _drift(args)
    sys.stdout.write(variables_table() + "\n")
    return 0
