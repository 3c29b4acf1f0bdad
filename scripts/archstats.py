"""Architecture counts of a Walras tree: import cycles, planner depth, import contracts, long and wide functions.

Run from the repository root (or give ``--root``)::

    python scripts/archstats.py            # text
    python scripts/archstats.py --json     # one JSON object

What it counts, for the tree at ``--root``:

- **cycles**: strongly connected components (Tarjan) of the graph of direct module imports among the first-party
  packages (``allocator``, ``walras`` and every ``walras_*`` package, at the root or under ``operator/``), as grimp
  (the import-graph library import-linter is built on) reads them: every ``import`` statement in a module, wherever
  it stands, including ``TYPE_CHECKING`` blocks; a package's ``__init__`` is a module of its own. A component of two
  or more modules, or a module that imports itself, is a cycle.
- **planner levels**: the number of modules on the longest import chain inside ``walras.planner.*`` (the package's
  own ``__init__`` left out: it re-exports, it is not a phase); a planner module that imports no other planner module
  is level 1. Modules in a cycle are condensed into one node first (the cycle is reported under cycles).
- **contracts**: the ``[[tool.importlinter.contracts]]`` tables of ``pyproject.toml`` (read with ``tomllib``) and
  whether ``lint-imports`` keeps them all (its exit status and its ``Contracts: K kept, B broken`` line).
- **long functions**: functions and methods (nested ones counted on their own, ``def`` line to last line) over 120
  lines in ``allocator/`` and ``operator/walras/``, numba kernels excluded: a function decorated with ``njit``,
  ``jit``, ``vectorize`` or ``guvectorize`` (plain, dotted such as ``numba.njit``, or called such as ``njit(...)``),
  and every function of a file named ``numba_kernels.py``, ``*_kernel.py`` or ``*_kernels.py``.
- **wide planner functions**: functions in ``operator/walras/planner/`` with more than 8 parameters; ``self``/``cls``
  as the first parameter is not counted, ``*args`` and ``**kwargs`` count one each, keyword-only ones count.
- **largest_remainder**: the ``def largest_remainder`` statements in ``allocator/`` and ``operator/``.

The script lives in ``scripts/`` rather than ``bench/``: it measures the source, not run time, so it needs none of the
benchmark harness (machine description, instance generators); ``tests/test_architecture.py`` imports it
(``scripts`` is a namespace package on the tests' ``pythonpath``) so the test and the measurement share one code path.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]

#: The issue's targets (issue 27), which tests/test_architecture.py asserts.
MAX_FUNCTION_LINES = 120
MAX_PLANNER_PARAMS = 8
MAX_PLANNER_LEVELS = 9
MIN_CONTRACTS = 10

PLANNER = "walras.planner"
KERNEL_DECORATORS = frozenset({"njit", "jit", "vectorize", "guvectorize"})
_KERNEL_FILE = re.compile(r"^(numba_kernels|.*_kernels?)\.py$")
_LINT_SUMMARY = re.compile(r"Contracts:\s*(\d+)\s*kept,\s*(\d+)\s*broken")


# ----------------------------------------------------------------------------------------------------------- imports
def first_party_packages(root: Path) -> list[str]:
    """The top-level packages whose imports are counted: ``allocator``, ``walras`` and every ``walras_*`` package,
    each a folder with an ``__init__.py`` at the root or under ``operator/`` (where ``walras`` lives)."""
    found: set[str] = set()
    for where in source_roots(root):
        if not where.is_dir():
            continue
        for p in where.iterdir():
            name = p.name
            if (p / "__init__.py").is_file() and (name in ("allocator", "walras") or name.startswith("walras_")):
                found.add(name)
    return sorted(found)


def source_roots(root: Path) -> list[Path]:
    """The ``sys.path`` entries from which the tree's packages import: the root (``allocator``) and ``operator/``."""
    return [root, root / "operator"]


def import_graph(paths: Sequence[Path], packages: Sequence[str]) -> dict[str, dict[str, str]]:
    """Direct imports between the modules of ``packages`` (found under ``paths``), as grimp reads them: module ->
    {first-party module it imports -> where (``line N: <statement>``, its first import statement)}. Every module of
    the packages is a key, importing nothing or not.

    ``paths`` go to the front of ``sys.path`` while grimp locates the packages; a package that resolves elsewhere
    anyway (already imported from another tree, or found by an editable install's finder) is refused rather than
    measured silently."""
    added = [str(p) for p in paths]
    sys.path[:0] = added
    try:
        for name in packages:
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec is not None else None
            if origin is None or not any(Path(origin).resolve().is_relative_to(p.resolve()) for p in paths):
                raise RuntimeError(f"package {name} resolves to {origin}, not to a module under {added}")
        graph = grimp.build_graph(*packages, include_external_packages=False, cache_dir=None)
    finally:
        for entry in added:
            sys.path.remove(entry)
    edges: dict[str, dict[str, str]] = {}
    for m in sorted(graph.modules):
        edges[m] = {}
        for t in sorted(graph.find_modules_directly_imported_by(m)):
            details = graph.get_import_details(importer=m, imported=t)
            first = min(details, key=lambda d: d["line_number"]) if details else None
            edges[m][t] = f"line {first['line_number']}: {first['line_contents']}" if first else ""
    return edges


def strongly_connected(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``edges`` (iterative; nodes only reached as targets are included),
    each sorted, in reverse topological order (a component comes before every component that imports it)."""
    nodes = sorted(set(edges) | {t for ts in edges.values() for t in ts})
    succ = {n: sorted(edges.get(n, ())) for n in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(succ[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(succ[nxt])))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def import_cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import cycles of ``edges``: components of two or more modules, and modules that import themselves;
    sorted by their first module."""
    cycles = [c for c in strongly_connected(edges) if len(c) > 1 or c[0] in set(edges.get(c[0], ()))]
    return sorted(cycles)


def cycle_imports(edges: Mapping[str, Mapping[str, str]], cycle: Sequence[str]) -> list[str]:
    """The imports that close ``cycle``: ``a -> b (line N: statement)`` for every edge between its modules."""
    members = set(cycle)
    return [
        f"{m} -> {t} ({where})" if where else f"{m} -> {t}"
        for m in sorted(members)
        for t, where in sorted(edges.get(m, {}).items())
        if t in members
    ]


@dataclass(frozen=True)
class Depth:
    """The longest import chain among the modules under a package: ``levels`` modules, ``chain`` from the importing
    module down to one that imports no other module of the set (cycle members condensed, shown as ``a|b``)."""

    levels: int
    chain: tuple[str, ...]


def import_depth(edges: Mapping[str, Iterable[str]], package: str = PLANNER) -> Depth:
    """Levels of the import DAG of the modules strictly below ``package`` (its own ``__init__`` left out): the number
    of modules on the longest chain of direct imports, each strongly connected component counted as one level."""
    prefix = package + "."
    inside = {m: {t for t in ts if t.startswith(prefix)} for m, ts in edges.items() if m.startswith(prefix)}
    if not inside:
        return Depth(0, ())
    components = strongly_connected(inside)  # reverse topological: imported components come first
    owner = {m: i for i, comp in enumerate(components) for m in comp}
    best: list[tuple[int, tuple[str, ...]]] = []
    for i, comp in enumerate(components):
        below = {owner[t] for m in comp for t in inside.get(m, ()) if owner[t] != i}
        name = "|".join(comp)
        if below:
            levels, chain = max((best[j] for j in below), key=lambda lc: (lc[0], lc[1]))
            best.append((levels + 1, (name, *chain)))
        else:
            best.append((1, (name,)))
    levels, chain = max(best, key=lambda lc: (lc[0], lc[1]))
    return Depth(levels, chain)


# --------------------------------------------------------------------------------------------------------- contracts
def contract_names(pyproject: Path) -> list[str]:
    """The names of the ``[[tool.importlinter.contracts]]`` tables of ``pyproject``."""
    with pyproject.open("rb") as fh:
        data = tomllib.load(fh)
    contracts = data.get("tool", {}).get("importlinter", {}).get("contracts", [])
    return [str(c.get("name", c.get("id", "?"))) for c in contracts]


@dataclass(frozen=True)
class LintResult:
    """What ``lint-imports`` said about the tree: its exit status, the kept and broken counts of its summary line
    (None when it printed none), the contracts it reported broken, and the command's last lines."""

    executable: str | None
    returncode: int | None
    kept: int | None
    broken: int | None
    broken_names: tuple[str, ...]
    tail: str


def find_lint_imports() -> str | None:
    """The ``lint-imports`` next to the running interpreter (the virtual environment's), else the one on PATH."""
    local = Path(sys.executable).with_name("lint-imports")
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("lint-imports")


def run_lint_imports(root: Path, executable: str | None = None, timeout: float = 600.0) -> LintResult:
    """Run ``lint-imports`` in ``root`` with the tree's source roots first on ``PYTHONPATH`` (so it reads this tree,
    not an installed copy) and no grimp cache; ``returncode`` None when no ``lint-imports`` is installed."""
    exe = executable or find_lint_imports()
    if exe is None:
        return LintResult(None, None, None, None, (), "lint-imports is not installed")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in source_roots(root)), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    proc = subprocess.run(
        [exe, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    out = proc.stdout + proc.stderr
    summary = _LINT_SUMMARY.search(out)
    broken_names = tuple(
        m.group(1).strip() for m in re.finditer(r"^(.*?)\s+BROKEN\s*$", out, flags=re.MULTILINE) if m.group(1).strip()
    )
    return LintResult(
        exe,
        proc.returncode,
        int(summary.group(1)) if summary else None,
        int(summary.group(2)) if summary else None,
        broken_names,
        "\n".join(out.strip().splitlines()[-40:]),
    )


# --------------------------------------------------------------------------------------------------------- functions
@dataclass(frozen=True)
class Function:
    """One function of the source: file (relative to the measured root), dotted name inside the file, ``def``
    line, length in lines (``def`` line to last line), parameter count (``self``/``cls`` first parameter left out,
    ``*args``/``**kwargs`` one each) and whether it is a numba kernel (decorator or kernel file)."""

    path: str
    qualname: str
    lineno: int
    lines: int
    params: int
    kernel: bool

    def label(self) -> str:
        """``path:line qualname``, as offenders are listed."""
        return f"{self.path}:{self.lineno} {self.qualname}"


def _decorator_name(node: ast.expr) -> str:
    """The last name of a decorator: ``njit`` for ``@njit``, ``@numba.njit`` and ``@njit(nogil=True)``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _param_count(args: ast.arguments) -> int:
    positional = [*args.posonlyargs, *args.args]
    count = len(positional) + len(args.kwonlyargs) + (args.vararg is not None) + (args.kwarg is not None)
    if positional and positional[0].arg in ("self", "cls"):
        count -= 1
    return count


def is_kernel_file(path: Path) -> bool:
    """True for ``numba_kernels.py``, ``*_kernel.py`` and ``*_kernels.py``."""
    return bool(_KERNEL_FILE.match(path.name))


def functions_in(path: Path, relative_to: Path) -> list[Function]:
    """Every function and method defined in the Python file ``path`` (nested ones included), in source order."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    kernel_file = is_kernel_file(path)
    rel = path.relative_to(relative_to).as_posix()
    found: list[Function] = []

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                kernel = kernel_file or any(_decorator_name(d) in KERNEL_DECORATORS for d in child.decorator_list)
                end = child.end_lineno if child.end_lineno is not None else child.lineno
                found.append(
                    Function(
                        rel,
                        ".".join((*scope, child.name)),
                        child.lineno,
                        end - child.lineno + 1,
                        _param_count(child.args),
                        kernel,
                    )
                )
                visit(child, (*scope, child.name))
            elif isinstance(child, ast.ClassDef):
                visit(child, (*scope, child.name))
            else:
                visit(child, scope)

    visit(tree, ())
    return found


def python_files(dirs: Iterable[Path]) -> list[Path]:
    """The ``.py`` files under ``dirs`` (recursively, sorted; ``__pycache__`` and hidden folders skipped)."""
    files: list[Path] = []
    for d in dirs:
        if not d.is_dir():
            continue
        for p in d.rglob("*.py"):
            parts = p.relative_to(d).parts
            if any(part == "__pycache__" or part.startswith(".") for part in parts):
                continue
            files.append(p)
    return sorted(files)


def all_functions(dirs: Iterable[Path], relative_to: Path) -> list[Function]:
    """Every function of every Python file under ``dirs``."""
    return [f for p in python_files(dirs) for f in functions_in(p, relative_to)]


def long_functions(dirs: Iterable[Path], relative_to: Path, limit: int = MAX_FUNCTION_LINES) -> list[Function]:
    """Functions over ``limit`` lines under ``dirs``, numba kernels excluded, longest first."""
    found = [f for f in all_functions(dirs, relative_to) if f.lines > limit and not f.kernel]
    return sorted(found, key=lambda f: (-f.lines, f.path, f.lineno))


def wide_functions(dirs: Iterable[Path], relative_to: Path, limit: int = MAX_PLANNER_PARAMS) -> list[Function]:
    """Functions with more than ``limit`` parameters under ``dirs``, widest first."""
    found = [f for f in all_functions(dirs, relative_to) if f.params > limit]
    return sorted(found, key=lambda f: (-f.params, f.path, f.lineno))


def definitions(dirs: Iterable[Path], relative_to: Path, name: str) -> list[Function]:
    """The functions (at any nesting) named exactly ``name`` under ``dirs``."""
    return [f for f in all_functions(dirs, relative_to) if f.qualname.rsplit(".", 1)[-1] == name]


# ----------------------------------------------------------------------------------------------------------- summary
@dataclass(frozen=True)
class Stats:
    """Every count of the module docstring for one tree."""

    root: str
    packages: list[str]
    modules: int
    imports: int
    cycles: list[list[str]]
    cycle_imports: list[list[str]]
    planner_levels: int
    planner_chain: list[str]
    contracts: list[str]
    lint: LintResult | None
    long_functions: list[Function] = field(default_factory=list)
    wide_planner_functions: list[Function] = field(default_factory=list)
    largest_remainder: list[Function] = field(default_factory=list)


def product_dirs(root: Path) -> list[Path]:
    """Where product functions live: ``allocator/`` and ``operator/walras/``."""
    return [root / "allocator", root / "operator" / "walras"]


def planner_dir(root: Path) -> Path:
    """The planner package's folder."""
    return root / "operator" / "walras" / "planner"


def collect(root: Path = ROOT, lint: bool = True) -> Stats:
    """All counts for the tree at ``root``; ``lint=False`` skips running ``lint-imports``."""
    root = root.resolve()
    packages = first_party_packages(root)
    edges = import_graph(source_roots(root), packages)
    depth = import_depth(edges, PLANNER)
    cycles = import_cycles(edges)
    return Stats(
        root=str(root),
        packages=packages,
        modules=len(edges),
        imports=sum(len(ts) for ts in edges.values()),
        cycles=cycles,
        cycle_imports=[cycle_imports(edges, c) for c in cycles],
        planner_levels=depth.levels,
        planner_chain=list(depth.chain),
        contracts=contract_names(root / "pyproject.toml"),
        lint=run_lint_imports(root) if lint else None,
        long_functions=long_functions(product_dirs(root), root),
        wide_planner_functions=wide_functions([planner_dir(root)], root),
        largest_remainder=definitions([root / "allocator", root / "operator"], root, "largest_remainder"),
    )


def render(stats: Stats) -> str:
    """The counts as text, one section each, offenders listed."""
    out = [
        f"tree: {stats.root}",
        f"packages: {', '.join(stats.packages)} ({stats.modules} modules, {stats.imports} direct imports)",
    ]
    out.append(f"import cycles: {len(stats.cycles)}")
    for cycle, imports in zip(stats.cycles, stats.cycle_imports, strict=True):
        out.append(f"  {' <-> '.join(cycle)}")
        out += [f"      {line}" for line in imports]
    out.append(f"planner import graph: {stats.planner_levels} levels (target <= {MAX_PLANNER_LEVELS})")
    out += [f"  {i}. {m}" for i, m in enumerate(stats.planner_chain, 1)]
    lint = stats.lint
    if lint is None:
        kept = "not run"
    elif lint.returncode is None:
        kept = "lint-imports not installed"
    else:
        kept = f"lint-imports exit {lint.returncode}, {lint.kept} kept, {lint.broken} broken"
    out.append(f"import-linter contracts: {len(stats.contracts)} (target >= {MIN_CONTRACTS}); {kept}")
    out += [f"  - {n}" for n in stats.contracts]
    if lint is not None and lint.broken_names:
        out += [f"  BROKEN: {n}" for n in lint.broken_names]
    out.append(f"functions over {MAX_FUNCTION_LINES} lines (numba kernels excluded): {len(stats.long_functions)}")
    out += [f"  {f.lines:4d}  {f.label()}" for f in stats.long_functions]
    out.append(f"planner functions with more than {MAX_PLANNER_PARAMS} parameters: {len(stats.wide_planner_functions)}")
    out += [f"  {f.params:4d}  {f.label()}" for f in stats.wide_planner_functions]
    out.append(f"def largest_remainder: {len(stats.largest_remainder)}")
    out += [f"  {f.label()}" for f in stats.largest_remainder]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the counts of the tree (text, or ``--json``); exit 0 (it measures, it does not judge)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository root to measure (default: this one)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--no-lint", action="store_true", help="do not run lint-imports")
    args = parser.parse_args(argv)
    stats = collect(args.root, lint=not args.no_lint)
    print(json.dumps(asdict(stats), indent=2) if args.json else render(stats))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
