"""A kubelet stand-in for clusters without kubelets (in the spirit of kwok): Node objects whose pods "run".

:class:`KubeletStandIn` plays the kubelet of every node of a scenario (Node manifests: name, labels, ``spec.taints``,
``status.capacity`` and optionally ``status.allocatable``, which defaults to the capacity) against a real API server
(or the emulated one). No container runs; what a kubelet shows the control plane is reproduced:

* **Registration.** Each Node is created (or, if it exists, its labels and taints are merged), then its status
  subresource gets capacity, allocatable, a ``Ready=True`` condition (reason ``KubeletReady``), the three pressure
  conditions ``False``, an InternalIP address and ``nodeInfo``. The node lifecycle controller then lifts the
  ``node.kubernetes.io/not-ready`` taint the API server put on the new Node.
* **Heartbeats.** The Lease ``kube-node-lease/<node>`` (holder = node, 40 s duration, owned by the Node as the kubelet
  sets it) is renewed every ``lease_interval`` seconds and the Ready condition's ``lastHeartbeatTime`` every
  ``status_interval`` seconds, so the node lifecycle controller never marks the node unreachable.
* **Admission** of each pod bound to one of the nodes, in the order the watch delivers them (as the kubelet's
  ``HandlePodAdditions``, ``k8s.io/kubernetes/pkg/kubelet/lifecycle/predicate.go``): the pod count first, then every
  requested resource in name order: the sum of the admitted, non-terminal pods' effective requests
  (:func:`walras_testbed.kubelet.resources.pod_requests`) plus this pod's must not exceed ``allocatable`` (a resource
  the node does not list has allocatable 0). A pod that fits becomes ``Running`` (``Ready``, ``ContainersReady``,
  ``Initialized``, ``PodScheduled`` and ``PodReadyToStartContainers`` conditions ``True``, a running state per
  container, a pod IP); one that does not becomes ``Failed`` with reason ``OutOf<resource>`` (``OutOfcpu``,
  ``OutOfmemory``, ``OutOfnvidia.com/gpu``, ``OutOfpods``) and the kubelet's message ``Pod was rejected: Node didn't
  have enough resource: cpu, requested: 2000, used: 31000, capacity: 32000`` (cpu in milli-cores). The kubelet's
  other admission checks (node selector, taints, host ports, OS) are NOT run: the scheduler or the binder is trusted
  with them.
* **In-place resize.** When a running pod's requests change (``pods/resize``), the new requests are admitted against
  the node like a new pod would be (without the pod itself): they fit -> ``containerStatuses[].resources`` and
  ``allocatedResources`` take them and the ``PodResizeInProgress``/``PodResizePending`` conditions are cleared; they
  do not -> condition ``PodResizePending`` with reason ``Infeasible`` (more than the node's allocatable) or
  ``Deferred`` (more than what is free now), as the kubelet reports them since v1.33.
* **Deletion.** A bound pod being deleted (``deletionTimestamp`` set) gets SIGTERM: its containers take
  ``stop-seconds`` to exit (the pod's annotation ``kubelet.walras.dev/stop-seconds``, a number or ``inf`` for a job
  that checkpoints until it is killed; default the stand-in's ``stop_seconds``, 0) and are killed when the grace
  period the API server granted (``deletionGracePeriodSeconds``: the pod's ``terminationGracePeriodSeconds`` or what
  the delete/eviction asked for) runs out, so the pod stays ``Terminating`` for
  ``min(stop-seconds, deletionGracePeriodSeconds, grace_cap)`` seconds (``grace_cap``: an upper bound for tests,
  default none). Then the stand-in deletes it with grace period 0 and a UID precondition, as the kubelet's status
  manager does; its resources are freed when the object is gone. A force deletion (grace period 0) removes the
  object at once, whatever the stand-in is doing.
* **Test controls**: :meth:`complete_pod` (``Succeeded``, containers terminated with reason ``Completed``),
  :meth:`fail_pod` (``Failed``), :meth:`set_node_ready` (``Ready=False`` with reason ``KubeletNotReady``, or back),
  :meth:`stop_heartbeats` (the node goes silent: no Lease renewals or status updates, and its pods are no longer
  handled: nothing admitted, no deletion confirmed; the lifecycle controller marks it ``Unknown`` after its grace
  period), :meth:`lose_node` (the node reports ``Ready=False`` once, then goes silent: a node lost at once, without
  waiting the lifecycle controller's 50 s; only a force deletion removes its pods), :meth:`add_node` /
  :meth:`remove_node`.

All state changes run in one asyncio task per event source under one lock, so admission decisions are sequential.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import aiohttp

from walras_testbed.kubelet.client import JSON, ApiClient, ApiError
from walras_testbed.kubelet.resources import Resources, add, milli, pod_requests, resources

logger = logging.getLogger("walras_testbed.kubelet")

LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_SECONDS = 40
KUBELET_VERSION = "v1.36.2-walras-standin"
TERMINAL = ("Succeeded", "Failed")
#: Pod annotation: seconds its containers take to exit after SIGTERM (``inf``: until killed at the grace period).
ANNOTATION_STOP_SECONDS = "kubelet.walras.dev/stop-seconds"


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Admitted:
    """A pod the node admitted: its identity and the requests it holds."""

    namespace: str
    name: str
    requests: Resources


@dataclass
class NodeState:
    """One node of the scenario and the pods it holds."""

    name: str
    index: int
    labels: dict[str, str]
    taints: list[JSON]
    capacity: dict[str, Any]
    allocatable: dict[str, Any]
    ready: bool = True
    heartbeats: bool = True
    uid: str = ""
    admitted: dict[str, Admitted] = field(default_factory=dict)
    next_ip: int = 2

    @classmethod
    def from_manifest(cls, doc: Mapping[str, Any], index: int) -> NodeState:
        meta = doc.get("metadata") or {}
        status = doc.get("status") or {}
        capacity = dict(status.get("capacity") or status.get("allocatable") or {})
        if not capacity:
            raise ValueError(f"node {meta.get('name')!r}: status.capacity is empty")
        capacity.setdefault("pods", "110")
        allocatable = {**capacity, **(status.get("allocatable") or {})}
        labels = {"kubernetes.io/hostname": meta["name"], "kubernetes.io/os": "linux",
                  "kubernetes.io/arch": "amd64", **(meta.get("labels") or {})}
        return cls(name=meta["name"], index=index, labels=labels,
                   taints=list((doc.get("spec") or {}).get("taints") or []),
                   capacity=capacity, allocatable=allocatable)

    @property
    def ip(self) -> str:
        return f"10.200.{self.index // 250}.{self.index % 250 + 1}"

    def used(self, without: str | None = None) -> Resources:
        total: Resources = {}
        for uid, pod in self.admitted.items():
            if uid != without:
                total = add(total, pod.requests)
        return total

    def shortfall(self, requests: Resources, without: str | None = None, count_pod: bool = True,
                  ) -> tuple[str, Fraction, Fraction, Fraction] | None:
        """The first resource the node lacks for ``requests`` (kubelet order: pods, then by name), as
        ``(resource, requested, used, allocatable)``, or None when they fit."""
        alloc = resources(self.allocatable)
        if count_pod:
            others = len([u for u in self.admitted if u != without])
            if others + 1 > alloc.get("pods", Fraction(0)):
                return "pods", Fraction(1), Fraction(others), alloc.get("pods", Fraction(0))
        used = self.used(without)
        for name in sorted(requests):
            want = requests[name]
            if want <= 0:
                continue
            have = alloc.get(name, Fraction(0))
            if used.get(name, Fraction(0)) + want > have:
                return name, want, used.get(name, Fraction(0)), have
        return None


def rejection_message(resource: str, requested: Fraction, used: Fraction, capacity: Fraction) -> str:
    return (f"Pod was rejected: Node didn't have enough resource: {resource}, requested: "
            f"{milli(resource, requested)}, used: {milli(resource, used)}, capacity: {milli(resource, capacity)}")


class KubeletStandIn:
    """The kubelets of a scenario's nodes (see the module docstring). ``await start()``, ``await stop()``."""

    def __init__(self, client: ApiClient, nodes: Iterable[Mapping[str, Any]], lease_interval: float = 10.0,
                 status_interval: float = 60.0, stop_seconds: float = 0.0, grace_cap: float | None = None) -> None:
        self.client = client
        self.nodes: dict[str, NodeState] = {}
        for doc in nodes:
            state = NodeState.from_manifest(doc, len(self.nodes))
            self.nodes[state.name] = state
        self.lease_interval = lease_interval
        self.status_interval = status_interval
        self.stop_seconds = stop_seconds
        self.grace_cap = grace_cap
        self.lock = asyncio.Lock()
        self.tasks: list[asyncio.Task[None]] = []
        self.deleting: dict[str, asyncio.Task[None]] = {}
        self._deleting_on: dict[str, str] = {}  # pod uid -> node, of the deletions being finished
        self.synced = asyncio.Event()
        self.decisions: list[tuple[str, str, str, str]] = []  # (namespace, name, node, "Running" | reason)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Register every node, take over the pods already bound to them, and start watching and heartbeating."""
        for node in list(self.nodes.values()):
            await self._register(node)
        self.tasks.append(asyncio.create_task(self._watch_pods(), name="kubelet-pods"))
        self.tasks.append(asyncio.create_task(self._heartbeat(), name="kubelet-heartbeat"))
        await self.synced.wait()

    async def stop(self, delete_nodes: bool = False) -> None:
        for task in [*self.tasks, *self.deleting.values()]:
            task.cancel()
        for task in [*self.tasks, *self.deleting.values()]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks.clear()
        self.deleting.clear()
        if delete_nodes:
            for name in list(self.nodes):
                await self.client.request("DELETE", f"/api/v1/nodes/{name}")
        await self.client.close()

    # ------------------------------------------------------------------ nodes
    async def _register(self, node: NodeState) -> None:
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node.name, "labels": node.labels},
                "spec": {"taints": node.taints} if node.taints else {}}
        status, out = await self.client.request("POST", "/api/v1/nodes", body)
        if status == 409:
            out = await self.client.call("PATCH", f"/api/v1/nodes/{node.name}",
                                         {"metadata": {"labels": node.labels}}, "application/merge-patch+json")
        elif status >= 300:
            raise ApiError(status, out)
        node.uid = out["metadata"]["uid"]
        await self._patch_node_status(node, full=True)
        await self._renew_lease(node)

    def _conditions(self, node: NodeState) -> list[JSON]:
        stamp = now()
        pressure = [{"type": t, "status": "False", "reason": f"KubeletHasNo{t}" if t != "PIDPressure"
                     else "KubeletHasSufficientPID", "message": "stand-in", "lastHeartbeatTime": stamp,
                     "lastTransitionTime": stamp} for t in ("MemoryPressure", "DiskPressure", "PIDPressure")]
        ready = {"type": "Ready", "status": "True" if node.ready else "False",
                 "reason": "KubeletReady" if node.ready else "KubeletNotReady",
                 "message": "kubelet stand-in is posting ready status" if node.ready
                 else "kubelet stand-in reports the node not ready",
                 "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
        return [*pressure, ready]

    async def _patch_node_status(self, node: NodeState, full: bool = False) -> None:
        status: JSON = {"conditions": self._conditions(node)}
        if full:
            status.update({
                "capacity": node.capacity, "allocatable": node.allocatable,
                "addresses": [{"type": "InternalIP", "address": node.ip}, {"type": "Hostname", "address": node.name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": KUBELET_VERSION,
                             "kubeProxyVersion": "", "containerRuntimeVersion": "standin://0", "osImage": "stand-in",
                             "kernelVersion": "", "machineID": node.name, "systemUUID": node.name,
                             "bootID": node.uid}})
        # strategic merge keys conditions by type, as the kubelet's own status patches do
        await self.client.call("PATCH", f"/api/v1/nodes/{node.name}/status", {"status": status},
                               "application/strategic-merge-patch+json")

    async def _renew_lease(self, node: NodeState) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{node.name}"
        spec = {"holderIdentity": node.name, "leaseDurationSeconds": LEASE_DURATION_SECONDS,
                "renewTime": micro_now()}
        status, _ = await self.client.request("PATCH", path, {"spec": spec}, "application/merge-patch+json")
        if status == 404:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": node.name, "namespace": LEASE_NAMESPACE, "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid}]},
                    "spec": spec}
            status, out = await self.client.request(
                "POST", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases", body)
            if status == 409:  # created meanwhile (a heartbeat racing the registration): renew that one
                await self.client.call("PATCH", path, {"spec": spec}, "application/merge-patch+json")
            elif status >= 300:
                raise ApiError(status, out)

    async def _heartbeat(self) -> None:
        loop = asyncio.get_running_loop()
        last_status = loop.time()
        while True:
            await asyncio.sleep(self.lease_interval)
            beat_status = loop.time() - last_status >= self.status_interval
            for node in list(self.nodes.values()):
                if not node.heartbeats or not node.uid:  # silent, or not registered yet
                    continue
                try:
                    await self._renew_lease(node)
                    if beat_status:
                        await self._patch_node_status(node)
                except (TimeoutError, ApiError, OSError, aiohttp.ClientError) as err:
                    logger.warning("heartbeat of node %s failed: %s", node.name, err)
            if beat_status:
                last_status = loop.time()

    async def add_node(self, doc: Mapping[str, Any]) -> None:
        """Register one more node (as a kubelet joining)."""
        state = NodeState.from_manifest(doc, len(self.nodes))
        async with self.lock:
            self.nodes[state.name] = state
        await self._register(state)

    async def remove_node(self, name: str) -> None:
        """Stop playing ``name``'s kubelet and delete the Node object."""
        async with self.lock:
            self.nodes.pop(name, None)
        await self.client.request("DELETE", f"/api/v1/nodes/{name}")

    async def set_node_ready(self, name: str, ready: bool) -> None:
        """Report ``Ready=True`` or ``Ready=False`` (reason ``KubeletNotReady``) for node ``name``."""
        node = self.nodes[name]
        node.ready = ready
        await self._patch_node_status(node)

    async def stop_heartbeats(self, name: str) -> None:
        """Node ``name`` goes silent: no more Lease renewals or status updates, its pods no longer handled (the
        deletions it was finishing are abandoned: only a force deletion removes those pods now)."""
        async with self.lock:
            node = self.nodes[name]
            node.heartbeats = False
            for uid in [u for u in self.deleting if self._deleting_on.get(u) == name]:
                self.deleting.pop(uid).cancel()
                self._deleting_on.pop(uid, None)

    async def lose_node(self, name: str) -> None:
        """Node ``name`` is lost: it reports ``Ready=False`` (reason ``KubeletNotReady``) one last time and goes
        silent (:meth:`stop_heartbeats`)."""
        await self.set_node_ready(name, False)
        await self.stop_heartbeats(name)

    # ------------------------------------------------------------------ pods
    async def _watch_pods(self) -> None:
        rv = ""
        while True:
            try:
                if not rv:
                    listing = await self.client.call("GET", "/api/v1/pods")
                    rv = listing["metadata"]["resourceVersion"]
                    seen = set()
                    for pod in listing.get("items") or []:
                        seen.add(pod["metadata"]["uid"])
                        await self._on_pod("ADDED", pod)
                    async with self.lock:  # pods deleted while the watch was down
                        for node in self.nodes.values():
                            for uid in [u for u in node.admitted if u not in seen]:
                                del node.admitted[uid]
                    self.synced.set()
                async for event in self.client.watch("/api/v1/pods", rv):
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        rv = "" if obj.get("code") == 410 else rv
                        break
                    rv = obj.get("metadata", {}).get("resourceVersion") or rv
                    if event.get("type") != "BOOKMARK":
                        await self._on_pod(str(event.get("type")), obj)
            except asyncio.CancelledError:
                raise
            except ApiError as err:
                logger.warning("pod watch: %s", err)
                if err.status == 410:
                    rv = ""
                await asyncio.sleep(0.5)
            except (TimeoutError, OSError, ValueError, aiohttp.ClientError) as err:
                logger.warning("pod watch interrupted: %s", err)
                await asyncio.sleep(0.5)

    async def _on_pod(self, kind: str, pod: JSON) -> None:
        meta = pod.get("metadata") or {}
        node = self.nodes.get((pod.get("spec") or {}).get("nodeName") or "")
        uid = str(meta.get("uid"))
        if node is None:
            return
        async with self.lock:
            phase = (pod.get("status") or {}).get("phase")
            if kind == "DELETED" or phase in TERMINAL:
                node.admitted.pop(uid, None)
                return
            if not node.heartbeats:  # a silent (lost) node handles nothing
                return
            if meta.get("deletionTimestamp"):
                if uid not in self.deleting:
                    self.deleting[uid] = asyncio.create_task(self._finish_deletion(pod))
                    self._deleting_on[uid] = node.name
                return
            if uid in node.admitted:
                await self._maybe_resize(node, pod)
                return
            if phase == "Running":  # admitted before this stand-in (re)started
                node.admitted[uid] = Admitted(meta["namespace"], meta["name"], pod_requests(pod))
                return
            await self._admit(node, pod)

    async def _admit(self, node: NodeState, pod: JSON) -> None:
        meta = pod["metadata"]
        requests = pod_requests(pod)
        short = node.shortfall(requests)
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        if short is not None:
            resource = short[0]
            status: JSON = {"phase": "Failed", "reason": f"OutOf{resource}", "message": rejection_message(*short),
                            "startTime": now()}
            self.decisions.append((meta["namespace"], meta["name"], node.name, f"OutOf{resource}"))
        else:
            node.admitted[meta["uid"]] = Admitted(meta["namespace"], meta["name"], requests)
            status = self._running_status(node, pod)
            self.decisions.append((meta["namespace"], meta["name"], node.name, "Running"))
        body = {"metadata": {"uid": meta["uid"]}, "status": status}
        code, out = await self.client.request("PATCH", path, body, "application/merge-patch+json")
        if code >= 300:
            node.admitted.pop(meta["uid"], None)
            logger.warning("status of pod %s/%s not written: %s %s", meta["namespace"], meta["name"], code, out)

    def _running_status(self, node: NodeState, pod: JSON) -> JSON:
        stamp = now()
        ip = f"10.{100 + node.index // 250}.{node.index % 250}.{node.next_ip}"
        node.next_ip = node.next_ip % 250 + 1 if node.next_ip < 250 else 2
        conditions = [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp}
                      for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                "PodScheduled")]
        containers = []
        for c in (pod.get("spec") or {}).get("containers") or []:
            res = c.get("resources") or {}
            containers.append({
                "name": c["name"], "image": c.get("image", ""), "imageID": "", "containerID": f"standin://{c['name']}",
                "ready": True, "started": True, "restartCount": 0, "state": {"running": {"startedAt": stamp}},
                "allocatedResources": res.get("requests") or {}, "resources": res})
        return {"phase": "Running", "conditions": conditions, "hostIP": node.ip, "hostIPs": [{"ip": node.ip}],
                "podIP": ip, "podIPs": [{"ip": ip}], "startTime": stamp, "containerStatuses": containers}

    async def _maybe_resize(self, node: NodeState, pod: JSON) -> None:
        meta = pod["metadata"]
        held = node.admitted[meta["uid"]]
        want = pod_requests(pod)
        if want == held.requests:
            return
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        short = node.shortfall(want, without=meta["uid"], count_pod=False)
        existing = [c for c in (pod.get("status") or {}).get("conditions") or []
                    if c.get("type") not in ("PodResizePending", "PodResizeInProgress")]
        if short is None:
            held.requests = want
            statuses = []
            specs = {c["name"]: c.get("resources") or {} for c in (pod.get("spec") or {}).get("containers") or []}
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                res = specs.get(cs["name"], {})
                statuses.append({**cs, "allocatedResources": res.get("requests") or {}, "resources": res})
            status: JSON = {"conditions": existing, "containerStatuses": statuses}
        else:
            resource, requested, used, have = short
            infeasible = requested > have
            reason = "Infeasible" if infeasible else "Deferred"
            message = (f"Node didn't have enough capacity: {resource}, requested: {milli(resource, requested)}, "
                       f"capacity: {milli(resource, have)}" if infeasible else
                       f"Node didn't have enough resource: {resource}, requested: {milli(resource, requested)}, "
                       f"used: {milli(resource, used)}, capacity: {milli(resource, have)}")
            status = {"conditions": [*existing, {"type": "PodResizePending", "status": "True", "reason": reason,
                                                  "message": message, "lastTransitionTime": now()}]}
        await self.client.request("PATCH", path, {"status": status}, "application/merge-patch+json")

    def termination_seconds(self, pod: Mapping[str, Any]) -> float:
        """How long a pod being deleted stays ``Terminating``: its containers' stop time (annotation
        :data:`ANNOTATION_STOP_SECONDS`, else ``stop_seconds``), at most the grace period granted
        (``deletionGracePeriodSeconds``) and at most ``grace_cap``."""
        meta = pod.get("metadata") or {}
        grace = float(meta.get("deletionGracePeriodSeconds") or 0)
        stop = self.stop_seconds
        text = (meta.get("annotations") or {}).get(ANNOTATION_STOP_SECONDS)
        if text is not None:
            try:
                stop = max(0.0, float(text))
            except ValueError:
                logger.warning("pod %s/%s: %s=%r is not a number; using %g s", meta.get("namespace"),
                               meta.get("name"), ANNOTATION_STOP_SECONDS, text, self.stop_seconds)
        seconds = min(stop, grace)
        return seconds if self.grace_cap is None else min(seconds, self.grace_cap)

    async def _finish_deletion(self, pod: JSON) -> None:
        meta = pod["metadata"]
        try:
            await asyncio.sleep(self.termination_seconds(pod))
            code, out = await self.client.request(
                "DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                 "preconditions": {"uid": meta["uid"]}})
            if code not in (200, 404, 409):
                logger.warning("deleting pod %s/%s: %s %s", meta["namespace"], meta["name"], code, out)
        finally:
            self.deleting.pop(meta["uid"], None)
            self._deleting_on.pop(meta["uid"], None)

    async def _set_terminal(self, namespace: str, name: str, phase: str, reason: str, message: str,
                            exit_code: int) -> None:
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        pod = await self.client.call("GET", path)
        stamp = now()
        statuses = [{**cs, "ready": False, "started": False,
                     "state": {"terminated": {"exitCode": exit_code, "reason": reason, "startedAt": stamp,
                                              "finishedAt": stamp}}}
                    for cs in (pod.get("status") or {}).get("containerStatuses") or []]
        conditions = [{**c, "status": "False", "lastTransitionTime": stamp}
                      if c.get("type") in ("Ready", "ContainersReady") else c
                      for c in (pod.get("status") or {}).get("conditions") or []]
        body = {"metadata": {"uid": pod["metadata"]["uid"]},
                "status": {"phase": phase, "reason": reason if phase == "Failed" else None,
                           "message": message or None, "containerStatuses": statuses, "conditions": conditions}}
        await self.client.call("PATCH", path + "/status", body, "application/merge-patch+json")
        node = self.nodes.get((pod.get("spec") or {}).get("nodeName") or "")
        if node is not None:
            async with self.lock:
                node.admitted.pop(pod["metadata"]["uid"], None)

    async def complete_pod(self, namespace: str, name: str) -> None:
        """Every container exits 0: phase ``Succeeded``; the node frees the pod's resources."""
        await self._set_terminal(namespace, name, "Succeeded", "Completed", "", 0)

    async def fail_pod(self, namespace: str, name: str, reason: str = "Error", message: str = "",
                       exit_code: int = 1) -> None:
        """The pod's containers exit with ``exit_code``: phase ``Failed`` with ``reason``."""
        await self._set_terminal(namespace, name, "Failed", reason, message, exit_code)

    def held(self, name: str) -> Resources:
        """What node ``name`` has admitted, summed (for tests)."""
        return self.nodes[name].used()
