"""Typed, validated views of the Walras custom resources (ResourcePool, FungibleJob, ColocationProfile).

The CRD schemas in ``crds/`` reject malformed objects at the API server; this module re-checks what the planner relies
on (the same rules, including the CEL cross-field rules) so that an object that reached the planner some other way
(``walras plan -f``, an older CRD) is reported with a clear message instead of breaking the plan. Every parser
raises ``ValueError`` naming the offending field; :mod:`walras.planner.plan` turns that into a condition and a
Warning event and goes on with the other objects.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from walras.planner.quantity import parse_quantity

POLICIES = ("utility", "colocation", "throughput", "fair")
UTILITY_TYPES = ("linear", "log", "power", "alpha-fair", "target-priority")
CURVE_TYPES = ("linear", "log", "power", "sigmoid")
FAIR_MECHANISMS = ("ps-dsf", "pf-vds", "drfh", "tsf")
COLOCATION_METHODS = ("auto", "search", "exact", "bestors", "bestors+hill", "dynsize")
AA_METHODS = ("alg1", "alg2")
COST_TYPES = ("linear", "convex")

# Bounds of every number and collection a user writes (issue 30 item 7: one object must not stop the others). The
# CRD schemas in crds/ carry the same numbers (tests/test_hostile_bounds.py compares them), so the API server refuses
# an object out of them; these checks refuse the objects created before the bounds existed, or read from a file.
#: spec.weight and spec.utility.weight (issue 32 asks for scale invariance over [1e-6, 1e6]).
MIN_WEIGHT, MAX_WEIGHT = 1e-6, 1e6
#: A throughput is 0 (the pool cannot run the job) or in [MIN_THROUGHPUT, MAX_THROUGHPUT].
MIN_THROUGHPUT, MAX_THROUGHPUT = 1e-9, 1e9
#: spec.demand, spec.colocation.size: one replica's amount of the priced resource (a milli-unit at least).
MIN_DEMAND, MAX_DEMAND = 1e-3, 1e6
#: spec.replicas.count, .max; spec.backoffLimit; spec.migration.maxPodsPerCycle; pool machines.
MAX_REPLICAS = 10_000
#: Pools one job lists in spec.throughput; entries of spec.resources; labels of a pool's nodeSelector.
MAX_POOLS_PER_JOB, MAX_RESOURCES, MAX_SELECTOR_LABELS = 64, 32, 16
#: A quantity in spec.resources (1 Ei: more than any node's memory).
MAX_QUANTITY = 2.0**60
#: Targets and splittable demands of throughput (spec.utility.target, spec.throughputDemand).
MAX_TARGET = 1e12
#: utility.exponent in [MIN_EXPONENT, 1]; utility.alpha, fair.alpha, curve exponents, cost exponents up to MAX_ALPHA.
MIN_EXPONENT, MAX_ALPHA = -100.0, 100.0
#: Points of a utility curve; an amount on it; the size of a value on it, of a curve's scale.
MAX_CURVE_POINTS, MAX_CURVE_AMOUNT, MAX_CURVE_VALUE = 64, 1e6, 1e12
#: Seconds in spec.migration (a year); a relative gain; an interference coefficient; a pool's capacity override.
MAX_SECONDS, MAX_GAIN, MAX_INTERFERENCE, MAX_CAPACITY = 31_536_000, 1e3, 1e3, 1e9
#: Length of a short name (a colocation type, a throughput unit, a pool name key).
MAX_NAME, MAX_UNIT = 253, 32

#: Resources Kubernetes allocates in whole units only: every extended resource (a name with a domain other than
#: kubernetes.io, e.g. nvidia.com/gpu) is an integer count (k8s.io/kubernetes pkg/apis/core/helper
#: IsExtendedResourceName; the API server refuses a fractional request of one).


def integral_resource(name: str) -> bool:
    """Whether Kubernetes accepts only whole amounts of resource ``name``: an extended resource (a name with a
    ``/`` whose domain is not ``kubernetes.io``, not a ``requests.`` quota name); ``cpu``, ``memory``,
    ``ephemeral-storage``, ``hugepages-*`` and ``kubernetes.io/*`` are not."""
    if "/" not in name or name.startswith("requests."):
        return False
    domain = name.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def host_access(template: Mapping[str, Any]) -> tuple[str, ...]:
    """What of the host a pod template asks for, that the default pod policy refuses (docs/security.md, issue 30 item
    6: a FungibleJob must not be a way to create any pod through the operator's ServiceAccount): ``privileged``
    containers, the host's namespaces (``hostNetwork``, ``hostPID``, ``hostIPC``), ``hostPath`` volumes, ``hostPort``s
    and Windows ``hostProcess`` containers (the host-level checks of Pod Security's ``baseline`` level), and a
    ``serviceAccountName`` other than ``default`` (the pod would run with that account's rights, which a user allowed
    only FungibleJobs could not otherwise use: a confused deputy), sorted."""
    spec = template.get("spec") if isinstance(template, Mapping) else None
    if not isinstance(spec, Mapping):
        return ()
    found: set[str] = {name for name in ("hostNetwork", "hostPID", "hostIPC") if spec.get(name) is True}
    for key in ("serviceAccountName", "serviceAccount"):  # the pod would run with that account's rights
        if spec.get(key) not in (None, "", "default"):
            found.add("serviceAccountName")
    if _host_process(spec.get("securityContext")):
        found.add("hostProcess")
    for volume in spec.get("volumes") or []:
        if isinstance(volume, Mapping) and volume.get("hostPath") is not None:
            found.add("hostPath")
    for group in ("containers", "initContainers", "ephemeralContainers"):
        for container in spec.get(group) or []:
            if not isinstance(container, Mapping):
                continue
            context = container.get("securityContext")
            if isinstance(context, Mapping) and context.get("privileged") is True:
                found.add("privileged")
            if _host_process(context):
                found.add("hostProcess")
            for port in container.get("ports") or []:
                if isinstance(port, Mapping) and port.get("hostPort"):
                    found.add("hostPort")
    return tuple(sorted(found))


def _host_process(context: Any) -> bool:
    windows = context.get("windowsOptions") if isinstance(context, Mapping) else None
    return isinstance(windows, Mapping) and windows.get("hostProcess") is True


def whole(value: float) -> bool:
    """Whether ``value`` is a whole number (within 1e-9 of one)."""
    return abs(value - round(value)) <= 1e-9


def _name(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("metadata.name is missing")
    namespace = meta.get("namespace") or ""
    return str(namespace), name


def _mapping(value: Any, field_name: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{field_name} must be an object, got {type(value).__name__}")
    return value


def _number(value: Any, field_name: str, *, minimum: float | None = None, exclusive: bool = False,
            maximum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{field_name} must be a finite number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int past the float range
        raise ValueError(f"{field_name} must be a finite number, got an integer of {len(str(value))} digits") from None
    if not math.isfinite(number):
        raise ValueError(f"{field_name} must be a finite number, got {value!r}")
    if minimum is not None and (number < minimum or (exclusive and number == minimum)):
        relation = ">" if exclusive else ">="
        raise ValueError(f"{field_name} must be {relation} {minimum:g}, got {value!r}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{field_name} must be at most {maximum:g}, got {value!r}")
    return number


def _count(mapping: Mapping[str, Any], field_name: str, most: int) -> Mapping[str, Any]:
    """``mapping`` when it has at most ``most`` entries, each keyed by a name of at most :data:`MAX_NAME` characters."""
    if len(mapping) > most:
        raise ValueError(f"{field_name} has {len(mapping)} entries; at most {most} are allowed")
    for key in mapping:
        if len(str(key)) > MAX_NAME:
            raise ValueError(f"{field_name} has a key of {len(str(key))} characters; at most {MAX_NAME} are allowed")
    return mapping


def _boolean(value: Any, field_name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{field_name} must be true or false, got {value!r}")
    return value


def _integer(value: Any, field_name: str, *, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field_name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{field_name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        shown = value if value < 10**30 else f"an integer of {len(str(value))} digits"
        raise ValueError(f"{field_name} must be at most {maximum}, got {shown}")
    return int(value)


def _choice(value: Any, field_name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{field_name} must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


@dataclass(frozen=True)
class PoolSpec:
    """A validated ResourcePool (cluster-scoped)."""

    name: str
    node_selector: dict[str, str]
    resource: str
    policy: str
    capacity: float | None = None
    degree_limit: int | None = None
    extra_degree: bool = False
    aa_method: str = "alg2"
    profile: str | None = None
    colocation_method: str = "auto"
    machines: int | None = None
    fair_mechanism: str = "ps-dsf"
    fair_alpha: float | None = None
    #: Namespaces whose jobs may ask for host access in this pool (spec.podPolicy.allowHostAccess: privileged,
    #: host namespaces, hostPath, hostPort; :func:`host_access`); empty: none may (the default).
    host_access_namespaces: frozenset[str] = frozenset()
    #: ``spec.preemption`` (docs/preemption.md): whether and how running pods yield to waiting jobs.
    preemption: PreemptionSpec = field(default_factory=lambda: PreemptionSpec())


#: The preemption rules of ``spec.preemption.rule`` (docs/preemption.md).
PREEMPTION_RULES = ("Never", "LowerPriority", "Market")


@dataclass(frozen=True)
class PreemptionSpec:
    """A pool's ``spec.preemption`` (docs/preemption.md): the rule (``Market`` by default: what a user gets without
    asking should let a waiting job that bids more win capacity, issue 31), and the churn budgets: at most
    ``max_per_plan`` running pods preempted per plan (None: 10 % of the pool's running Walras pods, at least 1) and
    ``max_per_hour`` over any hour (None: 3 times that default); ``horizon`` is the time a preemption is taken to
    last (seconds) when the waiting job reports no remaining work."""

    rule: str = "Market"
    max_per_plan: int | None = None
    max_per_hour: int | None = None
    horizon: float = 600.0


def parse_preemption(raw: Any) -> PreemptionSpec:
    """``spec.preemption`` -> :class:`PreemptionSpec` (``ValueError`` names the bad field)."""
    spec = _mapping(raw, "spec.preemption")
    per_plan, per_hour, horizon = spec.get("maxPerPlan"), spec.get("maxPerHour"), spec.get("horizonSeconds")
    out = PreemptionSpec(
        _choice(spec.get("rule", "Market"), "spec.preemption.rule", PREEMPTION_RULES),
        None if per_plan is None else _integer(per_plan, "spec.preemption.maxPerPlan", minimum=0, maximum=100000),
        None if per_hour is None else _integer(per_hour, "spec.preemption.maxPerHour", minimum=0, maximum=1000000),
        600.0 if horizon is None else _number(horizon, "spec.preemption.horizonSeconds", minimum=1.0,
                                              maximum=31536000.0))
    if out.max_per_plan is not None and out.max_per_hour is not None and out.max_per_plan > out.max_per_hour:
        raise ValueError("spec.preemption.maxPerPlan must not exceed spec.preemption.maxPerHour")
    return out


def parse_pool(obj: Mapping[str, Any]) -> PoolSpec:
    """Validate a ResourcePool object and return its :class:`PoolSpec` (``ValueError`` names the bad field)."""
    _, name = _name(obj)
    spec = _mapping(obj.get("spec"), "spec")
    selector = _count(_mapping(spec.get("nodeSelector"), "spec.nodeSelector"), "spec.nodeSelector",
                      MAX_SELECTOR_LABELS)
    if not selector:
        raise ValueError("spec.nodeSelector must select nodes by at least one label")
    for key, value in selector.items():
        if not isinstance(value, str) or len(value) > 63:
            raise ValueError(f"spec.nodeSelector[{key!r}] must be a string of at most 63 characters, got "
                             f"{_short(value)}")
    resource = spec.get("resource")
    if not isinstance(resource, str) or not resource:
        raise ValueError("spec.resource (the priced resource, e.g. nvidia.com/gpu) is required")
    if len(resource) > MAX_NAME:
        raise ValueError(f"spec.resource has {len(resource)} characters; at most {MAX_NAME} are allowed")
    capacity = spec.get("capacity")
    degree = spec.get("degreeLimit")
    policy = _mapping(spec.get("policy"), "spec.policy")
    kind = _choice(policy.get("type"), "spec.policy.type", POLICIES)
    utility = _mapping(policy.get("utility"), "spec.policy.utility")
    colocation = _mapping(policy.get("colocation"), "spec.policy.colocation")
    fair = _mapping(policy.get("fair"), "spec.policy.fair")
    profile = colocation.get("profile")
    if kind == "colocation" and (not isinstance(profile, str) or not profile):
        raise ValueError("spec.policy.colocation.profile is required when spec.policy.type is colocation")
    mechanism = _choice(fair.get("mechanism", "ps-dsf"), "spec.policy.fair.mechanism", FAIR_MECHANISMS)
    alpha = fair.get("alpha")
    if mechanism == "pf-vds" and alpha is None:
        raise ValueError("spec.policy.fair.alpha is required when spec.policy.fair.mechanism is pf-vds")
    machines = colocation.get("machines")
    allowed = _mapping(spec.get("podPolicy"), "spec.podPolicy").get("allowHostAccess") or []
    if not isinstance(allowed, list) or len(allowed) > 256 or not all(isinstance(n, str) and 0 < len(n) <= 63
                                                                       for n in allowed):
        raise ValueError("spec.podPolicy.allowHostAccess must be a list of at most 256 namespace names")
    return PoolSpec(
        name=name,
        node_selector={str(k): str(v) for k, v in selector.items()},
        resource=resource,
        policy=kind,
        capacity=None if capacity is None else _number(capacity, "spec.capacity", minimum=0.0, maximum=MAX_CAPACITY),
        degree_limit=None if degree is None else _integer(degree, "spec.degreeLimit", minimum=1, maximum=1000),
        extra_degree=bool(spec.get("extraDegree", False)),
        aa_method=_choice(utility.get("method", "alg2"), "spec.policy.utility.method", AA_METHODS),
        profile=profile if isinstance(profile, str) else None,
        colocation_method=_choice(
            colocation.get("method", "auto"), "spec.policy.colocation.method", COLOCATION_METHODS
        ),
        machines=None if machines is None
        else _integer(machines, "spec.policy.colocation.machines", minimum=1, maximum=MAX_REPLICAS),
        fair_mechanism=mechanism,
        fair_alpha=None if alpha is None
        else _number(alpha, "spec.policy.fair.alpha", minimum=0.0, exclusive=True, maximum=MAX_ALPHA),
        host_access_namespaces=frozenset(allowed),
        preemption=parse_preemption(spec.get("preemption")),
    )


@dataclass(frozen=True)
class UtilitySpec:
    """A job's utility of its throughput (004 Sec. 2.2): ``type`` with its parameters and a weight."""

    type: str = "linear"
    exponent: float | None = None
    alpha: float | None = None
    target: float | None = None
    weight: float = 1.0


@dataclass(frozen=True)
class CurveSpec:
    """Utility of a pod as a function of the amount it gets on a node (AA policy, paper 000 Sec. 3).

    Either ``points`` (amount, value) pairs, interpolated linearly and held constant after the last point, or a
    parametric family ``type`` (linear ``scale*min(a, saturation)``, log ``scale*log(1+a)``, power
    ``scale*a**exponent``, sigmoid ``scale/(1+exp(-(a-saturation)))``).
    """

    points: tuple[tuple[float, float], ...] = ()
    type: str | None = None
    scale: float = 1.0
    exponent: float = 0.5
    saturation: float | None = None


#: Annotation a running FungibleJob may keep up to date with the work it has left, in the unit of its
#: ``spec.throughput`` times seconds (iterations, when the throughput is iterations per second). With it, the
#: migration phase moves a pod only when the move finishes the job sooner, restart included (docs/lifecycle.md).
ANNOTATION_REMAINING_WORK = "walras.dev/remaining-work"

#: Kubernetes' default ``terminationGracePeriodSeconds``: the restart cost of a move when neither
#: ``spec.migration.restartSeconds`` nor the template's grace period says otherwise.
DEFAULT_GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class MigrationSpec:
    """``spec.migration``: the job opts in to rebalancing. A pod is moved only when the job's utility gains at least
    ``min_gain`` (relative), after the pod ran ``min_run_seconds``, at most ``max_pods_per_cycle`` pods per plan, and
    at least ``cooldown_seconds`` after the job's previous move.

    ``restart_seconds``: the seconds a move stops the job's progress (the pod's termination grace, the replacement's
    scheduling and start, the checkpoint restore); None: the template's ``terminationGracePeriodSeconds``, else
    :data:`DEFAULT_GRACE_SECONDS`. It is used only with the job's remaining work (:data:`ANNOTATION_REMAINING_WORK`),
    which then replaces the ``min_gain`` rule by the finish-sooner rule of :mod:`walras.planner.migration`."""

    min_gain: float = 0.05
    min_run_seconds: float = 600.0
    max_pods_per_cycle: int = 1
    cooldown_seconds: float = 600.0
    restart_seconds: float | None = None


def _parse_migration(spec: Mapping[str, Any]) -> MigrationSpec | None:
    if spec.get("migration") is None:
        return None
    raw = _mapping(spec.get("migration"), "spec.migration")
    restart = raw.get("restartSeconds")
    return MigrationSpec(
        min_gain=_number(raw.get("minGain", 0.05), "spec.migration.minGain", minimum=0.0, maximum=MAX_GAIN),
        min_run_seconds=float(_integer(raw.get("minRunSeconds", 600), "spec.migration.minRunSeconds", minimum=0,
                                       maximum=MAX_SECONDS)),
        max_pods_per_cycle=_integer(raw.get("maxPodsPerCycle", 1), "spec.migration.maxPodsPerCycle", minimum=1,
                                    maximum=MAX_REPLICAS),
        cooldown_seconds=float(_integer(raw.get("cooldownSeconds", 600), "spec.migration.cooldownSeconds",
                                        minimum=0, maximum=MAX_SECONDS)),
        restart_seconds=None if restart is None
        else float(_integer(restart, "spec.migration.restartSeconds", minimum=0, maximum=MAX_SECONDS)),
    )


def _remaining_work(obj: Mapping[str, Any]) -> float | None:
    """The job's :data:`ANNOTATION_REMAINING_WORK`: a finite number >= 0 written as a string (annotations are
    strings). A missing or malformed value is None (the progress signal is advisory: a bad value must not make the
    job invalid and lose its pods; without it the migration phase applies its utility-gain rule)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(ANNOTATION_REMAINING_WORK) if isinstance(annotations, Mapping) else None
    if raw is None:
        return None
    try:
        value = float(str(raw).strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0.0 else None


def restart_cost(spec: JobSpec) -> float:
    """Seconds a move stops ``spec``'s job (:class:`MigrationSpec` ``restart_seconds``): the explicit value, else the
    template's ``terminationGracePeriodSeconds``, else :data:`DEFAULT_GRACE_SECONDS`."""
    rules = spec.migration
    if rules is not None and rules.restart_seconds is not None:
        return rules.restart_seconds
    pod_spec = spec.template.get("spec") if isinstance(spec.template, Mapping) else None
    grace = pod_spec.get("terminationGracePeriodSeconds") if isinstance(pod_spec, Mapping) else None
    if isinstance(grace, int | float) and not isinstance(grace, bool) and grace >= 0:
        return float(grace)
    return DEFAULT_GRACE_SECONDS


@dataclass(frozen=True)
class JobSpec:
    """A validated FungibleJob."""

    namespace: str
    name: str
    generation: int | None
    throughput: dict[str, float]
    utility: UtilitySpec
    demand: float
    replicas: int  # fixed count, or the maximum of an elastic job
    min_replicas: int  # equals ``replicas`` for a fixed count
    elastic: bool
    resources: dict[str, float]
    resource_text: dict[str, str]  # the same quantities as written in the spec ("16Gi"), for pod requests
    colocation_type: str | None
    colocation_size: float
    curve: CurveSpec | None
    throughput_demand: float | None
    weight: float
    template: Mapping[str, Any] = field(default_factory=dict)
    throughput_unit: str = "/s"
    suspend: bool = False
    backoff_limit: int = 6
    migration: MigrationSpec | None = None  # None: the job's running pods are never moved
    remaining_work: float | None = None  # ANNOTATION_REMAINING_WORK, None when absent or malformed
    host_access: tuple[str, ...] = ()  # what of the host the template asks for (:func:`host_access`)
    #: ``spec.replicas.gang``: all ``replicas`` placed together in one pool, or none (docs/gangs.md; the market's
    #: share of the job is then N replicas or 0, an indivisible bundle of 004 Sec. 2.1 with the demand vector of
    #: Sec. 7.1; :mod:`walras.planner.gang`)
    gang: bool = False
    #: Per pool name, the most units of the pool's priced resource one pod may get (set by a tenant's Budget cap on
    #: that pool, :mod:`walras.planner.tenants`: a job with ``curve`` gets at most its ``demand`` there, so the
    #: cap's admission of ``replicas x demand`` units holds under assign-and-allocate's variable amounts)
    pod_caps: tuple[tuple[str, float], ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def _parse_utility(raw: Mapping[str, Any]) -> UtilitySpec:
    if not raw:
        return UtilitySpec()
    kind = _choice(raw.get("type"), "spec.utility.type", UTILITY_TYPES)
    weight = _number(raw.get("weight", 1.0), "spec.utility.weight", minimum=MIN_WEIGHT, maximum=MAX_WEIGHT)
    exponent = alpha = target = None
    if kind == "power":
        if raw.get("exponent") is None:
            raise ValueError("spec.utility.exponent is required for a power utility")
        exponent = _number(raw["exponent"], "spec.utility.exponent", minimum=MIN_EXPONENT)
        if exponent == 0 or exponent > 1:
            raise ValueError(f"spec.utility.exponent must be non-zero and at most 1, got {exponent:g}")
    if kind == "alpha-fair":
        if raw.get("alpha") is None:
            raise ValueError("spec.utility.alpha is required for an alpha-fair utility")
        alpha = _number(raw["alpha"], "spec.utility.alpha", minimum=0.0, maximum=MAX_ALPHA)
    if kind == "target-priority":
        if raw.get("target") is None:
            raise ValueError("spec.utility.target is required for a target-priority utility")
        target = _number(raw["target"], "spec.utility.target", minimum=MIN_THROUGHPUT, maximum=MAX_TARGET)
    return UtilitySpec(type=kind, exponent=exponent, alpha=alpha, target=target, weight=weight)


def _parse_curve(raw: Mapping[str, Any]) -> CurveSpec | None:
    if not raw:
        return None
    points = raw.get("points")
    parametric = _mapping(raw.get("parametric"), "spec.utilityCurve.parametric")
    if (points is not None) == bool(parametric):
        raise ValueError("spec.utilityCurve takes either points or parametric")
    if points is not None:
        if not isinstance(points, list) or len(points) < 2:
            raise ValueError("spec.utilityCurve.points needs at least two points")
        if len(points) > MAX_CURVE_POINTS:
            raise ValueError(f"spec.utilityCurve.points has {len(points)} points; at most {MAX_CURVE_POINTS} are "
                             "allowed")
        pairs = []
        for k, point in enumerate(points):
            point = _mapping(point, f"spec.utilityCurve.points[{k}]")
            amount = _number(point.get("amount"), f"spec.utilityCurve.points[{k}].amount", minimum=0.0,
                             maximum=MAX_CURVE_AMOUNT)
            value = _number(point.get("value"), f"spec.utilityCurve.points[{k}].value", minimum=-MAX_CURVE_VALUE,
                            maximum=MAX_CURVE_VALUE)
            pairs.append((amount, value))
        amounts = [a for a, _ in pairs]
        if any(b <= a for a, b in itertools.pairwise(amounts)):
            raise ValueError("spec.utilityCurve.points must have strictly increasing amounts")
        return CurveSpec(points=tuple(pairs))
    kind = _choice(parametric.get("type"), "spec.utilityCurve.parametric.type", CURVE_TYPES)
    scale = _number(parametric.get("scale", 1.0), "spec.utilityCurve.parametric.scale", minimum=0.0, exclusive=True,
                    maximum=MAX_CURVE_VALUE)
    exponent = _number(
        parametric.get("exponent", 0.5), "spec.utilityCurve.parametric.exponent", minimum=0.0, exclusive=True,
        maximum=MAX_ALPHA,
    )
    saturation = parametric.get("saturation")
    return CurveSpec(
        type=kind,
        scale=scale,
        exponent=exponent,
        saturation=None
        if saturation is None
        else _number(saturation, "spec.utilityCurve.parametric.saturation", minimum=0.0, exclusive=True,
                     maximum=MAX_CURVE_AMOUNT),
    )


def _short(value: Any) -> str:
    """``value`` for a message: its repr, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _throughput(value: Any, field_name: str) -> float:
    """A throughput: 0 (the pool cannot run the job) or in [:data:`MIN_THROUGHPUT`, :data:`MAX_THROUGHPUT`]."""
    number = _number(value, field_name, minimum=0.0, maximum=MAX_THROUGHPUT)
    if 0.0 < number < MIN_THROUGHPUT:
        raise ValueError(f"{field_name} must be 0 or at least {MIN_THROUGHPUT:g}, got {value!r}")
    return number


def _quantity(name: Any, value: Any) -> float:
    """A quantity of ``spec.resources``: at most :data:`MAX_QUANTITY`, and a whole number of an extended resource
    (:func:`integral_resource`: the API server refuses a pod requesting 0.5 nvidia.com/gpu)."""
    field_name = f"spec.resources[{str(name)!r}]"
    amount = parse_quantity(value, field_name)
    if amount > MAX_QUANTITY:
        raise ValueError(f"{field_name} must be at most 1Ei, got {_short(value)}")
    if integral_resource(str(name)) and not whole(amount):
        raise ValueError(f"{field_name} is {_short(value)}, but {name} is an extended resource that Kubernetes "
                         "allocates in whole units only")
    return amount


def parse_job(obj: Mapping[str, Any]) -> JobSpec:
    """Validate a FungibleJob object and return its :class:`JobSpec` (``ValueError`` names the bad field)."""
    namespace, name = _name(obj)
    namespace = namespace or "default"
    spec = _mapping(obj.get("spec"), "spec")
    raw_throughput = _count(_mapping(spec.get("throughput"), "spec.throughput"), "spec.throughput",
                            MAX_POOLS_PER_JOB)
    if not raw_throughput:
        raise ValueError("spec.throughput must list the job's throughput on at least one pool")
    throughput = {
        str(pool): _throughput(value, f"spec.throughput[{pool!r}]") for pool, value in raw_throughput.items()
    }
    replicas_raw = _mapping(spec.get("replicas"), "spec.replicas")
    has_count = "count" in replicas_raw
    has_range = "min" in replicas_raw or "max" in replicas_raw
    if has_count and has_range:
        raise ValueError("spec.replicas takes either count, or min and max, not both")
    if has_range:
        if "max" not in replicas_raw:
            raise ValueError("spec.replicas.max is required with spec.replicas.min")
        high = _integer(replicas_raw["max"], "spec.replicas.max", minimum=1, maximum=MAX_REPLICAS)
        low = _integer(replicas_raw.get("min", 0), "spec.replicas.min", minimum=0, maximum=MAX_REPLICAS)
        if low > high:
            raise ValueError(f"spec.replicas.min ({low}) must be at most spec.replicas.max ({high})")
        elastic = True
    else:
        high = low = _integer(replicas_raw.get("count", 1), "spec.replicas.count", minimum=0, maximum=MAX_REPLICAS)
        elastic = False
    gang = _boolean(replicas_raw.get("gang", False), "spec.replicas.gang")
    if gang and (has_range or not has_count or high < 1):
        raise ValueError("spec.replicas.gang needs spec.replicas.count (at least 1), not min and max")
    raw_resources = _count(_mapping(spec.get("resources"), "spec.resources"), "spec.resources", MAX_RESOURCES)
    resources = {str(k): _quantity(k, v) for k, v in raw_resources.items()}
    colocation = _mapping(spec.get("colocation"), "spec.colocation")
    colocation_type = colocation.get("type")
    if colocation and (not isinstance(colocation_type, str) or not colocation_type):
        raise ValueError("spec.colocation.type is required")
    if isinstance(colocation_type, str) and len(colocation_type) > 63:
        raise ValueError(f"spec.colocation.type has {len(colocation_type)} characters; at most 63 are allowed")
    unit = spec.get("throughputUnit")
    if unit is not None and (not isinstance(unit, str) or len(unit) > MAX_UNIT):
        raise ValueError(f"spec.throughputUnit must be a string of at most {MAX_UNIT} characters, got {_short(unit)}")
    throughput_demand = spec.get("throughputDemand")
    template = _mapping(spec.get("template"), "spec.template")
    generation = (obj.get("metadata") or {}).get("generation")
    return JobSpec(
        namespace=namespace,
        name=name,
        generation=generation if isinstance(generation, int) else None,
        throughput=throughput,
        utility=_parse_utility(_mapping(spec.get("utility"), "spec.utility")),
        demand=_number(spec.get("demand", 1.0), "spec.demand", minimum=MIN_DEMAND, maximum=MAX_DEMAND),
        replicas=high,
        min_replicas=low,
        elastic=elastic,
        resources=resources,
        resource_text={str(k): str(v) for k, v in raw_resources.items()},
        colocation_type=colocation_type if isinstance(colocation_type, str) else None,
        colocation_size=_number(colocation.get("size", 1.0), "spec.colocation.size", minimum=MIN_DEMAND,
                                maximum=MAX_DEMAND),
        curve=_parse_curve(_mapping(spec.get("utilityCurve"), "spec.utilityCurve")),
        throughput_demand=None
        if throughput_demand is None
        else _number(throughput_demand, "spec.throughputDemand", minimum=MIN_THROUGHPUT, maximum=MAX_TARGET),
        weight=_number(spec.get("weight", 1.0), "spec.weight", minimum=MIN_WEIGHT, maximum=MAX_WEIGHT),
        template=template,
        throughput_unit=str(spec.get("throughputUnit") or "/s"),
        suspend=_boolean(spec.get("suspend", False), "spec.suspend"),
        backoff_limit=_integer(spec.get("backoffLimit", 6), "spec.backoffLimit", minimum=0, maximum=MAX_REPLICAS),
        migration=_parse_migration(spec),
        remaining_work=_remaining_work(obj),
        host_access=host_access(template),
        gang=gang,
    )


@dataclass(frozen=True)
class ProfileSpec:
    """A validated ColocationProfile: type names, interference matrix alpha (001 Sec. 3), cost function."""

    name: str
    types: tuple[str, ...]
    interference: tuple[tuple[float, ...], ...]
    cost: str = "linear"
    exponent: float = 1.0


def parse_profile(obj: Mapping[str, Any]) -> ProfileSpec:
    """Validate a ColocationProfile and return its :class:`ProfileSpec` (``ValueError`` names the bad field)."""
    _, name = _name(obj)
    spec = _mapping(obj.get("spec"), "spec")
    types = spec.get("types")
    if not isinstance(types, list) or not types or not all(isinstance(t, str) and t for t in types):
        raise ValueError("spec.types must be a non-empty list of type names")
    if len(types) > 64 or any(len(t) > 63 for t in types):
        raise ValueError("spec.types may list at most 64 type names of at most 63 characters each")
    if len(set(types)) != len(types):
        raise ValueError("spec.types must not repeat a type name")
    matrix = spec.get("interference")
    if not isinstance(matrix, list) or len(matrix) != len(types):
        raise ValueError(f"spec.interference must have one row per type ({len(types)} rows)")
    rows = []
    for k, row in enumerate(matrix):
        if not isinstance(row, list) or len(row) != len(types):
            raise ValueError(f"spec.interference[{k}] must have one entry per type ({len(types)} entries)")
        rows.append(tuple(_number(v, f"spec.interference[{k}][{l}]", minimum=0.0, maximum=MAX_INTERFERENCE)
                          for l, v in enumerate(row)))
    cost = _mapping(spec.get("cost"), "spec.cost")
    kind = _choice(cost.get("type", "linear"), "spec.cost.type", COST_TYPES)
    if kind == "convex" and cost.get("exponent") is None:
        raise ValueError("spec.cost.exponent is required for a convex cost")
    exponent = _number(cost.get("exponent", 1.0), "spec.cost.exponent", minimum=1.0, maximum=MAX_ALPHA)
    return ProfileSpec(name=name, types=tuple(types), interference=tuple(rows), cost=kind, exponent=exponent)
