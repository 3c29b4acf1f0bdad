"""Thread policy of a CPU solve on the torch route: how many torch intra-op threads a solve uses, applied for the
solve only (the numpy route, the default on the CPU, is single-threaded and sets nothing).

Measured (``python -m bench.pricing``, section "Threads"; docs/bench/pricing.md) on this project's 2-core machine,
004 Sec. 6.2 instances, one against two threads alternating in one process:

- loaded (load average about 9 on 2 cores): two threads were 1.7-5.8x *slower* at n = 10^4, 10^5 and 10^6, log and
  target-priority alike: torch's intra-op workers wait at barriers for descheduled peers;
- quiet (load average 0.6, the earlier benchmark): two threads gained at most 8 % at n = 10^6 (0.211 s against
  0.228 s of one thread's CPU time), because most of an evaluation is the compiled hull walk
  (:mod:`allocator.pricing._compiled.kernels`), which is single-threaded whatever torch's setting;
- below ~10^5 entries the elementwise operations take tens of microseconds, less than waking a worker costs.

So every CPU solve runs on one intra-op thread: the gain of a second thread is small on a quiet machine and the loss
large on a busy one, and problem size does not change that up to 4 * 10^6 entries (the largest measured). Parallel
capacity is used across processes instead (:func:`allocator.pricing.solve_distributed` shards the jobs).
``PriceDiscovery(threads=k)`` overrides the policy (the benchmark measures both counts that way).

torch's thread count is process-wide: :func:`intra_op_threads` sets it for the solve and restores the caller's value
on return (also on error), so a solve leaves no process-global state changed. Two solves running at the same time in
threads of one process share the setting; both want one thread, and the last to finish restores the original.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["POLICY", "intra_op_threads", "solve_threads"]

#: One line for benchmark headers.
POLICY = (
    "numpy route: single-threaded (compiled hull walk, numpy); torch route: 1 torch intra-op thread per CPU solve "
    "(allocator.pricing.threads), caller's count restored after"
)


def solve_threads(numel: int, device: Any, threads: int | None = None) -> int | None:
    """The intra-op thread count for a torch solve of ``numel`` throughput entries on ``device`` (a name or a
    ``torch.device``): ``threads`` when given, else 1 on the CPU (the policy above); ``None`` leaves torch's setting
    alone (CUDA solves)."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        return int(threads)
    del numel  # measured: the count that wins does not depend on the size up to 4 * 10^6 entries
    return 1 if str(device).split(":")[0] == "cpu" else None


@contextmanager
def intra_op_threads(numel: int, device: Any, threads: int | None = None, backend: str = "torch") -> Iterator[None]:
    """Run the block with :func:`solve_threads` intra-op threads; restore the caller's count after. The numpy route
    (``backend="numpy"``) has no thread pool to set: its compiled walk and numpy operations run on the calling
    thread; ``threads`` is only validated there, and torch is not imported."""
    want = solve_threads(numel, device, threads)
    if backend != "torch":
        yield
        return
    import torch

    before = torch.get_num_threads()
    change = want is not None and want != before
    if change:
        torch.set_num_threads(want)  # type: ignore[arg-type]
    try:
        yield
    finally:
        if change:
            torch.set_num_threads(before)
