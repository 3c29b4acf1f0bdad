"""Compiled engine of the BestOrS dynamic programme (paper 001, Sec. 5, eqs. 5-6) behind
:func:`allocator.colocation.bestors_table`.

One layer of eq. (5), ``C(x, r) = min_{0 <= j <= x} C(j, r - 1) + w_r(j, x)``, is evaluated by divide and conquer on
``x``: the smallest optimal split point ``opt(x)`` is non-decreasing in ``x`` (the segment cost ``w`` satisfies the
quadrangle inequality, see the module docstring of :mod:`allocator.colocation`), so the middle ``x`` of a range is
solved by a scan of ``[opt_lo, min(opt_hi, x)]`` and splits the range in two with narrower scans. ``O(n log n)`` per
layer, ``O(m n log n)`` in all. The segment cost is ``w_r(j, x) = (x - j) (S_x - S_j)`` plus, when hard limits are
given, ``big * (max(0, (x - j) - max_tasks[r]) + max(0, D_x - D_j - capacity[r]))``.

Ties go to the smallest ``j`` and every value is computed with the same floating-point operations in the same order
as the vectorised NumPy version this replaces, so the result does not depend on the order in which the ranges are
visited. The kernel runs in compiled code (numba) because the scan is a long chain of tiny, data-dependent steps: the
vectorised NumPy version it replaces paid about ten NumPy calls per recursion level and layer, which dominated the
planner's colocation pools (hundreds of machines).
"""

from __future__ import annotations

import numpy as np

from allocator._jit import njit


@njit(nogil=True)
def bestors_dc(prefix, dprefix, mt, cp, big, limited, m):
    """``(costs, choice)`` of shape ``(m, n + 1)`` for the BestOrS DP on prefix sums ``prefix`` (length ``n + 1``).

    ``limited`` adds the hard-limit penalty with per-layer ``mt`` (max tasks), ``cp`` (capacity) on the prefix sums
    ``dprefix`` of the demands, weighted by ``big``; otherwise ``dprefix``, ``mt``, ``cp`` and ``big`` are unused.
    """
    n = prefix.shape[0] - 1
    costs = np.empty((m, n + 1))
    choice = np.zeros((m, n + 1), dtype=np.int64)
    for x in range(n + 1):
        val = x * (prefix[x] - prefix[0])
        if limited:
            over = max(0.0, x - mt[0]) + max(0.0, dprefix[x] - dprefix[0] - cp[0])
            val = val + big * over
        costs[0, x] = val
    # explicit stack of ranges (x_lo, x_hi, opt_lo, opt_hi); depth-first, so at most ~log2(n) + 2 entries
    depth = 2
    while (1 << depth) <= n + 1:
        depth += 1
    sxl = np.empty(2 * depth + 2, np.int64)
    sxr = np.empty(2 * depth + 2, np.int64)
    sol = np.empty(2 * depth + 2, np.int64)
    soh = np.empty(2 * depth + 2, np.int64)
    for layer in range(1, m):
        prev = costs[layer - 1]
        cur = costs[layer]
        ch = choice[layer]
        mtl = mt[layer]
        cpl = cp[layer]
        sxl[0], sxr[0], sol[0], soh[0] = 0, n, 0, n
        top = 1
        while top > 0:
            top -= 1
            xl, xr, ol, oh = sxl[top], sxr[top], sol[top], soh[top]
            mid = (xl + xr) // 2
            hi = min(oh, mid)
            best = np.inf
            bj = ol
            pm = prefix[mid]
            if limited:
                dm = dprefix[mid]
                for j in range(ol, hi + 1):
                    val = (mid - j) * (pm - prefix[j])
                    over = max(0.0, (mid - j) - mtl) + max(0.0, dm - dprefix[j] - cpl)
                    v = prev[j] + (val + big * over)
                    if v < best:
                        best = v
                        bj = j
            else:
                for j in range(ol, hi + 1):
                    v = prev[j] + (mid - j) * (pm - prefix[j])
                    if v < best:
                        best = v
                        bj = j
            cur[mid] = best
            ch[mid] = bj
            if xl <= mid - 1:
                sxl[top], sxr[top], sol[top], soh[top] = xl, mid - 1, ol, bj
                top += 1
            if mid + 1 <= xr:
                sxl[top], sxr[top], sol[top], soh[top] = mid + 1, xr, bj, oh
                top += 1
    return costs, choice
