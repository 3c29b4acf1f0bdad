"""A model of the API server and of the operator's write path, for planner simulations in the tests.

``SimCluster`` holds raw objects as the API server would (nodes, pods, pools, jobs) and applies a plan's actions the
way :class:`walras.operator.controller.Controller` does (the real ``pod_manifest`` builds the pods; direct mode binds
each pod it creates or plans to bind). A kubelet stand-in admits bound pods: a pod that fits next to the node's
running pods becomes Running, one that does not becomes ``Failed`` with ``OutOf<resource>`` (so a double-booking
plan shows up as a kubelet rejection). The operator side plans from a *lagged* view of the pods (the informer cache
``lag`` writes behind) overlaid with its assumed pods (:class:`walras.operator.assumed.AssumedPods`), as the operator
does; binding conflicts can be injected with a seeded probability.
"""

from __future__ import annotations

import copy
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from walras.kube.decode import cluster_from, pod_from, pod_requests
from walras.kube.decode import quantities as parse_quantities
from walras.kube.encode import job_status, pod_manifest
from walras.operator.assumed import AssumedPods
from walras.planner import Plan, Snapshot
from walras.planner.cluster import Cluster, Pod
from walras.planner.invariants import Violation, check_cluster, check_plan

from tests.planning import build_plan

JSON = dict[str, Any]


def node(name: str, labels: dict[str, str], cpu: str = "16", memory: str = "64Gi", gpu: str = "4",
         pods: str = "110") -> JSON:
    return {"kind": "Node", "metadata": {"name": name, "labels": dict(labels)}, "spec": {},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpu, "pods": pods},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pool(name: str, selector: dict[str, str], policy: str, resource: str = "nvidia.com/gpu", **extra: Any) -> JSON:
    return {"kind": "ResourcePool", "metadata": {"name": name, "generation": 1},
            "spec": {"nodeSelector": dict(selector), "resource": resource, "policy": {"type": policy}, **extra}}


def job(name: str, throughput: dict[str, float], replicas: JSON, *, cpu: str = "2", memory: str = "8Gi",
        utility: JSON | None = None, namespace: str = "ml", uid: str | None = None) -> JSON:
    return {"kind": "FungibleJob",
            "metadata": {"name": name, "namespace": namespace, "generation": 1, "uid": uid or f"uid-{name}"},
            "spec": {"throughput": dict(throughput), "utility": utility or {"type": "log"}, "replicas": replicas,
                     "demand": 1, "resources": {"cpu": cpu, "memory": memory},
                     "template": {"spec": {"containers": [
                         {"name": "main", "image": "x"},
                         {"name": "sidecar", "image": "y", "resources": {"requests": {"cpu": "100m"}}}]}}}}


@dataclass
class SimCluster:
    """API-server state plus the operator model (see the module docstring)."""

    nodes: dict[str, JSON] = field(default_factory=dict)
    pods: dict[tuple[str, str], JSON] = field(default_factory=dict)
    pools: dict[str, JSON] = field(default_factory=dict)
    jobs: dict[tuple[str, str], JSON] = field(default_factory=dict)
    mode: str = "direct"
    lag: int = 0
    bind_conflict: float = 0.0
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    assumed: AssumedPods = field(default_factory=AssumedPods)
    now: float = 0.0
    previous: Plan | None = None
    history: deque[dict[tuple[str, str], JSON]] = field(default_factory=lambda: deque(maxlen=16))
    rejected: list[str] = field(default_factory=list)  # kubelet OutOf<resource> rejections
    violations: list[Violation] = field(default_factory=list)
    counter: int = 0

    # ------------------------------------------------------------------ views

    def snapshot(self, lagged: bool = False) -> Snapshot:
        pods = self.pods
        if lagged and self.lag and self.history:
            # the informer cache lags the operator's own writes (Walras's pods as of ``lag`` passes ago); other
            # writers' pods race with any scheduler (kubelet admission settles those) and are shown as they are
            old = self.history[max(0, len(self.history) - 1 - self.lag)]
            pods = {k: v for k, v in old.items() if k in self.pods and _managed(v)}
            pods.update({k: v for k, v in self.pods.items() if not _managed(v)})
        return Snapshot(nodes=tuple(self.nodes.values()), pods=tuple(pods.values()), pools=tuple(self.pools.values()),
                        jobs=tuple(self.jobs.values()))

    def cluster(self) -> Cluster:
        return cluster_from(self.snapshot())

    def _record(self) -> None:
        self.history.append(copy.deepcopy(self.pods))

    # ------------------------------------------------------------------ the operator

    def plan(self) -> Plan:
        """One operator pass: plan from the lagged cache with the assumed pods, check the plan against the true
        state, apply it."""
        view = self.assumed.overlay(cluster_from(self.snapshot(lagged=True)), self.now)
        plan = build_plan(view, self.previous)
        self.violations.extend(v for v in check_plan(self.cluster(), plan) if v.kind != "LostPod" or not self.lag)
        self.apply(plan)
        self.previous = plan
        return plan

    def apply(self, plan: Plan) -> None:
        for pp in plan.pods:
            key = (pp.namespace, pp.name)
            current = self.pods.get(key)
            if pp.action == "create" and current is None:
                manifest = pod_manifest(self.jobs[(pp.namespace, pp.job)], pp, "walras-scheduler")
                self.counter += 1
                manifest["metadata"]["uid"] = f"pod-{self.counter}"
                manifest["metadata"]["resourceVersion"] = str(self.counter)
                manifest["status"] = {"phase": "Pending"}
                self.pods[key] = manifest
                self.assumed.assume(self._typed(manifest), self.now)
                if self.mode == "direct" and pp.node:
                    self._bind(key, pp.node)
            elif pp.action == "bind" and current is not None and self.mode == "direct" and pp.node:
                if not current["spec"].get("nodeName"):
                    self._bind(key, pp.node)
            elif pp.action in ("delete", "evict"):  # no PodDisruptionBudget here: an eviction is a deletion
                self.pods.pop(key, None)
                self.assumed.forget(*key)  # deleted, or 404: either way no longer ours to count
            elif pp.action == "resize" and current is not None:
                container = current["spec"]["containers"][0]
                resources = container.setdefault("resources", {})
                resources["requests"] = {**(resources.get("requests") or {}), **pp.requests}
                resources["limits"] = {**(resources.get("limits") or {}), **pp.limits}
                self._touch(current)
        for jp in plan.jobs.values():
            obj = self.jobs.get((jp.namespace, jp.name))
            if obj is not None:
                obj["status"] = job_status(jp)

    def _typed(self, manifest: JSON) -> Pod:
        pod = pod_from(manifest)
        assert pod is not None
        return pod

    def _touch(self, obj: JSON) -> None:
        self.counter += 1
        obj["metadata"]["resourceVersion"] = str(self.counter)

    def _bind(self, key: tuple[str, str], node_name: str) -> None:
        pod = self.pods[key]
        if self.rng.random() < self.bind_conflict:
            # a failed binding: the pod exists, unbound; it is assumed as such and planned again next time
            self.assumed.assume(self._typed(pod), self.now)
            return
        pod["spec"]["nodeName"] = node_name
        self._touch(pod)
        self.assumed.assume(self._typed(pod), self.now)

    def bind_pending(self) -> None:
        """Extender mode: kube-scheduler binds each pending pod to the node the plan chose (the extender's answer)."""
        if self.previous is None:
            return
        for pp in self.previous.pods:
            current = self.pods.get((pp.namespace, pp.name))
            if current is not None and pp.node and not current["spec"].get("nodeName") and pp.action in (
                    "create", "bind"):
                self._bind((pp.namespace, pp.name), pp.node)

    # ------------------------------------------------------------------ the kubelet

    def kubelet(self) -> None:
        """Admit bound Pending pods in name order: Running when they fit next to the node's running pods on every
        resource, else Failed with OutOf<resource>."""
        used: dict[str, dict[str, float]] = {}
        for pod in self.pods.values():
            if pod["spec"].get("nodeName") and (pod.get("status") or {}).get("phase") == "Running":
                requests = pod_requests(pod["spec"])
                row = used.setdefault(pod["spec"]["nodeName"], {})
                for name, value in requests.items():
                    row[name] = row.get(name, 0.0) + value
        for key in sorted(self.pods):
            pod = self.pods[key]
            node_name = pod["spec"].get("nodeName")
            if not node_name or (pod.get("status") or {}).get("phase") != "Pending":
                continue
            node_obj = self.nodes.get(node_name)
            if node_obj is None:
                continue
            alloc = parse_quantities(node_obj["status"]["allocatable"])
            row = used.setdefault(node_name, {})
            requests = pod_requests(pod["spec"])
            short = [name for name, value in requests.items() if row.get(name, 0.0) + value > alloc.get(name, 0.0)
                     + 1e-9]
            if short:
                pod["status"] = {"phase": "Failed", "reason": f"OutOf{short[0]}"}
                self.rejected.append(f"{key[0]}/{key[1]} on {node_name}: OutOf{short[0]}")
            else:
                pod["status"] = {"phase": "Running"}
                for name, value in requests.items():
                    row[name] = row.get(name, 0.0) + value
            self._touch(pod)

    def step(self) -> Plan:
        """Advance the clock, record the cache history, plan and apply, run the kubelet."""
        self.now += 1.0
        self._record()
        plan = self.plan()
        if self.mode == "extender":
            self.bind_pending()
        self.kubelet()
        self.violations.extend(v for v in check_cluster(self.cluster()) if v.kind != "StatusDisagrees")
        return plan


def _managed(pod: JSON) -> bool:
    return ((pod.get("metadata") or {}).get("labels") or {}).get("walras.dev/managed") == "true"


def changes(plan: Plan, previous: Plan | None) -> list[str]:
    """The writes a plan asks for: creates, deletes, evictions, resizes, and binds of pods whose planned node changed
    since the previous plan (a pending pod planned to the same node again is no new write, in extender mode)."""
    before = {(p.namespace, p.name): p.node for p in previous.pods} if previous is not None else {}
    out = []
    for p in plan.pods:
        if p.action in ("create", "delete", "evict", "resize"):
            out.append(f"{p.action} {p.namespace}/{p.name}")
        elif p.action == "bind" and before.get((p.namespace, p.name)) != p.node:
            out.append(f"bind {p.namespace}/{p.name} -> {p.node}")
    return out
