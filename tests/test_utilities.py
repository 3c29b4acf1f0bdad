"""allocator.utilities: values, supergradients, the argmax of u(t) - alpha t on [gamma, delta], spec strings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import utilities as U

F64 = torch.float64


def _grid_argmax(u: U.Utility, alpha: float, lo: float, hi: float) -> float:
    """Brute-force maximiser of u(t) - alpha t on a fine grid (reference for the analytic argmax)."""
    t = torch.linspace(lo, hi, 200001, dtype=F64)
    f = u.value(t) - alpha * t
    return float(t[int(torch.argmax(f))])


FAMILIES = [
    U.Linear(1.5),
    U.Log(2.0),
    U.Power(0.5),
    U.Power(-1.0, weight=0.5),
    U.Power(1.0),
    U.AlphaFair(0.0),
    U.AlphaFair(1.0),
    U.AlphaFair(2.0),
    U.AlphaFair(0.5),
    U.TargetPriority(0.7, weight=2.0),
]


@pytest.mark.parametrize("u", FAMILIES, ids=repr)
@settings(max_examples=25, deadline=None)
@given(
    alpha=st.floats(0.01, 5.0),
    lo=st.floats(0.05, 1.0),
    width=st.floats(0.01, 2.0),
)
def test_argmax_matches_brute_force(u: U.Utility, alpha: float, lo: float, width: float) -> None:
    u = u.to("cpu", F64)
    hi = lo + width
    one = torch.ones(1, dtype=F64)
    t = float(u.argmax(alpha * one, lo * one, hi * one)[0])
    assert lo - 1e-12 <= t <= hi + 1e-12
    ref = _grid_argmax(u, alpha, lo, hi)
    f = lambda x: float(u.value(torch.tensor([x], dtype=F64))[0]) - alpha * x  # noqa: E731
    # Same objective value (maximisers need not be unique for linear / target-priority).
    assert f(t) >= f(ref) - 1e-6 * max(1.0, abs(f(ref)))


@pytest.mark.parametrize("u", FAMILIES, ids=repr)
def test_derivative_is_a_supergradient(u: U.Utility) -> None:
    u = u.to("cpu", F64)
    t = torch.linspace(0.05, 3.0, 60, dtype=F64)
    du = u.derivative(t)
    for s in (0.01, 0.3, 1.0):
        # concavity: u(t + s) <= u(t) + u'(t) s and u(t - s) <= u(t) - u'(t) s
        assert torch.all(u.value(t + s) <= u.value(t) + du * s + 1e-9)
        inside = t - s > 0
        assert torch.all((u.value(t - s) <= u.value(t) - du * s + 1e-9)[inside])


def test_values_of_each_family() -> None:
    t = torch.tensor([0.25, 1.0, 4.0], dtype=F64)
    assert U.Log(2.0).to(dtype=F64).value(t).tolist() == pytest.approx((2 * np.log([0.25, 1, 4])).tolist())
    assert U.Power(0.5).to(dtype=F64).value(t).tolist() == pytest.approx([0.5, 1.0, 2.0])
    assert U.Power(-1.0).to(dtype=F64).value(t).tolist() == pytest.approx([-4.0, -1.0, -0.25])
    assert U.AlphaFair(2.0).to(dtype=F64).value(t).tolist() == pytest.approx([-4.0, -1.0, -0.25])
    assert U.AlphaFair(1.0).to(dtype=F64).value(t).tolist() == pytest.approx(np.log([0.25, 1, 4]).tolist())
    assert U.AlphaFair(0.0).to(dtype=F64).value(t).tolist() == pytest.approx([0.25, 1.0, 4.0])
    assert U.TargetPriority([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]).to(dtype=F64).value(t).tolist() == pytest.approx(
        [-0.75, 0.0, 0.0]
    )
    # log(0) is -inf, never NaN
    zero = torch.zeros(1, dtype=F64)
    assert torch.isneginf(U.Log().to(dtype=F64).value(zero)).all()
    assert U.TargetPriority(0.5).to(dtype=F64).value(zero).item() == -0.5


def test_per_job_parameters_take_and_to() -> None:
    u = U.TargetPriority(target=[0.1, 0.2, 0.3], weight=[1.0, 2.0, 3.0])
    assert u.n_jobs == 3
    sub = u.take(torch.tensor([2, 0]))
    assert sub.n_jobs == 2
    assert sub.target.tolist() == pytest.approx([0.3, 0.1])
    assert sub.weight.tolist() == pytest.approx([3.0, 1.0])
    assert U.Log().n_jobs is None
    assert u.to(dtype=torch.float32).target.dtype == torch.float32
    assert isinstance(u, U.Utility)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: U.Log(weight=[1.0, -1.0]), r"weight\[1\] \(job 1\)"),
        (lambda: U.TargetPriority(target=[0.2, 0.0, 0.3]), r"target\[1\] \(job 1\)"),
        (lambda: U.TargetPriority(target=0.2, weight=[1.0, float("nan")]), r"weight\[1\]"),
        (lambda: U.Power(0.0), r"p = 0.0"),
        (lambda: U.Power([0.5, 2.0]), r"p\[1\] \(job 1\)"),
        (lambda: U.AlphaFair(-1.0), r"alpha"),
    ],
)
def test_bad_parameters_raise_value_error_naming_the_job(call, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        call()


def test_from_spec() -> None:
    assert isinstance(U.from_spec("log", 5), U.Log)
    assert isinstance(U.from_spec("linear", 5), U.Linear)
    p = U.from_spec("power:0.5", 5)
    assert isinstance(p, U.Power) and float(p.p) == 0.5
    a = U.from_spec("alpha:2", 5)
    assert isinstance(a, U.AlphaFair) and float(a.alpha) == 2.0
    t = U.from_spec("target:0.2", 5)
    assert isinstance(t, U.TargetPriority) and float(t.target) == pytest.approx(0.2)
    tw = U.from_spec("target:0.2:1,2", 10000, seed=1)
    assert isinstance(tw, U.TargetPriority)
    w = np.asarray(tw.weight)
    assert set(np.unique(w).tolist()) == {1.0, 2.0}
    assert 0.45 < (w == 2.0).mean() < 0.55
    same = U.from_spec("target:0.2:1,2", 10000, seed=1)
    assert np.array_equal(np.asarray(same.weight), w)  # type: ignore[attr-defined]
    per_job = U.from_spec("log", 3, weight=[1.0, 2.0, 3.0])
    assert per_job.n_jobs == 3
    targets = U.from_spec("target:1", 2, target=[0.5, 0.7])
    assert targets.target.tolist() == pytest.approx([0.5, 0.7])  # type: ignore[attr-defined]
    for bad in ("cubic", "power", "power:x", "alpha:1:2", "target", "log:3", "target:0.2:"):
        with pytest.raises(ValueError):
            U.from_spec(bad, 3)
    with pytest.raises(ValueError, match="3 jobs"):
        U.from_spec("log", 3, weight=[1.0, 2.0])


def test_initial_prices_eq17_unit_demands() -> None:
    # eq. (17): x_i = R / n, p = (1/n) sum_i u'(a_i^T x_i) a_i
    a = torch.tensor([[1.0, 2.0], [3.0, 1.0], [2.0, 2.0]], dtype=F64)
    r = torch.tensor([0.6, 0.9], dtype=F64)
    p = U.initial_prices(U.Log().to(dtype=F64), a, r)
    x = r / 3
    t = a @ x
    expected = ((1 / t)[:, None] * a).mean(0)
    assert p.tolist() == pytest.approx(expected.tolist())


def test_gap_scale_is_the_utility_range_of_target_priority_and_n_elsewhere() -> None:
    """The scale of the default duality-gap tolerance (allocator.pricing.default_eps): w_i t_des_i summed over the
    jobs for target-priority (its utility runs from -w t_des at zero throughput to 0 at the target), n otherwise."""
    assert U.TargetPriority([0.2, 0.5], [1.0, 2.0]).gap_scale(2) == pytest.approx(0.2 + 1.0)
    assert U.TargetPriority(0.3, 2.0).gap_scale(4) == pytest.approx(4 * 0.6)
    assert U.from_spec("target:0.2:1,2", 1000, seed=0).gap_scale(1000) == pytest.approx(
        0.2 * float(U.from_spec("target:0.2:1,2", 1000, seed=0).weight.sum())  # type: ignore[attr-defined]
    )
    for util in (U.Log(), U.Linear(2.0), U.Power(0.5), U.AlphaFair(2.0)):
        assert util.gap_scale(7) == 7.0
