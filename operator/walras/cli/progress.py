"""Progress on stderr for the command line's steps that may take more than two seconds (``walras demo``'s start-up:
loading the planner, which compiles its kernels on the first run after an install, and starting a control plane).

On a terminal each step is a rich spinner with the elapsed time, replaced by one line when it ends; elsewhere (a pipe,
a log file, a test) one plain line when the step starts and one when it ends, so that a log shows where the time
went. stdout is never written (it carries the command's result).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

__all__ = ["step"]


@contextmanager
def step(prefix: str, what: str, stream: TextIO | None = None, *, enabled: bool = True) -> Iterator[None]:
    """Report ``what`` (a present participle: "starting the cluster") on ``stream`` (default stderr) while the block
    runs, then ``done (N.N s)`` or ``failed (N.N s)``."""
    out = sys.stderr if stream is None else stream
    if not enabled:
        yield
        return
    start = time.monotonic()
    if out.isatty():
        from rich.console import Console

        console = Console(file=out, highlight=False)
        ok = False
        try:
            with console.status(f"{prefix}: {what} ..."):
                yield
            ok = True
        finally:
            console.print(f"{prefix}: {what}: {'done' if ok else 'failed'} ({time.monotonic() - start:.1f} s)",
                          markup=False)
        return
    print(f"{prefix}: {what} ...", file=out, flush=True)
    ok = False
    try:
        yield
        ok = True
    finally:
        print(f"{prefix}: {what}: {'done' if ok else 'failed'} ({time.monotonic() - start:.1f} s)", file=out,
              flush=True)
