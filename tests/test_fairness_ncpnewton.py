"""The semismooth Newton finish of PF-VDS(alpha) (``allocator.fairness.pfvds._ncpnewton``), checked independently.

- the Jacobian of ``Phi`` against central finite differences of ``Phi`` itself;
- alpha = 1: from a perturbed optimum, against CVXPY + Clarabel (``max sum phi log X``; totals unique, 002 Theorem 2);
- alpha != 1: against the plain best-response sweeps run to a KKT residual of 1e-9 (independent code);
- ``pf_vds`` with the Newton tries: certified by ``kkt_residual`` where the plain sweeps need hundreds of sweeps
  (totals against PS-MFA's);
- ``kkt_residual`` with a witness: accepts the solver's prices where its own fit over-reports, rejects non-equilibria.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_fairness_ipm import _check_allocation, _random_instance, _reference

import allocator.fairness.pfvds.equilibrium as pfvds
from allocator.fairness import kkt_residual, make_instance
from allocator.fairness.pfvds._ncpnewton import _System, ncp_newton
from allocator.fairness.pfvds.psmfa import ps_mfa


def _plain_sweeps(monkeypatch: pytest.MonkeyPatch, inst, alpha: float, **kw):
    """``pf_vds`` without the Newton tries and without PS-MFA (best-response sweeps only)."""
    monkeypatch.setattr(pfvds, "NEWTON_MAX_UNKNOWNS", 0)
    res = pfvds.pf_vds(inst, alpha, **kw)
    monkeypatch.undo()
    return res


@pytest.mark.parametrize(("alpha", "caps"), [(0.5, False), (2.0, False), (1.0, True), (5.0, True)])
def test_jacobian_matches_finite_differences(alpha: float, caps: bool) -> None:
    inst = _random_instance(3, 5, 3, 2, caps, True, False)
    rng = np.random.default_rng(7)
    ncap = int(np.isfinite(inst.max_tasks).sum())
    sysm = _System(inst, alpha, rng.uniform(0.5, 2.0, int((inst.capacities > 0).sum())), rng.uniform(0.5, 2.0, ncap))
    z = rng.uniform(0.05, 0.4, sysm.p + sysm.q + sysm.m)  # generic point: every FB pair away from (0, 0)
    got = sysm.evaluate(z, jac=True)
    assert got is not None and got[1] is not None
    jm = got[1]
    h = 1e-6
    fd = np.empty_like(jm)
    for j in range(z.size):
        up, dn = z.copy(), z.copy()
        up[j] += h
        dn[j] -= h
        fu, fdn = sysm.evaluate(up, jac=False), sysm.evaluate(dn, jac=False)
        assert fu is not None and fdn is not None
        fd[:, j] = (fu[0] - fdn[0]) / (2 * h)
    np.testing.assert_allclose(jm, fd, rtol=1e-5, atol=1e-7)


def test_pf_vds_one_from_a_perturbed_optimum_matches_cvxpy() -> None:
    """Local convergence: from an optimum with 5 % noise on every used pair, Newton's result is certified (with its
    own prices as the witness) and its totals are CVXPY's; every certified run must be right, and nearly all must
    certify (measured: 12 of 12, 3 of them at 1e-8 to 1e-10 after the 80-step limit on degenerate instances)."""
    certified = 0
    seeds = range(12)
    for seed in seeds:
        inst = _random_instance(seed, 6, 4, 2, seed % 3 == 0, seed % 2 == 0, False)
        tot_ref, _ = _reference(inst)
        # the optimum's flows are not unique; any optimal split serves as the start's centre
        x_ref = pfvds.pf_vds(inst, 1.0).x
        rng = np.random.default_rng(seed)
        x0 = x_ref * rng.uniform(0.95, 1.05, x_ref.shape)
        res = ncp_newton(inst, 1.0, x0)
        _check_allocation(inst, res.x)
        if kkt_residual(res.x, inst, 1.0, lam=res.lam) <= 1e-6:
            certified += 1
            np.testing.assert_allclose(res.x.sum(axis=1), tot_ref, rtol=1e-5)  # Clarabel's totals: ~1e-6
    assert certified >= 11, f"Newton certified on only {certified} of {len(seeds)} instances"


def test_witness_prices_certify_what_the_fit_cannot_and_reject_non_equilibria() -> None:
    # seed 9 (two capped users): the Newton split leaves a saturated server used only by capped users, where the NNLS
    # fit has no rows and over-reports 1; the solver's own prices certify it
    inst = _random_instance(9, 6, 4, 2, True, False, False)
    x_ref = pfvds.pf_vds(inst, 1.0).x
    x0 = x_ref * np.random.default_rng(9).uniform(0.95, 1.05, x_ref.shape)
    res = ncp_newton(inst, 1.0, x0)
    assert kkt_residual(res.x, inst, 1.0) == 1.0
    assert kkt_residual(res.x, inst, 1.0, lam=res.lam) <= 1e-12
    # the same prices do not certify a non-equilibrium: the equal share, or the optimum with one user's tasks halved
    eq_share = np.where(inst.eligible, inst.gamma / inst.eligible.sum(axis=0), 0.0)
    assert kkt_residual(eq_share, inst, 1.0, lam=res.lam) > 1e-2
    bad = res.x.copy()
    bad[1] *= 0.5
    assert kkt_residual(bad, inst, 1.0, lam=res.lam) > 1e-2


@pytest.mark.parametrize("alpha", [0.5, 2.0, 5.0])
def test_other_alpha_matches_long_best_response(monkeypatch: pytest.MonkeyPatch, alpha: float) -> None:
    converged = 0
    for seed in range(8):
        inst = _random_instance(100 + seed, 6, 4, 3, False, seed % 2 == 0, False)
        ref = _plain_sweeps(monkeypatch, inst, alpha, tol=1e-9, max_sweeps=20000)
        if not ref.converged:
            continue
        start = _plain_sweeps(monkeypatch, inst, alpha, max_sweeps=10).x
        res = ncp_newton(inst, alpha, start)
        _check_allocation(inst, res.x)
        if kkt_residual(res.x, inst, alpha, lam=res.lam) <= 1e-8:
            converged += 1
            # totals are unique where the solution is locally unique (002 Sec. 4.4)
            np.testing.assert_allclose(res.x.sum(axis=1), ref.x.sum(axis=1), rtol=1e-5)
    assert converged >= 5


# 5 users x 3 nodes x 3 resources (found by a random search): plain best response needs between 300 and 2,000
# sweeps at alpha = 20 (residual 1.5e-2 after 300, falling ~0.07 % per sweep; 3.6e-8 after 2,000)
D = [[0.23, 0.95, 0.38], [0.48, 0.84, 0.47], [0.59, 0.12, 0.78], [0.58, 0.4, 0.81], [0.37, 0.51, 0.22]]
C = [[11.0, 8.1, 8.9], [16.3, 9.2, 12.3], [19.7, 19.4, 15.9]]
E = [[1, 1, 1], [0, 1, 1], [1, 0, 1], [1, 1, 1], [1, 1, 1]]


def test_pf_vds_newton_finish_where_sweeps_are_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    inst = make_instance(D, C, np.array(E, dtype=bool))
    slow = _plain_sweeps(monkeypatch, inst, 20.0, max_sweeps=300)
    assert not slow.converged and slow.residual > 1e-3
    # reference: PS-MFA (independent code, Sec. 5.1), certified with its own prices
    ref = ps_mfa(inst, 20.0, tol=1e-8)
    assert kkt_residual(ref.x, inst, 20.0, lam=ref.lam) <= 1e-8
    res = pfvds.pf_vds(inst, 20.0)
    assert res.converged and res.method == "sweeps+newton" and res.iterations <= 50
    assert kkt_residual(res.x, inst, 20.0, lam=res.lam) == res.residual <= 1e-6
    _check_allocation(inst, res.x)
    np.testing.assert_allclose(res.x.sum(axis=1), ref.x.sum(axis=1), rtol=1e-5)


def test_start_without_tasks_for_a_user_is_rejected() -> None:
    inst = make_instance(D, C, np.array(E, dtype=bool))
    x0 = np.where(inst.eligible, 1.0, 0.0)
    x0[2] = 0.0
    with pytest.raises(ValueError, match="every user"):
        ncp_newton(inst, 2.0, x0)
