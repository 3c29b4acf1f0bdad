"""The invariant checks of the real-control-plane scenarios (``e2e/invariants.py``) on literal cluster states."""

from __future__ import annotations

from typing import Any

from e2e.invariants import not_running, overcommitted, rejected


def node(name: str, **allocatable: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": allocatable}}


def pod(name: str, node_name: str, phase: str, reason: str | None = None, **requests: str) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if reason:
        status["reason"] = reason
    return {"metadata": {"name": name, "namespace": "ns"},
            "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": {"requests": requests}}]},
            "status": status}


def test_overcommit_counts_running_pods_only_and_every_resource() -> None:
    nodes = [node("n1", cpu="2", memory="1Gi", pods="2"), node("n2", cpu="1", pods="10")]
    fits = [pod("a", "n1", "Running", cpu="1500m"), pod("b", "n1", "Running", cpu="500m", memory="1Gi"),
            pod("c", "n1", "Succeeded", cpu="4"), pod("d", "n1", "Failed", "OutOfcpu", cpu="4")]
    assert overcommitted(nodes, fits) == []
    over = [*fits, pod("e", "n1", "Running", cpu="1m"), pod("f", "n2", "Running", **{"nvidia.com/gpu": "1"})]
    assert overcommitted(nodes, over) == ["n1: cpu 2.001 > 2", "n1: pods 3 > 2", "n2: nvidia.com/gpu 1 > 0"]


def test_rejected_and_not_running() -> None:
    pods = [pod("a", "n1", "Running"), pod("b", "n1", "Failed", "OutOfmemory"), pod("c", "n2", "Pending")]
    assert rejected(pods) == ["ns/b: OutOfmemory"]
    jobs = [{"metadata": {"namespace": "ns", "name": "j"}, "status": {"pods": [
        {"name": "a", "node": "n1"}, {"name": "c", "node": "n2"}, {"name": "x", "node": "n1"},
        {"name": "b", "node": "n2"}]}}]
    assert not_running(jobs, pods) == ["ns/c: Pending", "ns/x: missing", "ns/b: on n1, planned n2"]
