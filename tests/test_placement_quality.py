"""Issue 33's targets for the planner's integral plans, against the exact reference (tests/reference): on a fixed
set of generated clusters of the issue's shape, the cold plan of the empty cluster must reach

* placed/optimal (the weighted geometric mean over jobs of the plan's throughput over the optimum's): median
  >= 0.99, p10 >= 0.97, min >= 0.95;
* no plan that leaves GPUs idle while a job whose next replica fits there waits;
* no starved job (a job the optimum serves with no pod); no replica with less than its ``demand`` of GPUs.

The seeds are the generated clusters whose reference solves in about a second (the whole file runs in well under a
minute on one core). ``test_reference_bounds_the_plan`` does not depend on the plan's quality: no plan the planner
makes can beat the exact optimum beyond its certified gap, and every plan fits the instance's nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from tests.planning import build_plan
from tests.reference import Instance, Metrics, Reference, evaluate, generate, optimum, snapshot

SEEDS = (0, 2, 4, 11, 16, 18)
#: Generated clusters where the integral stage stayed below the min target before the local search and the fair
#: pools' re-arrangement (placed/optimal 0.871 on seed 19, 0.928 on seed 10: a fair pool's PS-DSF arrangement of
#: fixed-size replicas was kept, and the exact route stopped at its time limit on a greedy incumbent).
BELOW_TARGET = (10, 19)


@dataclass(frozen=True)
class Case:
    seed: int
    instance: Instance
    reference: Reference
    metrics: Metrics


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return _cases(SEEDS)


def _cases(seeds: tuple[int, ...]) -> list[Case]:
    out = []
    for seed in seeds:
        inst = generate(seed)
        ref = optimum(inst, time_limit=20)
        plan = build_plan(snapshot(inst))
        met = evaluate(inst, plan, ref)
        print(f"seed {seed}: placed/optimal {met.ratio:.3f}, starved {met.starved}, under-demand {met.under_demand}, "
              f"idle {met.idle_waiting:g} GPUs ({met.waiting_jobs} waiting), GPUs {met.gpus:g} / {met.gpus_optimum:g}"
              f", reference {ref.status} gap {ref.gap:.2g}")
        out.append(Case(seed, inst, ref, met))
    return out


def test_reference_bounds_the_plan(cases: list[Case]) -> None:
    for case in cases:
        met, ref = case.metrics, case.reference
        assert ref.gap <= 1e-4, (case.seed, ref.status, ref.gap)
        assert met.violations == 0, case.seed
        served, value = met.plan_objective
        assert served <= ref.served, case.seed
        if served == ref.served:
            assert value <= ref.bound + 1e-9, (case.seed, value, ref.bound)


def test_issue_33_targets(cases: list[Case]) -> None:
    ratios = np.array([c.metrics.ratio for c in cases])
    report = {c.seed: (round(c.metrics.ratio, 4), c.metrics.idle_waiting, c.metrics.starved, c.metrics.under_demand)
              for c in cases}
    assert float(np.median(ratios)) >= 0.99, report
    assert float(np.percentile(ratios, 10)) >= 0.97, report
    assert float(ratios.min()) >= 0.95, report
    assert all(c.metrics.idle_waiting == 0 for c in cases), report
    assert all(c.metrics.starved == 0 for c in cases), report
    assert all(c.metrics.under_demand == 0 for c in cases), report


def test_issue_33_min_target_on_the_clusters_once_below_it() -> None:
    below = _cases(BELOW_TARGET)
    report = {c.seed: round(c.metrics.ratio, 4) for c in below}
    assert all(c.metrics.idle_waiting == 0 and c.metrics.starved == 0 and c.metrics.under_demand == 0
               for c in below), report  # work conservation holds there too: only the ratio may fail
    assert min(c.metrics.ratio for c in below) >= 0.95, report


@pytest.mark.parametrize("seed", [3, 6, 38])
def test_three_replans_of_the_applied_plan_keep_every_pod(seed: int) -> None:
    """The plan of the applied plan, applied again, three times (as the operator re-plans a settled cluster): every
    pod is kept each time. These generated clusters used to evict two one-GPU replicas of one job for one two-GPU
    replica of another at the second re-plan (the preemption phase judged each victim alone), lowering placed/optimal
    from 1.000 to 0.952-0.960 of the exact reference."""
    from tests.reference import applied

    print("seed", seed)
    inst = generate(seed)
    snap = snapshot(inst)
    current = build_plan(snap)
    state = snap
    for k in range(4):
        state = applied(state, current)
        current = build_plan(state, current)
        moved = [(p.action, p.name, p.reason) for p in current.pods if p.action != "keep"]
        assert moved == [], (k, moved)
