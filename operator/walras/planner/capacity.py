"""Node capacity (kube-scheduler's ``NodeInfo`` and its Filter plugins, vectorised over nodes and resources).

For every node, the free vector over every resource present is ``allocatable - requested`` where ``requested`` sums
the effective requests of every non-terminal pod bound to the node (Walras's or not, terminating ones included, and
the pods the operator has assumed there, :mod:`.cache`). A pod *fits* a node when its request vector is within the
free vector on every resource, the ``pods`` count included (``NodeResourcesFit``). In a plan (``nominated=True``)
a node's requested vector also holds the requests of the pods kube-scheduler *nominated* to it
(:func:`reserve_nominated`, docs/refusals.md "Nominations"). A node is *usable* for new pods when
it is Ready and not cordoned; a job's pods may go to the usable nodes its template admits (``NodeAffinity``,
``TaintToleration``, ``nodeSelector``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from walras.planner.cluster import PODS, Cluster, Constraints, Node, Pod
from walras.planner.reuse import Inputs, Reuse, Same, frozen

#: Slack for float comparisons of quantities (requests are decimal quantities; sums of a few thousand of them).
EPS = 1e-9


@dataclass
class NodeTable:
    """Column view of the nodes: ``alloc`` and ``used`` are ``(K, R)`` over ``resources`` (``pods`` first)."""

    nodes: tuple[Node, ...]
    names: list[str]
    index: dict[str, int]
    resources: tuple[str, ...]
    column: dict[str, int]
    alloc: np.ndarray
    used: np.ndarray
    usable: np.ndarray  # bool (K,)
    #: :meth:`admitted` once computed per constraints (read-only masks; a table reused for the same nodes keeps them).
    masks: dict[Constraints, np.ndarray] = field(default_factory=dict)
    #: Each label key's values over the nodes, once read (:func:`walras.planner.objects.select`; kept like masks).
    labels: dict[str, np.ndarray] = field(default_factory=dict)

    def copy(self) -> NodeTable:
        """The same table with its own ``used`` (a phase that reserves writes into its copy, never into a table
        another phase reads); the node data and the memo dicts (``masks``, ``labels``) are shared."""
        return NodeTable(self.nodes, self.names, self.index, self.resources, self.column, self.alloc,
                         self.used.copy(), self.usable, self.masks, self.labels)

    @property
    def free(self) -> np.ndarray:
        """Free amount per node and resource (may be negative on a node that is already over-committed)."""
        return self.alloc - self.used

    def vector(self, requests: Mapping[str, float]) -> np.ndarray:
        """A request mapping as a vector over ``resources`` (names this cluster does not know are ignored here;
        :meth:`unknown` reports them)."""
        out = np.zeros(len(self.resources))
        for name, value in requests.items():
            r = self.column.get(name)
            if r is not None:
                out[r] = value
        return out

    def unknown(self, requests: dict[str, float]) -> list[str]:
        """Requested resources that no node offers (a pod requesting one fits nowhere)."""
        return sorted(name for name, value in requests.items() if value > 0 and name not in self.column)

    def add(self, k: int, vector: np.ndarray) -> None:
        """Reserve ``vector`` on node ``k`` (kube-scheduler's Reserve/assume)."""
        self.used[k] += vector

    def fits(self, k: int, vector: np.ndarray) -> bool:
        """Whether ``vector`` fits node ``k``'s free vector on every resource."""
        return bool(np.all(self.used[k] + vector <= self.alloc[k] + EPS * np.maximum(1.0, self.alloc[k])))

    def fits_many(self, nodes: np.ndarray, vector: np.ndarray) -> np.ndarray:
        """Mask over ``nodes``: whether ``vector`` fits each one's free vector on every resource."""
        alloc = self.alloc[nodes]
        return np.all(self.used[nodes] + vector <= alloc + EPS * np.maximum(1.0, alloc), axis=1)

    def fit_count(self, vector: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """How many pods of request ``vector`` each node of ``nodes`` can still take (0 where none fits)."""
        if nodes.size == 0:
            return np.zeros(0, dtype=np.int64)
        free = np.maximum(self.free[nodes], 0.0)
        need = vector > 0
        if not need.any():
            return np.full(nodes.size, 1 << 30, dtype=np.int64)
        slack = EPS * np.maximum(1.0, self.alloc[nodes][:, need])
        counts = np.floor((free[:, need] + slack) / vector[need]).min(axis=1)
        return np.maximum(counts, 0).astype(np.int64)

    def admitted(self, constraints: Constraints) -> np.ndarray:
        """Usable nodes a pod with ``constraints`` may be placed on (bool mask, read-only)."""
        got = self.masks.get(constraints)
        if got is not None:
            return got
        if constraints == Constraints():
            plain = np.array([not any(t.effect in ("NoSchedule", "NoExecute") for t in n.taints) for n in self.nodes],
                             dtype=bool)
            got = self.usable & plain
        else:
            got = self.usable & np.array([constraints.admits(n) for n in self.nodes], dtype=bool)
        self.masks[constraints] = frozen(got)
        return got

    def over_committed(self) -> list[tuple[str, str, float, float]]:
        """``(node, resource, requested, allocatable)`` for every pair where requests exceed allocatable."""
        over = self.used > self.alloc + EPS * np.maximum(1.0, self.alloc)
        return [
            (self.names[k], self.resources[r], float(self.used[k, r]), float(self.alloc[k, r]))
            for k, r in zip(*np.nonzero(over), strict=True)
        ]


@dataclass(frozen=True)
class TableEntry:
    """The capacity phase's record (:mod:`.reuse`): the node table of the nodes and pods in ``inputs``
    (``(Same(nodes), Same(pods))``), its arrays read-only, with the admitted masks and label columns plans added."""

    inputs: Inputs
    table: NodeTable


def node_table(cluster: Cluster, reuse: Reuse | None = None, *, nominated: Nominations | None = None) -> NodeTable:
    """The :class:`NodeTable` of ``cluster``: every non-terminal pod bound to an existing node counts there, and with
    ``nominated`` (the plan's table, :func:`nominations`; not the invariants', which count bound pods only) the pods
    nominated to a node are reserved on it (:func:`reserve_nominated`). With
    ``reuse`` (the caller's cache, :mod:`.reuse`), a cluster with the same node and pod objects in the same order as
    the recorded table was built from gets that table (its arrays shared read-only, ``used`` copied: later phases
    reserve in it); this plan's is recorded."""
    reuse = reuse or Reuse.off()
    inputs = (Same(cluster.nodes), Same(cluster.pods))
    hit = reuse.lookup(TableEntry, inputs)
    if hit is not None:
        t = hit.table
        table = NodeTable(t.nodes, t.names, t.index, t.resources, t.column, t.alloc, t.used.copy(), t.usable,
                          dict(t.masks), dict(t.labels))
        # the same arrays, with this plan's masks and label columns
        reuse.store(TableEntry(inputs, NodeTable(t.nodes, t.names, t.index, t.resources, t.column, t.alloc, t.used,
                                                 t.usable, table.masks, table.labels)))
        reserve_nominated(table, cluster, nominated or {})
        return table
    table = _node_table(cluster)
    shared = NodeTable(table.nodes, table.names, table.index, table.resources, table.column, frozen(table.alloc),
                       frozen(table.used.copy()), frozen(table.usable), table.masks,
                       table.labels)  # masks and label columns: this plan's too
    reuse.store(TableEntry(inputs, shared))
    reserve_nominated(table, cluster, nominated or {})
    return table


#: Seconds a plan keeps holding a node for a pod after kube-scheduler cleared its nomination while the pod is still
#: unbound (docs/refusals.md): kube-scheduler clears a nomination when an attempt of the preemptor fails while its
#: victims are still leaving (seen on the real control plane: the nomination is gone for ~0.1 s before the next
#: attempt binds the pod), and a plan in that gap must not refill the room.
NOMINATION_HOLD = 30.0

Nominations = Mapping[tuple[str, str], tuple[str, float | None]]


def nominations(cluster: Cluster, previous: Nominations | None = None, now: float | None = None
                ) -> dict[tuple[str, str], tuple[str, float | None]]:
    """The pods whose requests a plan reserves on a node (docs/refusals.md, "Nominations"): pod -> (node, since).

    A pod of another controller (not one Walras manages), live (not terminal, not terminating), not bound yet, with
    ``status.nominatedNodeName`` naming an existing node, at a priority higher than the lowest of the Walras pods
    that count on that node (terminating ones included: the victims of the preemption), or on a node no Walras pod
    counts on. kube-scheduler's own filters count such a pod on its node for every pod of no higher priority
    (``addNominatedPods``); Walras's pods are of lower priority, so the planner counts it too and places none of
    Walras's replacements into the room the preemption freed while the nomination stands. A pod in ``previous`` (the
    previous plan's) whose nomination is cleared meanwhile, and that is still unbound and live, stays reserved on
    its node for :data:`NOMINATION_HOLD` seconds from when it was first reserved there (with a clock)."""
    before = previous or {}
    out: dict[tuple[str, str], tuple[str, float | None]] = {}
    # the foreign, unbound, live pods: the only ones that may be reserved (most clusters have none)
    waiting = [pod for pod in cluster.pods
               if pod.job is None and pod.node is None and not pod.terminal and not pod.terminating]
    if not waiting:
        return out
    nodes = {node.name for node in cluster.nodes}
    lowest: dict[str, int] = {}
    for pod in cluster.pods:
        if pod.job is not None and pod.node is not None and not pod.terminal:
            lowest[pod.node] = min(pod.priority, lowest.get(pod.node, pod.priority))
    for pod in waiting:
        node, since = pod.nominated, now
        held = before.get(pod.key)
        if held is not None and (node is None or node == held[0]):
            node, since = held
            if pod.nominated is None and now is not None and since is not None and now - since >= NOMINATION_HOLD:
                continue
        if node is not None and node in nodes and (node not in lowest or pod.priority > lowest[node]):
            out[pod.key] = (node, since)
    return out


def reserve_nominated(table: NodeTable, cluster: Cluster, held: Nominations) -> None:
    """Reserve the requests of the pods ``held`` (:func:`nominations`) on their nodes of ``table``: per node, the
    nominated pods' requests less what the node's terminating pods hold (the room they free is the room the
    nomination waits for: counting both would sell it twice), at least 0 per resource."""
    if not held:
        return
    wanted = np.zeros_like(table.used)
    leaving = np.zeros_like(table.used)
    pods = {pod.key: pod for pod in cluster.pods}
    for key, (node, _) in held.items():
        pod = pods.get(key)
        if pod is not None:
            wanted[table.index[node]] += table.vector(pod.requests)
    for pod in cluster.pods:
        k = table.index.get(pod.node) if pod.node is not None else None
        if k is not None and pod.terminating and not pod.terminal and wanted[k].any():
            leaving[k] += table.vector(pod.requests)
    table.used += np.maximum(wanted - leaving, 0.0)


def _node_table(cluster: Cluster) -> NodeTable:
    names = [n.name for n in cluster.nodes]
    index = {name: k for k, name in enumerate(names)}
    # Pods repeat a few request mappings (the translation shares equal ones): each distinct mapping is read once
    # (by identity), for the resource names (as Cluster.resource_names) and for its vector; then one np.add.at over
    # the (pod's node, pod's vector) pairs, in pod order.
    distinct: dict[int, int] = {}
    requests_of: list[Mapping[str, float]] = []
    at_nodes: list[int] = []
    at_vectors: list[int] = []
    for pod in cluster.pods:
        if pod.phase in ("Succeeded", "Failed"):  # Pod.terminal: counts nowhere, names no resource
            continue
        requests = pod.requests
        g = distinct.get(id(requests))
        if g is None:
            g = distinct[id(requests)] = len(requests_of)
            requests_of.append(requests)
        if pod.node is None:
            continue
        at = index.get(pod.node)
        if at is not None:
            at_nodes.append(at)
            at_vectors.append(g)
    known = {PODS}
    for node in cluster.nodes:
        known.update(node.allocatable)
    for requests in requests_of:
        known.update(requests)
    resources = (PODS, *sorted(known - {PODS}))
    column = {name: r for r, name in enumerate(resources)}
    alloc = np.zeros((len(names), len(resources)))
    for k, node in enumerate(cluster.nodes):
        for name, value in node.allocatable.items():
            alloc[k, column[name]] = value
    vectors = np.zeros((len(requests_of), len(resources)))
    for g, requests in enumerate(requests_of):
        for name, value in requests.items():
            vectors[g, column[name]] = value
    used = np.zeros_like(alloc)
    if at_nodes:
        np.add.at(used, np.array(at_nodes), vectors[np.array(at_vectors)])
    usable = np.array([n.usable for n in cluster.nodes], dtype=bool)
    return NodeTable(cluster.nodes, names, index, resources, column, alloc, used, usable)


def room_for(pod: Pod, node: Node | None, others: Sequence[Pod]) -> str | None:
    """Why ``pod`` may not be bound to ``node`` now, or None when it fits: the node exists and, with every
    non-terminal pod bound to it (``others``: the cluster's and the operator's assumed ones; ``pod`` itself is
    left out), has free room for each resource ``pod`` requests (``pods`` included), the check that keeps a binding
    from over-committing a node (the extender binds foreign pods only after it, docs/refusals.md)."""
    if node is None:
        return "the node does not exist"
    used: dict[str, float] = {}
    for other in others:
        if other.node != node.name or other.terminal or other.key == pod.key:
            continue
        for resource, value in other.requests.items():
            used[resource] = used.get(resource, 0.0) + value
    for resource, value in sorted(pod.requests.items()):
        have = node.allocatable.get(resource, 0.0)
        if value > 0 and used.get(resource, 0.0) + value > have + EPS * max(1.0, have):
            return (f"node {node.name} has {have - used.get(resource, 0.0):.6g} {resource} free, the pod requests "
                    f"{value:.6g}")
    return None
