"""The Grafana dashboard ``deploy/grafana/walras-dashboard.json``: the panels issue 8 asks for, the pool and namespace
variables, and metric names checked both ways against the registry of ``walras.metrics.WalrasMetrics`` (every metric
the dashboard or the alert rules use is exported; every key metric the operator exports is on the dashboard).
Running the queries against a real Prometheus is ``tests/test_prometheus_rules.py``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.metrics_core import Metric
from walras.metrics import WalrasMetrics

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = json.loads((ROOT / "deploy" / "grafana" / "walras-dashboard.json").read_text())
RULES = yaml.safe_load((ROOT / "deploy" / "prometheus" / "walras-rules.yaml").read_text())
METRIC = re.compile(r"\bwalras_[a-z0-9_]+")

#: Metrics that must be on the dashboard (issue 8's panel list).
KEY_METRICS = {
    "walras_pool_price", "walras_pool_utilisation_ratio", "walras_solver_duality_gap",
    "walras_solver_duration_seconds_bucket", "walras_job_throughput", "walras_job_target_throughput",
    "walras_pods_pending", "walras_pods_bound_total", "walras_extender_request_duration_seconds_bucket",
}


def exposed_names(family: Metric) -> set[str]:
    """The sample names a metric family appears under in the exposition format."""
    if family.type == "counter":
        return {f"{family.name}_total"}
    if family.type == "histogram":
        return {f"{family.name}_{suffix}" for suffix in ("bucket", "sum", "count")}
    if family.type == "summary":
        return {family.name, f"{family.name}_sum", f"{family.name}_count"}
    return {family.name}


def exported() -> set[str]:
    registry = WalrasMetrics().registry
    return {name for family in registry.collect() for name in exposed_names(family)}


def targets() -> list[dict[str, Any]]:
    return [t for p in DASHBOARD["panels"] for t in p.get("targets", [])]


def dashboard_metrics() -> set[str]:
    exprs = [t["expr"] for t in targets()] + [v["query"]["query"] for v in DASHBOARD["templating"]["list"]
                                              if v["type"] == "query"]
    return {m for e in exprs for m in METRIC.findall(e)}


def rule_metrics() -> set[str]:
    return {m for g in RULES["groups"] for r in g["rules"] for m in METRIC.findall(r["expr"])}


def test_every_metric_used_is_exported_by_the_operator() -> None:
    names = exported()
    assert "walras_pool_price" in names and "walras_pods_bound_total" in names  # the registry is really read
    assert dashboard_metrics() - names == set()
    assert rule_metrics() - names == set()


def test_key_metrics_are_on_the_dashboard() -> None:
    assert exported() >= KEY_METRICS
    assert dashboard_metrics() >= KEY_METRICS


def test_every_exported_walras_metric_is_shown_somewhere() -> None:
    shown = dashboard_metrics() | rule_metrics()
    families = {family.name for family in WalrasMetrics().registry.collect()}
    for family in families:
        assert any(name.startswith(family) for name in shown), f"{family} is neither on the dashboard nor alerted on"


def test_required_panels_exist() -> None:
    titles = {p["title"] for p in DASHBOARD["panels"]}
    assert {"Price per pool", "Duality gap and tolerance", "Solve and plan time", "Utilisation per pool",
            "Job throughput vs target", "Pods pending vs planned", "Pods bound per minute", "Extender latency by verb",
            "Jobs pending by reason", "Replicas waiting by reason", "Job wait time", "Pod disruptions per minute",
            "Replicas per job and pool", "Allocation per job and pool"} <= titles
    by_title = {p["title"]: p for p in DASHBOARD["panels"]}
    latency = " ".join(t["expr"] for t in by_title["Extender latency by verb"]["targets"])
    assert "by (verb, le)" in latency and "histogram_quantile" in latency
    jobs = [t["expr"] for t in by_title["Job throughput vs target"]["targets"]]
    assert any("walras_job_throughput" in e for e in jobs) and any("walras_job_target_throughput" in e for e in jobs)


def test_pool_and_namespace_variables_filter_the_queries() -> None:
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["pool"]["query"]["query"] == "label_values(walras_pool_price, pool)"
    assert variables["namespace"]["query"]["query"] == "label_values(walras_job_throughput, fungiblejob_namespace)"
    for name in ("pool", "namespace"):
        assert variables[name]["includeAll"] and variables[name]["multi"] and variables[name]["allValue"] == ".*"
    for target in targets():
        expr = target["expr"]
        if re.search(r"walras_(pool_|pods_|binding_errors)", expr):
            assert 'pool=~"$pool"' in expr, expr
        if re.search(r"walras_job_(throughput|target|utility|cost|replicas|allocation)", expr):
            assert 'fungiblejob_namespace=~"$namespace"' in expr, expr


def test_dashboard_structure_is_importable() -> None:
    assert DASHBOARD["uid"] == "walras-market" and DASHBOARD["title"]
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    for panel in DASHBOARD["panels"]:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]
            assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


def test_per_job_legends_name_the_fungiblejob_not_the_scrape_target() -> None:
    """``job``/``namespace`` on a scraped series are the scrape job and the operator's namespace; a legend or filter
    on them would show the operator's namespace for every job."""
    for target in targets():
        if re.search(r"walras_job_(throughput|target|utility|cost)", target["expr"]):
            assert "{{fungiblejob_namespace}}/{{fungiblejob}}" in target["legendFormat"], target
        assert not re.search(r"(?<![a-z_])(job|namespace)=~", target["expr"]), target["expr"]
        assert "exported_" not in target["expr"] and "exported_" not in target.get("legendFormat", "")


def test_every_timeseries_panel_has_a_unit() -> None:
    """Units in the dashboard: each panel says what its axis measures; a panel mixing durations with other
    quantities overrides the unit of its duration series."""
    by_title = {p["title"]: p for p in DASHBOARD["panels"] if p["type"] != "row"}
    for title, panel in by_title.items():
        assert panel["fieldConfig"]["defaults"].get("unit"), title
    assert by_title["Extender latency by verb"]["fieldConfig"]["defaults"]["unit"] == "s"
    assert by_title["Utilisation per pool"]["fieldConfig"]["defaults"]["unit"] == "percentunit"
    for title in ("Solve and plan time", "Job wait time"):
        assert by_title[title]["fieldConfig"]["defaults"]["unit"] == "s"
    for title in ("Pods bound per minute", "Pod disruptions per minute", "Binding errors"):
        assert by_title[title]["fieldConfig"]["defaults"]["unit"] == "opm"


#: The kinds of series a panel may not mix on one axis (issue 29): each metric family is of one kind.
KINDS = {
    "gap": ("walras_solver_duality_gap",), "seconds": ("_seconds_bucket",), "iterations": ("walras_solver_iterations",),
    "utility": ("walras_job_utility",), "cost": ("walras_job_cost",),
}


def test_one_unit_per_axis_no_panel_mixes_kinds_of_series() -> None:
    """Issue 29: one panel drew the duality gap, seconds, iterations and a share on one axis, one drew utility with
    cost, one counts with per-minute rates. Now no panel overrides the unit of some of its series, no panel mixes
    those kinds, and a panel's series are either all rates (``rate(``) or none is."""
    for panel in DASHBOARD["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["fieldConfig"]["overrides"] == [], panel["title"]
        exprs = [t["expr"] for t in panel["targets"]]
        kinds = {kind for kind, marks in KINDS.items() for e in exprs for m in marks if m in e}
        assert len(kinds) <= 1, (panel["title"], kinds)
        rates = {("rate(" in e) for e in exprs}
        assert len(rates) == 1, (panel["title"], exprs)
        assert panel.get("description"), panel["title"]
