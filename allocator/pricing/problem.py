"""Problem data and input handling: validation and conversion of throughputs, capacities, demands and utility
(:func:`prepare`), device and dtype resolution, and the change detection of an incremental re-solve
(:func:`changed_rows`). The problem is eq. (4) of 004 with the per-job demands of its Sec. 7.1."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from allocator.pricing.result import Reuse
from allocator.utilities import Utility, UtilityBase

__all__ = ["Problem", "changed_rows", "prepare", "resolve_device", "resolve_dtype", "to_tensor", "validate_throughput"]

ArrayLike = Any


def resolve_device(device: torch.device | str | None, *inputs: Any) -> torch.device:
    """``device=None``: the device of a torch tensor input, else CUDA when available, else CPU."""
    if device is not None:
        return torch.device(device)
    for x in inputs:
        if isinstance(x, Tensor):
            return x.device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_dtype(dtype: torch.dtype | str | np.dtype | type | None) -> torch.dtype:
    """``None`` -> float32; accepts torch dtypes, numpy dtypes and the names float32/float64."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        out = dtype
    else:
        name = np.dtype(dtype).name
        out = {"float32": torch.float32, "float64": torch.float64}.get(name)  # type: ignore[assignment]
        if out is None:
            raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
    if out not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
    return out


def to_tensor(name: str, x: ArrayLike, device: torch.device, dtype: torch.dtype) -> Tensor:
    if isinstance(x, Tensor):
        t = x.detach()
    else:
        arr = np.asarray(x)
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
            raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
        t = torch.from_numpy(np.ascontiguousarray(arr))
    return t.to(device=device, dtype=dtype)


def first_bad(name: str, bad: Tensor, values: Tensor, rule: str) -> None:
    if bool(bad.any()):
        idx = tuple(int(v) for v in torch.nonzero(bad)[0])
        val = float(values[idx])
        where = f"{name}[{', '.join(map(str, idx))}]"
        if name in ("throughput", "demand") and len(idx) >= 1:
            who = f"job {idx[0]}" + (f", pool {idx[1]}" if len(idx) == 2 else "")
        elif name in ("capacity", "prices"):
            who = f"pool {idx[0]}"
        else:
            who = ""
        raise ValueError(f"{where} = {val!r} ({who}): {name} must be {rule}")


@dataclass
class Problem:
    a: Tensor  # (n, m)
    capacity: Tensor  # (m,)
    demand: Tensor | None  # None, (n,) or (n, m)
    utility: Utility


def prepare(
    throughput: ArrayLike,
    capacity: ArrayLike,
    utility: Utility,
    demand: ArrayLike | None,
    device: torch.device,
    dtype: torch.dtype,
    check_throughput: bool = True,
) -> Problem:
    """Validate and convert the inputs (``check_throughput=False``: the caller validates the throughputs)."""
    a = to_tensor("throughput", throughput, device, dtype)
    if a.ndim != 2:
        raise ValueError(f"throughput must be a 2-d array (jobs x pools), got shape {tuple(a.shape)}")
    n, m = a.shape
    if m == 0:
        raise ValueError("throughput has no columns: there must be at least one pool")
    if check_throughput:
        validate_throughput(a)
    cap = to_tensor("capacity", capacity, device, dtype)
    if cap.ndim != 1 or cap.shape[0] != m:
        raise ValueError(f"capacity has shape {tuple(cap.shape)} but throughput has {m} pools: expected ({m},)")
    first_bad("capacity", ~torch.isfinite(cap) | (cap < 0), cap, "finite and non-negative")
    d: Tensor | None = None
    if demand is not None:
        d = to_tensor("demand", demand, device, dtype)
        if d.ndim == 0:
            d = d.expand(n)
        if d.shape not in ((n,), (n, m)):
            raise ValueError(f"demand has shape {tuple(d.shape)}: expected a scalar, ({n},) or ({n}, {m})")
        first_bad("demand", ~torch.isfinite(d) | (d <= 0), d, "finite and positive")
        if d.ndim == 1 and bool((d == 1).all()):
            d = None
    if not isinstance(utility, Utility):
        raise ValueError(f"utility must implement allocator.utilities.Utility, got {type(utility).__name__}")
    nu = utility.n_jobs
    if nu is not None and nu != n:
        raise ValueError(f"utility has parameters for {nu} jobs but throughput has {n} rows (jobs)")
    return Problem(a=a, capacity=cap, demand=d, utility=utility.to(device=device, dtype=dtype))


def validate_throughput(a: Tensor, rows: Tensor | None = None) -> None:
    """``ValueError`` naming the first NaN, infinite or negative throughput (only ``rows`` are scanned when given:
    the others are known to be valid; the message then still names the first bad entry of the whole matrix)."""
    sub = a if rows is None else a.index_select(0, rows)
    if sub.numel() == 0:
        return
    # One reduction pass without n x m temporaries: min and max propagate NaN, so ``lo >= 0 and hi < inf`` holds
    # exactly when every entry is finite and non-negative. The full scan that names the entry runs only on failure.
    lo, hi = torch.aminmax(sub)
    if not (bool(lo >= 0) and bool(hi < torch.inf)):
        first_bad("throughput", ~torch.isfinite(a) | (a < 0), a, "finite and non-negative")


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, Tensor) or isinstance(y, Tensor):
        return isinstance(x, Tensor) and isinstance(y, Tensor) and x.shape == y.shape and bool(torch.equal(x, y))
    return bool(x == y)


def changed_rows(state: Reuse, prob: Problem) -> Tensor | None:
    """Rows of ``prob`` whose subproblem may differ from the one ``state`` solved (throughputs, demands or utility
    parameters changed), or ``None`` when nothing can be reused (other shapes, dtype or device, another utility
    family or a changed shared parameter; utilities outside :class:`allocator.utilities.UtilityBase`)."""
    a, old = prob.a, state.a
    if a.shape != old.shape or a.dtype != old.dtype or a.device != old.device:
        return None
    if a.device.type == "cpu":
        from allocator.pricing.kernels import rows_differ

        changed = torch.from_numpy(rows_differ(a.contiguous().numpy(), old.contiguous().numpy()))
    else:
        changed = (a != old).any(dim=1)
    d, od = prob.demand, state.demand
    if d is not None or od is not None:
        one = torch.ones((), dtype=a.dtype, device=a.device)  # ``None`` means a demand of 1 for every job
        d_, od_ = (one if d is None else d), (one if od is None else od)
        if d is not None and od is not None and d.shape != od.shape:
            return None
        diff = d_ != od_
        changed |= diff if diff.ndim == 1 else diff.any(dim=1)
    u, ou = prob.utility, state.utility
    if type(u) is not type(ou) or not isinstance(u, UtilityBase):
        return None
    mine, theirs = vars(u), vars(ou)
    if mine.keys() != theirs.keys():
        return None
    for name, value in mine.items():
        other = theirs[name]
        if name in u._params and isinstance(value, Tensor) and isinstance(other, Tensor) and value.ndim == 1:
            if other.shape != value.shape:
                return None
            changed |= value != other
        elif not _same(value, other):
            return None
    return torch.nonzero(changed).squeeze(1)
