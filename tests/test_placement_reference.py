"""The exact reference of issue 33 (tests/reference) against brute force on tiny instances (the "written
independently" check of the developers' guide), and the generator's and the measures' own properties.

The brute force enumerates every integer replica matrix ``y[i, k]`` (0..N_i on each node of a pool where job i is
usable), keeps those that fit every node on every resource, the pod slots and the degree limit, and takes the
lexicographic best (jobs served, then ``sum over served of w_i log(T_i / r_i)``); it shares nothing with the MILP
but the instance and :func:`tests.reference.lexicographic`'s definition of the order, restated here inline.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from walras.planner.model import Plan, PodPlan

from tests.reference import evaluate, generate, optimum, snapshot, throughputs, tiny
from tests.reference.clusters import GPU, NO_LIMIT, RESOURCES, Instance, parse_quantity
from tests.reference.metrics import idle_while_waiting


def _u(inst: Instance, i: int, t: float) -> float:
    """004's utility families, restated: w log t, w t, w t^p, w t^(1-a)/(1-a), w min(t - target, 0)."""
    kind, p = inst.utility[i] if inst.utility else ("log", 0.0)
    w = float(inst.weight[i])
    if kind == "log":
        return w * math.log(t) if t > 0 else -math.inf
    if kind == "linear":
        return w * t
    if kind == "power":
        return w * t**p
    if kind == "alpha":
        return w * t ** (1 - p) / (1 - p) if t > 0 else -math.inf  # p > 1 here
    assert kind == "target"
    return w * min(t - p, 0.0)


def brute_force(inst: Instance) -> tuple[int, float, np.ndarray]:
    """(served, objective, replicas) of the lexicographic optimum by enumeration."""
    K = len(inst.nodes)
    cells = [(i, k) for i in range(inst.n) for k in range(K) if inst.a[i, inst.node_pool[k]] > 0]
    best: tuple[int, float] = (-1, -math.inf)
    best_y = np.zeros((inst.n, K), dtype=np.int64)
    r = inst.a.max(axis=1)
    for combo in itertools.product(*[range(int(inst.replicas[i]) + 1) for i, _ in cells]):
        y = np.zeros((inst.n, K), dtype=np.int64)
        for (i, k), v in zip(cells, combo, strict=True):
            y[i, k] = v
        if np.any(y.sum(axis=1) > inst.replicas):
            continue
        ok = True
        for k in range(K):
            j = int(inst.node_pool[k])
            use = np.zeros(len(RESOURCES))
            for i in range(inst.n):
                vec = inst.base[i].copy()
                vec[RESOURCES.index(inst.pool_resource[j])] += inst.demand[i]
                vec[RESOURCES.index("pods")] += 1
                use += y[i, k] * vec
            limit = inst.capacity[k].copy()
            if inst.degree[j] != NO_LIMIT:
                limit[RESOURCES.index("pods")] = min(limit[RESOURCES.index("pods")], inst.degree[j])
            if np.any(use > limit + 1e-9):
                ok = False
                break
        if not ok:
            continue
        per_pool = np.zeros((inst.n, inst.m))
        for k in range(K):
            per_pool[:, inst.node_pool[k]] += y[:, k]
        t = (inst.a * per_pool).sum(axis=1) / inst.replicas
        count, total = 0, 0.0
        for i in range(inst.n):
            if math.isinf(_u(inst, i, 0.0)):  # served first; an unserved such job counts 0
                if t[i] <= 0:
                    continue
                count += 1
            total += _u(inst, i, float(t[i])) - _u(inst, i, float(r[i]))
        value = (count, total)
        if value[0] > best[0] or (value[0] == best[0] and value[1] > best[1] + 1e-12):
            best, best_y = value, y
    return best[0], best[1], best_y


@pytest.mark.parametrize(("seed", "mixed"), [(s, False) for s in range(24)] + [(s, True) for s in range(24, 40)])
def test_reference_equals_brute_force_on_tiny_instances(seed: int, mixed: bool) -> None:
    inst = tiny(seed, mixed)
    print(f"tiny seed {seed}: {inst.n} jobs, {len(inst.nodes)} nodes, degree {inst.degree}, N {inst.replicas}, "
          f"utilities {inst.utility or 'log'}")
    served, value, _ = brute_force(inst)
    ref = optimum(inst, time_limit=10)
    assert ref.status == "optimal", ref.status
    assert ref.served == served
    assert ref.gap >= 0
    assert ref.objective == pytest.approx(value, abs=1e-6)
    assert ref.bound >= value - 1e-6
    # the solution it returns is feasible and its reported numbers are its own
    t = throughputs(inst, ref.replicas)
    np.testing.assert_allclose(ref.throughput, t)
    assert int(sum(t[i] > 0 for i in range(inst.n) if math.isinf(_u(inst, i, 0.0)))) == served
    assert np.all(ref.replicas.sum(axis=1) <= inst.replicas)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_on_generated_clusters_is_feasible_and_work_conserving(seed: int) -> None:
    """On clusters of the issue's shape: the optimum fits every node on every resource and the degree limits, and
    (log utility: a next replica always adds utility) leaves no GPU idle where a waiting job's next replica fits."""
    inst = generate(seed)
    ref = optimum(inst, time_limit=20)
    print(f"seed {seed}: status {ref.status}, gap {ref.gap:.3g}, served {ref.served}/{inst.n}, gpus {ref.gpus}")
    assert ref.gap <= 1e-4
    K = len(inst.nodes)
    used = np.zeros((K, len(RESOURCES)))
    for k in range(K):
        for i in range(inst.n):
            used[k] += ref.replicas[i, k] * inst.request(i, int(inst.node_pool[k]))
    assert np.all(used <= inst.capacity + 1e-9)
    assert np.all(used[:, RESOURCES.index("pods")] <= [inst.slots(k) for k in range(K)])
    idle, waiting = idle_while_waiting(inst, used, ref.replicas.sum(axis=1).astype(float))
    assert (idle, waiting) == (0.0, 0)


def test_generator_is_deterministic_and_of_the_issue_shape() -> None:
    for seed in range(30):
        one, two = generate(seed), generate(seed)
        assert one.manifests == two.manifests
        np.testing.assert_array_equal(one.a, two.a)
        assert 2 <= one.m <= 4 and 5 <= one.n <= 15
        for j in range(one.m):
            members = np.flatnonzero(one.node_pool == j)
            assert 2 <= members.size <= 4
            assert np.all((one.capacity[members, 0] >= 4) & (one.capacity[members, 0] <= 8))
        assert set(one.demand) <= {1.0, 2.0}
        ratio = float((one.replicas * one.demand).sum()) / one.gpus()
        assert 0.5 <= ratio <= 3.5, ratio  # 0.8-2.5x drawn, rounded to whole replicas (at least one each)
        # the manifests say what the instance says
        snap = snapshot(one)
        for i, job in enumerate(snap.jobs):
            spec = job["spec"]
            assert spec["replicas"]["count"] == one.replicas[i] and spec["demand"] == one.demand[i]
            assert spec["utility"] == {"type": "log"}
            for j, pool in enumerate(one.pools):
                assert spec["throughput"].get(pool, 0.0) == one.a[i, j]
            assert parse_quantity(spec["resources"]["cpu"]) == one.base[i, 1]
            assert parse_quantity(spec["resources"]["memory"]) == one.base[i, 2] * 2**30
        for k, node in enumerate(snap.nodes):
            assert parse_quantity(node["status"]["allocatable"][GPU]) == one.capacity[k, 0]
    assert generate(1).manifests != generate(2).manifests


def test_parse_quantity() -> None:
    assert parse_quantity("2") == 2.0
    assert parse_quantity("500m") == 0.5
    assert parse_quantity("16Gi") == 16 * 2**30
    assert parse_quantity("1.5") == 1.5
    with pytest.raises(ValueError):
        parse_quantity("two")


def _plan_of(inst: Instance, replicas: np.ndarray, amount: dict[tuple[int, int], float] | None = None) -> Plan:
    """A plan that creates ``replicas[i, k]`` pods of job i on node k (requests: the job's cpu and memory and its
    demand of GPUs, or ``amount[(i, k)]``)."""
    pods = []
    for i in range(inst.n):
        for k in range(len(inst.nodes)):
            for q in range(int(replicas[i, k])):
                gpus = (amount or {}).get((i, k), float(inst.demand[i]))
                requests = {GPU: f"{gpus:g}", "cpu": f"{inst.base[i, 1]:g}", "memory": f"{inst.base[i, 2]:g}Gi"}
                pods.append(PodPlan(inst.namespace_of(i), f"{inst.jobs[i]}-{k}-{q}", inst.jobs[i],
                                    inst.pools[inst.node_pool[k]], inst.nodes[k], requests, dict(requests)))
    return Plan(pods=tuple(pods))


def test_measures_of_hand_made_plans() -> None:
    """evaluate() on plans written from the reference's own solution: the optimum itself scores 1 with nothing idle,
    starved or under demand; a pod taken away lowers the ratio and leaves its GPUs idle while its job waits; a job
    given no pod is starved; a pod with half its demand is under-demand and counts half a replica."""
    inst = generate(3)
    ref = optimum(inst, time_limit=20)
    best = evaluate(inst, _plan_of(inst, ref.replicas), ref)
    assert best.ratio == pytest.approx(1.0)
    assert (best.starved, best.under_demand, best.idle_waiting, best.violations) == (0, 0, 0.0, 0)
    assert best.gpus == ref.gpus and best.plan_objective == pytest.approx((ref.served, ref.objective))
    i, k = (int(v[0]) for v in np.nonzero(ref.replicas))
    fewer = ref.replicas.copy()
    fewer[i, k] -= 1
    less = evaluate(inst, _plan_of(inst, fewer), ref)
    assert less.ratio < 1.0 and less.idle_waiting >= inst.demand[i] and less.waiting_jobs >= 1
    assert less.gpus == ref.gpus - inst.demand[i]
    none = ref.replicas.copy()
    none[i] = 0
    assert evaluate(inst, _plan_of(inst, none), ref).starved == 1
    two = next(i for i in range(inst.n) if inst.demand[i] == 2 and ref.replicas[i].sum() > 0)
    kk = int(np.flatnonzero(ref.replicas[two])[0])
    half = evaluate(inst, _plan_of(inst, ref.replicas, {(two, kk): 1.0}), ref)
    assert half.under_demand == ref.replicas[two, kk]
    assert half.throughput[two] < ref.throughput[two]
    over = ref.replicas.copy()
    over[i, k] += 40
    assert evaluate(inst, _plan_of(inst, over), ref).violations >= 1
