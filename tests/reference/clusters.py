"""Generated clusters of issue 33's shape, as raw manifests for the planner and as a plain numeric instance for the
exact reference (:mod:`tests.reference.placement_milp`).

The shape (issue 33, "Measured on 48 generated clusters"): 2-4 GPU pools of 2-4 nodes with 4-8 GPUs each; 5-15 jobs
with Gavel's measured isolated throughputs (Narayanan et al., OSDI 2020; :func:`allocator.datasets.gavel_throughputs`,
the copy the repository ships); log utility; 1-2 GPUs (Gavel's scale factor) and some cpu/memory per replica; the
jobs' total GPU demand (replicas x GPUs per replica) 0.8-2.5x the cluster's GPUs. Some pools carry a degree limit
(the most Walras pods one node may run, ``ResourcePool.spec.degreeLimit``), and a job may be usable on a subset of the
pools only. Everything is drawn from ``numpy.random.default_rng(seed)``: the same seed gives the same cluster.

The numeric :class:`Instance` is written from the same draws, not read back from the planner: it states the integral
problem (paper 004's throughput model, Sec. 2.1, made integral over replicas on nodes) in plain arrays:

* ``a[i, j]``: job i's throughput (iterations/s of the whole job) with all its replicas in pool j (0: not usable);
  job i's throughput with ``n_ij`` replicas in pool j is ``T_i = sum_j a[i, j] n_ij / N_i``, ``N_i = replicas[i]``
  (what ``JobPlan.throughput`` reports: ``sum_j a_ij placed_ij / N_i``);
* ``demand[i]`` units of the pool's priced resource per replica, on one node, plus ``base[i]`` of the other resources
  and one pod slot (``RESOURCES``: GPUs, cpu cores, memory in GiB, pods);
* ``capacity[k]`` per node over ``RESOURCES``, ``node_pool[k]`` its pool, ``degree[j]`` pool j's degree limit
  (``NO_LIMIT`` for none);
* ``weight[i]``: the utility's weight (``u_i(T) = w_i log T``, 004 eq. 1).

Nothing of the planner's logic is imported: the manifests are plain dicts the caller decodes (``tests.planning``);
:func:`snapshot` and :func:`applied` take only the ``Snapshot`` type and the pod label names from
``walras.planner.model``. :func:`from_snapshot` reads an instance from raw manifests (the repository's examples).
"""

from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from allocator.datasets import GAVEL_GPU_TYPES, gavel_throughputs

__all__ = ["GPU", "NO_LIMIT", "RESOURCES", "Instance", "applied", "from_snapshot", "generate", "parse_quantity",
           "snapshot", "tiny"]

GPU = "nvidia.com/gpu"
#: The resources of a node and of a replica, in this order: GPUs, cpu cores, memory in GiB, pod slots.
RESOURCES = (GPU, "cpu", "memory", "pods")
NO_LIMIT = -1
NAMESPACE = "ml"
POOL_LABEL = "walras.dev/bench-pool"
GPU_POLICIES = ("utility", "throughput", "fair")
MAX_PODS = 110
_SUFFIX = {"": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2.0**10, "Mi": 2.0**20,
           "Gi": 2.0**30, "Ti": 2.0**40}
_QUANTITY = re.compile(r"^([0-9.]+(?:[eE][-+]?[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")

def parse_quantity(text: str) -> float:
    """A Kubernetes quantity (``"2"``, ``"500m"``, ``"16Gi"``) as a number (written here: the reference reads no
    planner code)."""
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise ValueError(f"not a quantity: {text!r}")
    return float(match.group(1)) * _SUFFIX[match.group(2) or ""]



@dataclass(frozen=True)
class Instance:
    """One integral placement problem (see the module docstring for the fields' meaning), with the raw manifests
    it was written as (``manifests``: kind -> list of API objects as dicts)."""

    seed: int
    pools: tuple[str, ...]
    pool_resource: tuple[str, ...]
    degree: np.ndarray  # (m,) int, NO_LIMIT for none
    nodes: tuple[str, ...]
    node_pool: np.ndarray  # (K,) int
    capacity: np.ndarray  # (K, R): GPUs (or the pool's priced resource), cpu, memory GiB, pods
    jobs: tuple[str, ...]  # names, all in NAMESPACE
    a: np.ndarray  # (n, m) throughput with all replicas in the pool; 0: not usable
    demand: np.ndarray  # (n,) priced units per replica
    replicas: np.ndarray  # (n,) int N_i
    base: np.ndarray  # (n, R) per replica, the priced resource and pods excluded
    weight: np.ndarray  # (n,)
    namespace: str = NAMESPACE
    #: per job (family, parameter): ("log", 0), ("linear", 0), ("power", exponent), ("alpha", alpha),
    #: ("target", target throughput); empty: every job log (the generated clusters)
    utility: tuple[tuple[str, float], ...] = ()
    #: per job its namespace; empty: every job in ``namespace``
    namespaces: tuple[str, ...] = ()
    manifests: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False, compare=False)

    def utility_of(self, i: int) -> tuple[str, float]:
        return self.utility[i] if self.utility else ("log", 0.0)

    def namespace_of(self, i: int) -> str:
        return self.namespaces[i] if self.namespaces else self.namespace

    @property
    def n(self) -> int:
        return len(self.jobs)

    @property
    def m(self) -> int:
        return len(self.pools)

    def request(self, i: int, j: int) -> np.ndarray:
        """The request vector over ``RESOURCES`` of one replica of job i in pool j."""
        vec = self.base[i].copy()
        vec[RESOURCES.index(self.pool_resource[j])] += self.demand[i]
        vec[RESOURCES.index("pods")] += 1.0
        return vec

    def slots(self, k: int) -> float:
        """Walras pods node k may run: its pod slots, and its pool's degree limit where there is one."""
        d = int(self.degree[self.node_pool[k]])
        pods = float(self.capacity[k, RESOURCES.index("pods")])
        return pods if d == NO_LIMIT else min(pods, float(d))

    def gpus(self) -> float:
        return float(sum(self.capacity[k, RESOURCES.index(self.pool_resource[self.node_pool[k]])]
                         for k in range(len(self.nodes))))


def _gavel_rows() -> list[tuple[str, int, np.ndarray]]:
    """(name, scale factor, throughput on K80/P100/V100) of Gavel's fully measured rows with 1 or 2 GPUs."""
    table = gavel_throughputs()
    rows = []
    for i, name in enumerate(table.job_types):
        row = table.throughput[i]
        scale = int(table.scale_factors[i])
        if scale in (1, 2) and np.all(np.isfinite(row)) and np.any(row > 0):
            rows.append((name, scale, row.astype(np.float64)))
    return rows


def _quantity(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _node(name: str, pool: str, gpu_type: str, cap: np.ndarray, rv: int) -> dict[str, Any]:
    allocatable = {GPU: _quantity(cap[0]), "cpu": _quantity(cap[1]), "memory": f"{_quantity(cap[2])}Gi",
                   "pods": _quantity(cap[3])}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": str(rv),
                         "labels": {"kubernetes.io/hostname": name, "walras.dev/accelerator": gpu_type,
                                    POOL_LABEL: pool}},
            "spec": {},
            "status": {"allocatable": allocatable, "capacity": dict(allocatable),
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _pool(name: str, policy: str, degree: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": {POOL_LABEL: name}, "resource": GPU, "policy": {"type": policy}}
    if degree != NO_LIMIT:
        spec["degreeLimit"] = int(degree)
    return {"apiVersion": "walras.dev/v1alpha1", "kind": "ResourcePool", "metadata": {"name": name,
            "generation": 1, "uid": f"uid-pool-{name}", "resourceVersion": "1"}, "spec": spec}


def _job(name: str, model: str, throughput: dict[str, float], demand: int, replicas: int, cpu: float,
         memory: float, rv: int) -> dict[str, Any]:
    return {"apiVersion": "walras.dev/v1alpha1", "kind": "FungibleJob",
            "metadata": {"name": name, "namespace": NAMESPACE, "generation": 1, "uid": f"uid-job-{name}",
                         "resourceVersion": str(rv)},
            "spec": {"throughput": throughput, "throughputUnit": "iterations/s", "utility": {"type": "log"},
                     "demand": int(demand), "replicas": {"count": int(replicas)},
                     "resources": {"cpu": _quantity(cpu), "memory": f"{_quantity(memory)}Gi"},
                     "template": {"spec": {"containers": [{"name": "train", "image": "example/trainer:0.1",
                                                           "args": ["--model", model]}]}}}}


def generate(seed: int) -> Instance:
    """The cluster of issue 33's shape drawn from ``seed`` (module docstring), as an :class:`Instance` with its
    manifests."""
    rng = np.random.default_rng(seed)
    m = int(rng.integers(2, 5))
    types = [GAVEL_GPU_TYPES[t] for t in rng.permutation(len(GAVEL_GPU_TYPES))]
    pool_types = [types[j % len(types)] for j in range(m)]
    pools = tuple(t if j < len(types) else f"{t}-b" for j, t in enumerate(pool_types))
    degree = np.array([int(rng.integers(2, 5)) if rng.random() < 0.3 else NO_LIMIT for _ in range(m)])
    policies = [GPU_POLICIES[int(rng.integers(len(GPU_POLICIES)))] for _ in range(m)]
    nodes: list[str] = []
    node_pool: list[int] = []
    caps: list[list[float]] = []
    for j in range(m):
        for q in range(int(rng.integers(2, 5))):
            nodes.append(f"{pools[j]}-{q}")
            node_pool.append(j)
            caps.append([float(rng.integers(4, 9)), float(rng.choice([24, 32, 48, 64])),
                         float(rng.choice([96, 128, 192, 256])), float(MAX_PODS)])
    capacity = np.array(caps)
    total_gpus = float(capacity[:, 0].sum())
    n = int(rng.integers(5, 16))
    rows = _gavel_rows()
    picks = rng.integers(len(rows), size=n)
    a = np.zeros((n, m))
    demand = np.zeros(n)
    base = np.zeros((n, len(RESOURCES)))
    models = []
    for i, r in enumerate(picks):
        name, scale, row = rows[int(r)]
        models.append(name)
        demand[i] = scale
        usable = rng.random(m) >= 0.2
        if not usable.any():
            usable[int(rng.integers(m))] = True
        for j in range(m):
            a[i, j] = round(float(row[GAVEL_GPU_TYPES.index(pool_types[j])]), 6) if usable[j] else 0.0
        if not (a[i] > 0).any():  # a row measured 0 on the only usable type
            a[i] = [round(float(row[GAVEL_GPU_TYPES.index(t)]), 6) for t in pool_types]
        base[i, 1] = float(rng.choice([1, 2, 4, 6])) * scale
        base[i, 2] = float(rng.choice([4, 8, 16, 24])) * scale
    factor = float(rng.uniform(0.8, 2.5))
    share = rng.dirichlet(np.ones(n)) * factor * total_gpus
    replicas = np.maximum(1, np.rint(share / demand)).astype(np.int64)
    jobs = tuple(f"job-{i:02d}" for i in range(n))
    manifests = {
        "nodes": [_node(nodes[k], pools[node_pool[k]], pool_types[node_pool[k]], capacity[k], 10 + k)
                  for k in range(len(nodes))],
        "pools": [_pool(pools[j], policies[j], int(degree[j])) for j in range(m)],
        "jobs": [_job(jobs[i], models[i], {pools[j]: float(a[i, j]) for j in range(m) if a[i, j] > 0},
                      int(demand[i]), int(replicas[i]), base[i, 1], base[i, 2], 1000 + i) for i in range(n)],
        "pods": [],
    }
    return Instance(seed=seed, pools=pools, pool_resource=tuple(GPU for _ in pools), degree=degree,
                    nodes=tuple(nodes), node_pool=np.array(node_pool), capacity=capacity, jobs=jobs, a=a,
                    demand=demand, replicas=replicas, base=base, weight=np.ones(n), manifests=manifests)


def tiny(seed: int, mixed: bool = False) -> Instance:
    """A tiny instance for brute force (at most 6 (job, node) pairs, at most 3 replicas a job): 1-2 pools of 1-2
    nodes with 2-4 GPUs, 2-3 jobs of 1-2 GPUs per replica, cpu that binds sometimes, an optional degree limit.
    With ``mixed``, each job's utility is drawn from 004's five families (log, linear, power 0.5, alpha-fair 2,
    target-priority at a throughput it may or may not reach). No manifests (the planner is not run on these)."""
    rng = np.random.default_rng(10_000 + seed)
    while True:
        m = int(rng.integers(1, 3))
        per_pool = [int(rng.integers(1, 3)) for _ in range(m)]
        n = int(rng.integers(2, 4))
        if n * sum(per_pool) <= 6:
            break
    node_pool = np.array([j for j in range(m) for _ in range(per_pool[j])])
    K = node_pool.size
    capacity = np.column_stack([rng.integers(2, 5, K).astype(float), rng.choice([4.0, 6.0, 8.0], K),
                                np.full(K, 64.0), np.full(K, float(MAX_PODS))])
    degree = np.array([int(rng.integers(1, 4)) if rng.random() < 0.4 else NO_LIMIT for _ in range(m)])
    a = np.round(rng.uniform(0.5, 10.0, (n, m)), 3) * (rng.random((n, m)) >= 0.25)
    for i in range(n):
        if not (a[i] > 0).any():
            a[i, int(rng.integers(m))] = 1.0
    demand = rng.integers(1, 3, n).astype(float)
    base = np.zeros((n, len(RESOURCES)))
    base[:, 1] = rng.choice([1.0, 2.0, 3.0], n)
    base[:, 2] = 8.0
    replicas = rng.integers(1, 4, n)
    weight = rng.choice([1.0, 2.0], n)
    families: tuple[tuple[str, float], ...] = ()
    if mixed:
        options = [("log", 0.0), ("linear", 0.0), ("power", 0.5), ("alpha", 2.0), ("target", 0.0)]
        picks = [options[int(c)] for c in rng.integers(len(options), size=n)]
        families = tuple((f, round(float(rng.uniform(0.3, 1.0)) * float(a[i].max()), 3)) if f == "target" else (f, p)
                         for i, (f, p) in enumerate(picks))
    return Instance(seed=seed, pools=tuple(f"p{j}" for j in range(m)), pool_resource=tuple(GPU for _ in range(m)),
                    degree=degree, nodes=tuple(f"n{k}" for k in range(K)), node_pool=node_pool, capacity=capacity,
                    jobs=tuple(f"j{i}" for i in range(n)), a=a, demand=demand, replicas=replicas, base=base,
                    weight=weight, utility=families)


def snapshot(instance: Instance) -> Any:
    """The instance's manifests as a :class:`walras.planner.model.Snapshot` (deep copies)."""
    from walras.planner.model import Snapshot

    man = copy.deepcopy(instance.manifests)
    return Snapshot(nodes=tuple(man["nodes"]), pods=tuple(man.get("pods", ())), pools=tuple(man["pools"]),
                    jobs=tuple(man["jobs"]), profiles=tuple(man.get("profiles", ())))


_rv = itertools.count(10**6)


def applied(snap: Any, plan: Any, *, bound: bool = True) -> Any:
    """``snap`` after the operator carried out ``plan``: deleted and evicted pods gone, created pods there (bound to
    their node and Running with ``bound``, else Pending without a node), bound pods on their node; each written pod
    gets a fresh uid and resourceVersion. (Written here from the pod plans' fields, as the operator's actuator
    would; the labels are the ones Walras puts on its pods.)"""
    from walras.planner.model import LABEL_JOB, LABEL_MANAGED, LABEL_POOL, Snapshot

    pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in snap.pods}
    for pp in plan.pods:
        key = (pp.namespace, pp.name)
        if pp.action in ("delete", "evict"):
            pods.pop(key, None)
        elif pp.action == "create" and pp.node is not None:
            rv = next(_rv)
            spec: dict[str, Any] = {"schedulerName": "walras",
                                    "containers": [{"name": "train", "image": "example/trainer:0.1",
                                                    "resources": {"requests": dict(pp.requests),
                                                                  "limits": dict(pp.limits or pp.requests)}}]}
            if bound:
                spec["nodeName"] = pp.node
            pods[key] = {"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": pp.name, "namespace": pp.namespace, "uid": f"uid-pod-{rv}",
                                      "resourceVersion": str(rv),
                                      "labels": {LABEL_JOB: pp.job, LABEL_POOL: pp.pool, LABEL_MANAGED: "true"}},
                         "spec": spec, "status": {"phase": "Running" if bound else "Pending"}}
        elif pp.action == "bind" and pp.node is not None and key in pods and bound:
            pod = copy.deepcopy(pods[key])
            pod["spec"]["nodeName"] = pp.node
            pod["status"]["phase"] = "Running"
            pod["metadata"]["resourceVersion"] = str(next(_rv))
            pods[key] = pod
    return Snapshot(snap.nodes, tuple(pods.values()), snap.pools, snap.jobs, snap.profiles)


_FAMILIES = {"log": "log", "linear": "linear", "power": "power", "alpha-fair": "alpha", "target-priority": "target"}
_PARAMS = {"log": None, "linear": None, "power": "exponent", "alpha-fair": "alpha", "target-priority": "target"}


def from_snapshot(snap: Any) -> Instance:
    """The instance of a snapshot of raw manifests (nodes, pools, jobs; no pods), read here from the objects'
    fields as the CRDs document them: a node is in the first pool (by name) whose ``nodeSelector`` its labels
    match; a job's ``throughput`` per pool, ``demand``, ``replicas.count`` (an elastic job: ``replicas.max``),
    ``resources`` cpu and memory, ``utility`` (family, parameter, weight) times ``spec.weight``. What the model
    leaves out: colocation interference (a colocation pool's throughputs are taken as written), an elastic job's
    minimum, ``throughputDemand`` and AA utility curves."""
    pools = sorted(snap.pools, key=lambda p: p["metadata"]["name"])
    names, resources, degree, selectors = [], [], [], []
    for pool in pools:
        spec = pool["spec"]
        names.append(pool["metadata"]["name"])
        resources.append(spec["resource"])
        degree.append(int(spec.get("degreeLimit", NO_LIMIT)))
        selectors.append(spec["nodeSelector"])
    nodes, node_pool, caps = [], [], []
    for node in sorted(snap.nodes, key=lambda n: n["metadata"]["name"]):
        labels = node["metadata"].get("labels", {})
        alloc = node["status"]["allocatable"]
        nodes.append(node["metadata"]["name"])
        node_pool.append(next((j for j, sel in enumerate(selectors)
                               if all(labels.get(k) == v for k, v in sel.items())), -1))
        caps.append([parse_quantity(alloc.get(GPU, "0")), parse_quantity(alloc.get("cpu", "0")),
                     parse_quantity(alloc.get("memory", "0")) / 2.0**30,
                     parse_quantity(alloc.get("pods", str(MAX_PODS)))])
    jobs = sorted(snap.jobs, key=lambda j: (j["metadata"]["namespace"], j["metadata"]["name"]))
    n = len(jobs)
    a, demand, replicas = np.zeros((n, len(pools))), np.zeros(n), np.zeros(n, dtype=np.int64)
    base, weight = np.zeros((n, len(RESOURCES))), np.ones(n)
    utilities: list[tuple[str, float]] = []
    for i, job in enumerate(jobs):
        spec = job["spec"]
        for j, name in enumerate(names):
            a[i, j] = float(spec["throughput"].get(name, 0.0))
        demand[i] = float(spec.get("demand", 1))
        count = spec["replicas"]
        replicas[i] = int(count["count"] if "count" in count else count["max"])
        res = spec.get("resources", {})
        base[i, 1] = parse_quantity(res.get("cpu", "0"))
        base[i, 2] = parse_quantity(res.get("memory", "0")) / 2.0**30
        util = spec.get("utility", {"type": "linear"})
        param = _PARAMS[util["type"]]
        utilities.append((_FAMILIES[util["type"]], float(util[param]) if param else 0.0))
        weight[i] = float(util.get("weight", 1.0)) * float(spec.get("weight", 1.0))
    return Instance(seed=-1, pools=tuple(names), pool_resource=tuple(resources), degree=np.array(degree),
                    nodes=tuple(nodes), node_pool=np.array(node_pool), capacity=np.array(caps),
                    jobs=tuple(j["metadata"]["name"] for j in jobs), a=a, demand=demand, replicas=replicas,
                    base=base, weight=weight, utility=tuple(utilities),
                    namespaces=tuple(j["metadata"]["namespace"] for j in jobs))
