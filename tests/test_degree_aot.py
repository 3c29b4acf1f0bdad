"""allocator.degree.kernels: the route table of the SEQ kernels (ahead-of-time extension, numba JIT), both routes
computing the same values, and a degree solve that imports no numba when the extension module is built."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from realtools import require
from test_dockerfile import parse_dockerfile

from allocator import degree
from allocator.degree import kernels
from allocator.degree._engine import run_sweep

ROOT = Path(__file__).resolve().parents[1]
SEEDS = (0, 1, 2, 3)


def _fresh(code: str, env: dict[str, str] | None = None) -> Any:
    """Run ``code`` in a fresh interpreter (repository root as working directory); it prints one JSON line."""
    base = {k: v for k, v in os.environ.items() if k != kernels.ENV}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, env={**base, **(env or {})}
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _register_code(path: Path) -> str:
    """Source that makes ``path`` the module ``allocator.degree._kernels_aot`` of a fresh interpreter."""
    return (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location({kernels.AOT_MODULE!r}, {str(path)!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        f"sys.modules[{kernels.AOT_MODULE!r}] = mod\n"
    )


def _instance(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Demands (half of them small integers, so that many values tie), capacities (some zero) and degrees."""
    rng = np.random.default_rng(seed)
    n, m = 400 + 100 * seed, 40 + 10 * seed
    w = np.where(rng.random(n) < 0.5, rng.integers(1, 6, n).astype(np.float64), rng.pareto(1.5, n) + 0.05)
    b = rng.uniform(0.5, 2.0, m) * w.sum() / m
    b[rng.random(m) < 0.1] = 0.0
    d = rng.integers(1, 8, m)
    return w, b, d


def _sweep(seed: int, extra: int, left: bool) -> list[np.ndarray]:
    """Every array a sweep writes (the records and the clients left) on the instance of ``seed``."""
    w, b, d = _instance(seed)
    inst = degree.as_instance(w, b, d)
    order = np.lexsort((np.arange(inst.n), inst.demands)).astype(np.int64)
    rec, rest_v, rest_i = run_sweep(inst.demands[order], order, inst.capacities, inst.degrees + (extra - 1), inst.tol,
                                    left=left)  # fmt: skip
    return [*(getattr(rec, f) for f in rec.__dataclass_fields__), rest_v, rest_i]


def _online(seed: int, make: Callable[[np.ndarray, np.ndarray], degree.OnlineSeq]) -> list[Any]:
    """The allocation, ``last_changes`` and ``last_recomputed`` after each of 60 arrivals and departures."""
    w, b, d = _instance(seed)
    rng = np.random.default_rng(100 + seed)
    alg = make(b, d)
    alg.extend((i, float(x)) for i, x in enumerate(w[:200]))
    present: list[Hashable] = list(range(200))
    trace: list[Any] = []
    for t in range(60):
        if rng.random() < 0.5 and present:
            alg.remove(present.pop(int(rng.integers(len(present)))))
        else:
            alg.add(f"new{t}", float(w[200 + t]))
            present.append(f"new{t}")
        trace.append((alg.allocation(), alg.last_changes, alg.last_recomputed))
    return trace


ONLINE: dict[str, Callable[[np.ndarray, np.ndarray], degree.OnlineSeq]] = {
    "incremental": lambda b, d: degree.OnlineSeq(b, d),
    "naive": lambda b, d: degree.OnlineSeq(b, d, method="naive", extra_degree=2),
    "left": lambda b, d: degree.OnlineSeqLeft(b, d),
}


def test_import_loads_no_numba() -> None:
    mods = _fresh("import json, sys\nimport allocator.degree\nprint(json.dumps('numba' in sys.modules))")
    assert mods is False


def test_route_table_rejects_unknown_and_missing_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kernels.ENV, raising=False)
    with pytest.raises(ValueError, match="kernel route"):
        kernels.load("cuda")
    monkeypatch.setattr(kernels, "AOT_MODULE", "allocator.degree._no_such_module")
    monkeypatch.setattr(kernels, "_loaded", None)
    with pytest.raises(ImportError):
        kernels.load("aot")
    assert kernels.load().route == "jit"  # no extension module (not built, or the build failed): the JIT route


def test_a_stale_aot_module_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """An extension built from another version of the kernel source (no ``source_<tag>`` export for this one) must
    not run: its kernels may take other arguments."""
    import types

    monkeypatch.delenv(kernels.ENV, raising=False)
    stale = types.ModuleType(kernels.AOT_MODULE)
    stale.source_0000000000000000 = lambda: 0  # type: ignore[attr-defined]
    for name in kernels.KERNELS:
        setattr(stale, name, lambda *args: pytest.fail("a stale kernel was called"))
    monkeypatch.setitem(sys.modules, kernels.AOT_MODULE, stale)
    monkeypatch.setattr(kernels, "_loaded", None)
    with pytest.raises(ImportError, match="another version"):
        kernels.load("aot")
    assert kernels.load().route == "jit"
    assert degree.seq_sparse([1.0, 2.0], [2.0], [1]).throughput == pytest.approx(2.0)


def test_source_tag_is_a_digest_of_the_kernel_source(tmp_path: Path) -> None:
    from allocator import _aot

    src = (ROOT / "allocator" / "degree" / "numba_kernels.py").read_bytes()
    assert kernels.source_tag() == _aot.source_tag(ROOT / "allocator" / "degree" / "numba_kernels.py")
    changed = tmp_path / "numba_kernels.py"
    changed.write_bytes(src + b"\n# edited\n")
    assert _aot.source_tag(changed) != kernels.source_tag()  # any edit of the source makes a built module stale
    assert len(kernels.source_tag()) == 16 and int(kernels.source_tag(), 16) >= 0


def test_jit_calls_use_exactly_the_ahead_of_time_signatures() -> None:
    """The callers pass the argument types of ``SIGNATURES`` (the ahead-of-time functions do not check dtypes): run
    every caller on the JIT route and compare the signatures numba compiled for with those of the extension."""
    code = (
        "import json, numpy as np\nfrom numba.core import sigutils\n"
        "from allocator import degree\nfrom allocator.degree import kernels, numba_kernels as nk\n"
        "w = np.array([3.0, 1.0, 2.0, 2.0, 5.0, 0.5]); b = np.array([4.0, 3.0, 0.0, 6.0]); d = [1, 2, 1, 3]\n"
        "degree.seq(w, b, d); degree.seq_left(w, b, d, extra_degree=0); degree.plan_pool(w, b, d)\n"
        "o = degree.OnlineSeq(b[::-1], d); o.extend(enumerate(w)); o.add('x', 2.5); o.remove(1); o.remove(4)\n"
        "out = {}\n"
        "for name, sig in nk.SIGNATURES.items():\n"
        "    args, ret = sigutils.normalize_signature(sig)\n"
        "    got = getattr(nk, name).nopython_signatures\n"
        "    out[name] = [len(got), all(s.args == tuple(args) and s.return_type == ret for s in got)]\n"
        "print(json.dumps([kernels.loaded().route, out]))"
    )
    route, sigs = _fresh(code, {kernels.ENV: "jit"})
    assert route == "jit"
    assert set(sigs) == set(kernels.KERNELS)
    assert sigs == {name: [1, True] for name in kernels.KERNELS}


@pytest.fixture(scope="module")
def aot_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The ahead-of-time extension, built by ``python -m allocator.degree.aot`` into a temporary folder and made the
    module ``allocator.degree._kernels_aot`` of this process for the tests that use it."""
    require("gcc")
    out = tmp_path_factory.mktemp("degree-aot")
    subprocess.run([sys.executable, "-m", "allocator.degree.aot", str(out)], cwd=ROOT, check=True)
    found = sorted(out.glob("_kernels_aot*.so"))
    assert found, "no extension module written"
    spec = importlib.util.spec_from_file_location(kernels.AOT_MODULE, found[0])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    previous = sys.modules.get(kernels.AOT_MODULE)
    sys.modules[kernels.AOT_MODULE] = module
    try:
        yield found[0]
    finally:
        if previous is None:
            sys.modules.pop(kernels.AOT_MODULE, None)
        else:
            sys.modules[kernels.AOT_MODULE] = previous
        kernels.load("jit")


@pytest.mark.parametrize("seed", SEEDS)
def test_aot_and_jit_sweeps_agree_exactly(aot_module: Path, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kernels.ENV, raising=False)
    for extra, left in ((1, False), (0, False), (2, False), (1, True)):
        assert kernels.load("jit").route == "jit"
        ref = _sweep(seed, extra, left)
        assert kernels.load("aot").route == "aot"
        got = _sweep(seed, extra, left)
        assert len(got) == len(ref) == 13
        for x, y in zip(got, ref):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)
        assert int(ref[1].sum()) > 0  # the instance is served (a sweep that did nothing would compare equal too)


@pytest.mark.parametrize("variant", sorted(ONLINE))
def test_aot_and_jit_online_runs_agree_exactly(aot_module: Path, variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kernels.ENV, raising=False)
    for seed in SEEDS[:2]:
        kernels.load("jit")
        ref = _online(seed, ONLINE[variant])
        kernels.load("aot")
        got = _online(seed, ONLINE[variant])
        assert got == ref  # float amounts compared with ==: bit for bit
        assert any(changes for _, changes, _ in ref)


def test_degree_solve_with_the_aot_module_imports_no_numba(aot_module: Path) -> None:
    code = _register_code(aot_module) + (
        "import json, numpy as np\nfrom allocator import degree\nfrom allocator.degree import kernels\n"
        "rng = np.random.default_rng(7); w = rng.uniform(0.1, 5, 3000); b = rng.uniform(1, 40, 300)\n"
        "d = rng.integers(1, 6, 300)\n"
        "plan = degree.plan_pool(w, b, d)\n"
        "o = degree.OnlineSeq(b, d); o.extend(enumerate(w[:500].tolist())); o.add('x', 3.0); o.remove(2)\n"
        "print(json.dumps([kernels.loaded().route, 'numba' in sys.modules, plan.tolist(), o.throughput()]))"
    )
    route, numba_loaded, plan, online = _fresh(code)
    assert (route, numba_loaded) == ("aot", False)
    kernels.load("jit")
    rng = np.random.default_rng(7)
    w, b, d = rng.uniform(0.1, 5, 3000), rng.uniform(1, 40, 300), rng.integers(1, 6, 300)
    np.testing.assert_array_equal(np.asarray(plan), degree.plan_pool(w, b, d))
    o = degree.OnlineSeq(b, d)
    o.extend(enumerate(w[:500].tolist()))
    o.add("x", 3.0)
    o.remove(2)
    assert online == o.throughput()


def test_environment_forces_the_jit_route_over_a_built_module(aot_module: Path) -> None:
    code = _register_code(aot_module) + (
        "import json\nfrom allocator import degree\nfrom allocator.degree import kernels\n"
        "degree.seq([1.0, 2.0], [2.0], [1])\nprint(json.dumps([kernels.loaded().route, 'numba' in sys.modules]))"
    )
    assert _fresh(code, {kernels.ENV: "jit"}) == ["jit", True]
    assert _fresh(code) == ["aot", False]


def test_image_and_install_build_the_degree_kernels_ahead_of_time() -> None:
    """The build stage compiles the kernels after installing the project (from outside the source tree, so that
    the module lands in the installed package) and fails when the route does not load; ``make install`` tries it
    and falls back to the JIT route with a message."""
    _, stages = parse_dockerfile((ROOT / "Dockerfile").read_text())
    runs = [a for i, a in stages[0].instructions if i == "RUN"]
    run = next(a for a in runs if "python -m allocator.degree.aot" in a)
    assert run.index("apt-get install") < run.index("cd /") < run.index("python -m allocator.degree.aot")
    assert "from allocator.degree import kernels; k = kernels.load(); assert k.route == 'aot'" in run
    makefile = (ROOT / "Makefile").read_text()
    assert "python -m allocator.degree.aot || echo" in makefile
    assert "allocator/degree/_kernels_aot*.so" in (ROOT / ".gitignore").read_text().splitlines()
