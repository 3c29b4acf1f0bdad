"""A waiting job wins capacity by its bid on the REAL control plane (kube-apiserver with its Eviction API and
disruption controller, kube-controller-manager; nodes played by the kubelet stand-in), the operator in-process with
the real planner, as the chart's ServiceAccount with the chart's RBAC, its API client counting every request:

* a pool of one 4-GPU node full of a low-bid job (linear, throughput 1, 4 replicas) with a PodDisruptionBudget
  ``minAvailable: 3``; a job that bids more (throughput 20) arrives: under the pool's default rule (``Market``) one
  of the low job's pods is evicted through the Eviction API (no DELETE of a running pod), the budget holds (never
  fewer than 3 of its pods Running), and the new job's pod runs on the freed GPU;
* then the plans settle: no further eviction, the low job keeps its 3 pods (no oscillation).

docs/preemption.md; with ``CI=true`` missing binaries fail the run (``tests.conftest.control_plane``).
"""

from __future__ import annotations

import threading
import time

from e2e.invariants import overcommitted, rejected
from e2e.test_e2e_safety import CountingOperator, Env, finish, pod_writes
from tests.lifecycle_support import wait_for

pytest_plugins = ["e2e.test_e2e_safety"]  # its env and walras fixtures (module scope)


def test_a_waiting_job_wins_capacity_by_its_bid_through_the_eviction_api(env: Env, walras: CountingOperator) -> None:
    pool_name, _ = env.setup_pool("contend", 1, 4)
    env.job("cheap", {pool_name: 1.0}, 4)
    before = wait_for(lambda: env.running("cheap", 4), 40, "cheap's 4 pods Running")
    env.disruption_budget("cheap", 3, healthy=4, allowed=1)
    walras.wait_plans(2)
    mark = walras.client.mark()
    lowest: list[int] = [4]
    stop = threading.Event()

    def watch() -> None:  # the budget holds throughout: never fewer than 3 of cheap's pods Running
        while not stop.is_set():
            pods = [p for p in env.pods("cheap") if (p.get("status") or {}).get("phase") == "Running"]
            lowest[0] = min(lowest[0], len(pods))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        env.job("rich", {pool_name: 20.0}, 1)
        won = wait_for(lambda: env.running("rich", 1), 60, "rich's pod Running on the freed GPU")
    finally:
        stop.set()
        watcher.join(5)
    assert won[0]["spec"]["nodeName"] == before[0]["spec"]["nodeName"]
    sent = pod_writes(walras.client.writes(mark), env.namespace)
    evictions = [p for _, p in sent if p.endswith("/eviction")]
    assert evictions and all(p.endswith("/eviction") for _, p in sent), f"only evictions, no DELETE: {sent}"
    assert all("/cheap-" in p for p in evictions), evictions
    assert lowest[0] >= 3, f"the PodDisruptionBudget broke: {lowest[0]} of cheap's pods Running"
    events = [e for e in env.events("cheap") if e["reason"] == "Preempted"]
    assert events and "rich" in events[0]["message"], events
    # settled: no oscillation, cheap keeps 3, rich keeps 1
    walras.wait_plans(3)
    mark = walras.client.mark()
    walras.wait_plans(5)
    assert pod_writes(walras.client.writes(mark), env.namespace) == []
    assert env.running("cheap", 3) is not None and env.running("rich", 1) is not None
    assert (env.status("rich").get("replicas") or {}) == {pool_name: 1}
    # the e2e invariants: no node over-committed, no pod rejected by the kubelet
    nodes = [n for n in env.get("/api/v1/nodes")["items"] if n["metadata"]["name"].startswith(pool_name)]
    pods = list(env.get(f"/api/v1/namespaces/{env.namespace}/pods")["items"])
    assert overcommitted(nodes, pods) == [] and rejected(pods) == []
    finish(env, "rich")
    finish(env, "cheap")
