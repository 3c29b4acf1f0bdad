"""The integral fill's replicas in a colocation pool are arranged by the pool's interference model (issue 33):
:func:`allocator.colocation.rearrange` (HILL's best-improvement moves of paper 001 Sec. 8.1.1 among fixed tasks, under
hard limits) checked against brute force with an independent cost (eq. (1), Sec. 7), and the planner's use of it
(:mod:`walras.planner.arrange`) against the fill's own best-fit arrangement."""

from __future__ import annotations

import itertools
import random
from typing import Any

import numpy as np
import pytest
import walras.planner.integral as integral
from walras.kube.decode import cluster_from
from walras.planner import Snapshot
from walras.planner.invariants import check_plan

from allocator.colocation import cost_function, rearrange
from tests.planning import build_plan
from tests.test_lifecycle_planner import pod as walras_pod
from tests.test_planner_fit import node, pool


def task_costs(machine: list[int], sizes: list[float], types: list[int], alpha: np.ndarray) -> list[float]:
    """Eq. (1) task by task: ``c_i = sum_{j on i's machine} p_j alpha[t_j, t_i]`` (task i itself included)."""
    return [sum(sizes[j] * alpha[types[j], types[i]] for j in range(len(machine)) if machine[j] == machine[i])
            for i in range(len(machine))]


def total(machine: list[int], sizes: list[float], types: list[int], alpha: np.ndarray, power: float) -> float:
    """``sum_i f(c_i)``, ``f(x) = x ** power`` (power 1: eq. (1); power > 1: the convex costs of Sec. 7)."""
    return sum(c ** power for c in task_costs(machine, sizes, types, alpha))


def instance(seed: int) -> dict[str, Any]:
    """A tiny instance: fixed tasks on ``m`` machines, ``n`` movable ones, two resources, random limits; the start
    is a random feasible arrangement of the movable tasks."""
    rng = random.Random(seed)
    print(f"seed {seed}")
    m, T = rng.randint(2, 4), rng.randint(1, 3)
    alpha = np.array([[rng.choice([0.0, 0.1, 0.5, 1.0, 3.0]) for _ in range(T)] for _ in range(T)])
    fixed = [(rng.randrange(m), rng.randrange(T), float(rng.randint(1, 3))) for _ in range(rng.randint(0, 4))]
    n = rng.randint(1, 4)
    sizes = [float(rng.randint(1, 3)) for _ in range(n)]
    types = [rng.randrange(T) for _ in range(n)]
    need = np.array([[float(rng.randint(1, 2)), rng.choice([1.0, 2.0]) * 2**30] for _ in range(n)])
    allowed = np.array([[rng.random() < 0.8 for _ in range(m)] for _ in range(n)])
    start = []
    room = np.zeros((m, 2))
    used = np.zeros((m, 2))
    for i in range(n):
        choices = np.flatnonzero(allowed[i])
        k = int(rng.choice(choices.tolist())) if choices.size else 0
        allowed[i, k] = True
        start.append(k)
        used[k] += need[i]
    for k in range(m):
        room[k] = used[k] + np.array([float(rng.randint(0, 3)), float(rng.randint(0, 3)) * 2**30])
    slots = np.array([float(sum(1 for s in start if s == k) + rng.randint(0, 2)) for k in range(m)])
    return {"m": m, "T": T, "alpha": alpha, "fixed": fixed, "sizes": sizes, "types": types, "need": need,
            "allowed": allowed, "start": start, "room": room, "slots": slots}


def run(inst: dict[str, Any], power: float):
    m, T = inst["m"], inst["T"]
    loads, counts = np.zeros((m, T)), np.zeros((m, T))
    for k, t, p in inst["fixed"]:
        loads[k, t] += p
        counts[k, t] += 1
    cost = None if power == 1 else cost_function(f"power:{power:g}")
    return rearrange(loads, counts, inst["sizes"], inst["types"], inst["alpha"], inst["start"], need=inst["need"],
                     room=inst["room"], slots=inst["slots"], allowed=inst["allowed"], cost=cost)


def feasible(inst: dict[str, Any], machine: list[int]) -> bool:
    for k in range(inst["m"]):
        mine = [i for i, x in enumerate(machine) if x == k]
        if len(mine) > inst["slots"][k] or not all(inst["allowed"][i, k] for i in mine):
            return False
        if (sum((inst["need"][i] for i in mine), np.zeros(2)) > inst["room"][k]).any():
            return False
    return True


def everything(inst: dict[str, Any], machine: list[int], power: float) -> float:
    """The pool's cost with the fixed tasks, computed task by task."""
    fixed = inst["fixed"]
    return total([k for k, _, _ in fixed] + list(machine), [p for _, _, p in fixed] + inst["sizes"],
                 [t for _, t, _ in fixed] + inst["types"], inst["alpha"], power)


@pytest.mark.parametrize("power", [1.0, 2.0])
def test_rearrange_is_feasible_never_worse_and_a_local_optimum_by_brute_force(power: float) -> None:
    for seed in range(300):
        inst = instance(seed)
        got = run(inst, power)
        machine = got.assignment.tolist()
        assert feasible(inst, machine), (seed, machine)
        start_cost = everything(inst, inst["start"], power)
        cost = everything(inst, machine, power)
        assert got.start_cost == pytest.approx(start_cost) and got.cost == pytest.approx(cost), seed
        assert cost <= start_cost + 1e-9, seed
        # no single feasible move of one movable task lowers the cost (the local-optimum claim)
        for i, k in itertools.product(range(len(machine)), range(inst["m"])):
            moved = machine.copy()
            moved[i] = k
            if feasible(inst, moved):
                assert everything(inst, moved, power) >= cost - 1e-9, (seed, i, k)


def test_rearrange_of_one_task_finds_the_best_machine_by_brute_force() -> None:
    for seed in range(300):
        inst = instance(seed)
        if len(inst["sizes"]) != 1:
            continue
        got = run(inst, 1.0)
        best = min(everything(inst, [k], 1.0) for k in range(inst["m"]) if feasible(inst, [k]))
        assert everything(inst, got.assignment.tolist(), 1.0) == pytest.approx(best), seed


def test_a_node_short_of_one_cpu_is_refused_whatever_the_memory_in_bytes() -> None:
    # A node with 64 Gi free but no cpu: the slack of a fit check is per resource (a tolerance scaled by the bytes of
    # memory once let a 3-cpu replica onto a node with 0 cpu free).
    alpha = np.array([[0.1, 5.0], [5.0, 0.1]])
    loads = np.array([[0.0, 1.0], [1.0, 0.0]])
    counts = loads.copy()
    got = rearrange(loads, counts, [1.0], [0], alpha, [0], need=[[3.0, 2.0**30]],
                    room=[[3.0, 64 * 2.0**30], [0.0, 64 * 2.0**30]], slots=[5, 5], allowed=[[True, True]])
    assert got.assignment.tolist() == [0] and got.moves == 0  # node 1 (its own type) has no cpu
    got = rearrange(loads, counts, [1.0], [0], alpha, [0], need=[[3.0, 2.0**30]],
                    room=[[3.0, 64 * 2.0**30], [3.0, 64 * 2.0**30]], slots=[5, 5], allowed=[[True, True]])
    assert got.assignment.tolist() == [1] and got.cost < got.start_cost


def test_a_start_that_does_not_fit_is_an_error() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        rearrange(np.zeros((1, 1)), np.zeros((1, 1)), [1.0], [0], [[1.0]], [0], need=[[2.0]], room=[[1.0]],
                  slots=[1], allowed=[[True]])


PROFILE = {"kind": "ColocationProfile", "metadata": {"name": "prof"},
           "spec": {"types": ["a", "b"], "interference": [[0.1, 5.0], [5.0, 0.1]]}}


def job(name: str, count: int, kind: str, utility: str, cpu: str) -> dict[str, Any]:
    return {"kind": "FungibleJob", "metadata": {"name": name, "namespace": "ml", "generation": 1},
            "spec": {"throughput": {"t4": 2.0}, "utility": {"type": utility}, "replicas": {"count": count},
                     "demand": 1, "resources": {"cpu": cpu, "memory": "1Gi"}, "colocation": {"type": kind},
                     "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}


def cluster(seed: int) -> Snapshot:
    """A small colocation pool with running pods and waiting jobs (two types that interfere across, little within)."""
    rng = random.Random(seed)
    print(f"seed {seed}")
    nn = rng.randint(2, 3)
    nodes = [node(f"t4-{k}", gpu=str(rng.choice([2, 4])), cpu=str(rng.choice([4, 6, 8]))) for k in range(nn)]
    jobs = [job(f"j{i}", rng.randint(1, 5), rng.choice("ab"), rng.choice(["log", "linear"]),
                rng.choice(["1", "2", "3"])) for i in range(rng.randint(2, 4))]
    pods = []
    for i, spec in enumerate(jobs):
        for r in range(rng.randint(0, 2)):
            p = walras_pod(f"j{i}-{r}", f"j{i}", f"t4-{rng.randrange(nn)}", pool_name="t4")
            p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = spec["spec"]["resources"]["cpu"]
            pods.append(p)
    return Snapshot(nodes=tuple(nodes), pods=tuple(pods), pools=(pool("colocation"),), jobs=tuple(jobs),
                    profiles=(PROFILE,))


def pool_cost(snap: Snapshot, plan: Any) -> float:
    """Eq. (1) over the pods that run or are created in the plan, by node (independent of the planner)."""
    kind = {j["metadata"]["name"]: "ab".index(j["spec"]["colocation"]["type"]) for j in snap.jobs}
    size = 1.0  # spec.colocation.size defaults to 1
    machine, types = [], []
    for p in plan.pods:
        if p.node is not None and p.action in ("keep", "create", "bind"):
            machine.append(p.node)
            types.append(kind[p.job])
    alpha = np.array(PROFILE["spec"]["interference"])
    ids = {name: k for k, name in enumerate(sorted(set(machine)))}
    return total([ids[x] for x in machine], [size] * len(machine), types, alpha, 1.0)


def counts(plan: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in plan.pods:
        if p.node is not None and p.action in ("keep", "create", "bind"):
            out[p.job] = out.get(p.job, 0) + 1
    return out


def test_the_fill_in_a_colocation_pool_is_never_worse_than_best_fit_and_keeps_its_counts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    arranged: dict[int, Any] = {}
    for seed in range(120):
        snap = cluster(seed)
        plan = build_plan(snap)
        assert check_plan(cluster_from(snap), plan) == [], seed
        arranged[seed] = plan
    best_fit = integral.colocation_nodes

    def unarranged(ctx, work, batches, problem, rows, node_ids, result):  # the fill's own nodes
        return node_ids[result.node].astype(np.int64)

    monkeypatch.setattr(integral, "colocation_nodes", unarranged)
    for seed, plan in arranged.items():
        snap = cluster(seed)
        plain = build_plan(snap)
        assert counts(plan) == counts(plain), seed  # the arrangement moves replicas, it never adds or drops one
        assert pool_cost(snap, plan) <= pool_cost(snap, plain) + 1e-9, seed
    assert best_fit is not unarranged


def test_the_fill_puts_a_replica_where_it_interferes_least_not_where_it_fits_best(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # cluster(344): t4-0 (4 cpu) runs j0 and j1 (type b), t4-1 (8 cpu) runs two j2 (type a, 3 cpu each); j1 (log,
    # 1 cpu) adds 3 replicas by the fill and the pool's policy adds one j2 on t4-2. Best fit puts two of j1's
    # replicas into t4-1's 2 free cpu, next to the two a's (cross interference 5 each way); the arrangement puts all
    # three on t4-2. Eq. (1) by hand: t4-0 b,b: 2 x 0.2; t4-1 a,a: 2 x 0.2; t4-2 b,b,b,a: 3 x (3 x 0.1 + 5) + (3 x 5 +
    # 0.1) = 31.0; total 31.8, against best fit's 0.4 + 4 x (2 x 0.1 + 2 x 5) + 2 x (0.1 + 5) = 51.4.
    snap = cluster(344)
    plan = build_plan(snap)
    assert check_plan(cluster_from(snap), plan) == []
    new = sorted(p.node for p in plan.pods if p.job == "j1" and p.action == "create")
    assert new == ["t4-2", "t4-2", "t4-2"]
    assert pool_cost(snap, plan) == pytest.approx(31.8)
    monkeypatch.setattr(integral, "colocation_nodes",
                        lambda ctx, work, batches, problem, rows, node_ids, result: node_ids[result.node])
    plain = build_plan(snap)
    assert pool_cost(snap, plain) == pytest.approx(51.4)
    assert counts(plain) == counts(plan)
