"""Build the ahead-of-time route of :mod:`allocator.pricing.kernels`: ``python -m allocator.pricing.aot [DIR]``.

Compiles every kernel of :mod:`allocator.pricing.numba_kernels` for the signatures in its ``SIGNATURES`` into the
extension module ``_kernels_aot`` (numba's ``pycc``; needs a C compiler), written next to this file unless ``DIR``
is given. Code is generated for the generic CPU of the build machine's architecture (pycc's default), so an image
built on one x86-64 host runs on any other. Importing the result needs numpy only, not numba: a fresh process pays
milliseconds for the kernels instead of numba's import and cache load (see the route table in
:mod:`allocator.pricing.kernels`). The operator image runs this at build time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

__all__ = ["build"]


def build(output_dir: str | os.PathLike[str] | None = None, *, verbose: bool = False) -> Path:
    """Compile the extension module into ``output_dir`` (default: this package) and return its path."""
    os.environ.setdefault("NUMBA_DISABLE_PERFORMANCE_WARNINGS", "1")
    import warnings

    from numba.core.errors import NumbaPendingDeprecationWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaPendingDeprecationWarning)
        from numba.pycc import CC

    from allocator.pricing import numba_kernels

    out = Path(output_dir) if output_dir is not None else Path(__file__).resolve().parent
    out.mkdir(parents=True, exist_ok=True)
    cc = CC("_kernels_aot")
    cc.output_dir = str(out)
    cc.verbose = verbose
    from allocator.pricing.kernels import source_tag

    def source() -> int:
        return 0

    cc.export(f"source_{source_tag()}", "i8()")(source)  # marks the source this module was compiled from
    for name, sigs in numba_kernels.SIGNATURES.items():
        fn = getattr(numba_kernels, name).py_func
        for suffix, sig in sigs:
            cc.export(f"{name}_{suffix}", sig)(fn)
    cc.compile()
    found = sorted(out.glob("_kernels_aot*.so")) + sorted(out.glob("_kernels_aot*.pyd"))
    if not found:
        raise RuntimeError(f"numba.pycc wrote no _kernels_aot extension into {out}")
    return found[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("output_dir", nargs="?", default=None, help="where to write the module (default: the package)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    path = build(args.output_dir, verbose=args.verbose)
    print(f"wrote {path} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
