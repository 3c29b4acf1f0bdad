"""allocator.colocation.kernels and allocator.fairness.kernels: the route tables of the colocation and fairness
kernels (ahead-of-time extension, numba JIT; :mod:`allocator._kernel_table`), both routes computing the same values
on the public solvers (tests/aot_workloads.py), and the packages importing no numba when the extensions are built."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tomllib
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from realtools import require
from test_dockerfile import parse_dockerfile

from allocator import _kernel_table
from allocator._kernel_table import KernelTable
from allocator.colocation import kernels as colocation_kernels
from allocator.fairness import kernels as fairness_kernels

ROOT = Path(__file__).resolve().parents[1]
TABLES: dict[str, KernelTable] = {"colocation": colocation_kernels.TABLE, "fairness": fairness_kernels.TABLE}
ENVS = {"colocation": colocation_kernels.ENV, "fairness": fairness_kernels.ENV}


def _fresh(code: str, env: dict[str, str] | None = None) -> tuple[Any, str]:
    """Run ``code`` in a fresh interpreter (repository root as working directory, ``tests`` on the path); it prints
    one JSON line last. Returns the parsed line and the standard error."""
    base = {k: v for k, v in os.environ.items() if k not in (*ENVS.values(), "NUMBA_DISABLE_JIT")}
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'tests')\n" + code], cwd=ROOT,
                         capture_output=True, text=True, env={**base, **(env or {})}, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def _register_code(module: str, path: Path) -> str:
    """Source that makes ``path`` the extension ``module`` of a fresh interpreter."""
    return (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location({module!r}, {str(path)!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        f"sys.modules[{module!r}] = mod\n"
    )


def _workload_code(package: str) -> str:
    return (
        "import json\nimport aot_workloads\n"
        f"from allocator.{package} import kernels\n"
        f"res = json.dumps(aot_workloads.run({package!r}), sort_keys=True)\n"
        "print(json.dumps([kernels.TABLE.loaded().route, 'numba' in sys.modules, res]))"
    )


def test_importing_the_packages_loads_no_numba() -> None:
    found, _ = _fresh("import json\nimport allocator.colocation, allocator.fairness\n"
                      "print(json.dumps('numba' in sys.modules))")
    assert found is False


@pytest.mark.parametrize("package", sorted(TABLES))
def test_route_table_rejects_unknown_and_missing_routes(package: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENVS[package], raising=False)
    with pytest.raises(ValueError, match="kernel route"):
        TABLES[package].load("cuda")
    missing = dataclasses.replace(TABLES[package], package=f"allocator.{package}._no_such_package")
    assert missing.aot_module == f"allocator.{package}._no_such_package._kernels_aot"
    with pytest.raises(ImportError):
        missing.load("aot")
    loaded = missing.load()  # no extension module (not built, or the build failed): the JIT route
    assert loaded.route == "jit" and set(loaded.functions) == set(TABLES[package].kernels)


@pytest.mark.parametrize("package", sorted(TABLES))
def test_a_stale_aot_module_is_not_used(package: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An extension built from another version of the kernel sources (no ``source_<tag>`` export for these) must
    not run: its kernels may take other arguments."""
    table = TABLES[package]
    monkeypatch.delenv(ENVS[package], raising=False)
    stale = types.ModuleType(table.aot_module)
    stale.source_0000000000000000 = lambda: 0  # type: ignore[attr-defined]
    for name in table.kernels:
        setattr(stale, name, lambda *args: pytest.fail("a stale kernel was called"))
    monkeypatch.setitem(sys.modules, table.aot_module, stale)
    table.reset()
    try:
        with pytest.raises(ImportError, match="another version"):
            table.load("aot")
        assert table.load().route == "jit"
    finally:
        table.reset()


@pytest.mark.parametrize("package", sorted(TABLES))
def test_source_tag_changes_with_any_kernel_source(package: str, monkeypatch: pytest.MonkeyPatch) -> None:
    table = TABLES[package]
    tag = table.source_tag()
    assert len(tag) == 16 and int(tag, 16) >= 0
    assert len(table.sources) >= 3 and all(src.path.is_file() for src in table.sources)
    real = _kernel_table._aot.source_tag
    for src in table.sources:  # an edit of any one source file makes a built module stale
        edited = src.path
        monkeypatch.setattr(_kernel_table._aot, "source_tag",
                            lambda p, e=edited: "0" * 16 if Path(p) == e else real(p))
        assert table.source_tag() != tag, src.module
        monkeypatch.setattr(_kernel_table._aot, "source_tag", real)
    assert table.source_tag() == tag


@pytest.mark.parametrize("package", sorted(TABLES))
def test_jit_calls_use_the_ahead_of_time_signatures(package: str) -> None:
    """The callers pass arguments of the exported signatures (the ahead-of-time functions do not check dtypes or
    layouts): run the workload on the JIT route and check every signature numba compiled for against the export's
    (same dtypes, dimensions and return type; a C-contiguous array may go where the export takes any layout)."""
    code = (
        "import json\nfrom numba.core import sigutils\nimport aot_workloads\n"
        f"from allocator.{package} import kernels\n"
        f"aot_workloads.run({package!r})\n"
        "out = {}\n"
        "for name, d in kernels.TABLE.dispatchers().items():\n"
        "    args, ret = sigutils.normalize_signature(kernels.SIGNATURES[name])\n"
        "    def fits(a, b):\n"
        "        if hasattr(b, 'layout'):\n"
        "            return (a.dtype, a.ndim) == (b.dtype, b.ndim) and a.layout in (b.layout, 'C' if b.layout == 'A'\n"
        "                                                                         else b.layout)\n"
        "        return a == b\n"
        "    sigs = d.nopython_signatures\n"
        "    out[name] = [len(sigs) > 0, all(len(s.args) == len(args) and all(map(fits, s.args, args))\n"
        "                                    and s.return_type == ret for s in sigs)]\n"
        "print(json.dumps([kernels.TABLE.loaded().route, out]))"
    )
    (route, sigs), _ = _fresh(code, {ENVS[package]: "jit"})
    assert route == "jit"
    assert sigs == {name: [True, True] for name in TABLES[package].kernels}


@pytest.fixture(scope="module")
def aot_modules(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The extensions built by ``python -m allocator.<package>.aot DIR`` into temporary folders."""
    require("gcc")
    found = {}
    for package in TABLES:
        out = tmp_path_factory.mktemp(f"{package}-aot")
        subprocess.run([sys.executable, "-m", f"allocator.{package}.aot", str(out)], cwd=ROOT, check=True,
                       capture_output=True, timeout=900)
        built = sorted(out.glob("_kernels_aot*.so"))
        assert built, f"no {package} extension module written"
        found[package] = built[0]
    yield found


@pytest.mark.parametrize("package", sorted(TABLES))
def test_aot_and_jit_routes_agree_exactly(aot_modules: dict[str, Path], package: str) -> None:
    """The workload's every number (assignments, costs, evaluations and moves of the colocation solvers; the PS-DSF
    and PF-VDS allocations, residuals and sweeps, the rounding, the smoothed levels and their Jacobian, a water
    filling that divides by zero) is the same on both routes, and the ahead-of-time run imports no numba."""
    table = TABLES[package]
    (route, numba, jit), _ = _fresh(_workload_code(package), {ENVS[package]: "jit"})
    assert (route, numba) == ("jit", True)
    code = _register_code(table.aot_module, aot_modules[package]) + _workload_code(package)
    (route, numba, aot), stderr = _fresh(code, {ENVS[package]: "aot"})
    assert route == "aot"
    assert aot == jit
    assert len(jit) > 3000  # the workload returned its results (two empty runs would compare equal too)
    assert "just in time" not in stderr
    if package == "colocation":  # fairness's pf_vds also runs the price-discovery route table (numba imported there)
        assert numba is False


def test_the_built_module_marks_its_source(aot_modules: dict[str, Path]) -> None:
    for package, path in aot_modules.items():
        code = _register_code(TABLES[package].aot_module, path) + (
            "import json\nprint(json.dumps(sorted(n for n in dir(mod) if n.startswith('source_'))))"
        )
        marks, _ = _fresh(code)
        assert marks == [f"source_{TABLES[package].source_tag()}"]


def test_image_install_and_wheel_build_these_kernels_ahead_of_time() -> None:
    """The build stage compiles both kernel sets into the installed package and fails when a route does not load;
    ``make install`` tries it (falling back to the JIT route with a message), ``make wheel`` requires it, setup.py
    tags a wheel as binary only with every extension present, pyproject.toml puts them into the wheel, and git
    ignores the built modules."""
    _, stages = parse_dockerfile((ROOT / "Dockerfile").read_text())
    runs = [a for i, a in stages[0].instructions if i == "RUN"]
    makefile = (ROOT / "Makefile").read_text()
    setup = (ROOT / "setup.py").read_text()
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    shipped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["allocator"]
    for package in TABLES:
        run = next(a for a in runs if f"python -m allocator.{package}.aot" in a)
        assert run.index("apt-get install") < run.index("cd /") < run.index(f"python -m allocator.{package}.aot")
        assert f"from allocator.{package} import kernels; k = kernels.load(); assert k.route == 'aot'" in run
        assert f"python -m allocator.{package}.aot || echo" in makefile
        assert f"$(BIN)/python -m allocator.{package}.aot\n" in makefile
        assert f'"allocator/{package}/_kernels_aot*.so"' in setup
        assert f"allocator/{package}/_kernels_aot*.so" in ignored
        assert f"{package}/_kernels_aot*.so" in shipped  # the wheel carries the module
