"""The architecture targets of issue 27, measured by ``scripts/archstats.py`` (one code path for the test and for the
numbers in docs/bench/architecture.md):

- no import cycle among the modules of ``allocator``, ``walras`` and the ``walras_*`` packages (grimp's graph of
  direct imports, Tarjan's strongly connected components; a package ``__init__`` is a module);
- the planner's import graph (``walras.planner.*``, its ``__init__`` left out) at most 9 levels deep;
- no product function (``allocator/``, ``operator/walras/``) over 120 lines outside numba kernels;
- at most 8 parameters per function in ``walras.planner`` (``self``/``cls`` not counted, ``*args``/``**kwargs`` one
  each);
- exactly one ``def largest_remainder``;
- at least 10 import-linter contracts in pyproject.toml, all kept by ``lint-imports``.

Each failure lists its offenders. The second half proves the detectors detect, on synthetic packages written to
``tmp_path``: a cycle, a deep chain, a long function (and kernels that are exempt), a wide function, a duplicated
definition, a broken contract.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scripts import archstats

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def stats() -> archstats.Stats:
    """The counts of this tree (``lint-imports`` is run by its own test)."""
    return archstats.collect(ROOT, lint=False)


# ------------------------------------------------------------------------------------------------ targets, this tree
def test_no_import_cycle(stats: archstats.Stats) -> None:
    lines = [
        f"{' <-> '.join(cycle)}: " + "; ".join(imports)
        for cycle, imports in zip(stats.cycles, stats.cycle_imports, strict=True)
    ]
    assert not stats.cycles, f"{len(stats.cycles)} import cycle(s):\n" + "\n".join(lines)


def test_planner_import_graph_depth(stats: archstats.Stats) -> None:
    assert stats.planner_levels >= 1, "no walras.planner.* module found: the measurement read the wrong tree"
    assert stats.planner_levels <= archstats.MAX_PLANNER_LEVELS, (
        f"walras.planner import graph is {stats.planner_levels} levels deep (at most {archstats.MAX_PLANNER_LEVELS}); "
        "longest chain: " + " -> ".join(stats.planner_chain)
    )


def test_no_long_product_function(stats: archstats.Stats) -> None:
    offenders = [f"{f.lines} lines: {f.label()}" for f in stats.long_functions]
    assert not offenders, (
        f"{len(offenders)} function(s) over {archstats.MAX_FUNCTION_LINES} lines outside numba kernels:\n"
        + "\n".join(offenders)
    )


def test_planner_functions_take_at_most_8_parameters(stats: archstats.Stats) -> None:
    offenders = [f"{f.params} parameters: {f.label()}" for f in stats.wide_planner_functions]
    assert not offenders, (
        f"{len(offenders)} planner function(s) with more than {archstats.MAX_PLANNER_PARAMS} parameters:\n"
        + "\n".join(offenders)
    )


def test_one_largest_remainder(stats: archstats.Stats) -> None:
    found = [f.label() for f in stats.largest_remainder]
    message = f"{len(found)} definitions of largest_remainder (exactly one expected):\n" + "\n".join(found)
    assert len(found) == 1, message


def test_at_least_10_import_contracts(stats: archstats.Stats) -> None:
    assert len(stats.contracts) >= archstats.MIN_CONTRACTS, (
        f"{len(stats.contracts)} import-linter contracts in pyproject.toml (at least {archstats.MIN_CONTRACTS}):\n"
        + "\n".join(stats.contracts)
    )


def _lint_imports() -> str:
    exe = archstats.find_lint_imports()
    if exe is None:
        message = "lint-imports is not installed (pip install -e '.[dev]': import-linter)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return exe


def test_lint_imports_keeps_every_contract(stats: archstats.Stats) -> None:
    result = archstats.run_lint_imports(ROOT, _lint_imports())
    assert result.returncode == 0 and result.broken == 0, (
        f"lint-imports exited {result.returncode} ({result.kept} kept, {result.broken} broken); broken: "
        f"{list(result.broken_names)}\n{result.tail}"
    )
    assert result.kept == len(stats.contracts), (
        f"lint-imports kept {result.kept} contracts, pyproject.toml has {len(stats.contracts)}\n{result.tail}"
    )


# -------------------------------------------------------------------------------------- the detectors, synthetic code
def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def _body(n: int) -> str:
    """A function body of ``n`` lines."""
    return "".join(f"    x{i} = {i}\n" for i in range(n - 1)) + "    return 0\n"


def test_detects_an_import_cycle_and_counts_levels(tmp_path: Path) -> None:
    pkg = "archfix_cycle"
    _write(
        tmp_path,
        {
            f"{pkg}/__init__.py": "from . import top\n",  # the package __init__ is a module of its own
            f"{pkg}/top.py": f"from {pkg} import a\n",
            f"{pkg}/a.py": f"from {pkg} import b\n",
            f"{pkg}/b.py": "def f():\n    from . import c  # an import inside a function counts\n    return c\n",
            f"{pkg}/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n",
            f"{pkg}/leaf.py": "X = 1\n",
            f"{pkg}/ring.py": f"import {pkg}\n",  # ring -> package __init__ -> top -> a -> b -> c -> a
            f"{pkg}/selfish.py": f"from {pkg} import selfish\n",
        },
    )
    edges = archstats.import_graph([tmp_path], [pkg])
    assert set(edges) == {pkg, *(f"{pkg}.{m}" for m in ("top", "a", "b", "c", "leaf", "ring", "selfish"))}
    cycles = archstats.import_cycles(edges)
    assert cycles == [[f"{pkg}.a", f"{pkg}.b", f"{pkg}.c"], [f"{pkg}.selfish"]]
    closing = archstats.cycle_imports(edges, cycles[0])
    assert any(line.startswith(f"{pkg}.b -> {pkg}.c (line 2") for line in closing), closing
    depth = archstats.import_depth(edges, pkg)
    # top -> {a|b|c}: 2 levels (the cycle counts as one); ring -> __init__ is outside the package's DAG.
    assert depth.levels == 2 and depth.chain == (f"{pkg}.top", f"{pkg}.a|{pkg}.b|{pkg}.c")
    # without the closing import c -> a and the self-import, nothing is left
    edges[f"{pkg}.c"].pop(f"{pkg}.a")
    edges[f"{pkg}.selfish"].pop(f"{pkg}.selfish")
    assert archstats.import_cycles(edges) == []


def test_import_depth_is_the_longest_chain() -> None:
    edges = {
        "p": {"p.a": ""},  # the package __init__ is left out of the depth
        "p.a": {"p.b": "", "p.d": ""},
        "p.b": {"p.c": ""},
        "p.c": {"p.d": ""},
        "p.d": {"q.x": ""},  # outside the package
        "p.e": {},
    }
    assert archstats.import_depth(edges, "p") == archstats.Depth(4, ("p.a", "p.b", "p.c", "p.d"))
    assert archstats.import_depth({"p": {}}, "p").levels == 0


def test_detects_long_and_wide_functions_and_exempts_kernels(tmp_path: Path) -> None:
    src = tmp_path / "pkg"
    _write(
        tmp_path,
        {
            "pkg/plain.py": (
                "def long_one():\n"
                + _body(120)  # 121 lines with the def line: over
                + "\n\ndef just_120():\n"
                + _body(119)  # 120 lines: not over
                + "\n\nclass K:\n    def wide(self, a, b, c, d, e, f, g, *args, **kwargs):\n        return 0\n"
                + "\n    def eight(self, a, b, c, d, e, f, g, h):\n        return 0\n"
                + "\n    @classmethod\n    def eight_kw(cls, a, b, c, /, d, *, e, f, g, h):\n        return 0\n"
                + "\n\ndef outer():\n    def inner(a, b, c, d, e, f, g, h, i):\n        return 0\n    return inner\n"
            ),
            "pkg/jitted.py": (
                "import numba\nfrom numba import njit\n\n\n@numba.njit(nogil=True)\ndef kernel_a():\n"
                + _body(130)
                + "\n\n@njit\ndef kernel_b():\n"
                + _body(130)
                + "\n\n@numba.vectorize\ndef kernel_c(x):\n"
                + _body(130)
            ),
            "pkg/numba_kernels.py": "def k():\n" + _body(200),
            "pkg/_walk_kernel.py": "def k():\n" + _body(200),
            "pkg/sub/_fill_kernels.py": "def k():\n" + _body(200),
            "pkg/kernelsmith.py": "def not_a_kernel_file():\n" + _body(125),
        },
    )
    long = archstats.long_functions([src], tmp_path)
    assert [(f.label(), f.lines) for f in long] == [
        ("pkg/kernelsmith.py:1 not_a_kernel_file", 126),
        ("pkg/plain.py:1 long_one", 121),
    ]
    wide = archstats.wide_functions([src], tmp_path)
    assert [(f.qualname, f.params) for f in wide] == [("K.wide", 9), ("outer.inner", 9)]
    assert archstats.definitions([src], tmp_path, "inner")[0].qualname == "outer.inner"


def test_counts_every_definition(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "a/x.py": "def largest_remainder(s, t):\n    return s\n",
            "a/y.py": "class P:\n    def largest_remainder(self):\n        return 0\n\ndef largest_remainder_rows():\n"
            "    return 0\n",
        },
    )
    found = archstats.definitions([tmp_path / "a"], tmp_path, "largest_remainder")
    assert [f.label() for f in found] == ["a/x.py:1 largest_remainder", "a/y.py:2 P.largest_remainder"]


def test_collect_measures_the_tree_it_is_given(tmp_path: Path) -> None:
    """The whole measurement (the one the targets above assert), run as the script on a synthetic tree laid out
    like this repository: the packages it finds, a planner cycle and chain, the product folders, the contracts."""
    _write(
        tmp_path,
        {
            "pyproject.toml": """
                [tool.importlinter]
                root_packages = ["allocator", "walras"]

                [[tool.importlinter.contracts]]
                name = "one"
                type = "forbidden"
                source_modules = ["allocator"]
                forbidden_modules = ["walras"]

                [[tool.importlinter.contracts]]
                name = "two"
                type = "forbidden"
                source_modules = ["walras.planner"]
                forbidden_modules = ["walras.operator"]
            """,
            "allocator/__init__.py": "",
            "allocator/m.py": "def big():\n" + _body(150),
            "operator/walras/__init__.py": "",
            "operator/walras/operator.py": "def largest_remainder():\n    return 0\n",
            "operator/walras/planner/__init__.py": "from walras.planner import a\n",
            "operator/walras/planner/a.py": "from walras.planner import b\n",
            "operator/walras/planner/b.py": "from walras.planner import c\n",
            "operator/walras/planner/c.py": (
                "from walras.planner import b\n\n\ndef w(a, b, c, d, e, f, g, h, i):\n    pass\n"
            ),
            "operator/walras/planner/policies.py": "def largest_remainder():\n    return 0\n",
            "operator/walras_extra/__init__.py": "import allocator\n",
            "walras_rootlevel/__init__.py": "import walras_extra\n",
            "operator/notours/__init__.py": "",
        },
    )
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "archstats.py"), "--root", str(tmp_path), "--json", "--no-lint"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["packages"] == ["allocator", "walras", "walras_extra", "walras_rootlevel"]
    assert got["modules"] == 11 and got["imports"] == 6
    assert got["cycles"] == [["walras.planner.b", "walras.planner.c"]]
    assert got["planner_levels"] == 2
    assert got["planner_chain"] == ["walras.planner.a", "walras.planner.b|walras.planner.c"]
    assert got["contracts"] == ["one", "two"]
    assert [(f["path"], f["qualname"], f["lines"]) for f in got["long_functions"]] == [("allocator/m.py", "big", 151)]
    assert [(f["qualname"], f["params"]) for f in got["wide_planner_functions"]] == [("w", 9)]
    assert sorted(f["path"] for f in got["largest_remainder"]) == [
        "operator/walras/operator.py",
        "operator/walras/planner/policies.py",
    ]


def test_detects_a_broken_contract(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pyproject.toml": """
                [tool.importlinter]
                root_packages = ["archfix_lint"]

                [[tool.importlinter.contracts]]
                name = "low never imports high"
                type = "forbidden"
                source_modules = ["archfix_lint.low"]
                forbidden_modules = ["archfix_lint.high"]

                [[tool.importlinter.contracts]]
                name = "high never imports elsewhere"
                type = "forbidden"
                source_modules = ["archfix_lint.high"]
                forbidden_modules = ["archfix_lint.elsewhere"]
            """,
            "archfix_lint/__init__.py": "",
            "archfix_lint/high.py": "X = 1\n",
            "archfix_lint/elsewhere.py": "Y = 1\n",
            "archfix_lint/low.py": "from archfix_lint.high import X\n",
        },
    )
    result = archstats.run_lint_imports(tmp_path, _lint_imports())
    assert result.returncode != 0, result.tail
    assert (result.kept, result.broken) == (1, 1), result.tail
    assert result.broken_names == ("low never imports high",), result.tail
