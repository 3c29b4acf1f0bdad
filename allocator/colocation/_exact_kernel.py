"""The compiled kernels of the exact partition (:func:`allocator.colocation._exact.exact_partition`): one layer of
the dynamic programme over machines and its backtrack, on the states of the count vectors (odometer order, the last
class varying fastest). Called through the route table :mod:`allocator.colocation.kernels`."""

from __future__ import annotations

import numpy as np

from allocator._jit import njit


@njit(nogil=True)
def dp_layer(prev, c1, radix, stride, out, nxt):  # pragma: no cover - compiled
    """One layer: ``nxt[y] = min_{x <= y} prev[y - x] + c1[x]`` over every state ``y`` (odometer over ``x``)."""
    S = prev.shape[0]
    K = radix.shape[0]
    ydig = np.zeros(K, np.int64)
    xdig = np.zeros(K, np.int64)
    evals = 0
    for y in range(S):
        # digits of y (C order: the last class varies fastest)
        rem = y
        for k in range(K):
            ydig[k] = rem // stride[k]
            rem -= ydig[k] * stride[k]
            xdig[k] = 0
        best = prev[y] + c1[0]
        x = 0
        while True:
            # next x in the sub-box [0, ydig] (odometer, last digit fastest)
            k = K - 1
            while k >= 0 and xdig[k] == ydig[k]:
                x -= xdig[k] * stride[k]
                xdig[k] = 0
                k -= 1
            if k < 0:
                break
            xdig[k] += 1
            x += stride[k]
            v = prev[y - x] + c1[x]
            evals += 1
            if v < best:
                best = v
        nxt[y] = best
    out[0] += evals + S


@njit(nogil=True)
def dp_backtrack(prev, c1, stride, radix, y, target):  # pragma: no cover - compiled
    """The first ``x <= y`` (odometer order) with ``prev[y - x] + c1[x] == target``; -1 if none."""
    K = radix.shape[0]
    ydig = np.zeros(K, np.int64)
    xdig = np.zeros(K, np.int64)
    rem = y
    for k in range(K):
        ydig[k] = rem // stride[k]
        rem -= ydig[k] * stride[k]
    if prev[y] + c1[0] == target:
        return 0
    x = 0
    while True:
        k = K - 1
        while k >= 0 and xdig[k] == ydig[k]:
            x -= xdig[k] * stride[k]
            xdig[k] = 0
            k -= 1
        if k < 0:
            return -1
        xdig[k] += 1
        x += stride[k]
        if prev[y - x] + c1[x] == target:
            return x
