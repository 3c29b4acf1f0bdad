"""The ``walras`` command line: one module per sub-command in this package.

Each sub-command module defines ``add_parser(subparsers) -> argparse.ArgumentParser`` (registering its options) and
``run(args: argparse.Namespace) -> int`` (the exit status). This module only dispatches.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: Sub-commands, in the order ``walras --help`` lists them; each is the module ``walras.cli.<name>``.
COMMANDS: tuple[str, ...] = ("solve", "plan", "run", "demo")


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="walras",
        description="Walras: a market for heterogeneous Kubernetes clusters (price discovery and placement).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"{__name__}.{name}")
        command_parser = module.add_parser(sub)
        command_parser.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the chosen sub-command; return its exit status."""
    args = build_parser().parse_args(argv)
    status: int = args._run(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
