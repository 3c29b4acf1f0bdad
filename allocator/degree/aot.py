"""Build the ahead-of-time route of :mod:`allocator.degree.kernels`: ``python -m allocator.degree.aot [DIR]``.

Compiles the kernels of the SEQ sweep (:mod:`allocator.degree.numba_kernels`, for the signatures in its
``SIGNATURES``) into the extension module ``_kernels_aot``, written next to this file unless ``DIR`` is given
(:func:`allocator._aot.build`: numba's ``pycc``, needs a C compiler, generic code for the build machine's
architecture). Importing the result needs numpy only, not numba: a fresh process that plans a throughput pool pays
milliseconds for the kernels instead of numba's import and cache load (see the route table in
:mod:`allocator.degree.kernels`). ``make install`` and the operator image run this at build time.
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
    from allocator.degree.kernels import source_tag

    def exports() -> list[tuple[str, Callable[..., Any], str]]:
        from allocator.degree import numba_kernels

        return [(name, getattr(numba_kernels, name).py_func, sig) for name, sig in numba_kernels.SIGNATURES.items()]

    out = Path(output_dir) if output_dir is not None else Path(__file__).resolve().parent
    return _aot.build("_kernels_aot", exports, source_tag(), out, verbose=verbose)


def main(argv: list[str] | None = None) -> int:
    return _aot.main(argv, __doc__, build)


if __name__ == "__main__":
    sys.exit(main())
