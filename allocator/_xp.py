"""One array code for two array libraries: numpy on the CPU, torch on CUDA devices and in ``torch.distributed`` runs.

Price discovery (:mod:`allocator.pricing`) and the utilities (:mod:`allocator.utilities`) are written once against
the operations both libraries share under the same name and meaning: arithmetic and comparison operators, integer
and boolean indexing (``x[idx]``, ``x[idx] = v``), ``x[:, None]``, and the functions of :func:`namespace` (``where``,
``minimum``, ``maximum``, ``clip``, ``log``, ``pow``, ``isfinite``, ``abs``, ``sign``, ``sum``/``amax``/``amin``/
``argmin``/``argmax``/``any`` with ``axis=``, ``broadcast_to``, ``concat``, ``zeros_like``, ``full_like``,
``nan_to_num``). This module holds the handful that differ: creation on an array's device and dtype, dtype
conversion, the scatter-add of resource usage, the row-wise gather, the index of the true entries, the move to numpy,
and the conversions between the two.

Which library an array belongs to is its type, and importing this module does not import torch. A torch tensor can
only exist once some caller imported torch, so :func:`is_tensor` looks torch up in ``sys.modules``; :func:`torch`
imports it on first use, for the routes that need it (:func:`allocator.pricing.problem.resolve_route` is the route
table).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import numpy as np

__all__ = [
    "Array",
    "arange",
    "as_numpy",
    "asarray_like",
    "astype",
    "convert",
    "convert_index",
    "copy",
    "device_of",
    "dtype_name",
    "equal",
    "finfo_eps",
    "flatnonzero",
    "fsum",
    "full",
    "index_like",
    "is_tensor",
    "is_torch_dtype",
    "namespace",
    "numel",
    "pick",
    "repeat",
    "scatter_sum",
    "torch",
    "wants_torch",
    "zeros",
]

#: An array of either library (numpy ``ndarray`` or ``torch.Tensor``).
Array = Any

FLOATS = ("float32", "float64")


def torch() -> ModuleType:
    """The torch module, imported on first use (the CUDA, distributed and forced-torch routes)."""
    import torch as _torch

    return _torch


def is_tensor(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (without importing torch: no tensor exists unless torch was imported)."""
    mod = sys.modules.get("torch")
    return mod is not None and isinstance(x, mod.Tensor)


def is_torch_dtype(dtype: Any) -> bool:
    mod = sys.modules.get("torch")
    return mod is not None and isinstance(dtype, mod.dtype)


def namespace(x: Array) -> ModuleType:
    """The library of ``x``: the ``torch`` module for a tensor, ``numpy`` otherwise (see the module docstring for the
    functions both share)."""
    return torch() if is_tensor(x) else np


def dtype_name(dtype: Any) -> str:
    """``"float32"``, ``"int64"``, ... for a numpy or torch dtype (or an array's dtype)."""
    if is_torch_dtype(dtype):
        return str(dtype).replace("torch.", "")
    return np.dtype(dtype).name


def device_of(x: Array) -> str:
    """``"cpu"`` for a numpy array, the tensor's device (``"cuda:0"``, ``"cpu"``) for a tensor."""
    return str(x.device) if is_tensor(x) else "cpu"


def wants_torch(device: Any = None, dtype: Any = None) -> bool | None:
    """Whether a conversion to ``device`` and ``dtype`` targets torch (True), numpy (False), or keeps the library
    (``None``: no device other than ``"cpu"`` and no dtype given). A torch dtype, a ``torch.device`` or a device
    string other than ``"cpu"`` means torch; a numpy dtype (or a name) on the CPU means numpy."""
    if is_torch_dtype(dtype) or (device is not None and not isinstance(device, str)):
        return True
    if isinstance(device, str) and device != "cpu":
        return True
    if dtype is not None:
        return False
    return None


def convert(x: Any, device: Any = None, dtype: Any = None) -> Array:
    """``x`` (array, tensor or scalar) as an array of the library :func:`wants_torch` picks, on ``device`` in
    ``dtype`` (names or either library's dtypes). No copy where nothing changes."""
    to_torch = wants_torch(device, dtype)
    if to_torch is None:
        to_torch = is_tensor(x)
    if to_torch:
        t = torch()
        tdt = None if dtype is None else (dtype if is_torch_dtype(dtype) else getattr(t, dtype_name(dtype)))
        out = x.detach() if is_tensor(x) else t.from_numpy(np.asarray(x, order="C"))
        return out.to(device=device, dtype=tdt)
    if is_tensor(x):
        x = x.detach().cpu().numpy()
    ndt = None if dtype is None else np.dtype(dtype_name(dtype))
    return np.asarray(x, dtype=ndt)


def as_numpy(x: Any) -> np.ndarray:
    """``x`` as a numpy array (a tensor is moved to the CPU; no copy where possible)."""
    if is_tensor(x):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def astype(x: Array, dtype: Any) -> Array:
    """``x`` in ``dtype`` (a name or either library's dtype), same library and device."""
    if is_tensor(x):
        t = torch()
        return x.to(dtype if is_torch_dtype(dtype) else getattr(t, dtype_name(dtype)))
    return x.astype(dtype_name(dtype), copy=False)


def _dtype_for(like: Array, dtype: Any) -> Any:
    if dtype is None:
        return like.dtype
    if is_tensor(like):
        return dtype if is_torch_dtype(dtype) else getattr(torch(), dtype_name(dtype))
    return np.dtype(dtype_name(dtype))


def zeros(shape: Any, like: Array, dtype: Any = None) -> Array:
    """Zeros of ``shape`` in ``like``'s library, on its device, in ``dtype`` (default ``like``'s)."""
    if is_tensor(like):
        return torch().zeros(shape, dtype=_dtype_for(like, dtype), device=like.device)
    return np.zeros(shape, dtype=_dtype_for(like, dtype))


def full(shape: Any, value: float | int, like: Array, dtype: Any = None) -> Array:
    """``value`` everywhere, in ``like``'s library, on its device, in ``dtype`` (default ``like``'s)."""
    if is_tensor(like):
        return torch().full(shape, value, dtype=_dtype_for(like, dtype), device=like.device)
    return np.full(shape, value, dtype=_dtype_for(like, dtype))


def arange(n: int, like: Array) -> Array:
    """``0..n-1`` as int64 in ``like``'s library, on its device."""
    if is_tensor(like):
        return torch().arange(n, device=like.device)
    return np.arange(n, dtype=np.int64)


def copy(x: Array) -> Array:
    return x.clone() if is_tensor(x) else x.copy()


def numel(x: Array) -> int:
    return int(x.numel()) if is_tensor(x) else int(x.size)


def flatnonzero(mask: Array) -> Array:
    """Indices (int64) of the true entries of a 1-d mask."""
    if is_tensor(mask):
        return torch().nonzero(mask).squeeze(1)
    return np.flatnonzero(mask)


def pick(x: Array, j: Array) -> Array:
    """``x[i, j[i]]`` for every row ``i`` of the 2-d ``x`` (a gather along the columns)."""
    if is_tensor(x):
        return x.gather(1, j.unsqueeze(1)).squeeze(1)
    return np.take_along_axis(x, j[:, None], axis=1)[:, 0]


def repeat(x: Array, k: int) -> Array:
    """Each entry of the 1-d ``x`` repeated ``k`` times in place (``[0, 0, 1, 1]`` for ``[0, 1]``, ``k = 2``)."""
    if is_tensor(x):
        return x.repeat_interleave(k)
    return np.repeat(x, k)


def scatter_sum(index: Array, weights: Array, size: int) -> Array:
    """``out[k] = sum of weights[i] over index[i] == k`` in float64, length ``size`` (resource usage per pool)."""
    if is_tensor(index):
        t = torch()
        out = t.zeros(size, dtype=t.float64, device=index.device)
        return out.index_add_(0, index, weights.double())
    return np.bincount(index, weights=weights, minlength=size).astype(np.float64, copy=False)


def fsum(x: Array) -> float:
    """The sum of all entries of ``x``, accumulated in float64, as a Python float."""
    if is_tensor(x):
        return float(x.sum(dtype=torch().float64))
    return float(np.sum(x, dtype=np.float64))


def equal(x: Array, y: Array) -> bool:
    """Same shape and entries."""
    if is_tensor(x) and is_tensor(y):
        return bool(torch().equal(x, y))
    if is_tensor(x) or is_tensor(y):
        return False
    return bool(np.array_equal(x, y))


def finfo_eps(x: Array) -> float:
    """The machine epsilon of ``x``'s floating dtype."""
    if is_tensor(x):
        return float(torch().finfo(x.dtype).eps)
    return float(np.finfo(x.dtype).eps)


def index_like(index: Any, like: Array) -> Array:
    """An integer index in ``like``'s library (and on its device), to select from ``like``."""
    if is_tensor(like):
        if is_tensor(index):
            return index.to(like.device)
        return torch().as_tensor(np.asarray(index, dtype=np.int64), device=like.device)
    return as_numpy(index)


def asarray_like(x: Any, like: Array, dtype: Any = None) -> Array:
    """``x`` (a numpy array or scalar) in ``like``'s library, on its device, in ``dtype`` (default ``like``'s)."""
    if is_tensor(like):
        return torch().as_tensor(np.asarray(x)).to(device=like.device, dtype=_dtype_for(like, dtype))
    return np.asarray(x, dtype=_dtype_for(like, dtype))


def convert_index(x: Any, device: Any = None, dtype: Any = None) -> Array:
    """An int64 index array moved to the library and device a conversion to ``device`` and ``dtype`` targets
    (:func:`wants_torch`; ``dtype`` only picks the library, the result stays int64)."""
    to_torch = wants_torch(device, dtype)
    if to_torch is None:
        to_torch = is_tensor(x)
    if to_torch:
        return convert(x, device, torch().int64)
    return np.asarray(as_numpy(x), dtype=np.int64)
