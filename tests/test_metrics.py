"""walras.metrics: every gauge set from a hand-built Plan, the job cardinality limit, series removal."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families
from walras.metrics import BINDING_ERROR_REASONS, WalrasMetrics, binding_reason
from walras.planner.model import Condition, JobPlan, Plan, PodPlan, PoolPlan, SolverStats


def samples(metrics: WalrasMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def make_plan(n_jobs: int = 3) -> Plan:
    plan = Plan(solver=SolverStats(iterations=42, gap=1e-5, converged=False, seconds=0.02), seconds=0.05)
    plan.pools["v100"] = PoolPlan("v100", "nvidia.com/gpu", "utility", 2, ("a", "b"), 8.0, 6.0, 1.5, 0.75)
    plan.pools["cpu"] = PoolPlan("cpu", "cpu", "colocation", 1, ("c",), 64.0, 16.0, 0.1, 0.25,
                                 conditions=(Condition("Valid", "False", "InvalidSelector", "bad"),))
    for i in range(n_jobs):
        plan.jobs[("ns", f"j{i}")] = JobPlan("ns", f"j{i}", "Running", {"v100": 1.0}, {"v100": 1}, throughput=10.0 + i,
                                             utility=float(i), cost=float(i), target=5.0 if i == 0 else None)
    plan.jobs[("ns", "bad")] = JobPlan("ns", "bad", "Invalid")
    return replace(plan, pods=(
        PodPlan("ns", "j0-0", "j0", "v100", "a", action="keep"),
        PodPlan("ns", "j1-0", "j1", "v100", "b", action="create"),
        PodPlan("ns", "j2-0", "j2", "v100", "b", action="bind"),
        PodPlan("ns", "j2-1", "j2", "v100", None, action="delete"),
        PodPlan("ns", "j3-0", "j3", "cpu", "c", action="keep"),
    ))


def test_pool_and_solver_gauges() -> None:
    m = WalrasMetrics()
    m.plan_succeeded(make_plan())
    s = samples(m)
    assert s[("walras_pool_price", (("pool", "v100"), ("resource", "nvidia.com/gpu")))] == 1.5
    assert s[("walras_pool_capacity", (("pool", "cpu"), ("resource", "cpu")))] == 64.0
    assert s[("walras_pool_used", (("pool", "v100"), ("resource", "nvidia.com/gpu")))] == 6.0
    assert s[("walras_pool_utilisation_ratio", (("pool", "v100"),))] == 0.75
    assert s[("walras_pool_nodes", (("pool", "v100"),))] == 2
    assert s[("walras_pods_planned", (("pool", "v100"),))] == 3  # the delete is not planned
    assert s[("walras_pods_pending", (("pool", "v100"),))] == 2  # create + bind
    assert s[("walras_pods_pending", (("pool", "cpu"),))] == 0
    assert s[("walras_solver_iterations", ())] == 42
    assert s[("walras_solver_duality_gap", ())] == 1e-5
    assert s[("walras_solver_converged", ())] == 0
    assert s[("walras_plans_total", (("result", "ok"),))] == 1
    assert s[("walras_plans_total", (("result", "error"),))] == 0
    assert s[("walras_solver_duration_seconds_count", ())] == 1
    assert s[("walras_plan_duration_seconds_sum", ())] == pytest.approx(0.05)
    assert s[("walras_invalid_objects", (("kind", "FungibleJob"),))] == 1
    assert s[("walras_invalid_objects", (("kind", "ResourcePool"),))] == 1
    assert s[("walras_invalid_objects", (("kind", "ColocationProfile"),))] == 0


def test_a_plan_that_took_the_previous_solve_is_counted_not_timed() -> None:
    """A plan whose market result was the previous plan's (``SolverStats.reused``: no solve ran) adds no sample to
    the solve-duration histogram (a 0 s solve that never happened) and counts in ``walras_solver_reused``; the solver
    gauges keep describing the last solve."""
    m = WalrasMetrics()
    m.plan_succeeded(make_plan())
    again = make_plan()
    again = replace(again, solver=replace(again.solver, reused=True, seconds=0.0))
    m.plan_succeeded(again)
    s = samples(m)
    assert s[("walras_solver_duration_seconds_count", ())] == 1
    assert s[("walras_solver_reused_total", ())] == 1
    assert s[("walras_solver_iterations", ())] == 42
    assert s[("walras_plans_total", (("result", "ok"),))] == 2


def test_job_gauges_and_cardinality_limit() -> None:
    m = WalrasMetrics(job_metrics_limit=2)
    m.update(make_plan(n_jobs=4))
    s = samples(m)
    jobs = {dict(k[1])["fungiblejob"] for k in s if k[0] == "walras_job_cost"}
    assert jobs == {"j3", "j2"}  # the two highest costs
    assert s[("walras_job_metrics_dropped", ())] == 3  # j0, j1, bad
    assert s[("walras_job_throughput", (("fungiblejob", "j3"), ("fungiblejob_namespace", "ns")))] == 13.0
    assert ("walras_job_target_throughput", (("fungiblejob", "j3"), ("fungiblejob_namespace", "ns"))) not in s


def test_series_of_removed_pools_and_jobs_disappear() -> None:
    m = WalrasMetrics()
    m.update(make_plan())
    smaller = make_plan(n_jobs=1)
    del smaller.pools["cpu"]
    smaller = replace(smaller, pods=[p for p in smaller.pods if p.pool != "cpu"])
    m.update(smaller)
    s = samples(m)
    assert not any(k[0] == "walras_pool_price" and ("pool", "cpu") in k[1] for k in s)
    assert not any(k[0] == "walras_pool_nodes" and ("pool", "cpu") in k[1] for k in s)
    assert {dict(k[1])["fungiblejob"] for k in s if k[0] == "walras_job_cost"} == {"j0", "bad"}
    assert s[("walras_job_target_throughput", (("fungiblejob", "j0"), ("fungiblejob_namespace", "ns")))] == 5.0


def test_counters_and_extender_histogram() -> None:
    m = WalrasMetrics()
    m.bound("v100", "direct")
    m.bound("v100", "direct")
    m.binding_error("v100", "Conflict")
    m.plan_failed()
    m.extender_request("filter", 200, 0.003)
    s = samples(m)
    assert s[("walras_pods_bound_total", (("mode", "direct"), ("pool", "v100")))] == 2
    assert s[("walras_binding_errors_total", (("pool", "v100"), ("reason", "Conflict")))] == 1
    assert s[("walras_plans_total", (("result", "error"),))] == 1
    assert s[("walras_extender_requests_total", (("code", "200"), ("verb", "filter")))] == 1
    assert s[("walras_extender_request_duration_seconds_count", (("verb", "filter"),))] == 1


def test_bad_limit_is_rejected() -> None:
    with pytest.raises(ValueError, match="job_metrics_limit"):
        WalrasMetrics(job_metrics_limit=-1)


def test_instances_do_not_share_a_registry() -> None:
    a, b = WalrasMetrics(), WalrasMetrics()
    a.bound("p", "direct")
    assert ("walras_pods_bound_total", (("mode", "direct"), ("pool", "p"))) not in samples(b)


def test_extender_series_exist_before_the_first_request() -> None:
    """Every verb has a duration histogram and a request counter (code 200) at 0 before any request arrives."""
    s = samples(WalrasMetrics())
    for verb in ("filter", "prioritize", "bind", "preempt"):
        assert s[("walras_extender_requests_total", (("code", "200"), ("verb", verb)))] == 0
        assert s[("walras_extender_request_duration_seconds_count", (("verb", verb),))] == 0
        assert s[("walras_extender_request_duration_seconds_bucket", (("le", "+Inf"), ("verb", verb)))] == 0
    m = WalrasMetrics()
    m.extender_request("filter", 200, 0.002)
    after = samples(m)
    assert after[("walras_extender_requests_total", (("code", "200"), ("verb", "filter")))] == 1
    assert after[("walras_extender_requests_total", (("code", "200"), ("verb", "bind")))] == 0


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Conflict", "Conflict"), ("AlreadyExists", "Conflict"), (409, "Conflict"), ("409", "Conflict"),
        ("Too Many Requests", "TooManyRequests"), ("TooManyRequests", "TooManyRequests"), (429, "TooManyRequests"),
        ("InternalError", "ServerError"), ("Service Unavailable", "ServerError"), (503, "ServerError"),
        ("504", "ServerError"), ("NotFound", "NotFound"), (404, "NotFound"), ("Invalid", "Invalid"),
        (422, "Invalid"), ("something else", "Other"), (None, "Other"), (302, "Other"),
    ],
)
def test_binding_reasons_are_a_fixed_set(raw: object, expected: str) -> None:
    assert binding_reason(raw) == expected  # type: ignore[arg-type]
    m = WalrasMetrics()
    m.binding_error("v100", raw)  # type: ignore[arg-type]
    s = samples(m)
    assert s[("walras_binding_errors_total", (("pool", "v100"), ("reason", expected)))] == 1
    assert {dict(k[1])["reason"] for k in s if k[0] == "walras_binding_errors_total"} <= set(BINDING_ERROR_REASONS)


def test_binding_error_series_exist_per_pool_and_go_with_the_pool() -> None:
    m = WalrasMetrics()
    m.update(make_plan())
    s = samples(m)
    for pool in ("v100", "cpu"):
        for reason in BINDING_ERROR_REASONS:
            assert s[("walras_binding_errors_total", (("pool", pool), ("reason", reason)))] == 0
    smaller = make_plan()
    del smaller.pools["cpu"]
    smaller = replace(smaller, pods=[p for p in smaller.pods if p.pool != "cpu"])
    m.update(smaller)
    s = samples(m)
    assert not any(k[0] == "walras_binding_errors_total" and ("pool", "cpu") in k[1] for k in s)
    assert s[("walras_binding_errors_total", (("pool", "v100"), ("reason", "Other")))] == 0


#: Labels Prometheus attaches to every scraped series itself (target labels); an exported label of the same name is
#: renamed ``exported_<name>`` on ingestion (honor_labels: false, the default).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "container", "endpoint"}


def test_no_exported_label_collides_with_a_prometheus_target_label() -> None:
    m = WalrasMetrics()
    m.plan_succeeded(make_plan())
    m.bound("v100", "direct")
    m.binding_error("v100", 409)
    m.extender_request("bind", 500, 0.1)
    labels = {name for _, pairs in samples(m) for name, _ in pairs}
    assert "fungiblejob" in labels and "fungiblejob_namespace" in labels
    assert labels & TARGET_LABELS == set()


def test_no_created_series() -> None:
    m = WalrasMetrics()
    m.plan_succeeded(make_plan())
    m.bound("v100", "direct")
    m.extender_request("filter", 200, 0.01)
    text = m.exposition().decode()
    assert "walras_pods_bound_total" in text
    assert "_created" not in text
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

    body = openmetrics(m.registry)
    assert b"walras_pods_bound_total" in body and b"_created" not in body and body.rstrip().endswith(b"# EOF")


def test_metrics_endpoint_is_prometheus_clients_handler() -> None:
    """``walras run``'s /metrics: the text format by default, OpenMetrics when the scraper asks for it (as
    Prometheus does), both from prometheus-client's own aiohttp handler."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer
    from walras.cli.run import metrics_app

    m = WalrasMetrics()
    m.plan_succeeded(make_plan())

    async def scrape() -> list[tuple[str, str]]:
        async with TestClient(TestServer(metrics_app(m))) as client:
            out = []
            for accept in ("", "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"):
                resp = await client.get("/metrics", headers={"Accept": accept} if accept else {})
                assert resp.status == 200
                out.append((resp.headers["Content-Type"], await resp.text()))
            resp = await client.get("/metrics", params={"name[]": "walras_pool_price"})
            out.append((resp.headers["Content-Type"], await resp.text()))
            return out

    (text_type, text), (om_type, om), (_, filtered) = asyncio.run(scrape())
    assert text_type.startswith("text/plain") and 'walras_pool_price{pool="v100"' in text
    assert om_type.startswith("application/openmetrics-text") and om.rstrip().endswith("# EOF")
    assert "walras_pool_price" in filtered and "walras_pool_capacity" not in filtered


def test_metric_names_carry_units_and_suffixes() -> None:
    """Counters end in ``_total``, histograms of durations in ``_seconds``, 0..1 gauges in ``_ratio``."""
    for family in WalrasMetrics().registry.collect():
        if family.type == "histogram":
            assert family.name.endswith("_seconds"), family.name
        if "utilisation" in family.name or "fraction" in family.name:
            assert family.name.endswith("_ratio"), family.name
        assert not family.name.endswith("_total") or family.type == "counter", family.name
    counters = {f.name for f in WalrasMetrics().registry.collect() if f.type == "counter"}
    text = WalrasMetrics().exposition().decode()
    for name in counters:
        assert f"# TYPE {name}_total counter" in text, name


# --- issue 28: job metrics, no -Inf/NaN sample ----------------------------------------------------------------------


def waiting_plan() -> Plan:
    """A running job (created at 1000, its first pod Running at 1090), a job that waits for a price it does not
    bid (utility -inf: the log of nothing), one granted but starting, and pods being disrupted."""
    plan = Plan()
    plan.pools["a"] = PoolPlan("a", "nvidia.com/gpu", "utility", 1, ("n",), 4.0, 4.0, 0.75, 1.0)
    plan.jobs[("ns", "run")] = JobPlan("ns", "run", "Running", {"a": 0.5}, {"a": 2}, utility=1.0, count=2,
                                       running=2, bound=2, created=1000.0, first_running=1090.0)
    plan.jobs[("ns", "wait")] = JobPlan("ns", "wait", "Pending", utility=float("-inf"), count=3,
                                        reason="PriceAboveBid", queue_position=1, waiting=1)
    plan.jobs[("ns", "new")] = JobPlan("ns", "new", "Pending", {"a": 0.25}, {"a": 1}, count=1)
    return replace(plan, pods=(
        PodPlan("ns", "run-0", "run", "a", "n", action="evict", exists=True),
        PodPlan("ns", "old-0", "old", "a", "n", action="delete", exists=True),
        PodPlan("ns", "lost-0", "lost", "a", "n", action="delete", exists=True, reason="NodeLost: gone"),
        PodPlan("ns", "never-0", "never", "a", None, action="delete", exists=True),
    ))


def test_no_sample_is_infinite_or_nan() -> None:
    m = WalrasMetrics()
    m.plan_succeeded(waiting_plan())
    text = m.exposition().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert sample.value == sample.value and abs(sample.value) != float("inf"), sample
    values = [line.rsplit(" ", 1)[-1] for line in text.splitlines() if line and not line.startswith("#")]
    assert not [v for v in values if v.lstrip("+-") in ("Inf", "NaN")]  # a bucket's le="+Inf" label is no value
    s = samples(m)
    assert ("walras_job_utility", (("fungiblejob", "wait"), ("fungiblejob_namespace", "ns"))) not in s
    assert s[("walras_job_utility", (("fungiblejob", "run"), ("fungiblejob_namespace", "ns")))] == 1.0


def test_pending_jobs_and_waiting_replicas_by_reason() -> None:
    m = WalrasMetrics()
    m.plan_succeeded(waiting_plan())
    s = samples(m)
    assert s[("walras_jobs_pending", (("reason", "PriceAboveBid"),))] == 1
    assert s[("walras_jobs_pending", (("reason", "Starting"),))] == 1  # "new": granted, placed, not running
    assert s[("walras_jobs_pending", (("reason", "DegreeLimited"),))] == 0  # every reason's series exists
    assert s[("walras_replicas_waiting", (("reason", "PriceAboveBid"),))] == 3
    assert s[("walras_replicas_waiting", (("reason", "Starting"),))] == 1


def test_wait_time_is_observed_once_per_job() -> None:
    m = WalrasMetrics()
    m.plan_succeeded(waiting_plan())
    m.plan_succeeded(waiting_plan())
    s = samples(m)
    assert s[("walras_job_wait_seconds_count", ())] == 1
    assert s[("walras_job_wait_seconds_sum", ())] == 90.0
    assert s[("walras_job_wait_seconds_bucket", (("le", "60.0"),))] == 0
    assert s[("walras_job_wait_seconds_bucket", (("le", "120.0"),))] == 1


def test_disruptions_are_counted_once_per_pod_and_kind() -> None:
    m = WalrasMetrics()
    m.plan_succeeded(waiting_plan())
    m.plan_succeeded(waiting_plan())  # the same pods still on their way out: not counted again
    s = samples(m)
    assert s[("walras_pod_disruptions_total", (("kind", "eviction"), ("pool", "a")))] == 1
    assert s[("walras_pod_disruptions_total", (("kind", "preemption"), ("pool", "a")))] == 1  # never-0 had no node
    assert s[("walras_pod_disruptions_total", (("kind", "node_lost"), ("pool", "a")))] == 1


def test_per_job_per_pool_allocation_and_build_info() -> None:
    m = WalrasMetrics()
    m.plan_succeeded(waiting_plan())
    s = samples(m)
    labels = (("fungiblejob", "run"), ("fungiblejob_namespace", "ns"), ("pool", "a"))
    assert s[("walras_job_replicas", labels)] == 2 and s[("walras_job_allocation_ratio", labels)] == 0.5
    m.plan_succeeded(replace(waiting_plan(), jobs={}))
    assert ("walras_job_replicas", labels) not in samples(m)
    from walras import __version__

    (info,) = [k for k in samples(m) if k[0] == "walras_build_info"]
    assert dict(info[1])["version"] == __version__ and samples(m)[info] == 1
