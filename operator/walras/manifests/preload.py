"""A process's one-time costs of planning, paid before its first plan needs them.

The first plan of a process imports what the phases load on first use (scipy's LP solver for the market's primal
recovery, numba and the compiled kernels of the placement policies, the kernels of price discovery): 727 modules and
1.3 s of a 2.5 s cold plan of the 5,000-node bench cluster, against 0.7-1.2 s for the same plan once they are loaded
(measured in fresh processes, load 0.6-1.0). :func:`preload` pays them at a moment the caller chooses: ``walras run``
at start-up, before its first plan (and before it freezes its start-up objects out of the collector's reach).
``walras plan`` does not: preloading while its read-ahead child reads took 1.9-2.1 s (imports included), longer than
the reading, and the whole command was no faster (4.2-4.4 s against 4.0-4.6 s on the 5,000-node bench cluster).

It plans the embedded example cluster (:mod:`walras.manifests.examples`: every placement policy, the market with its
recovery), so whatever a plan loads on first use is loaded, without a list of modules to keep in step with the
phases. ``tests/test_planner_preload.py`` checks that a plan of another cluster after it imports nothing more.
"""

from __future__ import annotations

import time

__all__ = ["preload"]


def preload() -> float:
    """Load what a first plan would (see the module docstring) by planning the example cluster once; the seconds it
    took. Pure: the plan is discarded and no process state but the imported modules changes."""
    from walras.kube.decode import cluster_from
    from walras.manifests.examples import snapshot
    from walras.planner.plan import build_plan

    started = time.perf_counter()
    build_plan(cluster_from(snapshot()))
    return time.perf_counter() - started
