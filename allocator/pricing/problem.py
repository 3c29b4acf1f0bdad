"""Problem data and input handling: the route table (which array library and device a solve runs on,
:func:`resolve_route`), validation and conversion of throughputs, capacities, demands and utility (:func:`prepare`). The
problem is eq. (4) of 004 with the per-job demands of its Sec. 7.1 (the change detection of an incremental re-solve is
:func:`allocator.pricing.dual.reuse.changed_rows`).

Routes (:func:`resolve_route`; the array code is the same for both, :mod:`allocator._xp`):

==========  ====================================================================  ================================
route       when                                                                  arrays
==========  ====================================================================  ================================
``torch``   ``backend="torch"``; or a ``torch.distributed`` group (``group=``);   torch tensors on the device: the
            or a torch tensor among the inputs; or a device other than ``"cpu"``  input tensor's, the one given, or
            (e.g. ``"cuda"``); or ``device=None``/``"auto"`` on a machine with    ``"cuda"`` (auto with CUDA),
            CUDA (:func:`cuda_available`)                                         else ``"cpu"``
``numpy``   otherwise: CPU solves of numpy (or list) inputs                       numpy arrays; torch is never
                                                                                  imported
==========  ====================================================================  ================================

``backend="numpy"`` with a condition of the torch route other than auto-detected CUDA is a ``ValueError``.
:func:`cuda_available` decides "auto" without importing torch where no NVIDIA driver is installed: torch is imported
(to ask ``torch.cuda.is_available()``) only when it is installed *and* a driver is present
(``/proc/driver/nvidia/version`` or a loadable ``libcuda``). Importing torch costs 3.2-3.8 s on this project's 2-core
machine, more than a 10^6-job solve (docs/design-choices.md).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from allocator._xp import (
    FLOATS,
    Array,
    as_numpy,
    device_of,
    dtype_name,
    is_tensor,
    is_torch_dtype,
    namespace,
    torch,
)
from allocator.utilities import Utility

__all__ = [
    "Backend",
    "Problem",
    "Route",
    "cuda_available",
    "prepare",
    "resolve_device",
    "resolve_dtype",
    "resolve_route",
    "to_array",
    "validate_throughput",
]

ArrayLike = Any
Backend = Literal["numpy", "torch"]


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    """Whether a CUDA device can be used, deciding without importing torch where there is no NVIDIA driver: torch
    must be installed (``importlib.util.find_spec``) and a driver present (``/proc/driver/nvidia/version``, or
    ``libcuda.so.1`` loadable); only then is torch imported and ``torch.cuda.is_available()`` asked. Cached per
    process."""
    if importlib.util.find_spec("torch") is None:
        return False
    if not os.path.exists("/proc/driver/nvidia/version"):
        try:
            ctypes.CDLL("libcuda.so.1")
        except OSError:
            return False
    return bool(torch().cuda.is_available())


@dataclass(frozen=True)
class Route:
    """Where a solve runs: the array ``backend`` (``"numpy"`` or ``"torch"``), the ``device`` (``"cpu"``,
    ``"cuda"``, ``"cuda:1"``) and the working ``dtype`` (``"float32"`` or ``"float64"``)."""

    backend: Backend
    device: str
    dtype: str

    def array_dtype(self) -> Any:
        """The working dtype as the backend's dtype object."""
        return getattr(torch(), self.dtype) if self.backend == "torch" else np.dtype(self.dtype)

    def with_dtype(self, dtype: str) -> Route:
        return Route(self.backend, self.device, dtype)

    def to_utility(self, utility: Utility) -> Utility:
        """``utility`` with its parameters on this route (numpy arrays, or tensors on the device)."""
        if self.backend == "torch":
            return utility.to(device=torch().device(self.device), dtype=self.array_dtype())
        return utility.to(device="cpu", dtype=self.array_dtype())


def _device_name(device: Any) -> str | None:
    """``None`` for "auto" (``None`` or ``"auto"``), else the device as a string (``torch.device`` accepted)."""
    if device is None:
        return None
    name = str(device)
    return None if name == "auto" else name


def resolve_route(
    device: Any = None, dtype: Any = None, backend: str | None = None, inputs: tuple[Any, ...] = (), group: Any = None
) -> Route:
    """The route of a solve (the table in the module docstring): backend, device and working dtype."""
    if backend not in (None, "numpy", "torch"):
        raise ValueError(f"backend must be 'numpy' or 'torch', got {backend!r}")
    dt = resolve_dtype(dtype)
    name = _device_name(device)
    tensor = next((x for x in inputs if is_tensor(x)), None)
    why = (
        "a torch.distributed group"
        if group is not None
        else "a torch tensor input"
        if tensor is not None
        else f"device {name!r}"
        if name not in (None, "cpu") or is_torch_dtype(dtype)
        else None
    )
    if backend == "numpy":
        if why is not None:
            raise ValueError(f"backend='numpy' runs on the CPU with numpy arrays; {why} needs backend='torch'")
        return Route("numpy", "cpu", dt)
    if why is None and backend is None:
        if name is None and cuda_available():
            return Route("torch", "cuda", dt)
        return Route("numpy", "cpu", dt)
    if name is None:
        name = device_of(tensor) if tensor is not None else ("cuda" if cuda_available() else "cpu")
    return Route("torch", str(torch().device(name)), dt)


def resolve_device(device: Any = None, *inputs: Any) -> str:
    """The device a solve with these arguments runs on (``"cpu"``, ``"cuda"``, ...), by :func:`resolve_route`."""
    return resolve_route(device, None, None, inputs).device


def resolve_dtype(dtype: Any) -> str:
    """``None`` -> ``"float32"``; accepts torch dtypes, numpy dtypes and the names float32/float64."""
    if dtype is None:
        return "float32"
    try:
        name = dtype_name(dtype)
    except TypeError:
        raise ValueError(f"dtype must be float32 or float64, got {dtype!r}") from None
    if name not in FLOATS:
        raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
    return name


def to_array(name: str, x: ArrayLike, route: Route) -> Array:
    """``x`` as an array of ``route`` (its backend, device and dtype); ``ValueError`` for non-numeric input. No copy
    where ``x`` already is one."""
    if is_tensor(x):
        if route.backend != "torch":
            raise ValueError(f"{name} is a torch tensor: it needs the torch route (backend='torch')")
        return x.detach().to(device=route.device, dtype=route.array_dtype())
    arr = np.asarray(x)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    if route.backend == "torch":
        return torch().from_numpy(np.asarray(arr, order="C")).to(device=route.device, dtype=route.array_dtype())
    return np.asarray(arr, dtype=route.array_dtype())


def first_bad(name: str, bad: Array, values: Array, rule: str) -> None:
    if bool(bad.any()):
        idx = tuple(int(v) for v in np.argwhere(as_numpy(bad))[0])
        val = float(as_numpy(values)[idx])
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
    a: Array  # (n, m)
    capacity: Array  # (m,)
    demand: Array | None  # None, (n,) or (n, m)
    utility: Utility


def prepare(
    throughput: ArrayLike,
    capacity: ArrayLike,
    utility: Utility,
    demand: ArrayLike | None,
    route: Route,
    check_throughput: bool = True,
) -> Problem:
    """Validate and convert the inputs to ``route`` (``check_throughput=False``: the caller validates the
    throughputs)."""
    a = to_array("throughput", throughput, route)
    xp = namespace(a)
    if a.ndim != 2:
        raise ValueError(f"throughput must be a 2-d array (jobs x pools), got shape {tuple(a.shape)}")
    n, m = a.shape
    if m == 0:
        raise ValueError("throughput has no columns: there must be at least one pool")
    if check_throughput:
        validate_throughput(a)
    cap = to_array("capacity", capacity, route)
    if cap.ndim != 1 or cap.shape[0] != m:
        raise ValueError(f"capacity has shape {tuple(cap.shape)} but throughput has {m} pools: expected ({m},)")
    first_bad("capacity", ~xp.isfinite(cap) | (cap < 0), cap, "finite and non-negative")
    d: Array | None = None
    if demand is not None:
        d = to_array("demand", demand, route)
        if d.ndim == 0:
            d = d * xp.ones_like(a[:, 0])
        if tuple(d.shape) not in ((n,), (n, m)):
            raise ValueError(f"demand has shape {tuple(d.shape)}: expected a scalar, ({n},) or ({n}, {m})")
        first_bad("demand", ~xp.isfinite(d) | (d <= 0), d, "finite and positive")
        if d.ndim == 1 and bool((d == 1).all()):
            d = None
    if not isinstance(utility, Utility):
        raise ValueError(f"utility must implement allocator.utilities.Utility, got {type(utility).__name__}")
    nu = utility.n_jobs
    if nu is not None and nu != n:
        raise ValueError(f"utility has parameters for {nu} jobs but throughput has {n} rows (jobs)")
    return Problem(a=a, capacity=cap, demand=d, utility=route.to_utility(utility))


def validate_throughput(a: Array, rows: Array | None = None) -> None:
    """``ValueError`` naming the first NaN, infinite or negative throughput (only ``rows`` are scanned when given:
    the others are known to be valid; the message then still names the first bad entry of the whole matrix)."""
    sub = a if rows is None else a[rows]
    if sub.size == 0 if not is_tensor(sub) else sub.numel() == 0:
        return
    # Reductions without n x m temporaries: min and max propagate NaN, so ``lo >= 0 and hi < inf`` holds exactly
    # when every entry is finite and non-negative. The full scan that names the entry runs only on failure.
    if is_tensor(sub):
        lo, hi = torch().aminmax(sub)
    else:
        lo, hi = sub.min(), sub.max()
    if not (bool(lo >= 0) and bool(hi < np.inf)):
        xp = namespace(a)
        first_bad("throughput", ~xp.isfinite(a) | (a < 0), a, "finite and non-negative")
