"""Ahead-of-time routes of the package's numba kernels: build an extension module with ``numba.pycc`` and load it
only when it was built from the current kernel source.

A package with kernels in a module ``numba_kernels.py`` (decorated with :func:`allocator._jit.njit`) compiles them
just in time on first use: importing numba and loading numba's on-disk cache costs a fresh process most of a second.
:func:`build` compiles the same Python functions ahead of time into a shared library that needs numpy only, not
numba, and adds an export ``source_<tag>`` naming the kernel source it was compiled from (:func:`source_tag`, a
digest of the file); :func:`load` refuses a module without the export of the current source, so a module left over
from another version of the kernels (which may take other arguments) is never called. Used by
:mod:`allocator.pricing._compiled.aot` and :mod:`allocator.degree.aot` (the builders) and
:mod:`allocator.degree.kernels` (a route table).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["ENV_NOTICE", "build", "choose", "load", "main", "notice", "requested", "source_tag"]

#: Set to ``0`` to silence :func:`notice` (the line on stderr before a just-in-time compilation).
ENV_NOTICE = "WALRAS_COMPILE_NOTICE"

_told: set[str] = set()


def source_tag(path: str | os.PathLike[str]) -> str:
    """The first 16 hex digits of the SHA-256 of the file at ``path`` (the kernel source, read, not imported)."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def load(module: str, tag: str, source: str) -> ModuleType:
    """Import the extension ``module`` and return it if it exports ``source_<tag>``; raise ``ImportError`` when it
    is missing or was built from another version of ``source`` (a path, for the message)."""
    mod = importlib.import_module(module)
    if not hasattr(mod, f"source_{tag}"):
        raise ImportError(f"{module} was built from another version of {source}")
    return mod


def requested(route: str | None, env: str) -> str | None:
    """The route a kernel table's ``load(route)`` asks for: ``route``, else the environment variable ``env``, else
    None (whichever opens, ahead of time first). Raises ``ValueError`` for a route other than ``"aot"``/``"jit"``."""
    want = route or os.environ.get(env) or None
    if want not in (None, "aot", "jit"):
        raise ValueError(f"kernel route must be 'aot' or 'jit', got {want!r}")
    return want


def choose(want: str | None, aot: Callable[[], T], jit: Callable[[], T]) -> tuple[str, T]:
    """Open the route ``want`` (from :func:`requested`): ``(route, what its opener returned)``. With ``want`` None,
    ``"aot"`` when ``aot()`` opens (it raises ``ImportError`` when the module is missing or stale), else ``"jit"``;
    a forced route that cannot open raises ``ImportError``."""
    if want == "jit":
        return "jit", jit()
    if want == "aot":
        return "aot", aot()
    try:
        return "aot", aot()
    except ImportError:
        return "jit", jit()


def notice(what: str, builder: str | None = None, stream: Any = None) -> bool:
    """Tell the user, once per process and kernel set ``what``, that its kernels are being compiled just in time
    (no ahead-of-time module installed and no numba cache yet): one line on stderr, naming the ``builder`` module
    that compiles them ahead of time where there is one. Returns whether the line was written (not again for the same
    ``what``; never with ``WALRAS_COMPILE_NOTICE=0``). A first plan after a fresh install otherwise pauses for tens
    of seconds without a word (issue 29)."""
    if what in _told or os.environ.get(ENV_NOTICE) == "0":
        return False
    _told.add(what)
    out = sys.stderr if stream is None else stream
    ahead = f" To build them ahead of time: python -m {builder}" if builder else ""
    print(f"walras: compiling the {what} kernels just in time (first use after install: seconds to a minute; "
          f"numba caches them for later runs).{ahead}", file=out, flush=True)
    return True


def build(
    name: str,
    exports: Callable[[], Iterable[tuple[str, Callable[..., Any], str]]],
    tag: str,
    output_dir: str | os.PathLike[str],
    *,
    verbose: bool = False,
) -> Path:
    """Compile the kernels ``exports()`` lists (export name, the kernel's Python function (a dispatcher's
    ``py_func``), numba signature) and the marker ``source_<tag>`` into the extension module ``name`` in
    ``output_dir``; return its path. ``exports`` is called after numba is configured (performance warnings off), so
    it is where the kernel module is imported.

    numba's ``pycc`` generates code for the generic CPU of the build machine's architecture, so a module built on one
    x86-64 host runs on any other. Needs a C compiler; raises when the build fails or writes no module.
    """
    os.environ.setdefault("NUMBA_DISABLE_PERFORMANCE_WARNINGS", "1")
    import warnings

    from numba.core.errors import NumbaPendingDeprecationWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaPendingDeprecationWarning)
        from numba.pycc import CC

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    cc = CC(name)
    cc.output_dir = str(out)
    cc.verbose = verbose

    def source() -> int:
        return 0

    cc.export(f"source_{tag}", "i8()")(source)  # marks the source this module was compiled from
    for export, fn, sig in exports():
        cc.export(export, sig)(fn)
    cc.compile()
    found = sorted(out.glob(f"{name}*.so")) + sorted(out.glob(f"{name}*.pyd"))
    if not found:
        raise RuntimeError(f"numba.pycc wrote no {name} extension into {out}")
    return found[-1]


def main(
    argv: list[str] | None,
    description: str | None,
    build_fn: Callable[..., Path],
) -> int:
    """The command line of a builder module: ``[DIR] [--verbose]``, calling ``build_fn(DIR, verbose=...)`` and
    printing the path written and the seconds it took."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("output_dir", nargs="?", default=None, help="where to write the module (default: the package)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    path = build_fn(args.output_dir, verbose=args.verbose)
    print(f"wrote {path} in {time.perf_counter() - start:.1f} s")
    return 0
