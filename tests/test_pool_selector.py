"""``walras run --pool-selector`` and the pools' claims (walras.operator.ownership, docs/tasks/two-releases.md):
the kubectl selector syntax, the job's home pool, the division of the pools between releases and the claim race."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from walras.cli.errors import UsageError
from walras.cli.run import pool_selector
from walras.kube.decode import label_selector_text
from walras.kube.errors import Conflict, NotFound
from walras.operator.ownership import ANNOTATION_PLANNED_BY, PoolScope, home_pool
from walras.planner.cluster import LabelSelector, Requirement
from walras.planner.model import LABEL_JOB, LABEL_MANAGED, LABEL_POOL, Snapshot


@pytest.mark.parametrize(("text", "expected"), [
    ("", LabelSelector()),
    ("walras.dev/release=team-a", LabelSelector((("walras.dev/release", "team-a"),))),
    ("a==b, c!=d", LabelSelector((("a", "b"),), (Requirement("c", "NotIn", ("d",)),))),
    ("x in (q, p),!y,z", LabelSelector((), (Requirement("x", "In", ("p", "q")), Requirement("y", "DoesNotExist"),
                                            Requirement("z", "Exists")))),
    ("k notin (a)", LabelSelector((), (Requirement("k", "NotIn", ("a",)),))),
])
def test_kubectl_selector_syntax(text: str, expected: LabelSelector) -> None:
    assert label_selector_text(text) == expected


@pytest.mark.parametrize("text", ["a=b,", "=b", "a in ()", "a=b,a=c", "a b", "a in (b", "-a=b", "a=b c"])
def test_malformed_selectors_are_errors(text: str) -> None:
    with pytest.raises(ValueError, match="label selector"):
        label_selector_text(text)


def test_selector_semantics_as_kubernetes() -> None:
    # kubectl's meaning: != and notin match an object without the key; in needs it
    assert label_selector_text("a!=b").matches({}) and not label_selector_text("a!=b").matches({"a": "b"})
    assert not label_selector_text("a in (b)").matches({}) and label_selector_text("a in (b,c)").matches({"a": "c"})
    assert label_selector_text("!a").matches({"b": "1"}) and not label_selector_text("!a").matches({"a": ""})


def test_cli_pool_selector_is_a_usage_error_when_malformed() -> None:
    class Args:
        pool_selector = "team in (a"

    with pytest.raises(UsageError, match="--pool-selector"):
        pool_selector(Args())  # type: ignore[arg-type]
    Args.pool_selector = "  "
    assert pool_selector(Args()) is None  # type: ignore[arg-type]


def _pool(name: str, labels: dict[str, str] | None = None, holder: str | None = None, rv: str = "1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels or {}, "resourceVersion": rv}
    if holder:
        meta["annotations"] = {ANNOTATION_PLANNED_BY: holder}
    return {"apiVersion": "walras.dev/v1alpha1", "kind": "ResourcePool", "metadata": meta, "spec": {}}


def _job(name: str, throughput: dict[str, float], ns: str = "ns") -> dict[str, Any]:
    return {"kind": "FungibleJob", "metadata": {"name": name, "namespace": ns}, "spec": {"throughput": throughput}}


def _pod(name: str, job: str, pool: str, ns: str = "ns", managed: bool = True) -> dict[str, Any]:
    labels = {LABEL_JOB: job, LABEL_POOL: pool, **({LABEL_MANAGED: "true"} if managed else {})}
    return {"kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels}}


def test_home_pool_is_the_first_existing_pool_by_name_with_a_positive_throughput() -> None:
    pools = ["a100", "k80", "v100"]
    assert home_pool(_job("j", {"v100": 2.0, "k80": 1.0}), pools) == "k80"
    assert home_pool(_job("j", {"a100": 0.0, "v100": 2.0}), pools) == "v100"  # 0: cannot run there
    assert home_pool(_job("j", {"gone": 3.0, "v100": 2.0}), pools) == "v100"  # a missing pool is skipped
    assert home_pool(_job("j", {"a100": 0.0}), pools) == "a100"  # no positive entry: all entries count
    assert home_pool(_job("j", {"gone": 1.0}), pools) is None
    assert home_pool({"spec": {"throughput": "bad"}}, pools) is None


def _snapshot() -> Snapshot:
    pools = (_pool("a-1", {"team": "a"}), _pool("a-2", {"team": "a"}), _pool("b-1", {"team": "b"}),
             _pool("x", {}))
    jobs = (_job("ja", {"a-1": 1.0, "b-1": 2.0}), _job("jb", {"b-1": 1.0, "x": 1.0}), _job("jx", {"x": 1.0}),
            _job("jgone", {"nowhere": 1.0}))
    pods = (_pod("ja-0", "ja", "a-1"), _pod("jb-0", "jb", "b-1"), _pod("orphan-a", "old", "a-2"),
            _pod("orphan-b", "old", "b-1"), _pod("foreign", "", "", managed=False))
    return Snapshot(nodes=(), pods=pods, pools=pools, jobs=jobs, profiles=())


def _names(objs: tuple[Any, ...]) -> set[str]:
    return {o["metadata"]["name"] for o in objs}


def test_two_releases_with_disjoint_selectors_partition_pools_jobs_and_pods() -> None:
    snap = _snapshot()
    a = PoolScope("walras/a", label_selector_text("team=a"))
    b = PoolScope("walras/b", label_selector_text("team in (b)"))
    # as the claims have been written: each release's pools carry its identity
    holders = {"a": "walras/a", "b": "walras/b"}
    claimed = [_pool(p["metadata"]["name"], labels, holders.get(labels.get("team", "")))
               for p in snap.pools for labels in [p["metadata"]["labels"]]]
    sa = a.narrow(snap, a.divide(claimed).managed)
    sb = b.narrow(snap, b.divide(claimed).managed)
    assert _names(sa.pools) == {"a-1", "a-2"} and _names(sb.pools) == {"b-1"}
    assert _names(sa.jobs) == {"ja"} and _names(sb.jobs) == {"jb"}  # jb's home pool is b-1 ("b-1" < "x")
    assert _names(sa.pods) == {"ja-0", "orphan-a", "foreign"} and _names(sb.pods) == {"jb-0", "orphan-b", "foreign"}
    # a release without a selector takes what nobody claimed: x, jx, and the job of no existing pool
    rest = PoolScope("walras/rest")
    scope = rest.divide(claimed)
    assert scope.managed == {"x"} and dict(scope.refused) == {"a-1": "walras/a", "a-2": "walras/a", "b-1": "walras/b"}
    sr = rest.narrow(snap, scope.managed)
    assert _names(sr.jobs) == {"jx", "jgone"}
    # every job has at most one release
    for left, right in itertools.combinations((sa, sb, sr), 2):
        assert not _names(left.jobs) & _names(right.jobs)


def test_divide_claims_refuses_and_takes_over_stale_claims() -> None:
    scope = PoolScope("ns/me", label_selector_text("team=a"))
    pools = [_pool("p1", {"team": "a"}), _pool("p2", {"team": "a"}, "ns/me"), _pool("p3", {"team": "a"}, "ns/other"),
             _pool("p4", {"team": "b"}, None)]
    d = scope.divide(pools)
    assert d.managed == {"p2"} and d.to_claim == ("p1",) and dict(d.refused) == {"p3": "ns/other"}
    d = scope.divide(pools, stale=lambda holder: holder == "ns/other")
    assert d.to_claim == ("p1", "p3") and not d.refused


class FakeClient:
    """The API calls of :meth:`PoolScope.scope`: claims (PATCH) and Lease reads (GET), answered from a table."""

    def __init__(self, conflicts: set[str] = frozenset(), leases: dict[str, Any] | None = None) -> None:
        self.conflicts, self.leases = set(conflicts), leases or {}
        self.calls: list[tuple[str, str, Any]] = []

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        self.calls.append((method, path, body))
        name = path.rsplit("/", 1)[1]
        if method == "PATCH":
            if name in self.conflicts:
                raise Conflict(409, "Conflict", "the object has been modified")
            return {}
        if name not in self.leases:
            raise NotFound(404, "NotFound", "not found")
        return self.leases[name]


def test_scope_claims_with_the_resource_version_and_a_lost_race_is_not_planned() -> None:
    snap = replace_pools(_snapshot(), (_pool("a-1", {"team": "a"}, rv="7"), _pool("a-2", {"team": "a"}, rv="8")))
    client = FakeClient(conflicts={"a-2"})
    scope = PoolScope("walras/a", label_selector_text("team=a"))
    out = asyncio.run(scope.scope(snap, client))  # type: ignore[arg-type]
    assert _names(out.pools) == {"a-1"}
    patches = {path.rsplit("/", 1)[1]: body for method, path, body in client.calls if method == "PATCH"}
    assert patches["a-1"] == {"metadata": {"resourceVersion": "7", "annotations": {ANNOTATION_PLANNED_BY: "walras/a"}}}
    assert patches["a-2"]["metadata"]["resourceVersion"] == "8"


def replace_pools(snap: Snapshot, pools: tuple[dict[str, Any], ...]) -> Snapshot:
    from dataclasses import replace

    return replace(snap, pools=pools)


def test_a_refused_pool_is_reported_once_and_taken_over_when_the_holders_lease_stands_still() -> None:
    now = [0.0]
    lease = {"spec": {"holderIdentity": "pod-1", "renewTime": "t0", "leaseTransitions": 0}}
    client = FakeClient(leases={"other": lease})
    scope = PoolScope("ns/me", label_selector_text("team=a"), stale_after=60.0, clock=lambda: now[0])
    snap = replace_pools(_snapshot(), (_pool("p", {"team": "a"}, "ns/other"),))
    reports: list[tuple[str, str]] = []

    def report(pool: Any, holder: str) -> None:
        reports.append((pool["metadata"]["name"], holder))

    for t in (0.0, 10.0, 30.0):
        now[0] = t
        lease["spec"]["renewTime"] = f"t{t}"  # a live holder renews
        assert not asyncio.run(scope.scope(snap, client, report)).pools  # type: ignore[arg-type]
    assert reports == [("p", "ns/other")]
    assert not [c for c in client.calls if c[0] == "PATCH"]
    now[0] = 89.0  # unchanged for 59 s: still live
    assert not asyncio.run(scope.scope(snap, client, report)).pools  # type: ignore[arg-type]
    now[0] = 91.0  # unchanged for 61 s: the holder is gone, its claim is taken over
    assert _names(asyncio.run(scope.scope(snap, client, report)).pools) == {"p"}  # type: ignore[arg-type]
    assert [c[1] for c in client.calls if c[0] == "PATCH"] == ["/apis/walras.dev/v1alpha1/resourcepools/p"]


def test_without_selector_and_claims_the_snapshot_is_unchanged() -> None:
    snap = _snapshot()
    client = FakeClient()
    assert asyncio.run(PoolScope("walras/x").scope(snap, client)) is snap  # type: ignore[arg-type]
    assert client.calls == []
