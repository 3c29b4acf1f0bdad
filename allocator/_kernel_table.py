"""The route table of a package whose numba kernels live in several modules (:mod:`allocator.colocation`,
:mod:`allocator.fairness`): an ahead-of-time extension module ``<package>._kernels_aot`` when it is built from the
current kernel sources, else the kernels compiled just in time.

:mod:`allocator.degree.kernels` and :mod:`allocator.pricing._compiled.kernels` keep their kernels in one module; a
:class:`KernelTable` lists the kernels a package calls from Python as :class:`Source` entries (module, exported name,
function, numba signature) over several modules and does the same as those tables:

* :meth:`KernelTable.build` compiles every listed kernel with ``numba.pycc`` (:func:`allocator._aot.build`) into
  ``_kernels_aot`` beside the package, with the marker ``source_<tag>`` where the tag is a digest of all the kernel
  source files (:meth:`KernelTable.source_tag`). Each kernel is compiled with the ``error_model`` and ``fastmath``
  options of its ``@njit`` decorator, so that both routes compute the same values (``error_model="numpy"`` makes a
  division by zero give ``inf``/``nan`` instead of raising).
* :meth:`KernelTable.load` opens the ahead-of-time route when the module imports and matches the sources (numba is
  not imported), else imports the kernel modules (numba JIT, on-disk cache) and, when none of the listed kernels has
  a cache entry yet (the first use after an install), says on stderr that it compiles them just in time and how to
  build them ahead of time (:func:`allocator._aot.notice`). An environment variable forces a route.

The ahead-of-time functions do not check their arguments' dtypes or layouts: the callers pass arrays of the dtypes
and layouts of the signatures (each package's tests compare the signatures numba compiles for on the JIT route with
the listed ones).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from allocator import _aot

__all__ = ["KernelTable", "Kernels", "Source"]

_ALLOCATOR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Source:
    """The kernels of one module that are called from Python: ``exports`` maps the exported name to the function's
    name in ``module`` and its numba signature (as in ``numba.pycc.CC.export``)."""

    module: str
    exports: Mapping[str, tuple[str, str]]

    @property
    def path(self) -> Path:
        """The module's source file (``allocator.a.b`` -> ``allocator/a/b.py``), found without importing it."""
        parts = self.module.split(".")
        if parts[0] != "allocator":
            raise ValueError(f"kernel module outside allocator: {self.module}")
        return _ALLOCATOR.joinpath(*parts[1:]).with_suffix(".py")


@dataclass(frozen=True)
class Kernels:
    """The loaded kernels of one route (``"aot"`` or ``"jit"``), by exported name (also as attributes), and the
    seconds spent loading them (the import of the extension module, or of numba and the kernel modules)."""

    route: str
    seconds: float
    functions: Mapping[str, Callable[..., Any]] = field(repr=False)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        try:
            return self.functions[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass
class KernelTable:
    """The kernels of ``package`` (``allocator.<name>``) listed in ``sources``; ``what`` names them in the
    just-in-time notice and ``env`` is the environment variable that forces a route (``aot`` or ``jit``)."""

    package: str
    what: str
    env: str
    sources: tuple[Source, ...]
    _loaded: Kernels | None = field(default=None, init=False, repr=False)

    @property
    def aot_module(self) -> str:
        """The ahead-of-time extension module (``<package>._kernels_aot``)."""
        return f"{self.package}._kernels_aot"

    @property
    def builder(self) -> str:
        """The module whose ``python -m`` builds the extension (``<package>.aot``)."""
        return f"{self.package}.aot"

    @property
    def kernels(self) -> tuple[str, ...]:
        """The exported names, in the order of ``sources``."""
        return tuple(name for src in self.sources for name in src.exports)

    def signatures(self) -> dict[str, str]:
        """The numba signature of each exported kernel."""
        return {name: sig for src in self.sources for name, (_, sig) in src.exports.items()}

    def source_tag(self) -> str:
        """The first 16 hex digits of the SHA-256 over the kernel modules' source digests (:func:`allocator._aot.
        source_tag` of each file, in the order of ``sources``): an edit of any of them makes a built module stale."""
        digest = hashlib.sha256()
        for src in self.sources:
            digest.update(f"{src.module}:{_aot.source_tag(src.path)}\n".encode())
        return digest.hexdigest()[:16]

    def loaded(self) -> Kernels | None:
        """The kernels of this process if :meth:`load` has run, else ``None``."""
        return self._loaded

    def dispatchers(self) -> dict[str, Any]:
        """The numba dispatchers of the exported kernels (imports the kernel modules, hence numba)."""
        out = {}
        for src in self.sources:
            mod = importlib.import_module(src.module)
            for name, (fn, _) in src.exports.items():
                out[name] = getattr(mod, fn)
        return out

    def _open(self, route: str) -> Mapping[str, Callable[..., Any]]:
        if route == "aot":
            mod = _aot.load(self.aot_module, self.source_tag(), ", ".join(str(s.path.name) for s in self.sources))
            return {name: getattr(mod, name) for name in self.kernels}
        import numba

        from allocator._jit import uncached

        found = self.dispatchers()
        compiles = not getattr(numba.config, "DISABLE_JIT", False)  # NUMBA_DISABLE_JIT=1 runs the Python source
        if compiles and len(uncached(found.values())) == len(found):  # none cached yet: the first use after install
            _aot.notice(self.what, self.builder)
        return found

    def load(self, route: str | None = None) -> Kernels:
        """Load the kernels once per process and return them: ``route`` (or the environment variable ``env``) when
        given, else ``"aot"`` when the extension module imports and matches the sources, else ``"jit"``. A forced
        route that cannot load raises ``ImportError``; a call naming another route than the loaded one loads that
        route instead (the tests compare them)."""
        want = _aot.requested(route, self.env)
        if self._loaded is not None and (want is None or want == self._loaded.route):
            return self._loaded
        start = time.perf_counter()
        name, fns = _aot.choose(want, lambda: self._open("aot"), lambda: self._open("jit"))
        self._loaded = Kernels(route=name, seconds=time.perf_counter() - start, functions=dict(fns))
        return self._loaded

    def reset(self) -> None:
        """Forget the loaded route (the next :meth:`load` opens one again)."""
        self._loaded = None

    def build(self, output_dir: str | os.PathLike[str] | None = None, *, verbose: bool = False) -> Path:
        """Compile the listed kernels ahead of time into ``output_dir`` (default: the package's folder) and return
        the extension's path (:func:`allocator._aot.build`: numba's ``pycc``, needs a C compiler)."""
        out = Path(output_dir) if output_dir is not None else _ALLOCATOR.joinpath(*self.package.split(".")[1:])
        options: dict[Callable[..., Any], dict[str, Any]] = {}

        def exports() -> list[tuple[str, Callable[..., Any], str]]:
            rows = []
            sigs = self.signatures()
            for name, dispatcher in self.dispatchers().items():
                fn = dispatcher.py_func
                options[fn] = dict(dispatcher.targetoptions)
                rows.append((name, fn, sigs[name]))
            return rows

        with _decorator_options(options):
            return _aot.build("_kernels_aot", exports, self.source_tag(), out, verbose=verbose)


@contextmanager
def _decorator_options(options: Mapping[Callable[..., Any], Mapping[str, Any]]) -> Iterator[None]:
    """Make ``numba.pycc`` compile each exported function with the ``error_model`` and ``fastmath`` of its ``@njit``
    (``pycc`` compiles every export with numba's defaults: ``error_model="python"``, no fastmath)."""
    from numba.pycc import compiler

    original = compiler.compile_extra

    def compile_extra(typingctx: Any, targetctx: Any, func: Any, args: Any, return_type: Any, flags: Any,
                      *rest: Any, **kw: Any) -> Any:
        opts = options.get(func, {})
        flags.error_model = opts.get("error_model", "python")
        flags.fastmath = opts.get("fastmath", False)
        return original(typingctx, targetctx, func, args, return_type, flags, *rest, **kw)

    compiler.compile_extra = compile_extra
    try:
        yield
    finally:
        compiler.compile_extra = original
