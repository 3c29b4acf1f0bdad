"""The ``walras`` command line: one module per sub-command in this package.

Each sub-command module defines ``add_parser(subparsers) -> argparse.ArgumentParser`` (registering its options) and
``run(args: argparse.Namespace) -> int`` (the exit status). This module dispatches and turns user errors into one
line on stderr with exit status 2.

Only the chosen sub-command's module is imported: ``walras --help`` and ``walras --version`` import no sub-command
(their dependencies - numpy, the solvers, kopf, the Kubernetes client, aiohttp - take up to seconds to import), so the
top-level help lists each command with the one-line summary kept in :data:`COMMANDS`
(``tests/test_cli_help.py`` checks it equals the module's own ``help=``).

Errors, route table of :func:`main` (everything else is a bug and keeps its traceback):

=============================  ===================================================================================
exception                      one line on stderr, exit status 2
=============================  ===================================================================================
:class:`errors.UsageError`     ``walras CMD: error: <message>`` (raised by sub-commands for input the user can fix)
:class:`OSError`               ``walras CMD: error: <file or address>: <strerror>`` (missing or unwritable file,
                               port in use, connection refused)
=============================  ===================================================================================

``KeyboardInterrupt`` exits with status 130 without a traceback. ``WALRAS_TRACEBACK=1`` re-raises instead (for
debugging).

A sub-command module that sets ``EXIT_WITHOUT_TEARDOWN = True`` (``walras plan``) ends the process as soon as its
status is known when :func:`main` runs as the program (no ``argv`` given: the console script, ``python -m walras``):
stdout and stderr are flushed and ``os._exit`` skips the interpreter's teardown, which for ``walras plan`` on 20,000
pods spends 0.3-0.7 s freeing objects and modules that the exiting process no longer needs (no ``atexit``
handler runs); the cyclic garbage collector is off in such a process from the parsed arguments to the exit. Called
with ``argv`` (tests, other Python code), :func:`main` always returns and leaves the collector as it was.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from walras import __version__
from walras.cli.errors import EXIT_USAGE, UsageError

#: Sub-commands in the order ``walras --help`` lists them, each the module ``walras.cli.<name>``, with its one-line
#: summary (the same text as the ``help=`` its ``add_parser`` registers).
COMMANDS: dict[str, str] = {
    "solve": "discover pool prices and an allocation (price discovery)",
    "plan": "plan offline from YAML manifests (nodes, pods, ResourcePools, FungibleJobs, ColocationProfiles)",
    "check": "check the scheduler's invariants on a cluster (live, or from manifests)",
    "explain": "say why a FungibleJob has the replicas it has (grants, prices, bids, what blocks the rest)",
    "simulate": "simulate a trace of jobs over time and compare scheduling policies",
    "run": "run the operator, the scheduler extender and the metrics endpoint",
    "demo": "run the operator on a local Kubernetes API with the example cluster",
}


class HelpFormatter(argparse.HelpFormatter):
    """Every sub-command's help: each option's default appended as ``(default: X)``
    (``argparse.ArgumentDefaultsHelpFormatter``'s rule), except where the help already speaks of its default, the
    default is ``None``, ``False`` or empty (a flag, an optional value), or the option takes no value."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if ("default" in text.lower() or default is None or default is False or default == argparse.SUPPRESS
                or default == []
                or not action.option_strings or action.nargs == 0):
            return text
        return f"{text} (default: %(default)s)"


class RawHelpFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """:class:`HelpFormatter` with the description printed as written (line breaks kept: tables, examples)."""


class SubcommandParser(argparse.ArgumentParser):
    """The parser class of every sub-command: :class:`HelpFormatter`, or :class:`RawHelpFormatter` where the module
    asks for ``RawDescriptionHelpFormatter`` (same layout, with defaults)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        chosen = kwargs.get("formatter_class")
        if chosen in (None, argparse.HelpFormatter):
            kwargs["formatter_class"] = HelpFormatter
        elif chosen is argparse.RawDescriptionHelpFormatter:
            kwargs["formatter_class"] = RawHelpFormatter
        super().__init__(*args, **kwargs)


def build_parser(load: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The top-level parser. Sub-commands named in ``load`` (default: all) are registered with their options by
    importing their module; the others are listed by name and summary only (enough for ``walras --help``)."""
    wanted = set(COMMANDS) if load is None else set(load)
    parser = argparse.ArgumentParser(
        prog="walras",
        description="Walras: a market for heterogeneous Kubernetes clusters (price discovery and placement).",
        epilog="'walras COMMAND --help' shows the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"walras {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=SubcommandParser)
    for name, summary in COMMANDS.items():
        if name in wanted:
            module = importlib.import_module(f"{__name__}.{name}")
            module.add_parser(sub).set_defaults(_run=module.run,
                                                _exit_now=getattr(module, "EXIT_WITHOUT_TEARDOWN", False))
        else:
            sub.add_parser(name, help=summary)
    return parser


def chosen_command(argv: Sequence[str]) -> str | None:
    """The sub-command ``argv`` names: its first word not starting with ``-`` (the top level takes no option with
    a value), or ``None``."""
    return next((a for a in argv if not a.startswith("-")), None)


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.strip().splitlines() if line.strip()) or "unknown error"


def describe(exc: BaseException) -> str | None:
    """The one-line message for a user error (see the module's route table), or ``None`` for a bug."""
    if isinstance(exc, UsageError):
        return _one_line(str(exc))
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc) or type(exc).__name__
        where = exc.filename if exc.filename is not None else None
        return _one_line(f"{where}: {reason}" if where is not None else reason)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), run the chosen sub-command and return its exit status; a user
    error prints one line on stderr and returns 2."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = chosen_command(args_list)
    parser = build_parser(load=[command] if command in COMMANDS else [])
    args = parser.parse_args(args_list)
    exit_early = argv is None and getattr(args, "_exit_now", False)
    collecting = gc.isenabled()
    if exit_early:
        # The process ends with os._exit: its cyclic garbage collector stays off until then. A sub-command that pauses
        # it for its work (walras plan) would otherwise switch it back on at the end, and the next allocation would
        # set off a full collection of everything still alive (0.23-0.27 s after walras plan on 20,000 pods).
        gc.disable()
    try:
        try:
            status: int = args._run(args)
        except KeyboardInterrupt:
            return 130
        except Exception as exc:
            message = describe(exc)
            if message is None or os.environ.get("WALRAS_TRACEBACK") == "1":
                raise
            print(f"walras {args.command}: error: {message}", file=sys.stderr)
            status = EXIT_USAGE
        if exit_early:
            exit_now(status)
        return status
    finally:  # reached only when the process goes on (an interrupt, a traceback, a replaced exit_now)
        if exit_early and collecting:
            gc.enable()


def exit_now(status: int) -> None:
    """Flush stdout and stderr and end the process with ``status`` without the interpreter's teardown (see the
    module's docstring); a flush that fails (a closed pipe) exits with 120, the status Python itself uses then."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        status = 120
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
