"""The state an incremental re-solve reuses (``previous=`` of :func:`allocator.pricing.solve`): :class:`Reuse`, what
a solve keeps of its best dual evaluation (004 Sec. 3: the dual function is a sum of independent per-job terms, so
at fixed prices a job whose data did not change has the same subproblem solution), and :func:`changed_rows`, the
jobs whose subproblem must be solved again.

A :class:`Reuse` is never written to after it is built: a re-solve patches copies of its buffers (the state of the
new result), so a result can seed any number of re-solves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from allocator._xp import Array, as_numpy, device_of, equal, flatnonzero, is_tensor, namespace, torch
from allocator.pricing.dual.subproblem import Subsolution
from allocator.pricing.problem import Problem
from allocator.utilities import Utility, UtilityBase

__all__ = ["Reuse", "changed_rows"]


@dataclass(frozen=True)
class Reuse:
    """What a later solve needs to reuse this solve's per-job subproblem solutions (``previous=`` of :func:`solve`):
    the evaluated problem (a private copy of the throughputs, after closed pools were masked), the utility it was
    solved with, and the subsolution at ``prices`` (the best dual prices, where a warm start begins)."""

    a: Array
    demand: Array | None
    utility: Utility
    prices: np.ndarray
    sol: Subsolution
    capacity: Array
    r_local: np.ndarray | None  #: the sums of the evaluation at ``prices`` (see :class:`Evaluation`)
    net_local: float
    u_local: float


def _same(x: Any, y: Any) -> bool:
    arrays = (np.ndarray,)
    if is_tensor(x) or is_tensor(y) or isinstance(x, arrays) or isinstance(y, arrays):
        return tuple(np.shape(x)) == tuple(np.shape(y)) and equal(x, y)
    return bool(x == y)


def changed_rows(state: Reuse, prob: Problem) -> Array | None:
    """Rows of ``prob`` whose subproblem may differ from the one ``state`` solved (throughputs, demands or utility
    parameters changed), or ``None`` when nothing can be reused (other shapes, dtype, route or device, another
    utility family or a changed shared parameter; utilities outside :class:`allocator.utilities.UtilityBase`)."""
    a, old = prob.a, state.a
    if (
        is_tensor(a) != is_tensor(old)
        or a.shape != old.shape
        or a.dtype != old.dtype
        or device_of(a) != device_of(old)
    ):
        return None
    xp = namespace(a)
    if device_of(a) == "cpu":
        from allocator.pricing._compiled.kernels import rows_differ

        mask = rows_differ(np.ascontiguousarray(as_numpy(a)), np.ascontiguousarray(as_numpy(old)))
        changed = torch().from_numpy(mask) if is_tensor(a) else mask
    else:
        changed = xp.any(a != old, axis=1)
    d, od = prob.demand, state.demand
    if d is not None or od is not None:
        # ``None`` means a demand of 1 for every job
        d_: Any = 1.0 if d is None else d
        od_: Any = 1.0 if od is None else od
        if d is not None and od is not None and d.shape != od.shape:
            return None
        diff = d_ != od_
        changed = changed | (diff if diff.ndim == 1 else xp.any(diff, axis=1))
    u, ou = prob.utility, state.utility
    if type(u) is not type(ou) or not isinstance(u, UtilityBase):
        return None
    mine, theirs = vars(u), vars(ou)
    if mine.keys() != theirs.keys():
        return None
    for name, value in mine.items():
        other = theirs[name]
        per_job = name in u._params and getattr(value, "ndim", 0) == 1 and getattr(other, "ndim", 0) == 1
        if per_job and is_tensor(value) == is_tensor(other):
            if other.shape != value.shape:
                return None
            changed = changed | (value != other)
        elif not _same(value, other):
            return None
    return flatnonzero(changed)
