"""The compiled smoothed-level kernels (``allocator.fairness.psdsf._levels_kernels``) against the numpy code they
replace.

Reference: ``_Smooth.evaluate_dense``, the plain numpy evaluation of the log-sum-exp smoothed PS-DSF level equations
(paper 002 Sec. 2.3, Definition 4; eq. 9) that the level continuation used before the kernels, and its dense
``(k, n) @ (n, k)`` Jacobian. Checked on random instances (ineligible pairs, task caps, a server nobody may use, a
near-empty server whose tiny load makes tiny softmax weights matter) at temperatures from ``1`` (dense softmax) to
``1e-6`` (a few servers per user): flows, weights, capped users, saturated resources, ``F`` and the Jacobian from
both of its paths (the support kernel and the dense product).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.fairness import make_instance
from allocator.fairness.psdsf._levels import _Smooth
from allocator.fairness.psdsf._levels_kernels import smooth_jacobian


def _instance(seed: int, n: int, k: int, r: int, caps: bool, dead: bool):
    rng = np.random.default_rng(seed)
    d = rng.uniform(0.1, 1.0, (n, r))
    c = rng.uniform(10.0, 100.0, (k, r))
    e = rng.random((n, k)) < 0.5
    e[np.arange(n), rng.integers(0, k - 1 if dead else k, n)] = True
    if dead:
        e[:, k - 1] = False  # nobody may use the last server: it has no equation
    cap = np.where(rng.random(n) < 0.3, rng.uniform(0.5, 5.0, n), np.inf) if caps else None
    return make_instance(d, c, e, max_tasks=cap)


def _compare(inst, theta: np.ndarray, tau: float) -> None:
    sm = _Smooth(inst)
    f0, x0, w0, rk0, cap0, j0 = sm.evaluate_dense(theta, tau, True)
    pt = sm.evaluate(theta, tau)
    assert np.allclose(pt.x, x0, rtol=1e-12, atol=1e-300)
    assert np.allclose(pt.w, w0, rtol=1e-12, atol=1e-300)
    assert (pt.w[~inst.eligible] == 0).all()
    assert (pt.capped == cap0).all()
    assert (pt.rk == rk0).all()
    assert np.allclose(pt.f, f0, rtol=1e-12, atol=1e-12)
    # a live server whose weights all underflowed has load 0 and F = -inf; its Jacobian row is 0/0 (nan) in numpy,
    # and the continuation stops before using it; the kernels must give nan there too and agree elsewhere
    ok = np.isfinite(j0)
    assert (ok.all(axis=1) == np.isfinite(f0)).all()
    scale = 1.0 / tau + float(np.abs(j0[ok]).max())
    sparse = smooth_jacobian(pt.x, pt.w, pt.capped, pt.rk, pt.lk, sm.live, sm.demands, sm.cinv, tau, sm.cut)
    dense = sm._dense_jacobian(pt.x, pt.w, pt.rk, pt.capped, pt.lk, tau)
    for jac in (sparse, dense, sm.jacobian(pt, tau)):
        assert (np.isfinite(jac) == ok).all()
        assert np.abs(jac[ok] - j0[ok]).max() <= 1e-10 * scale


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(2, 30),
    k=st.integers(2, 12),
    r=st.integers(1, 4),
    log_tau=st.floats(-6.0, 0.0),
    caps=st.booleans(),
    dead=st.booleans(),
)
def test_kernels_match_numpy(seed: int, n: int, k: int, r: int, log_tau: float, caps: bool, dead: bool) -> None:
    inst = _instance(seed, n, k, r, caps, dead and k > 2)
    rng = np.random.default_rng(seed + 1)
    theta = -np.log(np.maximum(inst.eligible.sum(axis=0), 1.0)) + rng.normal(0.0, 0.5, inst.k)
    _compare(inst, theta, 10.0**log_tau)


def test_tiny_load_server_keeps_row_terms() -> None:
    """A server with a far lower level than the others gets only tiny softmax weights (load ~1e-30 of capacity):
    its Jacobian row is made of them alone, so the kernel must keep every positive weight as a row term."""
    inst = _instance(3, 40, 8, 3, False, False)
    for tau in (1e-2, 1e-3):
        theta = -np.log(np.maximum(inst.eligible.sum(axis=0), 1.0))
        theta[2] -= 60.0 * tau  # softmax weights of server 2 below exp(-60)
        pt = _Smooth(inst).evaluate(theta, tau)
        assert 0.0 < pt.lk[2] < 1e-20  # the case under test does occur
        _compare(inst, theta, tau)


def test_large_instance_both_jacobian_paths() -> None:
    """200 users x 100 servers at a dense (``tau = 1``) and a sparse (``tau = 1e-4``) softmax."""
    inst = _instance(7, 200, 100, 3, True, False)
    theta = -np.log(np.maximum(inst.eligible.sum(axis=0), 1.0))
    for tau in (1.0, 1e-4):
        _compare(inst, theta, tau)
