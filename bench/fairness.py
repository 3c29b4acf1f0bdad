"""Benchmark for ``allocator.fairness`` (paper 002, Sec. 6): utilisation, fairness deviation, rounding cost, timings.

Run ``python -m bench.fairness`` (``--quick`` for a smoke run). Writes ``docs/bench/fairness.md``.

Cluster (002 Sec. 6.1, Fig. 5): 75 servers of 4 GHz / 12 GB, 100 of 8 GHz / 8 GB, 75 of 16 GHz / 4 GB, spread over
three locations on a line; users sit uniformly at a location and may use servers at the same or an adjacent location.
Demands are SYNTHETIC (no trace is shipped): "Google-like" two-resource tasks (CPU, RAM; log-normal, weakly correlated,
heavy-tailed like the 2011 cluster-usage trace) and "Bitbrains-like" four-resource VMs (CPU, RAM, network, storage
bandwidth; log-normal). For the four-resource case each server gets network and storage bandwidth of its
location/type link (synthetic values below). Utilisation is the used fraction of each resource over the whole cluster.

The fairness deviation of eq. 58 was lost in extraction; it is reconstructed from the text around it ("PS-DSF results in
equal weighted VDS for all users served by a server"): for user n, ``D_n = max over servers k with x[n, k] > 0 of
(v[n, k] - vmin_k) / vmin_k`` with ``v[n, k] = x_n / (phi_n gamma[n, k])`` and ``vmin_k`` the smallest weighted VDS
among the users served by k. Reported are its mean and max over users.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from allocator.fairness import allocate, make_instance, pf_vds, pf_vds_distributed, ps_dsf, refill
from allocator.fairness import merge_identical_nodes as _merge
from bench._machine import machine_line

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "bench" / "fairness.md"
ALPHAS = (0.5, 1.0, 2.0, 5.0, 20.0)


def machine() -> str:
    return machine_line()


def cluster(four: bool) -> tuple[np.ndarray, np.ndarray]:
    """Capacities (k x r) and location of each server. Types: (GHz, GB) = (4, 12) x75, (8, 8) x100, (16, 4) x75."""
    rows, loc = [], []
    counts = {0: (25, 25, 25), 1: (34, 33, 33), 2: (25, 25, 25)}
    types = [(4.0, 12.0), (8.0, 8.0), (16.0, 4.0)]
    # Synthetic per-server network (Gb/s) and storage (100 MB/s) bandwidth share of each location/type link.
    net = [[1.0, 2.0, 1.5], [1.5, 1.0, 2.0], [2.0, 1.5, 1.0]]
    sto = [[2.0, 1.0, 1.0], [1.0, 2.0, 1.0], [1.0, 1.0, 2.0]]
    for t, (ghz, gb) in enumerate(types):
        for l_ in range(3):
            for _ in range(counts[t][l_]):
                rows.append([ghz, gb, net[l_][t], sto[l_][t]] if four else [ghz, gb])
                loc.append(l_)
    return np.array(rows), np.array(loc)


def demands(rng: np.random.Generator, n: int, four: bool) -> np.ndarray:
    """Synthetic per-task demands: Google-like CPU/RAM log-normal, correlation 0.3; Bitbrains-like adds net/disk."""
    r = 4 if four else 2
    cov = np.full((r, r), 0.3) + 0.7 * np.eye(r)
    z = rng.multivariate_normal(np.zeros(r), cov, size=n)
    scale = np.array([0.8, 0.8, 0.15, 0.2])[:r]
    return np.asarray(np.clip(scale * np.exp(0.9 * z), 0.02 * scale, 12 * scale))


def eligibility(rng: np.random.Generator, n: int, loc: np.ndarray) -> np.ndarray:
    home = rng.integers(0, 3, n)
    return np.abs(home[:, None] - loc[None, :]) <= 1


def deviation(x: np.ndarray, d: np.ndarray, c: np.ndarray, e: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """Reconstructed eq. 58: mean and max over users of the relative excess of weighted VDS on the servers they use."""
    inst = make_instance(d, c, e, w)
    tot = x.sum(axis=1)
    served = x > 1e-9 * np.maximum(tot[:, None], 1e-12)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(served, tot[:, None] / (w[:, None] * np.where(served, inst.gamma, 1.0)), np.nan)
    vmin = np.nanmin(np.where(served, v, np.inf), axis=0)
    rel = np.where(served, (v - vmin[None, :]) / vmin[None, :], -np.inf).max(axis=1)
    rel = np.where(np.isfinite(rel), rel, 0.0)
    return float(rel.mean()), float(rel.max())


def utilisation(x: np.ndarray, d: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.asarray((x.T @ d).sum(axis=0) / c.sum(axis=0))


def comparison(runs: int, n_users: int, four: bool, seed: int) -> dict[str, dict[str, np.ndarray]]:
    c, loc = cluster(four)
    out: dict[str, dict[str, list]] = {}
    rng = np.random.default_rng(seed)
    mechs = [("PS-DSF", "ps-dsf", None), ("DRFH", "drfh", None), ("TSF", "tsf", None)]
    mechs += [(f"PF-VDS a={a:g}", "pf-vds", a) for a in ALPHAS]
    for _ in range(runs):
        d = demands(rng, n_users, four)
        e = eligibility(rng, n_users, loc)
        w = np.ones(n_users)
        for label, mech, alpha in mechs:
            t0 = time.perf_counter()
            fa = allocate(d, c, eligible=e, weights=w, mechanism=mech, alpha=alpha)
            x = fa.tasks
            el = time.perf_counter() - t0
            rec = out.setdefault(label, {"util": [], "dev": [], "time": [], "certified": []})
            rec["util"].append(utilisation(x, d, c))
            rec["dev"].append(deviation(x, d, c, e, w))
            rec["time"].append(el)
            rec["certified"].append(fa.status == "certified")
            if mech == "ps-dsf":
                xi = allocate(d, c, eligible=e, weights=w, mechanism=mech, integral=True).tasks
                rec = out.setdefault("PS-DSF integral", {"util": [], "dev": [], "time": [], "certified": []})
                rec["util"].append(utilisation(xi, d, c))
                rec["dev"].append(deviation(xi, d, c, e, w))
                rec["time"].append(0.0)
                rec.setdefault("loss", []).append(float(np.mean(1 - xi.sum(axis=1) / x.sum(axis=1))))
    return {k: {kk: np.array(vv) for kk, vv in v.items()} for k, v in out.items()}


def table(res: dict[str, dict[str, np.ndarray]], names: list[str]) -> str:
    head = (
        "| mechanism | "
        + " | ".join(f"util {n}" for n in names)
        + " | mean D (eq. 58) | max D | median solve s | certified runs |"
    )
    sep = "|" + "---|" * (len(names) + 5)
    lines = [head, sep]
    for label, rec in res.items():
        u = rec["util"].mean(axis=0)
        dv = rec["dev"]
        t = np.median(rec["time"]) if rec["time"].any() else float("nan")
        ok = rec["certified"]
        cert = f"{int(ok.sum())} of {ok.size}" if ok.size else "n/a (rounded)"
        lines.append(
            f"| {label} | "
            + " | ".join(f"{100 * v:.1f} %" for v in u)
            + f" | {dv[:, 0].mean():.3f} | {dv[:, 1].max():.3f} | {t:.3f} | {cert} |"
        )
    return "\n".join(lines)


def random_instance(n: int, k: int, r: int, seed: int):
    rng = np.random.default_rng(seed)
    d = rng.uniform(0.1, 1.0, (n, r))
    c = rng.uniform(10.0, 100.0, (k, r))
    e = rng.random((n, k)) < 0.5
    e[np.arange(n), rng.integers(0, k, n)] = True
    return make_instance(d, c, e)


def _to_tolerance(solve: Callable[[float | None], Any], cap: float, reps: int) -> tuple[list[float], Any]:
    """Time ``solve(max_seconds)``, which runs to tolerance 1e-6 or to the wall-clock cap ``max_seconds``.

    The first run has the cap. If it converged, ``reps - 1`` more runs without a cap (the same deterministic
    iteration, so they converge too) give the median; a run that hit its cap is reported as a single run, since
    repeating it would only re-measure the cap.
    """
    t0 = time.perf_counter()
    out = solve(cap)
    ts = [time.perf_counter() - t0]
    if out.converged:
        for _ in range(reps - 1):
            t0 = time.perf_counter()
            out = solve(None)
            ts.append(time.perf_counter() - t0)
            assert out.converged
    return ts, out


def _row(case: str, ts: list[float], what: str, count: int, residual: float, converged: bool, target: float) -> str:
    runs = f"median of {len(ts)}" if len(ts) > 1 else "single run"
    status = "converged" if converged else f"NOT converged, stopped at the {CAP_FACTOR:g} x target time cap"
    return (
        f"| {case} ({runs}) | {np.median(ts):.2f} | {count} {what}, residual {residual:.1e} ({status}) "
        f"| <= {target:g} s to residual 1e-6 |"
    )


CAP_FACTOR = 5.0  # a solve that has not met 1e-6 after CAP_FACTOR x its target time is stopped and reported as such


def _psdsf_what(res: Any) -> str:
    return "sweeps (level start certified)" if res.start == "levels" else "sweeps (plain Gauss-Seidel)"


def timing(n: int, k: int, r: int, reps: int, plain: bool = False) -> list[str]:
    """Time to fixed-point residual 1e-6 (PS-DSF) and KKT residual 1e-6 (PF-VDS(1)) on random distinct nodes.

    PS-DSF runs as :func:`allocator.fairness.ps_dsf` does by default (level start, certified by an exact sweep, else
    plain sweeps); with ``plain`` also the plain Gauss-Seidel sweeps from zero (``levels=False``) for comparison.
    """
    inst = random_instance(n, k, r, 11)
    merged, _, _ = _merge(inst)
    assert merged.k == k  # random nodes: nothing to merge, the solvers see all k nodes
    ts, res = _to_tolerance(lambda m: ps_dsf(inst, tol=1e-6, max_sweeps=100000, max_seconds=m), CAP_FACTOR * 2.0, reps)
    case = f"PS-DSF, {n} jobs x {k} nodes x {r} res."
    rows = [_row(case, ts, _psdsf_what(res), res.sweeps, res.residual, res.converged, 2)]
    if plain:
        ts, res = _to_tolerance(
            lambda m: ps_dsf(inst, tol=1e-6, max_sweeps=100000, max_seconds=m, levels=False), CAP_FACTOR * 2.0, reps
        )
        rows.append(_row(case + " plain sweeps only", ts, _psdsf_what(res), res.sweeps, res.residual, res.converged, 2))
    ts, res2 = _to_tolerance(
        lambda m: pf_vds(inst, 1.0, tol=1e-6, max_sweeps=100000, max_seconds=m), CAP_FACTOR * 10.0, reps
    )
    rows.append(
        _row(
            f"PF-VDS(1) centralised (route `ipm`: interior point, exact active-set finish), {n} x {k} x {r}",
            ts,
            _pfvds_what(res2),
            res2.ipm_iterations,
            res2.residual,
            res2.converged,
            10,
        )
    )
    return rows


def _pfvds_what(res: Any) -> str:
    sweeps = f" + {res.iterations} best-response sweeps" if res.iterations else ""
    return f"interior-point iterations, method `{res.method}`{sweeps}"


def robustness(sizes: list[tuple[int, int]], seeds: range) -> tuple[list[str], str]:
    """PF-VDS(1) once per random instance (seeds other than the timing instance's 11), to tolerance 1e-6; the table
    rows and a one-line count per size (certified, and certified within the 10 s target)."""
    rows = []
    counts = []
    for n, k in sizes:
        ok = fast = 0
        for seed in seeds:
            inst = random_instance(n, k, 3, seed)
            t0 = time.perf_counter()
            res = pf_vds(inst, 1.0, tol=1e-6, max_sweeps=100000, max_seconds=CAP_FACTOR * 10.0)
            el = time.perf_counter() - t0
            ok += bool(res.converged)
            fast += bool(res.converged and el <= 10.0)
            rows.append(
                f"| {n} x {k} x 3, seed {seed} | {el:.2f} | {res.ipm_iterations} {_pfvds_what(res)} | "
                f"{res.residual:.1e} | {'yes' if res.converged else 'NO'} |"
            )
        counts.append(f"{n} x {k}: {ok} of {len(seeds)} certified, {fast} within 10 s")
    return rows, "; ".join(counts) + "."


def pool_timing(n: int, reps: int, seed: int = 5) -> list[str]:
    """PS-DSF on ``n`` jobs over 500 nodes of 9 node types (3 server types x 3 locations, 002 Sec. 6.1 doubled).

    Three resources: CPU, RAM and a synthetic per-location network share (2 at the middle location, 1 elsewhere);
    Bitbrains-like demands restricted to (CPU, RAM, network); location eligibility as in the comparison. Identical
    nodes are merged exactly (9 groups), so the solver sees 9 servers: this is the Kubernetes node-pool case.
    """
    c, loc = cluster(False)
    c = np.vstack([c, c])
    loc = np.concatenate([loc, loc])
    caps = np.column_stack([c, np.where(loc == 1, 2.0, 1.0)])
    rng = np.random.default_rng(seed)
    d = demands(rng, n, True)[:, :3]
    e = eligibility(rng, n, loc)
    merged, _, _ = _merge(make_instance(d, caps, e))
    ts, out = _to_tolerance(
        lambda m: ps_dsf(merged, tol=1e-6, max_sweeps=100000, max_seconds=m), CAP_FACTOR * 2.0, reps
    )
    return [
        _row(
            f"PS-DSF, {n} jobs x {caps.shape[0]} nodes x 3 res. in {merged.k} node types (merged)",
            ts,
            _psdsf_what(out),
            out.sweeps,
            out.residual,
            out.converged,
            2,
        )
    ]


def verdict(rows: list[str]) -> str:
    """One sentence per timing row that misses its target (not converged, or slower than the target)."""
    missed = []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        target = float(cells[3].removeprefix("<=").split("s")[0].strip())
        if "NOT converged" in cells[2] or float(cells[1]) > target:
            missed.append(f"- target missed: {cells[0]} ({cells[1]} s, {cells[2]}; target {cells[3]}).")
    if not missed:
        return "Every row meets its target."
    why = ""
    if any(m.startswith("- target missed: PS-DSF") for m in missed):
        why = (
            "\n\nWhy (observed): the plain PS-DSF sweep map is piecewise affine and in long phases moves one user from "
            "one server to\nanother by the same amount every sweep, so the residual stays flat until a pair drains. "
            "The level start\n(smoothed per-server levels + exact active-set solve with pivots, "
            "`allocator/fairness/psdsf/_levels.py`) removes that\nphase: at 1000 x 500 the pivots (switch the "
            "saturated "
            "resource of an overloaded server, drop the pair that\nbreaks a cycle of active pairs) give a point one "
            "exact sweep certifies. The smoothed Newton continuation\nthat finds the active set runs on compiled "
            "kernels (`allocator/fairness/psdsf/_levels_kernels.py`), and pivots are tried\nonly from stages whose "
            "active "
            "set has settled. The plain-sweeps-only row is there for comparison."
        )
    return "\n".join(missed) + why


def small_instance(seed: int, n: int, k: int, r: int):
    """Small integer-valued heterogeneous instance with placement constraints (also the generator of
    ``tests/test_fairness_psmfa.py``): demands 0-4 plus 1-4 on one resource, capacities 4-39, 70 % eligibility
    (every user keeps a node), weights in {0.5, 1, 2}."""
    rng = np.random.default_rng(seed)
    d = rng.integers(0, 5, size=(n, r)).astype(float)
    d[np.arange(n), rng.integers(0, r, n)] += rng.integers(1, 5, n)
    c = rng.integers(4, 40, size=(k, r)).astype(float)
    e = rng.random((n, k)) < 0.7
    for i in range(n):
        if not e[i].any():
            e[i, rng.integers(0, k)] = True
    w = rng.choice([1.0, 1.0, 2.0, 0.5], size=n)
    return make_instance(d, c, e, w)


def tiny_instance(seed: int):
    """:func:`small_instance` with 3-8 users, 2-5 nodes and 2-3 resources drawn from seed ``1000 + seed`` (as in the
    alpha = 5 test of ``tests/test_fairness_psmfa.py``)."""
    size = np.random.default_rng(1000 + seed)
    n, k, r = int(size.integers(3, 9)), int(size.integers(2, 6)), int(size.integers(2, 4))
    return small_instance(seed, n, k, r)


def certification(alphas: tuple[float, ...], tiny: int, medium: int) -> list[str]:
    """PF-VDS(alpha) with default settings (as ``allocate`` runs it) on ``tiny`` small instances (seeds 0..) and
    ``medium`` 40 x 20 x 3 instances of :func:`random_instance` per alpha: certified count, worst time, methods."""
    rows = []
    for a in alphas:
        for label, make, count in (
            ("3-8 users x 2-5 nodes x 2-3 res.", tiny_instance, tiny),
            ("40 x 20 x 3", lambda s: random_instance(40, 20, 3, s), medium),
        ):
            ok, times, methods, worst_res = 0, [], {}, 0.0
            for seed in range(count):
                inst = make(seed)
                t0 = time.perf_counter()
                res = pf_vds(inst, a)
                times.append(time.perf_counter() - t0)
                ok += bool(res.converged)
                worst_res = max(worst_res, res.residual)
                methods[res.method] = methods.get(res.method, 0) + 1
            how = ", ".join(f"`{m}` {c}" for m, c in sorted(methods.items()))
            rows.append(
                f"| {a:g} | {label}, seeds 0-{count - 1} | {ok} of {count} | {worst_res:.1e} | "
                f"{np.median(times):.3f} | {max(times):.2f} | {how} |"
            )
    return rows


def maxmin_robustness(count: int) -> list[str]:
    """DRFH / TSF (``allocate``) on ``count`` random 10 x 5 x 3 instances of the issue-19 generator (uniform demands in
    [0.1, 1], capacities in [10, 100], 50 % eligibility), without and with task caps (30 % of users capped at a
    uniform [1, 30] tasks): runs that raised, statuses, worst residual, median solve time and LPs per solve."""
    rows = []
    for caps in (False, True):
        for mech in ("drfh", "tsf"):
            raised, certified, worst, times = 0, 0, 0.0, []
            for seed in range(count):
                rng = np.random.default_rng(seed)
                d = rng.uniform(0.1, 1.0, (10, 3))
                c = rng.uniform(10.0, 100.0, (5, 3))
                e = rng.random((10, 5)) < 0.5
                e[np.arange(10), rng.integers(0, 5, 10)] = True
                m = np.where(rng.random(10) < 0.3, rng.uniform(1, 30, 10), np.inf) if caps else None
                t0 = time.perf_counter()
                try:
                    fa = allocate(d, c, eligible=e, max_tasks=m, mechanism=mech)
                except RuntimeError:
                    raised += 1
                    continue
                times.append(time.perf_counter() - t0)
                certified += fa.status == "certified"
                worst = max(worst, fa.residual)
            rows.append(
                f"| {mech.upper()} | {'yes' if caps else 'no'} | {count} | {raised} | {certified} | {worst:.1e} | "
                f"{1e3 * float(np.median(times)):.1f} |"
            )
    return rows


def utilisation_study(runs: int, n_users: int, random_runs: int) -> list[str]:
    """PS-DSF against DRFH and TSF: mean utilisation per resource (used / total) in the setting of 002 Sec. 6.3 (the
    Fig. 5 cluster, synthetic Google-like and Bitbrains-like demands, ``runs`` runs of ``n_users`` users) and on
    ``random_runs`` random instances of :func:`random_instance` (40 x 20 x 3). Each row: the mean utilisation per
    resource, PS-DSF's relative gain over the better of DRFH and TSF per resource (mean over runs), the largest gain on
    any resource of any run, and PS-DSF followed by :func:`allocator.fairness.refill` (leftover capacity given away
    keeping sharing incentive and envy-freeness)."""
    rows = []
    settings: list[tuple[str, Callable[[int], tuple[np.ndarray, np.ndarray, np.ndarray]]]] = []
    for four in (False, True):
        c, loc = cluster(four)

        def draw(run: int, c: np.ndarray = c, loc: np.ndarray = loc, four: bool = four):
            rng = np.random.default_rng(1000 * (2 if four else 1) + run)
            return demands(rng, n_users, four), c, eligibility(rng, n_users, loc)

        name = "Bitbrains-like (CPU, RAM, net, storage)" if four else "Google-like (CPU, RAM)"
        settings.append((f"002 Sec. 6 cluster, {name}, {n_users} users, {runs} runs", draw))

    def draw_random(run: int):
        inst = random_instance(40, 20, 3, run)
        return inst.demands, inst.capacities, inst.eligible

    settings.append((f"random 40 x 20 x 3 (`random_instance`), {random_runs} seeds", draw_random))
    for label, draw in settings:
        count = random_runs if label.startswith("random") else runs
        util: dict[str, list[np.ndarray]] = {"ps-dsf": [], "drfh": [], "tsf": [], "refill": []}
        for run in range(count):
            d, c, e = draw(run)
            for mech in ("ps-dsf", "drfh", "tsf"):
                x = allocate(d, c, eligible=e, mechanism=mech).tasks
                util[mech].append(utilisation(x, d, c))
                if mech == "ps-dsf":
                    util["refill"].append(utilisation(refill(make_instance(d, c, e), x).x, d, c))
        u = {m: np.array(v) for m, v in util.items()}
        gain = u["ps-dsf"] / np.maximum(u["drfh"], u["tsf"]) - 1.0
        fmt = lambda a: " / ".join(f"{100 * x:.1f}" for x in a.mean(axis=0))  # noqa: E731
        rows.append(
            f"| {label} | {fmt(u['ps-dsf'])} | {fmt(u['drfh'])} | {fmt(u['tsf'])} | "
            f"{' / '.join(f'{100 * g:+.1f}' for g in gain.mean(axis=0))} | {100 * gain.max():+.1f} | "
            f"{fmt(u['refill'])} | {100 * u['ps-dsf'].mean():.1f} / {100 * u['drfh'].mean():.1f} / "
            f"{100 * u['tsf'].mean():.1f} / {100 * u['refill'].mean():.1f} |"
        )
    return rows


def pareto_gap(inst: Any, x: np.ndarray) -> float:
    """``max sum_n e_n / x_n`` over feasible allocations with totals ``>= x_n + e_n`` (HiGHS): 0 iff ``x`` is Pareto
    optimal over all allocations (capacities, placement; no task caps)."""
    from scipy.optimize import linprog

    n, k, r = inst.n, inst.k, inst.r
    users, nodes = np.nonzero(inst.eligible)
    p = users.size
    tot = x.sum(axis=1)
    a_cap = np.zeros((k, r, p + n))
    a_cap[nodes, :, np.arange(p)] = inst.demands[users]
    a_tot = np.zeros((n, p + n))
    a_tot[users, np.arange(p)] = -1.0
    a_tot[np.arange(n), p + np.arange(n)] = 1.0
    res = linprog(
        np.concatenate([np.zeros(p), -1.0 / tot]),
        A_ub=np.vstack([a_cap.reshape(k * r, p + n), a_tot]),
        b_ub=np.concatenate([inst.capacities.ravel(), -tot]),
        bounds=(0, None),
        method="highs",
    )
    return float(-res.fun)


def refill_pareto(count: int) -> str:
    """PS-DSF and PS-DSF + refill on random 20 x 10 x 3 instances (seeds 0..count-1): how many are Pareto optimal over
    all allocations (:func:`pareto_gap` <= 1e-6) and the mean utilisation over resources."""
    po, po_r, u, u_r = 0, 0, [], []
    for seed in range(count):
        inst = random_instance(20, 10, 3, seed)
        x = ps_dsf(inst).x
        y = refill(inst, x).x
        po += pareto_gap(inst, x) <= 1e-6
        po_r += pareto_gap(inst, y) <= 1e-6
        u.append(utilisation(x, inst.demands, inst.capacities).mean())
        u_r.append(utilisation(y, inst.demands, inst.capacities).mean())
    return (
        f"random 20 x 10 x 3, seeds 0-{count - 1}: Pareto optimal PS-DSF {po} of {count}, PS-DSF + refill {po_r} of "
        f"{count}; mean utilisation {100 * np.mean(u):.1f} % -> {100 * np.mean(u_r):.1f} %"
    )


UTIL_HEAD = (
    "| setting | PS-DSF util % per resource | DRFH | TSF | PS-DSF gain over max(DRFH, TSF), mean per resource % | "
    "largest gain, any resource, any run % | PS-DSF + refill util % per resource | "
    "mean over resources PS-DSF / DRFH / TSF / PS-DSF + refill % |\n|---|---|---|---|---|---|---|---|"
)
MAXMIN_HEAD = (
    "| mechanism | task caps | instances | raised | certified | worst residual | median ms per solve |\n"
    "|---|---|---|---|---|---|---|"
)


ROUTE_ROWS = (
    "| alpha = 1, no start given | `ipm`: interior point to duality measure 1e-14, its point (`ipm`) or "
    "the exact KKT solve on its active set (`ipm+kkt`) | convex program (Theorem 2); the interior point "
    "certifies up to 1000 x 500 (tables below); under a binding task cap its stationarity can stall at "
    "~4e-6 and the exact active-set solve certifies (`tests/test_fairness_ipm.py`) |"
    "\n"
    "| alpha != 1 (or a start given), NCP unknowns <= 2,500 | `sweeps+newton`: best-response sweeps, "
    "semismooth Newton on the equilibrium NCP from their iterates (`sweeps`, `sweeps+newton`, "
    "`sweeps+drift+newton`) | no convergence proof for the sweeps in general; they find the region and "
    "Newton converges locally quadratically; where the sweeps drift, Newton starts down the drift line |"
    "\n"
    "| alpha != 1 (or a start given), larger | `sweeps`: best-response sweeps alone | a dense Newton step "
    "of that order is too large; the sweeps converge where the game is a potential game (one resource, a "
    "common bottleneck); otherwise the result is `capped` if not certified |"
    "\n"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fairness")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--only",
        choices=["utilisation", "maxmin", "certification", "refill"],
        help="print one section's table (no docs written): the utilisation study, DRFH/TSF robustness, or the "
        "PF-VDS(alpha != 1) certification sample",
    )
    args = ap.parse_args(argv)
    quick = args.quick
    if args.only:
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        if args.only == "utilisation":
            print(UTIL_HEAD + "\n" + "\n".join(utilisation_study(5 if quick else 20, 40, 10 if quick else 50)))
        elif args.only == "refill":
            print(refill_pareto(5 if quick else 30))
        elif args.only == "maxmin":
            print(MAXMIN_HEAD + "\n" + "\n".join(maxmin_robustness(20 if quick else 200)))
        else:
            print("\n".join(certification((0.5, 2.0, 5.0, 20.0), 10 if quick else 40, 2 if quick else 10)))
        print(f"\n{time.perf_counter() - t0:.0f} s; load {load0:.2f} / {os.getloadavg()[0]:.2f}; {machine()}")
        return 0
    runs = 2 if quick else 3
    n_users = 30 if quick else 40
    t_start = time.perf_counter()
    load_start = os.getloadavg()[0]
    res2 = comparison(runs, n_users, four=False, seed=1)
    res4 = comparison(runs, n_users, four=True, seed=2)

    # Distributed heuristic (Sec. 5.2) against the centralised solver on one Bitbrains-like instance (merged pools).
    c4, loc = cluster(True)
    rng = np.random.default_rng(7)
    d = demands(rng, n_users, True)
    e = eligibility(rng, n_users, loc)
    inst, _, _ = _merge(make_instance(d, c4, e))
    dist_rows = []
    for a in (1.0, 2.0):
        cen = pf_vds(inst, a, tol=1e-8)
        t0 = time.perf_counter()
        dis = pf_vds_distributed(inst, a, iterations=2000 if quick else 20000)  # penalty 100, step 5
        el = time.perf_counter() - t0
        gap = float(np.max(np.abs(dis.x.sum(1) - cen.x.sum(1)) / cen.x.sum(1)))
        dist_rows.append(
            f"| {a:g} | {cen.residual:.1e} (`{cen.method}`, {cen.iterations} sweeps) | {dis.residual:.1e} "
            f"({dis.iterations} steps, {el:.1f} s) | {gap:.1e} |"
        )

    crows = certification((0.5, 2.0, 5.0, 20.0), 10 if quick else 40, 2 if quick else 10)
    urows = utilisation_study(5 if quick else 20, n_users, 10 if quick else 50)
    mrows = maxmin_robustness(20 if quick else 200)
    if quick:
        trows = timing(100, 50, 3, 5, plain=True) + pool_timing(200, 5)
        rrows, rsum = robustness([(100, 50)], range(20, 22))
    else:
        trows = timing(200, 100, 3, 5, plain=True) + timing(400, 200, 3, 5) + timing(1000, 500, 3, 5)
        trows += pool_timing(1000, 5)
        rrows, rsum = robustness([(200, 100), (400, 200), (1000, 500)], range(20, 25))
    total = time.perf_counter() - t_start
    cmd = "python -m bench.fairness" + (" --quick" if quick else "")
    kind = "quick smoke run" if quick else "full run"
    stamp = f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M}"
    loss2 = 100 * res2["PS-DSF integral"]["loss"].mean()
    loss4 = 100 * res4["PS-DSF integral"]["loss"].mean()
    text = f"""## Fairness on heterogeneous nodes (`allocator.fairness`, paper 002)

Command: `{cmd}` ({kind}, {total:.0f} s in all), {stamp} UTC.
Machine: {machine()}; `OPENBLAS_NUM_THREADS` = {os.environ.get("OPENBLAS_NUM_THREADS", "unset")}.
1-minute load average at start / end: {load_start:.2f} / {os.getloadavg()[0]:.2f} (the machine may be shared: timings
above a load of ~1 per core are inflated).

Cluster of 002 Sec. 6.1 / Fig. 5 (75 x 4 GHz/12 GB, 100 x 8 GHz/8 GB, 75 x 16 GHz/4 GB at three locations, users may
use their own and adjacent locations); **synthetic** Google-like (CPU, RAM) and Bitbrains-like (CPU, RAM, network,
storage) demands, {n_users} users per run, {runs} runs, equal weights. Identical nodes are merged exactly before
solving (see `allocator.fairness.merge_identical_nodes`). Utilisation = used / total per resource, mean over runs.
D = reconstructed eq. 58 (see the module docstring of `bench/fairness.py`). "PS-DSF integral" = PS-DSF rounded to
whole tasks with `integral=True` (capacity never exceeded); its mean task loss per user is
{loss2:.2f} % (two resources) and {loss4:.2f} % (four resources). "certified runs" = runs in which `allocate`
returned `status="certified"` (DRFH/TSF: every filling LP optimal and the split within the levels and capacities;
PS-DSF: fixed-point residual; PF-VDS: `kkt_residual` <= 1e-6, eqs. 28-29).
PF-VDS runs the method its route table picks (see "PF-VDS: one method per instance class" below).

### Two resources (Google-like), cf. 002 Figs. 9 and 13-14

{table(res2, ["CPU", "RAM"])}

### Four resources (Bitbrains-like), cf. 002 Figs. 7 and 12

{table(res4, ["CPU", "RAM", "net", "storage"])}

002 reports utilisation rising as alpha falls, with a larger deviation D (Figs. 7, 9, 10); the tables above show the
same ordering. For PS-DSF against DRFH/TSF see the next section.

### PS-DSF utilisation against DRFH and TSF (002 Sec. 6.3)

Paper 002 reports (Fig. 12, the real Bitbrains trace on the Fig. 5 cluster, 100 runs) PS-DSF utilisation up to 20 %
above DRFH and TSF on some resources, and (Figs. 13-14, Google trace) PS-DSF ahead with DRFH and TSF about equal. The
traces are not shipped; with the synthetic demands of this benchmark on the same cluster, and on random instances:

{UTIL_HEAD}
{chr(10).join(urows)}

Gain = PS-DSF utilisation / max(DRFH, TSF) - 1 per resource. What this shows: on the Fig. 5 cluster with Google-like
two-resource demands PS-DSF uses more of both resources on average; with Bitbrains-like four-resource demands and on
random instances it uses less than the better of DRFH and TSF. A gain of 20 % is reached only on single runs, not on
average, so the paper's "up to 20 %" is not claimed for Walras. "PS-DSF + refill" = PS-DSF followed by
`allocator.fairness.refill`, an LP that gives leftover capacity away while keeping every user's total at least its
PS-DSF total (sharing incentive) and envy-freeness; it is Pareto optimal only among the envy-free allocations that
dominate PS-DSF, not over all allocations (see its docstring).

### Distributed heuristic (Sec. 5.2) vs centralised PF-VDS, one Bitbrains-like instance

| alpha | centralised KKT residual | distributed KKT residual (after feasibility scaling) | max rel. gap of totals |
|---|---|---|---|
{chr(10).join(dist_rows)}

The heuristic replaces the multipliers by a quadratic penalty (eq. 57), so it only approaches the equilibrium to
O(1/penalty); 002 Fig. 6 likewise shows it converging numerically, without a proof.

### DRFH and TSF: progressive filling without infeasible stages

`allocate(..., mechanism="drfh" | "tsf")` on random 10 x 5 x 3 instances (the generator of issue 19: demands uniform in
[0.1, 1], capacities in [10, 100], 50 % eligibility; "task caps": 30 % of users capped at uniform [1, 30] tasks).
Each filling stage is one HiGHS LP whose frozen levels come from an exactly feasible witness and whose duals say who
freezes (`allocator/fairness/maxmin.py`). "raised" = HiGHS reported a stage infeasible.

{MAXMIN_HEAD}
{chr(10).join(mrows)}

### PF-VDS: one method per instance class

`pf_vds_route` picks the method from the instance before solving (route table in
`allocator/fairness/pfvds/equilibrium.py`):

| instance class | route (`method`) | why |
|---|---|---|
{ROUTE_ROWS}
Every result is accepted only through `kkt_residual` <= 1e-6 (eqs. 28-29). PS-MFA (Sec. 5.1) is not a route: it was
never needed on the sample below and is slow (first order); it remains available as
`allocator.fairness.pfvds.psmfa.ps_mfa`.

### PF-VDS(alpha != 1) on random instances: is every result certified?

`pf_vds(inst, alpha)` with its defaults (tolerance 1e-6), once per instance; "certified" = `kkt_residual` <= 1e-6
(eqs. 28-29). Methods: `sweeps` = Gauss-Seidel best response alone, `+newton` = finished by the semismooth Newton
solve, `+drift+newton` = Newton from a point down a drift of the sweeps (the routes are described below). For
alpha != 1 no
method here carries a convergence proof on general instances (see `allocator/fairness/pfvds/equilibrium.py`), so this
sample is
the evidence of how often the certificate is met.

| alpha | instances | certified | worst residual | median s | max s | methods |
|---|---|---|---|---|---|---|
{chr(10).join(crows)}

### Time to tolerance

Every solve runs to residual 1e-6 (PS-DSF: the Gauss-Seidel fixed-point residual, the largest relative change of any
column in a sweep; PF-VDS(1): `kkt_residual`, eqs. 28-29) or is stopped at {CAP_FACTOR:g} x its target time
(`max_seconds`, checked after each sweep; PF-VDS(1) takes the interior-point route, which is not interrupted). A run
that converged is repeated and the median of 5 reported; a capped run is reported once, as the time it took to give up
and the residual it had reached. Random heterogeneous nodes (every node distinct, 50 % eligibility, nothing merges) and,
last row, the node-pool case (500 nodes of 9 types, merged before solving). PS-DSF rows run `ps_dsf` as `allocate` does:
the level start (`allocator/fairness/psdsf/_levels.py`: Newton continuation on log-sum-exp smoothed per-server levels,
then
the exact piecewise-linear equations on the active set it reveals), accepted only if one exact Gauss-Seidel sweep from
it moves no column by more than 1e-6 -- the same certificate as the plain sweeps -- else plain sweeps from the smoothed
point; "level start certified" in the outcome says which. The "plain sweeps only" row is the previous solver
(`levels=False`) on the same instance. The level start is not certified on every instance: of 18 other random instances
(100 x 50 to 1000 x 500, seeds 20-24) one 1000 x 500 instance (seed 21) fell back to plain sweeps (6.4 s to 1e-6, single
run, 2026-11-23).

PF-VDS(1) rows run `pf_vds(inst, 1.0)` as `allocate` does: the primal-dual interior-point method
(`allocator/fairness/pfvds/ipm.py`: Mehrotra predictor-corrector, the `N x N` Schur complement formed by one symmetric
rank-k product per iteration) run to a duality measure of 1e-14, whose point, scaled into the capacities, is tried
first; then the KKT equations (eqs. 28-29) solved exactly by Newton's method on the active set the interior point's
indicators reveal, with pivots (`allocator/fairness/pfvds/_pfpolish.py`). A result is accepted only if `kkt_residual`
(multipliers refitted by NNLS, independent of the solver) is <= 1e-6. Method `ipm` = the interior point itself met
the tolerance; `ipm+kkt` = the exact solve; if neither does, the result is returned uncertified (`allocate`:
`status="capped"`), with no further stage.

| case | median s | outcome | issue target |
|---|---|---|---|
{chr(10).join(trows)}

{verdict(trows)}

#### PF-VDS(1) on other random instances (single runs, same generator, seeds 20-24)

| instance | s | outcome | KKT residual | certified <= 1e-6 |
|---|---|---|---|---|
{chr(10).join(rrows)}

Counts: {rsum} The interior-point iteration counts vary with the instance (the Mehrotra steps stay short,
0.1-0.4, for long stretches on some: seed 24 needs about twice the timing instance's iterations), and so does the time.
Until 2026-11-25 the interior point stopped at a duality measure of 1e-9 and the exact active-set solve had to finish:
on seeds 22 and 24 at 1000 x 500 its indicators left near-ties ambiguous and no solve was certified.
"""
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
