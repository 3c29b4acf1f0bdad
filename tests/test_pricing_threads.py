"""allocator.pricing.threads: a CPU solve runs on the policy's thread count and leaves torch's process-wide setting
as it found it, also when the solve fails."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from allocator import pricing
from allocator import utilities as U
from allocator.pricing import threads
from allocator.pricing._compiled import kernels


@pytest.fixture
def two_threads() -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen: list[int] = []
    real = kernels.walk

    def walk(*args: Any, **kwargs: Any) -> Any:
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(kernels, "walk", walk)
    return seen


def _instance(n: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.uniform(0.1, 1, (n, 3)).astype(np.float32), np.array([n / 3, n / 5, n / 9])


def test_cpu_solve_runs_on_one_thread_and_restores_the_count(monkeypatch: pytest.MonkeyPatch, two_threads: Any) -> None:
    seen = _recording(monkeypatch)
    a, r = _instance()
    res = pricing.solve(a, r, U.Log(), device="cpu", backend="torch")
    assert res.converged and seen and set(seen) == {1}
    assert torch.get_num_threads() == 2


def test_threads_override_is_used(monkeypatch: pytest.MonkeyPatch, two_threads: Any) -> None:
    torch.set_num_threads(1)
    seen = _recording(monkeypatch)
    a, r = _instance()
    pricing.PriceDiscovery(device="cpu", threads=2, backend="torch").solve(a, r, U.Log())
    assert set(seen) == {2} and torch.get_num_threads() == 1
    with pytest.raises(ValueError, match="threads must be at least 1"):
        pricing.PriceDiscovery(device="cpu", threads=0, backend="torch").solve(a, r, U.Log())


def test_count_is_restored_when_the_solve_raises(two_threads: Any) -> None:
    a, r = _instance()
    a[5, 1] = -1.0
    with pytest.raises(ValueError, match=r"throughput\[5, 1\]"):
        pricing.solve(a, r, U.Log(), device="cpu", backend="torch")
    assert torch.get_num_threads() == 2


def test_policy_leaves_cuda_alone() -> None:
    assert threads.solve_threads(10**9, torch.device("cuda")) is None
    assert threads.solve_threads(10, torch.device("cpu")) == 1
