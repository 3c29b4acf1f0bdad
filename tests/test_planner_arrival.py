"""The example GPU jobs (examples/jobs/gpu.yaml: 7 jobs, 23-26 GPUs wanted, 24 GPUs in three pools) arriving at the
operator together or in bursts, every plan applied to the model of the API server (tests/simcluster.py).

Together, the market prices them in one plan and every job runs. In bursts, the outcome depends on the order: a job
that finds its pools full is not offered them (``rounds.run_rounds``: job i is offered pool j only where one of its
pods can run now), and pods that run stay where they run (replica hysteresis; moves only with ``spec.migration``),
so the market never prices it against the jobs that came first. Of the 64 ways the 7 jobs can arrive in bursts (a
cut or not after each job), 54 leave a job with no pod in this model; CI met one such order through the real
operator (e2e/test_e2e_policies.py now creates the jobs before the operator starts). The second test pins one such
order as a known limitation: it fails (strict xfail) once the planner prices late arrivals against the running jobs.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.simcluster import SimCluster

ROOT = Path(__file__).resolve().parents[1]


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _arrive(cuts: tuple[int, ...], quiet: int = 4) -> dict[str, int]:
    """Jobs of gpu.yaml created in file order, one plan after each burst (``cuts[i]``: a plan after job i), then
    ``quiet`` plans of the unchanged cluster; returns each job's placed replicas."""
    jobs = _documents(ROOT / "examples" / "jobs" / "gpu.yaml")
    assert len(cuts) == len(jobs) - 1
    sim = SimCluster()
    for n in _documents(ROOT / "operator" / "walras" / "data" / "emulated-nodes.yaml"):
        if n["metadata"]["labels"].get("walras.dev/accelerator"):
            n = copy.deepcopy(n)
            n["status"].setdefault("conditions", [{"type": "Ready", "status": "True"}])
            sim.nodes[n["metadata"]["name"]] = n
    for p in _documents(ROOT / "examples" / "pools.yaml"):
        if p["spec"]["resource"] == "nvidia.com/gpu":
            p["metadata"]["generation"] = 1
            sim.pools[p["metadata"]["name"]] = p
    for i, j in enumerate(jobs):
        j["metadata"].update(uid=f"uid-{i}", generation=1)
        sim.jobs[(j["metadata"]["namespace"], j["metadata"]["name"])] = j
        if i == len(jobs) - 1 or cuts[i]:
            sim.step()
    for _ in range(quiet):
        sim.step()
    if sim.violations or sim.rejected:  # not an AssertionError: the strict xfail below expects only its own
        raise RuntimeError(f"invariants broken: {sim.violations} {sim.rejected}")
    return {key[1]: sum((j.get("status") or {}).get("replicas", {}).values()) for key, j in sim.jobs.items()}


def test_together_every_example_gpu_job_runs() -> None:
    placed = _arrive((0, 0, 0, 0, 0, 0))
    assert len(placed) == 7 and all(count > 0 for count in placed.values()), placed


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="market over time: a job that arrives when its pools "
                   "are full is never priced against the running jobs (see the module docstring)")
def test_one_job_per_plan_every_example_gpu_job_runs() -> None:
    placed = _arrive((1, 1, 1, 1, 1, 1))
    assert len(placed) == 7 and all(count > 0 for count in placed.values()), placed
