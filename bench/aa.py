"""Benchmark for ``allocator.aa`` (paper 000, Lai et al.): Section VIII and IX reproductions, heterogeneous
capacities against the exact optimum, and timings.

Run ``python -m bench.aa`` (full) or ``python -m bench.aa --quick`` (smoke); writes ``docs/bench/aa.md``.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from allocator.aa import (
    PiecewiseLinearCurves,
    TableCurves,
    aamr,
    algorithm1,
    assign_and_allocate,
    assign_and_allocate_multi,
    baseline,
    dpsopt,
    exact_optimum,
    multi_baseline,
    pchip_table,
    reallocate,
    reallocate_multi,
    solve,
    super_optimal,
)
from bench._machine import machine_line, now_utc

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "bench" / "aa.md"
BASELINES = ("uu", "ru", "ur", "rr")
#: the same random heuristics under the earlier reading of "random allocation" (random proportions of the whole
#: server, Dirichlet(1)), reported in the summary only, as a sensitivity check
PROPORTIONS = ("ur", "rr")

# ---------------------------------------------------------------------------------------------------------------------
# Section VIII generators


Sampler = Callable[[np.random.Generator, int], np.ndarray]


def uniform_sampler(rng: np.random.Generator, size: int) -> np.ndarray:
    return rng.uniform(0.0, 1.0, size)


def normal_sampler(rng: np.random.Generator, size: int) -> np.ndarray:
    """Normal(mean 10, sd 20) truncated to positive values by rejection (utilities must be nonnegative; the paper
    does not say how it treats negative draws)."""
    out = rng.normal(10.0, 20.0, size)
    bad = out <= 0
    while bad.any():
        out[bad] = rng.normal(10.0, 20.0, int(bad.sum()))
        bad = out <= 0
    return out


def power_sampler(mu: float) -> Sampler:
    """Power law ``p(x) = lambda x^-mu`` on ``x >= 1`` (inverse CDF ``x = u^(-1/(mu-1))``)."""

    def draw(rng: np.random.Generator, size: int) -> np.ndarray:
        return (1.0 - rng.uniform(0.0, 1.0, size)) ** (-1.0 / (mu - 1.0))

    return draw


def discrete_sampler(gamma: float, theta: float) -> Sampler:
    """Two values: ``l = 1`` with probability ``gamma``, ``h = theta * l`` otherwise."""

    def draw(rng: np.random.Generator, size: int) -> np.ndarray:
        return np.where(rng.uniform(0.0, 1.0, size) < gamma, 1.0, theta)

    return draw


def conditioned_pair(rng: np.random.Generator, n: int, sampler: Sampler) -> tuple[np.ndarray, np.ndarray]:
    """``n`` pairs ``(v, w)`` of i.i.d. draws from ``H`` conditioned on ``w <= v`` (rejection of whole pairs). For a
    continuous ``H`` this is the same as sorting two draws; for the discrete ``H`` it keeps ties' true weight."""
    v, w = sampler(rng, n), sampler(rng, n)
    bad = w > v
    while bad.any():
        k = int(bad.sum())
        v[bad], w[bad] = sampler(rng, k), sampler(rng, k)
        bad = w > v
    return v, w


def uniform_12_sampler(rng: np.random.Generator, size: int) -> np.ndarray:
    return rng.uniform(1.0, 2.0, size)


def integer_sampler(rng: np.random.Generator, size: int) -> np.ndarray:
    return rng.integers(1, 101, size).astype(np.float64)


def folded_normal_sampler(rng: np.random.Generator, size: int) -> np.ndarray:
    return np.abs(rng.normal(10.0, 20.0, size))


def concave_tables(rng: np.random.Generator, n: int, C: int, sampler: Sampler) -> np.ndarray:
    """Section VIII: ``f(0) = 0``, ``f(C/2) = v``, ``f(C) = v + w`` with ``v, w ~ H`` conditioned on ``w <= v``,
    PCHIP through the three points, sampled on ``0..C``."""
    v, w = conditioned_pair(rng, n, sampler)
    x = np.tile([0.0, C / 2, float(C)], (n, 1))
    y = np.stack([np.zeros(n), v, v + w], axis=1)
    return pchip_table(x, y, C)


def nonconcave_tables(rng: np.random.Generator, n: int, C: int, sampler: Sampler) -> np.ndarray:
    """Section VIII's nonconcave curves: a split point ``b`` uniform in ``1..C-1``; a concave PCHIP piece on
    ``[0, b]`` and another on ``[b, C]`` starting from ``f(b)``, each generated like a concave curve."""
    out = np.empty((n, C + 1))
    b = rng.integers(1, C, size=n)
    v1, w1 = conditioned_pair(rng, n, sampler)
    v2, w2 = conditioned_pair(rng, n, sampler)
    for i in range(n):
        bi = int(b[i])
        left = pchip_table([[0.0, bi / 2, bi]], [[0.0, v1[i], v1[i] + w1[i]]], bi)[0]
        L = C - bi
        right = pchip_table([[0.0, L / 2, L]], [[0.0, v2[i], v2[i] + w2[i]]], L)[0]
        out[i, : bi + 1] = left
        out[i, bi:] = left[-1] + right
    return out


# ---------------------------------------------------------------------------------------------------------------------
# one experiment point


@dataclass
class Row:
    """One figure point: means over trials of *literal / SO* (``so``), *shipped / SO* (``shipped``), and of the
    literal (``ratios[k]``) and shipped (``ratios[k + "_s"]``) utility over each heuristic's."""

    label: str
    so: float
    ratios: dict[str, float]
    shipped: float
    alg1: float = float("nan")
    alg1_shipped: float = float("nan")


def run_point(
    label: str,
    rng: np.random.Generator,
    trials: int,
    n: int,
    m: int,
    C: int,
    make: Callable[[np.random.Generator, int, int], np.ndarray],
    nonconcave: bool = False,
) -> Row:
    """Average over ``trials`` of the paper-literal Algorithm 2's (AANC's) utility and of the shipped method's
    (the same assignment, each node re-split optimally) divided by SO and by each heuristic's utility.

    The shipped amounts are ``reallocate(curves, server, caps, current=literal amounts)``, which is what
    ``assign_and_allocate(..., refine=True)`` returns; the first trial of every point checks that equality."""
    so_r: list[float] = []
    ship_r: list[float] = []
    a1_r: list[float] = []
    a1s_r: list[float] = []
    base_r: dict[str, list[float]] = {}
    caps = np.full(m, C, dtype=np.int64)
    method = "aanc" if nonconcave else "alg2"
    for t in range(trials):
        V = make(rng, n, C)
        curves = TableCurves(V)
        p, so = solve(curves, caps, method=method, refine=False)
        assert so is not None
        shipped_amount = reallocate(curves, p.server, caps, current=p.amount)
        if t == 0:
            s_pub, a_pub = assign_and_allocate(V, caps, method=method)
            assert (s_pub == p.server).all() and (a_pub == shipped_amount).all()
        ours = float(curves.evaluate(p.amount).sum())
        ship = float(curves.evaluate(shipped_amount).sum())
        so_r.append(ours / so.utility)
        ship_r.append(ship / so.utility)
        # Algorithm 1 on the same super-optimal allocation (for nonconcave curves: the exact DP one, as in AANC)
        p1 = algorithm1(so.amount, curves.evaluate(so.amount), caps)
        a1_r.append(float(curves.evaluate(p1.amount).sum()) / so.utility)
        a1_ship = reallocate(curves, p1.server, caps, current=p1.amount)
        a1s_r.append(float(curves.evaluate(a1_ship).sum()) / so.utility)
        for k in BASELINES:
            b = baseline(k, n, caps, rng)
            u = float(curves.evaluate(b.amount).sum())
            base_r.setdefault(k, []).append(ours / u)
            base_r.setdefault(k + "_s", []).append(ship / u)
        for k in PROPORTIONS:
            b = baseline(k, n, caps, rng, random_allocation="proportions")
            u = float(curves.evaluate(b.amount).sum())
            base_r.setdefault(k + "_p", []).append(ours / u)
            base_r.setdefault(k + "_p_s", []).append(ship / u)
    return Row(
        label,
        float(np.mean(so_r)),
        {k: float(np.mean(v)) for k, v in base_r.items()},
        float(np.mean(ship_r)),
        float(np.mean(a1_r)),
        float(np.mean(a1s_r)),
    )


def _f3(x: float) -> str:
    return "--" if np.isnan(x) else f"{x:.3f}"


def table(title: str, param: str, rows: list[Row], paper: str, main: str = "Alg 2") -> str:
    lines = [f"#### {title}", "", f"Paper: {paper}", ""]
    lines.append(
        f"| {param} | Alg 1 / SO, literal | Alg 1 / SO, re-split | {main} / SO, literal | {main} / SO, re-split "
        f"(shipped) | literal / UU | literal / RU | literal / UR | literal / RR |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        lines.append(
            f"| {r.label} | {_f3(r.alg1)} | {_f3(r.alg1_shipped)} | {r.so:.3f} | {r.shipped:.3f} | "
            + " | ".join(f"{r.ratios[k]:.2f}" for k in BASELINES)
            + " |"
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------------
# Section IX (AAMR)


def aamr_point(rng: np.random.Generator, trials: int, beta: int) -> Row:
    """Section IX: literal AAMR (DPSOPT + Algorithm 3) and shipped AAMR (the same assignment, each node re-split
    optimally over its 2-d capacity grid, ``reallocate_multi``; the first trial checks it equals
    ``assign_and_allocate_multi``'s default output) against SO = DPSOPT's utility and the heuristics."""
    m, C = 4, (40, 20)
    n = m * beta
    caps = np.tile(C, (m, 1))
    so_r: list[float] = []
    ship_r: list[float] = []
    base_r: dict[str, list[float]] = {}
    x1 = np.arange(C[0] + 1)[None, :, None].astype(float)
    x2 = np.arange(C[1] + 1)[None, None, :].astype(float)
    rows = np.arange(n)
    for t in range(trials):
        g = rng.uniform(0, 1, size=(n, 2))
        a = rng.uniform(0, 1, size=(n, 2))
        V = g[:, 0, None, None] * x1 ** a[:, 0, None, None] + g[:, 1, None, None] * x2 ** a[:, 1, None, None]
        c_hat, F = dpsopt(V, (m * C[0], m * C[1]))
        server, amount = aamr(V, c_hat, caps)
        shipped_amount = reallocate_multi(V, server, caps, current=amount)
        if t == 0:
            s_pub, a_pub = assign_and_allocate_multi(V, caps)
            assert (s_pub == server).all() and (a_pub == shipped_amount).all()
        ours = float(V[(rows, *amount.T)].sum())
        ship = float(V[(rows, *shipped_amount.T)].sum())
        so_r.append(ours / F)
        ship_r.append(ship / F)
        for k in BASELINES:
            _, ab = multi_baseline(k, n, caps, rng)
            u = float(V[(rows, *ab.T)].sum())
            base_r.setdefault(k, []).append(ours / u)
            base_r.setdefault(k + "_s", []).append(ship / u)
        for k in PROPORTIONS:
            _, ab = multi_baseline(k, n, caps, rng, random_allocation="proportions")
            u = float(V[(rows, *ab.T)].sum())
            base_r.setdefault(k + "_p", []).append(ours / u)
            base_r.setdefault(k + "_p_s", []).append(ship / u)
    return Row(
        str(beta), float(np.mean(so_r)), {k: float(np.mean(v)) for k, v in base_r.items()}, float(np.mean(ship_r))
    )


# ---------------------------------------------------------------------------------------------------------------------
# heterogeneous capacities vs the exact optimum


@dataclass
class HetFamily:
    """A family of random heterogeneous instances: ``m`` servers with capacities in ``caps`` (inclusive range),
    ``n`` threads in ``n_range(m)`` (inclusive), Section VIII's uniform PCHIP curves (concave or two pieces)."""

    label: str
    m: tuple[int, int]
    caps: tuple[int, int]
    n_range: Callable[[int], tuple[int, int]]


HET_FAMILIES = (
    HetFamily("small: m 2..4, C_j 4..20, n m+1..10", (2, 4), (4, 20), lambda m: (m + 1, 10)),
    HetFamily("medium: m 3..6, C_j 10..40, n 2m..4m", (3, 6), (10, 40), lambda m: (2 * m, 4 * m)),
)


def heterogeneous(rng: np.random.Generator, counts: tuple[int, int], milp_limit: float) -> str:
    """Ratio to the exact optimum (:func:`allocator.aa.exact_optimum`, HiGHS) with unequal node capacities, for
    Algorithm 1 and Algorithm 2 (AANC on nonconcave curves, i.e. both on the exact DP super-optimal allocation):
    paper-literal (``refine=False``), with the per-node re-split (``refine=True, search=False``), and shipped
    (``refine=True, search="auto"``: re-split + local search, since the capacities differ). Each instance is also
    solved with all capacities set to the largest one (the paper's model) for reference. Timings: median over the
    family's instances of one call each (whole ``assign_and_allocate``, SO included) and of the MILP."""
    lines = [
        "| family | curves | instances (MILP certified) | method | literal: mean / worst | re-split: mean / worst "
        "| **shipped**: mean / worst | literal ms | shipped ms | MILP ms (median / max) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    eq_lines = [
        "| family | curves | equal capacities (all = max C_j), Alg 2 or AANC / OPT: literal | re-split (shipped "
        "default there) | re-split + `search=True` |",
        "|---|---|---|---|---|",
    ]
    for fam, count in zip(HET_FAMILIES, counts):
        for conc in (True, False):
            ratios: dict[str, list[float]] = {}
            times: dict[str, list[float]] = {}
            milp_t: list[float] = []
            certified = 0
            for _ in range(count):
                m = int(rng.integers(fam.m[0], fam.m[1] + 1))
                caps = rng.integers(fam.caps[0], fam.caps[1] + 1, size=m).astype(np.int64)
                lo, hi = fam.n_range(m)
                n = int(rng.integers(lo, hi + 1))
                C = int(caps.max())
                V = (concave_tables if conc else nonconcave_tables)(rng, n, C, uniform_sampler)
                ex = exact_optimum(V, caps, time_limit=milp_limit)
                milp_t.append(ex.wall)
                certified += ex.status == "certified"
                ref = ex.utility if ex.status == "certified" else ex.bound  # capped: ratio to the dual bound
                rows_i = np.arange(n)
                for meth in ("alg1", "alg2"):
                    method = meth if conc else ("aanc" if meth == "alg2" else meth)
                    for tag, kw in (
                        ("lit", {"refine": False}),
                        ("re", {"refine": True, "search": False}),
                        ("ship", {}),
                    ):
                        t0 = time.perf_counter()
                        _, a = assign_and_allocate(V, caps, method=method, **kw)
                        times.setdefault(f"{meth}_{tag}", []).append(time.perf_counter() - t0)
                        u = float(V[rows_i, a].sum())
                        assert u <= ex.bound + 1e-7 * max(1.0, ex.bound), "a heuristic beat the MILP bound"
                        ratios.setdefault(f"{meth}_{tag}", []).append(u / ref)
                eq = np.full(m, C, dtype=np.int64)
                ex_eq = exact_optimum(V, eq, time_limit=milp_limit)
                ref_eq = ex_eq.utility if ex_eq.status == "certified" else ex_eq.bound
                method = "alg2" if conc else "aanc"
                for tag, kw in (("lit", {"refine": False}), ("re", {}), ("srch", {"search": True})):
                    _, a = assign_and_allocate(V, eq, method=method, **kw)
                    ratios.setdefault(f"eq_{tag}", []).append(float(V[rows_i, a].sum()) / ref_eq)
            curves = "concave" if conc else "nonconcave"

            def cell(key: str, ratios: dict[str, list[float]] = ratios) -> str:
                x = ratios[key]
                return f"{np.mean(x):.4f} / {np.min(x):.3f}"

            for meth, name in (("alg2", "Alg 2" if conc else "AANC"), ("alg1", "Alg 1")):
                lines.append(
                    f"| {fam.label} | {curves} | {count} ({certified}) | {name} | {cell(meth + '_lit')} | "
                    f"{cell(meth + '_re')} | **{cell(meth + '_ship')}** | "
                    f"{statistics.median(times[meth + '_lit']) * 1e3:.1f} | "
                    f"{statistics.median(times[meth + '_ship']) * 1e3:.1f} | "
                    f"{statistics.median(milp_t) * 1e3:.0f} / {max(milp_t) * 1e3:.0f} |"
                )
            eq_lines.append(f"| {fam.label} | {curves} | {cell('eq_lit')} | {cell('eq_re')} | {cell('eq_srch')} |")
    return "\n".join(lines) + "\n\n" + "\n".join(eq_lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------------
# UR / RR against the paper's published ratios


def baseline_study(seeds: int, trials: int) -> tuple[str, dict[str, tuple[float, float]]]:
    """The two Section VIII points whose heuristic ratios the paper states in its text (beta = 15: power law mu = 2,
    and discrete gamma = 0.85, theta = 100), ``seeds`` independent runs of ``trials`` trials each (the paper: one run
    of 1000). For every trial the literal Algorithm 2's utility is divided by UU, RU, UR and RR, with random
    allocation read both ways (``remaining``: each pod a uniform amount of what its node still has; ``proportions``:
    uniform random shares of the whole node). Reported per point and reading: the range over seeds of the
    per-run mean of ratios (the paper's statistic), the pooled median, the ratio of summed utilities, and the
    largest single-trial ratio."""
    m, C = 8, 100
    n = 15 * m
    caps = np.full(m, C, dtype=np.int64)
    points = (
        ("power law mu = 2, beta = 15", power_sampler(2.0), "3.9, 3.9, 5.7, 5.7"),
        ("discrete gamma = 0.85, theta = 100, beta = 15", discrete_sampler(0.85, 100.0), "5, 5, 9, 9"),
    )
    lines = [
        "| point | reading of random allocation | heuristic | paper | mean of ratios, per run (min .. max over "
        f"{seeds} runs of {trials}) | median ratio | ratio of summed utilities | largest single ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    out: dict[str, tuple[float, float]] = {}
    for p_i, (label, sampler, paper) in enumerate(points):
        paper_v = dict(zip(BASELINES, paper.split(", ")))
        per: dict[str, list[list[float]]] = {}
        sums: dict[str, list[float]] = {}
        for seed in range(seeds):
            rng = np.random.default_rng(10_000 * (p_i + 1) + seed)
            for _ in range(trials):
                V = concave_tables(rng, n, C, sampler)
                curves = TableCurves(V)
                p, _ = solve(curves, caps, method="alg2", refine=False)
                ours = float(curves.evaluate(p.amount).sum())
                sums.setdefault("ours", []).append(ours)
                for reading in ("remaining", "proportions"):
                    for k in BASELINES:
                        if reading == "proportions" and k[1] == "u":
                            continue
                        b = baseline(k, n, caps, rng, random_allocation=reading)
                        u = float(curves.evaluate(b.amount).sum())
                        key = f"{reading}/{k}"
                        runs = per.setdefault(key, [[] for _ in range(seeds)])
                        runs[seed].append(ours / u)
                        sums.setdefault(key, []).append(u)
        for key, runs in per.items():
            reading, k = key.split("/")
            means = [float(np.mean(r)) for r in runs]
            pooled = np.concatenate([np.asarray(r) for r in runs])
            rom = float(np.sum(sums["ours"]) / np.sum(sums[key]))
            out[f"{label}/{key}"] = (min(means), max(means))
            lines.append(
                f"| {label} | {reading} | {k.upper()} | {paper_v[k]} | {min(means):.2f} .. {max(means):.2f} | "
                f"{float(np.median(pooled)):.2f} | {rom:.2f} | {float(pooled.max()):.0f} |"
            )
    return "\n".join(lines) + "\n", out


# ---------------------------------------------------------------------------------------------------------------------
# timings


def median_time(fn: Callable[[], object], runs: int) -> tuple[float, list[float], float]:
    """Median wall time, the runs, and the median CPU time of this process (``time.process_time``; on a shared
    machine wall time includes waiting for a core, CPU time does not)."""
    ts = []
    cs = []
    for _ in range(runs):
        c = time.process_time()
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
        cs.append(time.process_time() - c)
    return statistics.median(ts), ts, statistics.median(cs)


def large_pl_family(rng: np.random.Generator, n: int, C: int, K: int) -> PiecewiseLinearCurves:
    """Random concave piecewise-linear curves with ``K`` breakpoints (``K-1`` segments, decreasing slopes) spread
    over ``[0, C]``, per-thread scale lognormal."""
    gaps = rng.integers(1, C // K + 1, size=(n, K - 1))
    x = np.concatenate([np.zeros((n, 1)), np.cumsum(gaps, axis=1)], axis=1)
    slopes = np.sort(rng.uniform(0, 1, size=(n, K - 1)), axis=1)[:, ::-1] * rng.lognormal(0, 1, size=(n, 1))
    y = np.concatenate([np.zeros((n, 1)), np.cumsum(slopes * np.diff(x, axis=1), axis=1)], axis=1)
    return PiecewiseLinearCurves(x, y, C)


def timings(rng: np.random.Generator, quick: bool, runs: int) -> tuple[str, dict[str, float]]:
    out: dict[str, float] = {}
    lines = [
        "| case | what is timed | median wall | runs (wall) | median CPU | paper / target |",
        "|---|---|---|---|---|---|",
    ]

    def ms(xs: list[float]) -> str:
        return ", ".join(f"{t * 1e3:.1f}" for t in xs) + " ms"

    m, n, C = 8, 100, 100
    V = concave_tables(rng, n, C, uniform_sampler)
    caps = [C] * m
    small = "m=8, n=100, C=100"
    med, ts, cpu = median_time(lambda: assign_and_allocate(V, caps, method="alg2"), max(runs, 20))
    out["alg2_small"] = med
    lines.append(
        f"| {small}, concave PCHIP | **shipped** `assign_and_allocate(table, caps)`: validation + bisection SO + "
        f"Algorithm 2 + per-node re-split | {med * 1e3:.2f} ms | {len(ts)} runs, min {min(ts) * 1e3:.2f} ms | "
        f"{cpu * 1e3:.2f} ms | 9 ms (Matlab, literal) |"
    )
    med, ts, cpu = median_time(lambda: assign_and_allocate(V, caps, method="alg2", refine=False), max(runs, 20))
    out["alg2_small_lit"] = med
    lines.append(
        f"| {small}, concave PCHIP | paper-literal (`refine=False`) | {med * 1e3:.2f} ms | {len(ts)} runs, min "
        f"{min(ts) * 1e3:.2f} ms | {cpu * 1e3:.2f} ms | 9 ms (Matlab) |"
    )
    med, ts, cpu = median_time(lambda: assign_and_allocate(V, caps, method="alg1"), runs)
    lines.append(
        f"| {small}, concave PCHIP | shipped Algorithm 1 (+ re-split) | {med * 1e3:.2f} ms | {ms(ts)} | "
        f"{cpu * 1e3:.2f} ms | not reported |"
    )
    W = nonconcave_tables(rng, n, C, uniform_sampler)
    med, ts, cpu = median_time(lambda: assign_and_allocate(W, caps, method="aanc"), runs)
    out["aanc_small"] = med
    lines.append(
        f"| {small}, nonconcave | **shipped** AANC: exact DP SO + Algorithm 2 + exact per-node DP re-split | "
        f"{med * 1e3:.1f} ms | {ms(ts)} | {cpu * 1e3:.1f} ms | 9.47 s (Matlab, literal) |"
    )
    med, ts, cpu = median_time(lambda: assign_and_allocate(W, caps, method="aanc", refine=False), runs)
    out["aanc_small_lit"] = med
    lines.append(
        f"| {small}, nonconcave | paper-literal AANC (`refine=False`) | {med * 1e3:.1f} ms | {ms(ts)} | "
        f"{cpu * 1e3:.1f} ms | 9.47 s (Matlab) |"
    )
    hcaps = rng.integers(50, 151, size=m).astype(np.int64)
    for label, H in (
        ("concave PCHIP", concave_tables(rng, n, int(hcaps.max()), uniform_sampler)),
        ("nonconcave", nonconcave_tables(rng, n, int(hcaps.max()), uniform_sampler)),
    ):
        meth = "alg2" if label.startswith("concave") else "aanc"
        t_ship: list[float] = []
        t_re: list[float] = []
        c_ship: list[float] = []
        c_re: list[float] = []
        for _ in range(runs):  # interleaved, so both see the same load
            _, t1, c1 = median_time(functools.partial(assign_and_allocate, H, hcaps, method=meth), 1)
            _, t2, c2 = median_time(functools.partial(assign_and_allocate, H, hcaps, method=meth, search=False), 1)
            t_ship += t1
            c_ship.append(c1)
            t_re += t2
            c_re.append(c2)
        p_ship, _ = solve(H, hcaps, method=meth)
        assert p_ship.search is not None
        lines.append(
            f"| m=8, n=100, C_j in 50..150 (heterogeneous), {label} | **shipped** {meth}: re-split + local search "
            f"({p_ship.search.route}, {p_ship.search.moves} moves, {p_ship.search.status}; utility "
            f"+{(p_ship.search.after / p_ship.search.before - 1) * 100:.3f} %) | {statistics.median(t_ship) * 1e3:.1f} "
            f"ms | {ms(t_ship)} | {statistics.median(c_ship) * 1e3:.1f} ms | |"
        )
        lines.append(
            f"| same | `search=False` (re-split only), runs interleaved with the row above | "
            f"{statistics.median(t_re) * 1e3:.1f} ms | {ms(t_re)} | {statistics.median(c_re) * 1e3:.1f} ms | |"
        )
    n, m, C, K = (10_000, 100, 10_000, 8) if quick else (100_000, 1_000, 10_000, 8)
    t0 = time.perf_counter()
    fam = large_pl_family(rng, n, C, K)
    build = time.perf_counter() - t0
    caps = [C] * m
    large = f"n={n:,}, m={m:,}, C={C:,}, concave piecewise-linear, {K} breakpoints"

    def secs(xs: list[float]) -> str:
        return ", ".join(f"{t:.3f}" for t in xs)

    # shipped and literal interleaved run by run, so that both see the same machine load
    ship_t: list[float] = []
    ship_c: list[float] = []
    lit_t: list[float] = []
    lit_c: list[float] = []
    for _ in range(runs):
        _, t1, c1 = median_time(lambda: assign_and_allocate(fam, caps, method="alg2"), 1)
        _, t2, c2 = median_time(lambda: assign_and_allocate(fam, caps, method="alg2", refine=False), 1)
        ship_t += t1
        ship_c.append(c1)
        lit_t += t2
        lit_c.append(c2)
    out["alg2_large"] = statistics.median(ship_t)
    out["alg2_large_lit"] = statistics.median(lit_t)
    lines.append(
        f"| {large} | **shipped** `assign_and_allocate(family, caps)`: bisection SO on the compact family + "
        f"Algorithm 2 + per-node re-split (vectorised per-node bisection) | {statistics.median(ship_t):.3f} s | "
        f"{secs(ship_t)} | {statistics.median(ship_c):.3f} s | <= 1 s on 2 cores |"
    )
    lines.append(
        f"| same | paper-literal (`refine=False`), runs interleaved with the row above | "
        f"{statistics.median(lit_t):.3f} s | {secs(lit_t)} | {statistics.median(lit_c):.3f} s | |"
    )
    so_med, _, so_cpu = median_time(lambda: super_optimal(fam, m * C), runs)
    lines.append(
        f"| same | of which the super-optimal bisection alone | {so_med:.3f} s | | {so_cpu:.3f} s | O(n (log mC)^2) |"
    )
    lit, so = solve(fam, caps, method="alg2", refine=False)
    assert so is not None
    re_med, _, re_cpu = median_time(lambda: reallocate(fam, lit.server, np.asarray(caps), current=lit.amount), runs)
    lines.append(
        f"| same | of which the per-node re-split alone (`reallocate`) | {re_med:.3f} s | | {re_cpu:.3f} s | |"
    )
    lines.append(f"| same | building and validating the family (once) | {build:.3f} s | 1 run | | |")
    s_ship, a_ship = assign_and_allocate(fam, caps, method="alg2")
    for srv, amt in ((lit.server, lit.amount), (s_ship, a_ship)):
        assert (np.bincount(srv, weights=amt, minlength=m) <= C).all()
    ratio_lit = float(fam.evaluate(lit.amount).sum()) / so.utility
    ratio_ship = float(fam.evaluate(a_ship).sum()) / so.utility
    out["large_ratio"] = ratio_ship
    text = "\n".join(lines) + "\n"
    text += (
        f"\nLarge case quality: shipped / SO = {ratio_ship:.4f}, paper-literal Algorithm 2 / SO = {ratio_lit:.4f}; "
        f"{len(np.unique(lit.server))} of {m} nodes used; a dense table would need "
        f"{n * (C + 1) * 8 / 2**30:.1f} GiB.\n"
    )
    return text, out


# ---------------------------------------------------------------------------------------------------------------------


def machine() -> str:
    return f"- {machine_line('scipy', 'highspy')}\n- date (UTC): {now_utc()}\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="smoke-sized run")
    ap.add_argument("--seed", type=int, default=2024)
    args = ap.parse_args(argv)
    quick = args.quick
    rng = np.random.default_rng(args.seed)
    T = 10 if quick else 200  # concave trials per point (paper: 1000)
    TN = 4 if quick else 40  # nonconcave (AANC, exact DP) trials per point
    TM = 3 if quick else 20  # AAMR trials per point (paper: 100)
    HET = (6, 2) if quick else (40, 12)
    runs = 5
    betas = [1, 2, 3, 5, 8, 10, 15] if quick else list(range(1, 16))
    m, C = 8, 100
    t_start = time.perf_counter()
    load_start = os.getloadavg()[0]
    sections: list[str] = []

    def curve(sampler: Sampler) -> Callable[[np.random.Generator, int, int], np.ndarray]:
        return lambda r, n, c: concave_tables(r, n, c, sampler)

    rows = [run_point(str(b), rng, T, m * b, m, C, curve(uniform_sampler)) for b in betas]
    sections.append(
        table(
            "Fig. 2(a): uniform, Algorithm 2",
            "beta = n/m",
            rows,
            "ours/SO never below 0.99; heuristic ratios > 1, growing with beta; UU optimal at beta=1",
        )
    )
    fig2a = rows
    rows = [run_point(str(b), rng, T, m * b, m, C, curve(normal_sampler)) for b in betas]
    sections.append(
        table(
            "Fig. 2(b): normal (mean 10, sd 20), Algorithm 2",
            "beta",
            rows,
            "ours/SO never below 0.99; same trends as Fig. 2(a)",
        )
    )
    fig2b = rows
    rows = [run_point(str(b), rng, T, m * b, m, C, curve(power_sampler(2.0))) for b in betas]
    sections.append(
        table(
            "Fig. 3(a): power law mu = 2, Algorithm 2",
            "beta",
            rows,
            "close to SO; at beta = 15: 3.9x UU and RU, 5.7x UR and RR",
        )
    )
    fig3a = rows
    mus = [1.5, 2.0, 3.0, 4.0] if quick else [1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0]
    rows = [run_point(str(mu), rng, T, 5 * m, m, C, curve(power_sampler(mu))) for mu in mus]
    sections.append(
        table(
            "Fig. 3(b): power law, beta = 5, varying mu", "mu", rows, "nearly optimal; heuristics improve as mu grows"
        )
    )
    fig3b = rows
    rows = [run_point(str(b), rng, T, m * b, m, C, curve(discrete_sampler(0.85, 100.0))) for b in betas]
    sections.append(
        table(
            "Fig. 4(a): discrete, gamma = 0.85, theta = 100, Algorithm 2",
            "beta",
            rows,
            "at beta = 15: 9x UR and RR, 5x UU and RU",
        )
    )
    fig4a = rows
    gammas = [0.2, 0.5, 0.8, 0.9] if quick else [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95]
    rows = [run_point(str(g), rng, T, 5 * m, m, C, curve(discrete_sampler(g, 5.0))) for g in gammas]
    sections.append(
        table(
            "Fig. 4(b): discrete, beta = 5, theta = 5, varying gamma",
            "gamma",
            rows,
            "worst at gamma = 0.8 with 0.92 of SO; heuristics also worst there",
        )
    )
    fig4b = rows
    thetas = [2, 10, 100] if quick else [2, 5, 10, 20, 50, 100, 200]
    rows = [run_point(str(t), rng, T, 5 * m, m, C, curve(discrete_sampler(0.85, float(t)))) for t in thetas]
    sections.append(
        table(
            "Fig. 4(c): discrete, beta = 5, gamma = 0.85 (our choice; the paper does not state the "
            "fixed values), varying theta",
            "theta",
            rows,
            "always over 0.92 of SO; heuristics degrade as theta grows",
        )
    )
    fig4c = rows
    sens = []
    sens_literal: list[float] = []
    for name, smp in (
        ("uniform [0, 1] (as above)", uniform_sampler),
        ("uniform [1, 2]", uniform_12_sampler),
        ("uniform integers 1..100", integer_sampler),
        ("normal (10, 20) truncated (as above)", normal_sampler),
        ("normal (10, 20) folded", folded_normal_sampler),
    ):
        r2 = [run_point(str(b), rng, max(T // 4, 5), m * b, m, C, curve(smp)) for b in (2, 5)]
        sens_literal += [r.so for r in r2]
        sens.append(f"| {name} | {r2[0].so:.3f} | {r2[1].so:.3f} | {r2[0].shipped:.3f} | {r2[1].shipped:.3f} |")
    sens_best = max(sens_literal)
    sens_verdict = (
        f"The paper-literal Algorithm 2 / SO stays below 0.99 under all of them (best cell {sens_best:.3f}), so the "
        "paper's figure is not explained by a generator detail; its evaluation may have allocated differently from its "
        "pseudocode (e.g. handed out leftovers, as the shipped method does)."
        if sens_best < 0.99
        else f"The paper-literal Algorithm 2 / SO reaches {sens_best:.3f} in at least one cell, so a generator detail "
        "can move it to the paper's 0.99."
    )
    sensitivity = (
        "| H | literal Alg 2 / SO, beta = 2 | literal Alg 2 / SO, beta = 5 | shipped / SO, beta = 2 | "
        "shipped / SO, beta = 5 |\n"
        "|---|---|---|---|---|\n" + "\n".join(sens) + "\n"
    )
    betas_nc = [1, 3, 5, 10, 15] if quick else [1, 2, 3, 4, 5, 6, 8, 10, 12, 15]
    rows = [
        run_point(str(b), rng, TN, m * b, m, C, lambda r, n, c: nonconcave_tables(r, n, c, uniform_sampler), True)
        for b in betas_nc
    ]
    sections.append(
        table(
            "Fig. 5: nonconcave (two PCHIP pieces), uniform, AANC (Alg 1 columns: Algorithm 1 on the same exact DP "
            "super-optimal allocation)",
            "beta",
            rows,
            "AANC/SO never below 0.98",
            main="AANC",
        )
    )
    fig5 = rows
    rows = [aamr_point(rng, TM, b) for b in ([1, 4, 7] if quick else list(range(1, 8)))]
    sections.append(
        table(
            "Fig. 8: AAMR, m = 4, C = (40, 20), f = g1 x1^a1 + g2 x2^a2",
            "beta",
            rows,
            "AAMR/SO never below 0.96; at beta = 7: 1.98x UU, 1.97x RU, 2.67x UR, 2.62x RR",
            main="AAMR",
        )
    )
    fig8 = rows
    het = heterogeneous(rng, HET, milp_limit=60.0)
    base_seeds, base_trials = (2, 40) if quick else (5, 1000)
    base_text, _ = baseline_study(base_seeds, base_trials)
    tim, tvals = timings(rng, quick, runs)
    elapsed = time.perf_counter() - t_start

    load_end = os.getloadavg()[0]

    def worst(rows: list[Row], shipped: bool) -> float:
        return min(r.shipped if shipped else r.so for r in rows)

    def fmt(rows: list[Row], label: str | None = None, keys: tuple[str, ...] = BASELINES, suffix: str = "") -> str:
        r = rows[-1] if label is None else next(x for x in rows if x.label == label)
        return ", ".join(f"{r.ratios[k + suffix]:.2f}" for k in keys)

    prop_keys = tuple(k + "_p" for k in PROPORTIONS)
    missed: list[str] = []

    def at_least(name: str, shipped: float, literal: float, target: float) -> tuple[str, str, str, str, str]:
        ok = shipped >= target
        if not ok:
            missed.append(name)
        return name, f"{shipped:.3f}", f"{literal:.3f}", f">= {target}", "yes" if ok else "**no**"

    def compare(name: str, shipped: str, literal: str, paper: str) -> tuple[str, str, str, str, str]:
        return name, shipped, literal, paper, "(compare)"

    gamma08 = next(r for r in fig4b if r.label == "0.8")
    large = "n=1e5, m=1e3, C=1e4" if not quick else "quick: n=1e4, m=100, C=1e4"
    large_ok = tvals["alg2_large"] <= 1.0
    if not large_ok:
        missed.append(f"{large} timing")
    checks = [
        at_least("Algorithm 2 / SO, uniform, worst beta", worst(fig2a, True), worst(fig2a, False), 0.99),
        at_least("Algorithm 2 / SO, normal, worst beta", worst(fig2b, True), worst(fig2b, False), 0.99),
        at_least("Algorithm 2 / SO, discrete gamma = 0.8, theta = 5, beta = 5", gamma08.shipped, gamma08.so, 0.92),
        at_least("AANC / SO, nonconcave uniform, worst beta", worst(fig5, True), worst(fig5, False), 0.98),
        at_least("AAMR / SO, worst beta (Section IX)", worst(fig8, True), worst(fig8, False), 0.96),
        compare(
            "Algorithm 2 / UU, RU, UR, RR, discrete gamma = 0.85, theta = 100, beta = 15",
            fmt(fig4a, suffix="_s"),
            fmt(fig4a),
            "5, 5, 9, 9",
        ),
        compare(
            "Algorithm 2 / UU, RU, UR, RR, power mu = 2, beta = 15",
            fmt(fig3a, suffix="_s"),
            fmt(fig3a),
            "3.9, 3.9, 5.7, 5.7",
        ),
        compare(
            "Algorithm 2 / UR, RR, uniform, beta = 1 (paper: UU optimal there, UR not)",
            fmt(fig2a, "1", ("ur", "rr"), "_s"),
            fmt(fig2a, "1", ("ur", "rr")),
            "UR > 1",
        ),
        compare(
            "earlier reading of random allocation (proportions of the whole server): Algorithm 2 / UR, RR, "
            "discrete gamma = 0.85, theta = 100, beta = 15",
            fmt(fig4a, None, prop_keys, "_s"),
            fmt(fig4a, None, prop_keys),
            "9, 9",
        ),
        compare(
            "same, power mu = 2, beta = 15", fmt(fig3a, None, prop_keys, "_s"), fmt(fig3a, None, prop_keys), "5.7, 5.7"
        ),
        compare("AAMR / UU, RU, UR, RR at beta = 7", fmt(fig8, suffix="_s"), fmt(fig8), "1.98, 1.97, 2.67, 2.62"),
        compare(
            "earlier reading of random allocation: AAMR / UR, RR at beta = 7",
            fmt(fig8, None, prop_keys, "_s"),
            fmt(fig8, None, prop_keys),
            "2.67, 2.62",
        ),
        compare(
            "m=8, n=100, C=100: Algorithm 2 incl. SO, median wall",
            f"{tvals['alg2_small'] * 1e3:.2f} ms",
            f"{tvals['alg2_small_lit'] * 1e3:.2f} ms",
            "9 ms (Matlab)",
        ),
        (
            f"{large}, piecewise-linear: Algorithm 2 incl. SO, median wall",
            f"{tvals['alg2_large']:.3f} s",
            f"{tvals['alg2_large_lit']:.3f} s",
            "<= 1 s",
            "yes" if large_ok else "**no**",
        ),
    ]

    def span(rows: list[Row], attr: str) -> str:
        vals = [getattr(r, attr) for r in rows]
        if all(np.isnan(v) for v in vals):
            return "--"
        return f"{min(vals):.3f} / {float(np.mean(vals)):.3f}"

    side = [
        "| figure (points) | Alg 1, `refine=False` | Alg 1, `refine=True` | Alg 2 / AANC / AAMR, `refine=False` | "
        "Alg 2 / AANC / AAMR, `refine=True` | paper |",
        "|---|---|---|---|---|---|",
    ]
    for name, rows_f, paper_f in (
        ("Fig. 2(a) uniform, Alg 2", fig2a, ">= 0.99"),
        ("Fig. 2(b) normal, Alg 2", fig2b, ">= 0.99"),
        ("Fig. 3(a) power mu = 2, Alg 2", fig3a, "close to SO"),
        ("Fig. 3(b) power, varying mu, Alg 2", fig3b, "nearly optimal"),
        ("Fig. 4(a) discrete theta = 100, Alg 2", fig4a, "--"),
        ("Fig. 4(b) discrete, varying gamma, Alg 2", fig4b, ">= 0.92"),
        ("Fig. 4(c) discrete, varying theta, Alg 2", fig4c, ">= 0.92"),
        ("Fig. 5 nonconcave, AANC", fig5, ">= 0.98"),
        ("Fig. 8 two resources, AAMR", fig8, ">= 0.96"),
    ):
        side.append(
            f"| {name} ({len(rows_f)}) | {span(rows_f, 'alg1')} | {span(rows_f, 'alg1_shipped')} | "
            f"{span(rows_f, 'so')} | {span(rows_f, 'shipped')} | {paper_f} |"
        )
    side_text = "\n".join(side) + "\n"
    summary = (
        "| check | shipped (paper's algorithm + per-node re-split) | paper-literal | paper / target | "
        "target met by shipped |\n|---|---|---|---|---|\n"
        + "\n".join(f"| {c} | {sh} | {li} | {p} | {ok} |" for c, sh, li, p, ok in checks)
        + "\n"
    )
    verdict = (
        "Every target in the table is met by the shipped method."
        if not missed
        else "**Targets still missed by the shipped method: " + "; ".join(missed) + ".**"
    )
    literal_line = (
        f"The paper-literal pseudocode reaches {worst(fig2a, False):.3f} (uniform) / {worst(fig2b, False):.3f} "
        f"(normal) for Algorithm 2, {worst(fig5, False):.3f} for AANC and {worst(fig8, False):.3f} for AAMR (worst "
        f"beta, against SO), against the paper's stated >= 0.99 / 0.99 / 0.98 / 0.96; the shipped method reaches "
        f"{worst(fig2a, True):.3f} / {worst(fig2b, True):.3f} / {worst(fig5, True):.3f} / {worst(fig8, True):.3f}."
    )

    cmd = "python -m bench.aa" + (" --quick" if quick else "")
    text = (
        f"""## allocator.aa -- assign-and-allocate (paper 000, Lai et al.)

Command: `{cmd}` (seed {args.seed}; total {elapsed:.0f} s; 1-minute load average {load_start:.2f} at start,
{load_end:.2f} at end). Machine:

{machine()}
Two methods are measured on the same instances:

- **shipped** -- what `allocator.aa.assign_and_allocate` (and `assign_and_allocate_multi`) return by default
  (`refine=True`): the paper's algorithm (Algorithm 2 for concave curves, AANC for nonconcave, AAMR for two
  resources) followed by the optimal re-split of every node's units among the pods the algorithm put there
  (`allocator.aa.reallocate`, `reallocate_multi`; beyond the paper). With equal capacities (every Section VIII and
  IX table) the assignment is the paper's; with unequal ones the default `search="auto"` then improves the
  assignment by local search (relocate and swap moves, each node split optimally; `allocator.aa.local_search`, beyond
  the paper) -- see the heterogeneous section.
- **paper-literal** -- the same algorithm exactly as its pseudocode reads (`refine=False`): a node's units left over
  at the end are never handed out (Lemma V.7's proof keeps them).

The paper's guarantees -- 2(sqrt 2 - 1) of the optimum for Algorithms 1 and 2 on concave curves (Theorems V.17, VI.1)
and 1/2 for AANC (Theorem VII.3), equal capacities -- are proven for the literal algorithms; they carry over to the
shipped method because the re-split keeps the assignment and never lowers any node's utility. The issue's quality
targets are checked against the shipped method.

Ratios are averages over random trials of *method / other*, as in the paper's figures. SO is the super-optimal
utility (an upper bound on the optimum, Lemma V.2), so *method / SO* is a lower bound on *method / OPT*. The
figure tables compare the paper-literal method with the heuristics (as the paper does) and add *shipped / SO* in the
last column. The paper's figures are plots; the *Paper* line quotes the numbers its text states. Trials per point:
{T} concave (paper: 1000), {TN} nonconcave (paper: 1000), {TM} AAMR (paper: 100). Servers m = 8, C = 100 units
(Section VIII).

Generator details the paper leaves open, and our choices: ``(v, w)`` are i.i.d. draws from H conditioned on
``w <= v`` by rejecting whole pairs (for the discrete H this keeps the true weight of ties; sorting two draws would
over-weight high curves); the normal H is truncated to positive values; the power law is continuous on ``x >= 1``
(the paper's "each value x has a probability lambda x^-mu" could also mean the discrete zeta law); the discrete H
has ``l = 1``, ``h = theta``. Uniform allocation gives equal integer shares. Random allocation (UR, RR): each pod on a
node, in assignment order, gets a uniformly random amount of what the node still has (``floor(u (rest + 1))``), so a
node need not be fully used. Section VIII requires that a random allocation need not give a lone pod the whole node
("UR does not achieve optimal utility even for beta = 1, since it allocates threads random amounts"). An earlier
version of this benchmark split each node in uniformly random proportions (Dirichlet(1)) filling it, which makes UR
optimal at beta = 1; its ratios are kept in the summary as a sensitivity check. The mean of ratios
is what the paper plots; with very heavy tails (power law mu <= 1.5, and single trials elsewhere) a heuristic that
leaves the one huge-utility pod with 0 units makes a single ratio enormous, which then dominates that mean.

### Summary against the issue's targets

{summary}
{verdict}

{literal_line} The paper-literal Algorithm 2 follows Section VI, lines 1-10: tail sorted by nonincreasing slope,
each pod on the node with the most remaining capacity, ``min(c_hat_i, C_j)`` units, and no redistribution of what a
node has left at the end. Its shortfall against SO on the uniform and normal curves is that leftover plus the few
unfull pods' missing units; the shipped column (same assignment, each node re-split optimally) shows the assignment
itself is within a fraction of a percent of SO. The generators were not changed for the shipped method.
The table below ({max(T // 4, 5)} trials per cell) changes what the paper leaves open about H: its support, and
how the normal's negative draws are treated. {sens_verdict}

{sensitivity}
### Section VIII (one resource)

"""
        + "\n".join(sections[:-1])
        + f"""
### Section IX (two resources, AAMR with DPSOPT)

{sections[-1]}
### Heterogeneous capacities (beyond the paper)

The paper's guarantees (2(sqrt 2 - 1) for Algorithms 1 and 2, 1/2 for AANC) are proven **only for equal capacities**
(Section III; Section X names unequal ones as future work). With per-node capacities C_j the algorithms run
unchanged: the super-optimal step pools sum_j C_j units with each thread capped at max_j C_j; Algorithm 2 and AANC
send each thread to the node with the largest remaining capacity, Algorithm 1 places full threads first-fit and
unfull ones on the largest remaining capacity. The shipped default then runs `allocator.aa.local_search`
(`search="auto"` turns it on exactly when the capacities differ): best-improvement relocate and swap moves between
nodes, every node valued by its optimal split (max-plus convolution of its pods' curves, exact for any nondecreasing
curves), until no move improves (status `converged`) or 4n moves (`capped`); instances too large for one pass skip
it (route table in `allocator/aa/search.py`).

Reference: the exact optimum by HiGHS (`allocator.aa.exact_optimum`: binary x[i, j, c] per thread, node and amount,
one option per thread, capacity per node; time limit 60 s, status `certified` when HiGHS proves optimality; a
`capped` instance would be measured against HiGHS's dual bound, a lower bound on the true ratio). Curves: Section
VIII's uniform PCHIP (concave) and two-piece (nonconcave) generators with C = max C_j; on the nonconcave rows both
algorithms start from the exact DP super-optimal allocation (so "AANC" is Algorithm 2 there). Each cell is the mean
/ worst over the family of *method / OPT*. Columns: paper-literal (`refine=False`), re-split only (`refine=True,
search=False`, the shipped method before issue 19), and **shipped** (`refine=True`, default `search="auto"`). Times
are medians over the family's instances of one whole `assign_and_allocate` call (super-optimal step included) and of
one HiGHS solve. The issue's goal is shipped within 5 % of the MILP, i.e. worst >= 0.95. No ratio is proven here: the
worst cases below are what these instances gave, not bounds.

{het}
The second table solves the same curves with every capacity raised to max C_j (the paper's model): there
`search="auto"` keeps the paper's assignment, and `search=True` shows what the local search would add.

### `refine=False` (paper's pseudocode) and `refine=True` (re-split) side by side

Ratio to the super-optimal bound SO, worst / mean over each figure's points (each point a mean over its trials, as
above). Algorithm 1 runs on the same super-optimal allocation as Algorithm 2 (the paper omits it from Section VIII:
"it achieves the same approximation ratio"); on Fig. 5 that is the exact DP one, as in AANC. Fig. 8 has AAMR only.
Equal capacities throughout, so the shipped method is the `refine=True` column.

{side_text}
### UR and RR against the paper's published ratios

The paper defines the heuristics in one sentence each (Section VIII): UU assigns round robin and gives a node's pods
equal amounts; UR assigns round robin and gives pods "a random amount of resources"; RU and RR assign to random
nodes. What "a random amount" means is not stated. We read it as: each pod on a node, in turn, gets a uniformly
random amount of what the node still has (`random_allocation="remaining"`, the default) -- the reading under which
the text's "UR does not achieve optimal utility even for beta = 1" holds (uniform random shares of the whole node,
`"proportions"`, give a lone pod the whole node, so UR would be optimal at beta = 1). Our UU/RU (deterministic equal
shares) reproduce the paper's stated UU/RU ratios; the question is only UR/RR.

The paper's figures average the per-trial ratio *Algorithm 2 / heuristic* (its "average ratio"). Under a random
allocation one pod with a huge curve can get 0 units, which makes that trial's ratio enormous. For the power law
with mu = 2 (density proportional to x^-2 on x >= 1) the mean of a draw is infinite (the integral of x * x^-2
diverges), so the largest curve routinely dwarfs all others, and the average of ratios over 1000 trials is dominated
by the few trials that starve it: it does not settle from run to run. The table below repeats the paper's two stated
beta = 15 points {base_seeds} times with {base_trials} trials each (the paper: one run of 1000), both readings, on
the same instances, paper-literal Algorithm 2 (as the paper):

{base_text}
What it shows: (1) UU and RU (equal shares, which never starve a pod) are stable from run to run and close to
the paper's figures. (2) For the discrete H (bounded ratios), the `remaining` reading's per-run means sit next to
the paper's 9, while the `proportions` reading gives about half of it, so the paper's random allocation behaves
like `remaining`; the Section IX summary row (AAMR at beta = 7) points the same way. (3) For the power law, no single
number exists to match: per-run means under `remaining` spread over the range shown, far above the median and the
ratio of sums, so the paper's 5.7 is one draw of an estimator dominated by rare starved trials; under `proportions`
the means are closer to 5.7 but the discrete point is then off by a factor two. Our baseline code is therefore not
wrong against the paper's definitions; the paper leaves the random allocation undefined and reports a heavy-tailed
statistic from one run. The Section VIII tables use `remaining` and 200 trials per point.

### Timings (median of at least {runs} runs; the machine may be shared -- see the load averages in the header)

*median CPU* is this process's CPU time (`time.process_time`), which waiting for a core does not inflate.

{tim}
Real-world SPEC curves (Tables IV and V) are not reproduced: the paper's Figures 6-7 data are not in the text.
"""
    )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(text)
    print(f"wrote {OUT.relative_to(ROOT)} in {elapsed:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
