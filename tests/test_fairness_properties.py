"""Property tests (hypothesis) for ``allocator.fairness`` on random heterogeneous instances with placement constraints.

The checks are written from the definitions in paper 002 (Sec. 2.1, 3.3, Definition 2) and the project's fairness note,
independently of the solvers: sharing incentive, envy-freeness, non-wastefulness, feasibility, bottleneck fairness,
Pareto optimality of PF-VDS(1) (an LP solved by HiGHS), PF-VDS -> PS-DSF as alpha grows, reduction to DRF on one node.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from allocator.fairness import allocate, make_instance, pf_vds, ps_dsf

SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}  # derandomized under CI by conftest.py


@st.composite
def instances(draw: st.DrawFn, max_users: int = 5, max_nodes: int = 3, bottleneck: bool = False):
    """Random integer-valued instance; every user keeps at least one eligible node that has all its resources."""
    n = draw(st.integers(2, max_users))
    k = draw(st.integers(1, max_nodes))
    r = draw(st.integers(2, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    d = rng.integers(0, 5, size=(n, r)).astype(float)
    d[np.arange(n), rng.integers(0, r, n)] += rng.integers(1, 5, n)  # no zero demand vector
    c = rng.integers(4, 40, size=(k, r)).astype(float)
    if bottleneck:
        # Resource 0 is dominant for every user on every node (Definition 2): make its demand share the largest.
        share = d[:, None, :] / c[None, :, :]
        need = share.max(axis=(1, 2)) * c[:, 0].max() * 1.5 + 1.0
        d[:, 0] = np.maximum(d[:, 0], np.ceil(need))
    e = rng.random((n, k)) < 0.7
    for i in range(n):
        if not e[i].any():
            e[i, rng.integers(0, k)] = True
    w = rng.choice([1.0, 1.0, 2.0, 0.5], size=n)
    return d, c, e, w


def _totals(x: np.ndarray) -> np.ndarray:
    return x.sum(axis=1)


def check_feasible(x, d, c, e) -> None:
    assert (x >= -1e-9).all()
    assert (x[~e] <= 1e-9).all()
    assert (x.T @ d <= c * (1 + 1e-7) + 1e-9).all()


def check_sharing_incentive(x, inst) -> None:
    # x_n >= sum_k (phi_n / sum phi) gamma[n, k] over eligible k.
    lower = inst.weights / inst.weights.sum() * inst.gamma.sum(axis=1)
    assert (_totals(x) >= lower * (1 - 1e-5)).all(), (_totals(x), lower)


def check_envy_free(x, inst) -> None:
    d, w = inst.demands, inst.weights
    tot = _totals(x)
    for n in range(inst.n):
        need = d[n] > 0
        for m in range(inst.n):
            if m == n:
                continue
            ks = inst.eligible[n]
            got = (w[n] / w[m]) * x[m, ks][:, None] * d[m][None, need] / d[n][None, need]
            could = got.min(axis=1).sum()
            assert could <= tot[n] * (1 + 1e-4) + 1e-7, (n, m, could, tot[n])


def check_non_wasteful(x, inst) -> None:
    # Every eligible user of a node needs a resource saturated on that node (else the node could give it more).
    load = x.T @ inst.demands
    sat = load >= inst.capacities * (1 - 1e-5)
    for k in range(inst.k):
        for n in np.flatnonzero(inst.eligible[:, k]):
            assert (sat[k] & (inst.demands[n] > 0)).any(), (n, k, load[k], inst.capacities[k])


@settings(max_examples=40, **SETTINGS)
@given(instances())
def test_psdsf_properties(data) -> None:
    d, c, e, w = data
    inst = make_instance(d, c, e, w)
    res = ps_dsf(inst)
    assert res.converged
    x = res.x
    check_feasible(x, d, c, inst.eligible)
    check_sharing_incentive(x, inst)
    check_envy_free(x, inst)
    check_non_wasteful(x, inst)
    # Definition 4, node by node, in bottleneck form: every eligible user n of node k needs a saturated resource q of
    # k on which no user holding tasks on k has a larger weighted VDS (so n cannot grow there without taking from a
    # user whose weighted VDS is lower or equal).
    tot = _totals(x)
    load = x.T @ d
    for k in range(inst.k):
        sat = load[k] >= c[k] * (1 - 1e-6)
        idx = np.flatnonzero(inst.eligible[:, k])
        vds = tot[idx] / (inst.gamma[idx, k] * inst.weights[idx])
        served = x[idx, k] > 1e-9 * np.maximum(tot[idx], 1e-12)
        for a, n in enumerate(idx):
            ok = []
            for q in np.flatnonzero(sat & (d[n] > 0)):
                users_q = served & (d[idx, q] > 0)
                ok.append(not users_q.any() or vds[a] >= vds[users_q].max() * (1 - 1e-6))
            assert any(ok), (k, n, vds, served)


@settings(max_examples=25, **SETTINGS)
@given(instances(), st.sampled_from([1.0, 2.0]))
def test_pfvds_properties(data, alpha) -> None:
    d, c, e, w = data
    inst = make_instance(d, c, e, w)
    res = pf_vds(inst, alpha, tol=1e-8)
    assert res.converged, res.residual
    x = res.x
    check_feasible(x, d, c, inst.eligible)
    check_sharing_incentive(x, inst)
    check_envy_free(x, inst)
    check_non_wasteful(x, inst)


@settings(max_examples=25, **SETTINGS)
@given(instances())
def test_pfvds_one_is_pareto_optimal(data) -> None:
    # LP: maximise sum_n e_n subject to x'_n >= x_n + e_n, e >= 0, x' feasible. Pareto optimal <=> optimum ~ 0.
    d, c, e, w = data
    inst = make_instance(d, c, e, w)
    x = pf_vds(inst, 1.0, tol=1e-9).x
    tot = _totals(x)
    users, nodes = np.nonzero(inst.eligible)
    p = users.size
    n, k, r = inst.n, inst.k, inst.r
    a_cap = np.zeros((k * r, p + n))
    for j in range(p):
        a_cap[nodes[j] * r : (nodes[j] + 1) * r, j] = d[users[j]]
    a_tot = np.zeros((n, p + n))
    a_tot[users, np.arange(p)] = -1.0
    a_tot[np.arange(n), p + np.arange(n)] = 1.0
    res = linprog(
        np.concatenate([np.zeros(p), -1.0 / tot]),
        A_ub=np.vstack([a_cap, a_tot]),
        b_ub=np.concatenate([c.ravel(), -tot]),
        bounds=(0, None),
        method="highs",
    )
    assert res.status == 0
    assert -res.fun <= 1e-5, -res.fun


@settings(max_examples=25, **SETTINGS)
@given(instances(bottleneck=True))
def test_bottleneck_fairness_and_theorem4(data) -> None:
    d, c, e, w = data
    inst = make_instance(d, c, e, w)
    x = ps_dsf(inst).x
    tot = _totals(x)
    # Definition 2 / Corollary 1: on each node, max-min fairness in the bottleneck resource 0 measured by the
    # weighted holding x_n d[n, 0] / phi_n: a user served on k holds no more than any other eligible user of k.
    held = tot * d[:, 0] / w
    for k in range(inst.k):
        served = np.flatnonzero(x[:, k] > 1e-7 * np.maximum(tot, 1e-12))
        others = np.flatnonzero(inst.eligible[:, k])
        for n in served:
            assert held[n] <= held[others].min() * (1 + 1e-6) + 1e-9, (k, n, held)
    # Theorem 4: with a bottleneck resource every PF-VDS alpha gives the PS-DSF totals.
    for alpha in (0.5, 1.0, 3.0):
        xa = pf_vds(inst, alpha, tol=1e-9).x
        np.testing.assert_allclose(_totals(xa), tot, rtol=1e-4)


@settings(max_examples=15, **SETTINGS)
@given(instances(max_users=4, max_nodes=2))
def test_pfvds_approaches_psdsf(data) -> None:
    # Theorem 2: PF-VDS(alpha) -> PS-DSF as alpha -> infinity.
    d, c, e, w = data
    inst = make_instance(d, c, e, w)
    ref = _totals(ps_dsf(inst).x)
    gaps = []
    for alpha in (1.0, 8.0, 60.0):
        res = pf_vds(inst, alpha, tol=1e-9)
        gaps.append(float(np.max(np.abs(_totals(res.x) - ref) / ref)))
    # Theorem 2 is a limit without a rate: at alpha = 60 the derandomized CI sample holds a 4x2 instance still 3.6 %
    # away; and where PF-VDS(1) already equals PS-DSF, alpha = 60 may differ by the solvers' certified tolerance
    # (totals to ~1e-5, measured 7.9e-6).
    assert gaps[2] <= 0.05, gaps
    assert gaps[2] <= gaps[0] + 1e-5, gaps


@settings(max_examples=30, **SETTINGS)
@given(instances(max_nodes=1))
def test_one_node_everything_is_drf(data) -> None:
    d, c, _, w = data
    ref = allocate(d, c, weights=w, mechanism="drf").tasks
    # Independent DRF check (Definition 1) through the bottleneck characterisation of weighted max-min fairness: every
    # user needs a saturated resource on which its weighted dominant share is the largest among that resource's users.
    dom = (d / c[0]).max(axis=1)
    share = ref[:, 0] * dom / w
    sat = ref[:, 0] @ d >= c[0] * (1 - 1e-9)
    for n in range(d.shape[0]):
        ok = [share[n] >= share[d[:, q] > 0].max() * (1 - 1e-9) for q in np.flatnonzero(sat & (d[n] > 0))]
        assert any(ok), (n, share, sat)
    for mech in ("drfh", "tsf", "ps-dsf"):
        np.testing.assert_allclose(allocate(d, c, weights=w, mechanism=mech).tasks, ref, rtol=1e-6, atol=1e-9)
