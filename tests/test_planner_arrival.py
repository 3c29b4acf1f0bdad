"""The example GPU jobs (examples/jobs/gpu.yaml: 7 jobs, 23-26 GPUs wanted, 24 GPUs in three pools) arriving at the
operator together or in bursts, every plan applied to the model of the API server (tests/simcluster.py).

Together, the market prices them in one plan and every job runs. In bursts, a job that finds its pools full still
bids in them (``rounds.run_rounds`` offers every pool a job may use), and the preemption phase
(``walras.planner.preemption``, docs/preemption.md; the pools' default rule ``Market``) lets it take a running replica
through the Eviction API when the market's objective gains more than the restart costs. Before it (session 15) 54
of the 64 burst orders left a job with no pod; the second test pins one such order, one job per plan.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

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
    if sim.violations or sim.rejected:
        raise RuntimeError(f"invariants broken: {sim.violations} {sim.rejected}")
    return {key[1]: sum((j.get("status") or {}).get("replicas", {}).values()) for key, j in sim.jobs.items()}


def test_together_every_example_gpu_job_runs() -> None:
    placed = _arrive((0, 0, 0, 0, 0, 0))
    assert len(placed) == 7 and all(count > 0 for count in placed.values()), placed


def test_one_job_per_plan_every_example_gpu_job_runs() -> None:
    placed = _arrive((1, 1, 1, 1, 1, 1))
    assert len(placed) == 7 and all(count > 0 for count in placed.values()), placed
