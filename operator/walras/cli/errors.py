"""Errors a sub-command reports to the user as one line on stderr with exit status 2 (no traceback).

A sub-command raises :class:`UsageError` for input the user can fix (a bad option value, a missing file, no
reachable cluster, a port in use); :func:`walras.cli.main` prints ``walras <command>: error: <message>`` and exits
with status 2, the status argparse uses for a malformed command line. This module imports nothing else, so that any
layer of ``walras.cli`` can raise it without slowing ``walras --help``.
"""

from __future__ import annotations

#: Exit status of every user error (argparse's status for a malformed command line).
EXIT_USAGE = 2


class UsageError(Exception):
    """Input the user can fix; the message says what and how, in one line."""
