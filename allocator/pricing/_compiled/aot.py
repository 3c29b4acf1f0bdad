"""Build the ahead-of-time route of :mod:`allocator.pricing._compiled.kernels`:
``python -m allocator.pricing._compiled.aot [DIR]``.

Compiles every kernel of :mod:`allocator.pricing._compiled.numba_kernels` for the signatures in its ``SIGNATURES`` into
the extension module ``_kernels_aot`` (numba's ``pycc``; needs a C compiler), written next to this file unless ``DIR``
is given. Code is generated for the generic CPU of the build machine's architecture (pycc's default), so an image
built on one x86-64 host runs on any other. Importing the result needs numpy only, not numba: a fresh process pays
milliseconds for the kernels instead of numba's import and cache load (see the route table in
:mod:`allocator.pricing._compiled.kernels`). The operator image runs this at build time.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from allocator import _aot

__all__ = ["build"]


def build(output_dir: str | os.PathLike[str] | None = None, *, verbose: bool = False) -> Path:
    """Compile the extension module into ``output_dir`` (default: this package) and return its path."""
    from allocator.pricing._compiled.kernels import source_tag

    def exports() -> list[tuple[str, Callable[..., Any], str]]:
        from allocator.pricing._compiled import numba_kernels

        return [
            (f"{name}_{suffix}", getattr(numba_kernels, name).py_func, sig)
            for name, sigs in numba_kernels.SIGNATURES.items()
            for suffix, sig in sigs
        ]

    out = Path(output_dir) if output_dir is not None else Path(__file__).resolve().parent
    return _aot.build("_kernels_aot", exports, source_tag(), out, verbose=verbose)


def main(argv: list[str] | None = None) -> int:
    return _aot.main(argv, __doc__, build)


if __name__ == "__main__":
    sys.exit(main())
