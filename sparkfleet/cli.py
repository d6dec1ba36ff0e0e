"""The `sparkfleet` command: fleet operations around the pyinfra deploy."""

from __future__ import annotations

import argparse
import sys

from sparkfleet.docs import variables_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkfleet", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("vars", help="print README's table of inventory variables")
    args = parser.parse_args(argv)
    if args.command == "vars":
        sys.stdout.write(variables_table() + "\n")
    return 0
