"""Vectorised utility functions of throughput for price discovery (paper 004, Sec. 2.2 and Sec. 4.2).

Every utility here is a *concave, nondecreasing* function ``u_i(t)`` of a job's throughput ``t >= 0``, with
per-job parameters held as float64 arrays (a 0-d array is shared by all jobs, a 1-d array of length ``n`` gives one
value per job): numpy arrays, or torch tensors on the torch route of :mod:`allocator.pricing` (the code is written
once for both, :mod:`allocator._xp`). The families are

========================  =============================================================  ==============================
class                     ``u_i(t)``                                                     spec string
========================  =============================================================  ==============================
:class:`Linear`           ``w_i t``                                                      ``"linear"``
:class:`Log`              ``w_i log t`` (eq. 1)                                          ``"log"``
:class:`Power`            ``w_i t^p`` for ``p in (0, 1]``, ``-w_i t^p`` for ``p < 0``    ``"power:P"``
:class:`AlphaFair`        ``w_i t^(1-a)/(1-a)``, ``w_i log t`` at ``a = 1`` (Sec. 2.2)   ``"alpha:A"``
:class:`TargetPriority`   ``w_i min(t - t_des_i, 0)`` (eq. 2)                            ``"target:T[:W1,W2]"``
========================  =============================================================  ==============================

``w_i > 0`` is a per-job weight (priority) available in every family.

The protocol
------------
The price-discovery engine (:mod:`allocator.pricing`) touches a utility only through the :class:`Utility` protocol.
To add a utility, write a class with these members, all vectorised over jobs (arrays of shape ``(k,)`` where ``k``
is the number of jobs the object currently describes):

``value(t)``
    ``u_i(t_i)``; ``-inf`` where the utility is unbounded below (``log 0``), never NaN for ``t >= 0``.
``derivative(t)``
    a supergradient of ``u_i`` at ``t_i`` (``+inf`` allowed at ``t = 0``); used for the initial prices (eq. 17).
``argmax(alpha, gamma, delta)``
    a maximiser of ``u_i(t) - (alpha_i t + beta_i)`` over ``t in [gamma_i, delta_i]`` with ``alpha_i >= 0``
    (``beta`` shifts the value only, so it is not passed). This is step 2 of Algorithm 1: ``c(t)`` is affine on each
    hull segment. ``alpha`` may be 0 (free resource); ``gamma <= delta`` always. For strictly concave ``u`` this is
    eq. (15), ``clip((u')^{-1}(alpha), gamma, delta)``; for target-priority it is eq. (16).
``take(index)``
    the same utility restricted to the jobs ``index`` (an int64 array), in that order.
``to(device, dtype)``
    a copy with its arrays on ``device`` in floating dtype ``dtype`` (a numpy dtype: numpy arrays; a torch dtype
    or a CUDA device: torch tensors).
``n_jobs``
    the number of jobs with their own parameters, or ``None`` if every parameter is shared.

Concavity is required: the subproblem solver walks the segments of the convex cost ``c(t)`` left to right and stops
at the first segment whose maximiser lies left of its right end, which is a global maximiser exactly when
``u - c`` is concave. :class:`UtilityBase` supplies ``take``/``to``/``n_jobs`` for classes whose parameters are
array attributes listed in ``_params``.

Spec strings
------------
:func:`from_spec` builds a utility from a short string, as used by ``walras solve --utility`` and the planner:

- ``"linear"``, ``"log"``: the families above with unit weights;
- ``"power:P"``: :class:`Power` with exponent ``P`` (``0 < P <= 1`` or ``P < 0``);
- ``"alpha:A"``: :class:`AlphaFair` with ``A >= 0``;
- ``"target:T"``: :class:`TargetPriority` with target ``T > 0`` for every job and unit weights;
- ``"target:T:W1,W2,..."``: the same with each job's weight drawn uniformly from ``{W1, W2, ...}`` using
  ``numpy.random.default_rng(seed)`` (``"target:0.2:1,2"`` is the instance of 004 Sec. 6.2).

Keyword arguments of :func:`from_spec` override the spec: ``weight`` (per-job weights for any family) and
``target`` (per-job targets for ``target``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from allocator._xp import Array, as_numpy, convert, flatnonzero, fsum, index_like, is_tensor, namespace, zeros

__all__ = [
    "AlphaFair",
    "Linear",
    "Log",
    "Power",
    "TargetPriority",
    "Utility",
    "UtilityBase",
    "as_param",
    "from_spec",
    "initial_prices",
]

ArrayLike = Any


@runtime_checkable
class Utility(Protocol):
    """What the price-discovery engine needs from a utility (see the module docstring). Arrays are numpy arrays on
    the CPU route and torch tensors on the torch route (:mod:`allocator._xp`); ``to`` moves a utility between them."""

    @property
    def n_jobs(self) -> int | None: ...

    def value(self, t: Array) -> Array: ...

    def derivative(self, t: Array) -> Array: ...

    def argmax(self, alpha: Array, gamma: Array, delta: Array) -> Array: ...

    def take(self, index: Array) -> Utility: ...

    def to(self, device: Any = None, dtype: Any = None) -> Utility: ...


def as_param(name: str, value: ArrayLike, *, positive: bool = False, nonnegative: bool = False) -> Array:
    """Convert a scalar or 1-d array of per-job parameters to a float64 array, validating it (a numpy array; a
    float64 tensor on the input's device when ``value`` is a torch tensor).

    Raises ``ValueError`` naming ``name`` and the first offending job index when a value is NaN/inf, or not
    positive (``positive=True``) / negative (``nonnegative=True``).
    """
    arr = value.detach().double() if is_tensor(value) else np.array(value, dtype=np.float64)
    if arr.ndim > 1:
        raise ValueError(f"{name} must be a scalar or a 1-d array of per-job values, got shape {tuple(arr.shape)}")
    xp = namespace(arr)
    flat = arr.reshape(-1)
    bad = ~xp.isfinite(flat)
    what = "finite"
    if positive:
        bad |= flat <= 0
        what = "finite and positive"
    elif nonnegative:
        bad |= flat < 0
        what = "finite and non-negative"
    if bool(bad.any()):
        i = int(flatnonzero(bad)[0])
        where = f"{name}[{i}] (job {i})" if arr.ndim == 1 else name
        raise ValueError(f"{where} = {float(flat[i])!r}: must be {what}")
    return arr


def _clip(t: Array, lo: Array, hi: Array) -> Array:
    # clip with array bounds; NaN-free as long as lo <= hi and t is not NaN.
    xp = namespace(t)
    return xp.minimum(xp.maximum(t, lo), hi)


class UtilityBase:
    """Shared plumbing: per-job array parameters named in ``_params`` support ``take``, ``to`` and ``n_jobs``."""

    _params: tuple[str, ...] = ()

    def _with(self, changes: dict[str, Array]) -> Any:
        new = copy.copy(self)
        new.__dict__.update(changes)
        return new

    @property
    def n_jobs(self) -> int | None:
        sizes = {int(getattr(self, p).shape[0]) for p in self._params if getattr(self, p).ndim == 1}
        if len(sizes) > 1:
            raise ValueError(f"{type(self).__name__}: per-job parameters have different lengths {sorted(sizes)}")
        return sizes.pop() if sizes else None

    def take(self, index: Array) -> Any:
        changes = {}
        for p in self._params:
            v = getattr(self, p)
            if v.ndim == 1:
                changes[p] = v[index_like(index, v)]
        return self._with(changes) if changes else self

    def to(self, device: Any = None, dtype: Any = None) -> Any:
        """A copy with its parameters in ``dtype`` on ``device``: numpy arrays for a numpy dtype (or name) on the CPU,
        torch tensors for a torch dtype or a device other than ``"cpu"`` (:func:`allocator._xp.convert`)."""
        changes = {p: convert(getattr(self, p), device, dtype) for p in self._params}
        return self._with(changes)

    #: Family code of the compiled hull walk (:mod:`allocator.pricing._compiled.numba_kernels`) and the attribute
    #: holding its second per-job parameter; ``None`` (user-defined utilities) keeps the subproblem on the vectorised
    #: path.
    _kernel_family: int | None = None
    _kernel_param: str | None = None
    weight: Array  #: per-job weights ``w_i`` (every built-in family has them)

    def kernel_spec(self) -> tuple[int, np.ndarray, np.ndarray] | None:
        """``(family, w, q)`` for the compiled CPU hull walk: weights and the family's parameter as float64 arrays of
        length ``n`` or 1; ``None`` when this utility has no compiled form."""
        if self._kernel_family is None:
            return None

        def flat(x: Array | None) -> np.ndarray:
            if x is None:
                return np.zeros(1)
            return np.ascontiguousarray(as_numpy(x).astype(np.float64).reshape(-1))

        q = getattr(self, self._kernel_param) if self._kernel_param is not None else None
        return self._kernel_family, flat(self.weight), flat(q)

    def gap_scale(self, n: int) -> float:
        """``sum_i s_i`` over the ``n`` jobs: the scale of the default duality-gap tolerance ``1e-3 sum_i s_i`` of
        :func:`allocator.pricing.default_eps`. ``s_i = 1``, the ``1e-3 n`` of 004 Sec. 5 (for log utility a 0.1 %
        error in throughput); families with a natural utility range override it."""
        return float(n)

    def __repr__(self) -> str:
        parts = []
        for name in self._params:
            v = getattr(self, name)
            parts.append(f"{name}={float(v):g}" if v.ndim == 0 else f"{name}=<{v.shape[0]} values>")
        return f"{type(self).__name__}({', '.join(parts)})"


def _weight(weight: ArrayLike) -> Array:
    return as_param("weight", weight, positive=True)


class Linear(UtilityBase):
    """``u_i(t) = w_i t``: total (weighted) throughput (Sec. 2.2)."""

    _kernel_family = 0

    def __init__(self, weight: ArrayLike = 1.0) -> None:
        self.weight = _weight(weight)
        self._params = ("weight",)

    def value(self, t: Array) -> Array:
        return self.weight * t

    def derivative(self, t: Array) -> Array:
        return self.weight * namespace(t).ones_like(t)

    def argmax(self, alpha: Array, gamma: Array, delta: Array) -> Array:
        # Linear net utility (w - alpha) t: right end when w > alpha, left end otherwise.
        return namespace(alpha).where(self.weight > alpha, delta, gamma)


class Log(UtilityBase):
    """``u_i(t) = w_i log t`` (eq. 1): proportional fairness. ``u(0) = -inf``."""

    _kernel_family = 1

    def __init__(self, weight: ArrayLike = 1.0) -> None:
        self.weight = _weight(weight)
        self._params = ("weight",)

    def value(self, t: Array) -> Array:
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.weight * namespace(t).log(t)

    def derivative(self, t: Array) -> Array:
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.weight / t

    def argmax(self, alpha: Array, gamma: Array, delta: Array) -> Array:
        # eq. (15): u'(t) = w / t = alpha  ->  t = w / alpha (inf when alpha = 0), projected on [gamma, delta].
        with np.errstate(divide="ignore", invalid="ignore"):
            return _clip(self.weight / alpha, gamma, delta)


class Power(UtilityBase):
    """Power (CRRA) utility: ``w_i t^p`` for ``p in (0, 1]``, ``-w_i t^p`` for ``p < 0`` (Sec. 2.2).

    ``p`` may differ per job. ``p = 1`` is linear utility.
    """

    _kernel_family = 2
    _kernel_param = "p"

    def __init__(self, p: ArrayLike, weight: ArrayLike = 1.0) -> None:
        pt = as_param("p", p)
        bad = (pt == 0) | (pt > 1)
        if bool(bad.any()):
            i = int(flatnonzero(bad.reshape(-1))[0])
            where = f"p[{i}] (job {i})" if pt.ndim == 1 else "p"
            raise ValueError(f"{where} = {float(pt.reshape(-1)[i])!r}: power utility needs p in (0, 1] or p < 0")
        self.p = pt
        self.weight = _weight(weight)
        self._params = ("p", "weight")

    def value(self, t: Array) -> Array:
        xp = namespace(t)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return self.weight * xp.sign(self.p) * xp.pow(t, self.p)

    def derivative(self, t: Array) -> Array:
        xp = namespace(t)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return self.weight * xp.abs(self.p) * xp.pow(t, self.p - 1)

    def argmax(self, alpha: Array, gamma: Array, delta: Array) -> Array:
        # u'(t) = w |p| t^(p-1) = alpha  ->  t = (alpha / (w |p|))^(1/(p-1)); p = 1 is linear.
        xp = namespace(alpha)
        p = self.p
        linear = p == 1
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            expo = 1.0 / xp.where(linear, -1.0, p - 1)
            t = xp.pow(alpha / (self.weight * xp.abs(p)), expo)
        if bool(linear.any()):
            t = xp.where(linear, xp.where(self.weight > alpha, delta, gamma), t)
        return _clip(t, gamma, delta)


class AlphaFair(UtilityBase):
    """Alpha-fair utility (Sec. 2.2): ``w_i t^(1-a)/(1-a)`` for ``a != 1``, ``w_i log t`` for ``a = 1``.

    ``a = 0`` is linear, ``a = 1`` log; a large ``a`` approximates max-min fairness. ``a`` may differ per job.
    """

    _kernel_family = 3
    _kernel_param = "alpha"

    def __init__(self, alpha: ArrayLike, weight: ArrayLike = 1.0) -> None:
        self.alpha = as_param("alpha", alpha, nonnegative=True)
        self.weight = _weight(weight)
        self._params = ("alpha", "weight")

    def value(self, t: Array) -> Array:
        xp = namespace(t)
        a = self.alpha
        is_log = a == 1
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            one_minus = xp.where(is_log, 1.0, 1 - a)
            power = xp.pow(t, one_minus) / one_minus
            if bool(is_log.any()):
                power = xp.where(is_log, xp.log(t), power)
        return self.weight * power

    def derivative(self, t: Array) -> Array:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return self.weight * namespace(t).pow(t, -self.alpha)

    def argmax(self, alpha: Array, gamma: Array, delta: Array) -> Array:
        # u'(t) = w t^(-a) = alpha  ->  t = (w / alpha)^(1/a); a = 0 is linear.
        xp = namespace(alpha)
        a = self.alpha
        linear = a == 0
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            t = xp.pow(self.weight / alpha, 1.0 / xp.where(linear, 1.0, a))
        if bool(linear.any()):
            t = xp.where(linear, xp.where(self.weight > alpha, delta, gamma), t)
        return _clip(t, gamma, delta)


class TargetPriority(UtilityBase):
    """Target-priority utility (eq. 2): ``w_i min(t - t_des_i, 0)`` with ``w_i > 0`` and ``t_des_i > 0``."""

    _kernel_family = 4
    _kernel_param = "target"

    def __init__(self, target: ArrayLike, weight: ArrayLike = 1.0) -> None:
        self.target = as_param("target", target, positive=True)
        self.weight = _weight(weight)
        self._params = ("target", "weight")

    def value(self, t: Array) -> Array:
        return self.weight * namespace(t).clip(t - self.target, None, 0.0)

    def derivative(self, t: Array) -> Array:
        # Supergradient: w below the target, 0 at or above it.
        return namespace(t).where(t < self.target, self.weight, 0.0)

    def gap_scale(self, n: int) -> float:
        """``sum_i w_i t_des_i``: job ``i``'s utility ranges over ``[-w_i t_des_i, 0]`` (zero throughput to the target),
        so a gap of ``1e-3 w_i t_des_i`` per job is the paper's 0.1 % accuracy in throughput (004 Sec. 5 states
        ``1e-3 n`` for utilities of order one per job; this utility is of order ``w t_des`` per job)."""
        scale = self.weight * self.target
        return fsum(namespace(scale).broadcast_to(scale, (n,))) if n else 0.0

    def argmax(self, alpha: Array, gamma: Array, delta: Array) -> Array:
        # eq. (16): climb to the target (or as far as allowed) only when the marginal value w beats the price slope.
        return namespace(alpha).where(self.weight > alpha, _clip(self.target, gamma, delta), gamma)


def initial_prices(utility: Utility, throughput: Array, capacity: Array, demand: Array | None = None) -> Array:
    """Initial prices of eq. (17), generalised to demands.

    Every job gets the same share ``x_ij = R_j / D_j`` of each pool (``D_j = sum_i d_ij``, so the shares use exactly
    the capacity), rows scaled down when ``1^T x_i > 1`` (the ``kappa`` of Sec. 5). The price of pool ``j`` is the
    sensitivity of the total utility to its capacity, ``p_j = (1/R_j) sum_i u_i'(a_i^T x_i) a_ij x_ij`` (which is
    ``(1/n) sum_i u_i'(t_i) a_ij`` for unit demands). Pools with ``R_j = 0`` get the largest other price. Arrays of
    either library (:mod:`allocator._xp`); the result is in the throughputs' library and dtype.
    """
    xp = namespace(throughput)
    n, m = throughput.shape
    if n == 0:
        return zeros(m, like=throughput)
    if demand is None:
        total = xp.full_like(capacity, float(n))
    elif demand.ndim == 1:
        total = demand.sum() * xp.ones_like(capacity)
    else:
        total = xp.sum(demand, axis=0)
    share = xp.where(total > 0, capacity / xp.clip(total, 1e-30, None), 0.0)
    x = xp.broadcast_to(share, (n, m))
    rowsum = xp.sum(x, axis=1)
    scale = 1.0 / xp.clip(rowsum, 1.0, None)
    t = xp.sum(throughput * x, axis=1) * scale
    du = utility.derivative(t)
    du = xp.where(xp.isfinite(du), du, 0.0)
    weighted = (du * scale)[:, None] * throughput * x
    p = xp.sum(weighted, axis=0) / xp.clip(capacity, 1e-30, None)
    p = xp.where(capacity > 0, p, 0.0)
    if bool((capacity <= 0).any()) and bool((capacity > 0).any()):
        p = xp.where(capacity > 0, p, xp.amax(p[capacity > 0]))
    return xp.clip(p, 0.0, None)


def _parse_float(text: str, what: str, spec: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"utility spec {spec!r}: {what} {text!r} is not a number") from None
    if not math.isfinite(v):
        raise ValueError(f"utility spec {spec!r}: {what} must be finite")
    return v


def from_spec(
    spec: str,
    n: int,
    *,
    weight: ArrayLike | None = None,
    target: ArrayLike | None = None,
    seed: int | np.random.Generator | None = 0,
) -> Utility:
    """Build a utility for ``n`` jobs from a spec string (grammar in the module docstring).

    ``weight`` (scalar or length-``n``) sets per-job weights for any family; ``target`` (scalar or length-``n``) sets
    the targets of ``target:`` specs (the ``T`` in the spec is then ignored). Weight lists in a ``target:T:W1,W2``
    spec are sampled with ``numpy.random.default_rng(seed)``.
    """
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    parts = spec.strip().split(":")
    kind = parts[0].strip().lower()

    def check_len(name: str, v: ArrayLike | None) -> ArrayLike | None:
        if v is not None and np.ndim(v) == 1 and len(v) != n:
            raise ValueError(f"{name} has {len(v)} values but there are {n} jobs")
        return v

    weight = check_len("weight", weight)
    target = check_len("target", target)
    w = 1.0 if weight is None else weight
    if kind in ("linear", "log"):
        if len(parts) != 1:
            raise ValueError(f"utility spec {spec!r}: {kind!r} takes no parameter")
        return Linear(w) if kind == "linear" else Log(w)
    if kind in ("power", "alpha"):
        if len(parts) != 2:
            raise ValueError(f"utility spec {spec!r}: expected '{kind}:<number>'")
        v = _parse_float(parts[1], "exponent" if kind == "power" else "alpha", spec)
        return Power(v, w) if kind == "power" else AlphaFair(v, w)
    if kind == "target":
        if len(parts) not in (2, 3):
            raise ValueError(f"utility spec {spec!r}: expected 'target:T' or 'target:T:W1,W2,...'")
        t_des: ArrayLike = _parse_float(parts[1], "target", spec) if target is None else target
        if len(parts) == 3 and weight is None:
            choices = [_parse_float(x, "weight", spec) for x in parts[2].split(",") if x.strip()]
            if not choices:
                raise ValueError(f"utility spec {spec!r}: empty weight list")
            rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
            w = np.asarray(choices, dtype=np.float64)[rng.integers(0, len(choices), size=n)]
        return TargetPriority(t_des, w)
    raise ValueError(
        f"unknown utility spec {spec!r}: expected one of linear, log, power:P, alpha:A, target:T[:W1,W2,...]"
    )


def spec_names() -> Sequence[str]:
    """The spec-string forms :func:`from_spec` accepts (for help texts)."""
    return ("linear", "log", "power:P", "alpha:A", "target:T[:W1,W2,...]")
