"""Cluster-wide invariants checked after the e2e scenarios on the real control plane (kubelet stand-in).

* **No over-commit**: on every node, the effective requests (:func:`walras_testbed.kubelet.resources.pod_requests`)
  of its Running pods sum to at most the node's allocatable, for every resource, and the Running pods fit ``pods``.
* **No pod lost**: every pod a job's status plans exists, is bound to its planned node and Running; no pod was
  rejected by a node (``Failed`` with ``OutOf<resource>``: the operator bound it where it did not fit).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from walras_testbed.kubelet.resources import add, pod_requests, resources


def overcommitted(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> list[str]:
    """One line per (node, resource) whose Running pods request more than its allocatable."""
    running: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        if pod.get("status", {}).get("phase") == "Running" and pod["spec"].get("nodeName"):
            running.setdefault(pod["spec"]["nodeName"], []).append(pod)
    problems = []
    for node in nodes:
        name = node["metadata"]["name"]
        alloc = resources(node.get("status", {}).get("allocatable"))
        used: dict[str, Fraction] = {}
        for pod in running.get(name, []):
            used = add(used, pod_requests(pod))
        used["pods"] = Fraction(len(running.get(name, [])))
        for resource, value in sorted(used.items()):
            if value > alloc.get(resource, Fraction(0)):
                problems.append(f"{name}: {resource} {float(value):g} > {float(alloc.get(resource, 0)):g}")
    return problems


def rejected(pods: list[dict[str, Any]]) -> list[str]:
    """Pods a node refused (``Failed`` with an ``OutOf...`` reason)."""
    return [f"{p['metadata']['namespace']}/{p['metadata']['name']}: {p['status'].get('reason')}"
            for p in pods if p.get("status", {}).get("phase") == "Failed"
            and str(p["status"].get("reason", "")).startswith("OutOf")]


def not_running(jobs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> list[str]:
    """Planned pods (job status) that are missing, elsewhere than planned, or not Running."""
    by_name = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
    problems = []
    for job in jobs:
        ns = job["metadata"]["namespace"]
        for want in (job.get("status") or {}).get("pods") or []:
            pod = by_name.get((ns, want["name"]))
            if pod is None:
                problems.append(f"{ns}/{want['name']}: missing")
            elif pod["spec"].get("nodeName") != want.get("node"):
                problems.append(f"{ns}/{want['name']}: on {pod['spec'].get('nodeName')}, planned {want.get('node')}")
            elif pod.get("status", {}).get("phase") != "Running":
                problems.append(f"{ns}/{want['name']}: {pod.get('status', {}).get('phase')}")
    return problems


def violations(cluster: Any) -> list[str]:
    """Every invariant violation now (empty when the cluster is sound)."""
    nodes = cluster.get("nodes")["items"]
    pods = cluster.get("pods", "-A")["items"]
    jobs = cluster.get("fungiblejobs", "-A")["items"]
    return [*overcommitted(nodes, pods), *rejected(pods), *not_running(jobs, pods)]
