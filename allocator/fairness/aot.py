"""Build the ahead-of-time route of :mod:`allocator.fairness.kernels`: ``python -m allocator.fairness.aot [DIR]``.

Compiles the fairness kernels (the PS-DSF water filling and smoothed levels, the pod rounding hand-back, the PF-VDS
interior-point products; the signatures in :data:`allocator.fairness.kernels.SIGNATURES`) into the extension module
``_kernels_aot``, written next to this file unless ``DIR`` is given (:func:`allocator._aot.build`: numba's
``pycc``, needs a C compiler, generic code for the build machine's architecture). Importing the result needs numpy
only, not numba, and nothing is compiled on first use. ``make install``, ``make wheel`` and the operator image run
this at build time.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from allocator import _aot

__all__ = ["build"]


def build(output_dir: str | os.PathLike[str] | None = None, *, verbose: bool = False) -> Path:
    """Compile the extension module into ``output_dir`` (default: this package) and return its path."""
    from allocator.fairness.kernels import TABLE

    return TABLE.build(output_dir, verbose=verbose)


def main(argv: list[str] | None = None) -> int:
    return _aot.main(argv, __doc__, build)


if __name__ == "__main__":
    sys.exit(main())
