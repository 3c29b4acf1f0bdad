"""An exact reference for the Budgets' Fisher market, written apart from the planner: the Eisenberg-Gale program
solved by CVXPY with Clarabel, and the instances the property tests and bench/budgets.py share.

An instance: ``m`` pools of capacity ``R_j`` units; jobs ``i`` with a tenant, a throughput row ``a_i`` (0: the
pool cannot run it), replicas ``r_i`` of demand 1 (so ``d_ij = r_i`` units when it runs there all the time), a
weight and a utility family. The tenants' shares ``B_t`` are split over their jobs by weight (docs/budgets.md, T1),
here recomputed from the instance, not read from the planner.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import cvxpy as cp
import numpy as np
from walras.planner.cluster import Budget, BudgetSpec, Cluster, Job, Pool, TenantOptions
from walras.planner.market import MarketSettings, solve_market
from walras.planner.model import Snapshot
from walras.planner.spec import MAX_WEIGHT, MIN_WEIGHT, parse_job, parse_pool
from walras.planner.tenants import apply_tenants, market_eps

from tests.simcluster import job, node, pool


@dataclass(frozen=True)
class Instance:
    capacity: tuple[float, ...]
    throughput: tuple[tuple[float, ...], ...]  # (n, m)
    replicas: tuple[int, ...]
    weights: tuple[float, ...]
    families: tuple[str, ...]
    tenant: tuple[int, ...]  # tenant index of each job
    shares: tuple[float, ...]  # per tenant

    @property
    def n(self) -> int:
        return len(self.replicas)

    @property
    def m(self) -> int:
        return len(self.capacity)

    def A(self) -> np.ndarray:
        return np.array(self.throughput, dtype=np.float64).reshape(self.n, self.m)

    def D(self) -> np.ndarray:
        return np.repeat(np.array(self.replicas, dtype=np.float64)[:, None], self.m, axis=1)

    def budgets(self) -> np.ndarray:
        """b_i = B_t w_i / sum_{k in t} w_k (the definition, computed here independently)."""
        w = np.array(self.weights)
        t = np.array(self.tenant)
        totals = np.array([w[t == k].sum() for k in range(len(self.shares))])
        return np.array(self.shares)[t] * w / totals[t]


def generate(rng: np.random.Generator, *, tenants: int | None = None) -> Instance:
    """A random small instance: 2-3 pools, 2-3 tenants of 1-3 jobs, generic throughputs."""
    m = int(rng.integers(2, 4))
    k = tenants or int(rng.integers(2, 4))
    tenant: list[int] = []
    for t in range(k):
        tenant += [t] * int(rng.integers(1, 4))
    n = len(tenant)
    A = rng.uniform(0.2, 10.0, size=(n, m))
    A[rng.random((n, m)) < 0.2] = 0.0
    for i in range(n):
        if not (A[i] > 0).any():
            A[i, int(rng.integers(m))] = rng.uniform(0.2, 10.0)
    replicas = rng.integers(1, 5, size=n)
    capacity = np.maximum(np.round(replicas.sum() * rng.uniform(0.15, 0.5, size=m)), 1.0)
    families = tuple(str(f) for f in rng.choice(["log", "linear", "power"], size=n))
    return Instance(tuple(capacity.tolist()), tuple(map(tuple, A.tolist())), tuple(int(r) for r in replicas),
                    tuple(rng.uniform(0.5, 4.0, size=n).tolist()), families, tuple(tenant),
                    tuple(rng.uniform(0.5, 3.0, size=k).tolist()))


def scaled(inst: Instance, t: int, *, throughput: float = 1.0, weight: float = 1.0) -> Instance:
    """Tenant ``t`` multiplies all its throughputs and/or weights by a factor."""
    A = [tuple(v * throughput for v in row) if inst.tenant[i] == t else row for i, row in enumerate(inst.throughput)]
    w = [v * weight if inst.tenant[i] == t else v for i, v in enumerate(inst.weights)]
    return replace(inst, throughput=tuple(A), weights=tuple(w))


def split(inst: Instance, i: int, k: int) -> Instance:
    """Job ``i`` split into ``k`` identical jobs: each with the job's replicas, throughput a_i / k... expressed as
    k jobs of ``r_i`` replicas each, where the original is made ``k r_i`` replicas of throughput ``a_i`` (so the work
    per replica is the same before and after)."""
    rows, reps, ws, fams, ten = [], [], [], [], []
    for q in range(inst.n):
        copies = k if q == i else 1
        for _ in range(copies):
            rows.append(tuple(v / k for v in inst.throughput[q]) if q == i else inst.throughput[q])
            reps.append(inst.replicas[q])
            ws.append(inst.weights[q])
            fams.append(inst.families[q])
            ten.append(inst.tenant[q])
    return replace(inst, throughput=tuple(rows), replicas=tuple(reps), weights=tuple(ws), families=tuple(fams),
                   tenant=tuple(ten))


def merged(inst: Instance, i: int, k: int) -> Instance:
    """The unsplit counterpart of :func:`split`: job ``i`` with ``k r_i`` replicas and throughput ``a_i``."""
    reps = tuple(r * k if q == i else r for q, r in enumerate(inst.replicas))
    return replace(inst, replicas=reps)


def api_weights(w: float) -> tuple[float, float]:
    """``w`` written as a user can write it: ``(spec.utility.weight, spec.weight)``, each within the bounds the CRD
    and the decoder admit (``[MIN_WEIGHT, MAX_WEIGHT]``, crds/ and ``walras.planner.spec``), whose product ``w`` is
    the job's weight ``w_i`` of (T1) (``walras.planner.tenants.job_weight``). Every ``w`` in ``[MIN_WEIGHT**2,
    MAX_WEIGHT**2]`` can be written so; the scale-invariance guarantee multiplies weights of ``[0.5, 4]`` by c in
    ``[1e-6, 1e6]``, which stays inside. A weight outside cannot be written and is refused here."""
    if not MIN_WEIGHT**2 <= w <= MAX_WEIGHT**2:
        raise ValueError(f"a weight of {w!r} cannot be written as spec.utility.weight x spec.weight")
    utility = min(max(w, MIN_WEIGHT), MAX_WEIGHT)
    return utility, min(max(w / utility, MIN_WEIGHT), MAX_WEIGHT)


def cluster(inst: Instance) -> Cluster:
    """The typed cluster of ``inst`` (pools and jobs only: the market's view), tenant t = namespace ``t<t>``; a
    job's weight is written over ``spec.utility.weight`` and ``spec.weight`` (:func:`api_weights`)."""
    names = [f"p{j}" for j in range(inst.m)]
    pools = tuple(Pool(n, 1, parse_pool({"metadata": {"name": n},
                                         "spec": {"nodeSelector": {"pool": n}, "resource": "nvidia.com/gpu",
                                                  "policy": {"type": "throughput"}}}))
                  for n in names)
    jobs = []
    for i in range(inst.n):
        weight, priority = api_weights(inst.weights[i])
        utility: dict[str, object] = {"type": inst.families[i], "weight": weight}
        if inst.families[i] == "power":
            utility["exponent"] = 0.5
        obj = {"metadata": {"name": f"j{i:03d}", "namespace": f"t{inst.tenant[i]}"},
               "spec": {"throughput": {names[j]: inst.throughput[i][j] for j in range(inst.m)},
                        "utility": utility, "weight": priority, "replicas": {"count": inst.replicas[i]},
                        "demand": 1}}
        spec = parse_job(obj)
        jobs.append(Job(spec.namespace, spec.name, None, spec))
    budgets = tuple(Budget(f"team{t}", 1, BudgetSpec(share, (f"t{t}",))) for t, share in enumerate(inst.shares))
    return Cluster(pools=pools, jobs=tuple(sorted(jobs, key=lambda j: j.key)), budgets=budgets)


@dataclass(frozen=True)
class Outcome:
    allocation: np.ndarray  # (n, m) time fractions, rows in the instance's job order
    prices: np.ndarray


def walras(inst: Instance) -> Outcome:
    """What the planner's market does with tenants on: :func:`apply_tenants` then :func:`solve_market` with the
    tolerance :func:`market_eps` (as ``build_plan`` runs it)."""
    options = TenantOptions(default_share=1.0)
    typed, tenancy = apply_tenants(cluster(inst), options)
    order = {j.key: j.spec for j in typed.jobs}
    utilities = [order[(f"t{inst.tenant[i]}", f"j{i:03d}")].utility for i in range(inst.n)]  # type: ignore[union-attr]
    settings = MarketSettings(eps=market_eps(tenancy, options), budgets=True)  # as build_plan runs the market
    result = solve_market(inst.A(), np.array(inst.capacity), utilities, [1.0] * inst.n, inst.D(), None, settings)
    return Outcome(result.allocation, result.prices)


def eisenberg_gale(inst: Instance, *, slice_of: int | None = None, duals: bool = False) -> Any:
    """The Eisenberg-Gale program (docs/budgets.md, T2) by CVXPY + Clarabel: the allocation and the objective.
    With ``slice_of=t``: only tenant t's jobs, in its proportional slice ``B_t / sum B`` of every pool."""
    A, D, b = inst.A(), inst.D(), inst.budgets()
    rows = np.arange(inst.n) if slice_of is None else np.flatnonzero(np.array(inst.tenant) == slice_of)
    R = np.array(inst.capacity)
    if slice_of is not None:
        R = R * inst.shares[slice_of] / sum(inst.shares)
    # The program is solved in scaled units, which leave its solution unchanged (so that Clarabel meets no badly
    # scaled instance, e.g. a job split into 50 pieces of tiny budgets): each buyer's throughputs over their largest
    # (log(c t) = log c + log t), the budgets over their sum, each pool's capacity and demands over the capacity.
    # The objective is reported in the instance's own units.
    scale_a = np.maximum(A[rows].max(axis=1, keepdims=True), 1e-300)
    scale_r = np.maximum(R, 1e-300)
    X = cp.Variable((rows.size, inst.m), nonneg=True)
    t = cp.sum(cp.multiply(A[rows] / scale_a, X), axis=1)
    capacity = cp.sum(cp.multiply(D[rows] / scale_r, X), axis=0) <= R / scale_r
    constraints = [capacity, cp.sum(X, axis=1) <= 1]
    zero = A[rows] <= 0
    if zero.any():
        constraints.append(X[zero] == 0)
    problem = cp.Problem(cp.Maximize((b[rows] / b[rows].sum()) @ cp.log(t)), constraints)
    try:
        problem.solve(solver=cp.CLARABEL)
    except cp.error.SolverError:  # Clarabel's equilibration stalls on some degenerate instances (51 identical
        problem.solve(solver=cp.CLARABEL, equilibrate_enable=False)  # pieces of a split job): solve without it
    assert problem.status in ("optimal", "optimal_inaccurate"), problem.status
    x = np.clip(np.asarray(X.value), 0.0, None)
    out = x, float(b[rows] @ np.log(np.maximum((A[rows] * x).sum(axis=1), 1e-300)))
    # prices in the instance's units: the scaled capacity row's dual times sum b over the capacity's scale
    prices = np.asarray(capacity.dual_value, dtype=np.float64) * b[rows].sum() / scale_r
    return (*out, prices) if duals else out


def tenant_units(inst: Instance, X: np.ndarray, t: int) -> np.ndarray:
    """Units of each pool tenant t's jobs hold: sum_i d_ij x_ij over its jobs."""
    rows = np.array(inst.tenant) == t
    return (inst.D()[rows] * X[rows]).sum(axis=0)


def tenant_utility(inst: Instance, X: np.ndarray, t: int) -> float:
    """sum_{i in t} b_i log(a_i^T x_i): the tenant's part of the Eisenberg-Gale objective."""
    rows = np.flatnonzero(np.array(inst.tenant) == t)
    rates = np.einsum("ij,ij->i", inst.A()[rows], X[rows])
    return float(inst.budgets()[rows] @ np.log(np.maximum(rates, 1e-300)))


def budget_doc(name: str, share: float, namespaces: list[str], caps: dict[str, float] | None = None) -> dict[str, Any]:
    """A Budget object (the raw manifest the decoder reads) of ``share`` over ``namespaces``, with per-pool caps."""
    spec: dict[str, Any] = {"share": share, "namespaces": namespaces}
    if caps:
        spec["caps"] = [{"pool": p, "maxUnits": u} for p, u in caps.items()]
    return {"kind": "Budget", "metadata": {"name": name, "generation": 1}, "spec": spec}


def gpu_job(name: str, namespace: str, throughput: dict[str, float], replicas: int) -> dict[str, Any]:
    """A FungibleJob of ``replicas`` one-GPU replicas (1 cpu, 1Gi) with ``throughput`` per pool."""
    obj = job(name, throughput, {"count": replicas}, namespace=namespace, cpu="1", memory="1Gi")
    obj["spec"]["resources"]["nvidia.com/gpu"] = "1"
    return obj


def capped_cluster(rng: np.random.Generator, caps: dict[str, float]) -> Snapshot:
    """Two 2-node GPU pools ``a``/``b`` and 1-3 jobs of each of the tenants alpha (share 3, ``caps``) and beta
    (share 1), drawn from ``rng``: the caps-hold-in-placed-plans instances of the tests and the bench."""
    nodes = [node(f"a{k}", {"pool": "a"}) for k in range(2)] + [node(f"b{k}", {"pool": "b"}) for k in range(2)]
    jobs = []
    for t in ("alpha", "beta"):
        for q in range(int(rng.integers(1, 4))):
            pools = {"a": float(rng.uniform(1, 10)), "b": float(rng.uniform(1, 10))}
            if rng.random() < 0.4:
                pools.pop(str(rng.choice(["a", "b"])))
            jobs.append(gpu_job(f"{t}-{q}", t, pools, int(rng.integers(1, 5))))
    return Snapshot(nodes=tuple(nodes), pools=(pool("a", {"pool": "a"}, "throughput"),
                                               pool("b", {"pool": "b"}, "throughput")),
                    jobs=tuple(jobs), budgets=(budget_doc("alpha", 3.0, ["alpha"], caps),
                                               budget_doc("beta", 1.0, ["beta"])))


def equilibrium_violation(inst: Instance, X: np.ndarray, *, tol: float = 1e-3) -> float:
    """How far ``X`` is from an allocation of the budget-constrained equilibrium (docs/budgets.md, T6), by an LP
    (HiGHS) written apart from the planner: the least ``sum_i |spend_i - b_i| / sum b`` over prices ``p >= 0`` and
    per-job multipliers ``beta_i, nu_i >= 0`` under which every job's ``x_i`` is its budget-constrained demand, i.e.
    the LP optimality conditions of ``max a_i^T x, p^T D_i x <= b_i, 1^T x <= 1``: ``beta_i a_ij <= p_j d_ij + nu_i``
    on every usable pool, with equality where ``x_ij > tol``; ``nu_i = 0`` unless ``1^T x_i >= 1 - tol``; ``p_j = 0``
    unless pool j is full within ``tol``; spend ``<= b_i`` for a satiated job (on its best pool all the time), ``=
    b_i`` (the mismatch) for any other. 0: ``X`` is an equilibrium allocation (prices exist), > 0: it is not."""
    from scipy.optimize import linprog

    A, D, b, R = inst.A(), inst.D(), inst.budgets(), np.array(inst.capacity)
    n, m = A.shape
    size = m + 4 * n  # p, beta, nu, spend excess, spend shortfall
    bounds: list[tuple[float, float | None]] = [(0.0, None)] * size
    t, best = (A * X).sum(axis=1), A.max(axis=1)
    for j in range(m):
        if (D[:, j] * X[:, j]).sum() < R[j] * (1 - tol):
            bounds[j] = (0.0, 0.0)
    ub: list[np.ndarray] = []
    ub_rhs: list[float] = []
    eq: list[np.ndarray] = []
    eq_rhs: list[float] = []
    for i in range(n):
        if X[i].sum() < 1 - tol:
            bounds[m + n + i] = (0.0, 0.0)
        for j in range(m):
            if A[i, j] <= 0:
                continue
            row = np.zeros(size)
            row[m + i], row[j], row[m + n + i] = A[i, j] / best[i], -D[i, j], -1.0
            (eq if X[i, j] > tol else ub).append(row)
            (eq_rhs if X[i, j] > tol else ub_rhs).append(0.0)
        row = np.zeros(size)
        row[:m] = D[i] * X[i]
        row[m + 2 * n + i], row[m + 3 * n + i] = -1.0, 1.0
        satiated = t[i] >= best[i] * (1 - tol) and X[i].sum() >= 1 - tol
        (ub if satiated else eq).append(row)
        (ub_rhs if satiated else eq_rhs).append(float(b[i]))
    cost = np.zeros(size)
    cost[m + 2 * n:] = 1.0 / b.sum()
    out = linprog(cost, A_ub=np.array(ub) if ub else None, b_ub=ub_rhs or None, A_eq=np.array(eq) if eq else None,
                  b_eq=eq_rhs or None, bounds=bounds, method="highs")
    return float(out.fun) if out.status == 0 else float("inf")
