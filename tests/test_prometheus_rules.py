"""Alert rules and dashboard queries against a real Prometheus scraping a real ``walras demo --serve``.

The test starts ``walras demo --serve`` (the real operator on the demo's emulated API, /metrics on a free loopback
port) and the Debian ``prometheus`` binary (loopback, a free port, a temporary TSDB, 1 s scrape and rule
evaluation, the rules file loaded), waits for a few scrapes, then

* runs every PromQL expression of ``deploy/grafana/walras-dashboard.json`` and every alert's signal (the expression
  without its final ``<op> <threshold>``) through ``/api/v1/query``: each must parse, and each must return data,
  (the extender's request series and the binding-error counter are pre-created at zero, per verb and per pool and
  reason, so even the series of events the direct-mode demo never has are present). ``ABSENT_IN_DEMO`` lists the
  metrics allowed to have no series (the per-job series of waiting jobs: every job of the demo runs; the
  ``walras_budget_*`` series: the demo runs with tenants off); the test
  checks that it is exactly the metrics with no series in the scrape, and that the operator's registry exports
  them (``tests/test_dashboard.py``);
* checks that each alert fires for exactly the series whose signal crosses its threshold (computed in Python from
  the signal's values), and through ``/api/v1/rules`` that Prometheus loaded every rule and evaluated it without
  error and that the operator-down alert stays quiet while the demo is up;
* runs ``promtool check rules`` on the file, and ``promtool test rules`` on its unit tests
  (``deploy/prometheus/walras-rules.test.yaml``: a firing and a quiet case per alert, checked to catch a changed
  threshold);
* checks the labels as Prometheus stored them: the scrape attaches ``namespace``/``pod`` target labels as the
  Kubernetes service discovery of a ServiceMonitor would, and no ingested series may carry an ``exported_*`` label;
  the per-job series name the FungibleJobs' own namespaces in ``fungiblejob_namespace``; no ``*_created`` series.

Both processes are stopped by the test. Under ``CI=true`` a missing ``prometheus``/``promtool`` fails the test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from realtools import require
from walras_testbed.kubelet.controlplane import free_port, http_get, stop_process, wait_for

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "walras-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "walras-rules.test.yaml"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
#: Target labels the scrape attaches, as Kubernetes service discovery does for a ServiceMonitor target.
TARGET_LABELS = {"namespace": "walras-system", "pod": "walras-7d9f-abcde", "service": "walras"}
DASHBOARD = ROOT / "deploy" / "grafana" / "walras-dashboard.json"

#: Metrics the direct-mode demo legitimately never produces a series for (see the module docstring).
#: ``walras_job_pending_since_timestamp_seconds`` has a series per job with no pod Running: every job of the demo runs;
#: the demo plans with tenants off (as `walras run --no-tenants`), so no ``walras_budget_*`` series;
#: ``walras_pod_creations_refused_total`` has a series per job and admission that refused a creation, and the demo's
#: API admits every pod.
ABSENT_IN_DEMO: frozenset[str] = frozenset({
    "walras_job_pending_since_timestamp_seconds", "walras_pod_creations_refused_total",
    "walras_budget_share_credits_per_hour", "walras_budget_spend_rate_credits_per_hour", "walras_budget_spent_credits",
    "walras_budget_units", "walras_budget_pool_share_ratio"})

#: Grafana's built-in and template variables, replaced the way Grafana would with "All" selected.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$pool": ".*", "$namespace": ".*"}

COMPARISON = re.compile(r"^(?P<signal>.*\S)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<threshold>-?[0-9.]+(e-?[0-9]+)?)\s*$", re.S)
OPERATORS = {
    ">": lambda a, b: a > b, "<": lambda a, b: a < b, ">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}
METRIC = re.compile(r"\bwalras_[a-z0-9_]+")


def rule_expressions() -> list[tuple[str, str]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [(r.get("alert") or r["record"], r["expr"].strip()) for g in groups for r in g["rules"]]


def dashboard_expressions() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            found.append((f"{panel['title']} [{target['refId']}]", target["expr"]))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found.append((f"variable {variable['name']}", variable["query"]["query"]))
    return found


def grafana_to_promql(expr: str) -> str:
    """Substitute Grafana variables; ``label_values(metric, label)`` becomes the series query Grafana issues."""
    match = re.fullmatch(r"label_values\((?P<metric>[^,]+),\s*(?P<label>\w+)\)", expr.strip())
    if match:
        return f"count by ({match['label']}) ({match['metric']})"
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unsubstituted Grafana variable in {expr!r}"
    return expr


def alert_signal(expr: str) -> str:
    match = COMPARISON.match(expr)
    assert match, f"alert expression {expr!r} is not `<signal> <op> <threshold>`"
    return match["signal"]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    prometheus_bin = require("prometheus")
    tmp = tmp_path_factory.mktemp("prometheus")
    metrics_port, prometheus_port = free_port(), free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "walras", "demo", "--serve", "--metrics-port", str(metrics_port)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    procs = [demo]
    try:
        wait_for(lambda: b"walras_pool_price" in http_get(f"http://127.0.0.1:{metrics_port}/metrics"),
                 "walras demo --serve to expose /metrics", 75, procs)
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "walras",
                                "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"],
                                                    "labels": TARGET_LABELS}]}],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        server = subprocess.Popen(
            [prometheus_bin, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{prometheus_port}", "--storage.tsdb.retention.time=1h",
             "--log.level=warn"],
            cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        procs.append(server)
        base = f"http://127.0.0.1:{prometheus_port}"
        wait_for(lambda: http_get(f"{base}/-/ready").startswith(b"Prometheus"), "Prometheus to be ready", 30, procs)

        def scraped_enough() -> bool:
            # at least 4 scrapes of an up target: rate() and increase() need two samples in their window
            result = query(base, 'count_over_time(up{job="walras"}[1m]) >= 4 and up{job="walras"} == 1')
            return bool(result["data"]["result"])

        wait_for(scraped_enough, "four successful scrapes of the demo", 30, procs)
        yield base
    finally:
        for proc in reversed(procs):
            stop_process(proc)


def query(base: str, expr: str) -> dict[str, Any]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        body = http_get(url)
    except urllib.error.HTTPError as exc:
        body = exc.read()
    result: dict[str, Any] = json.loads(body)
    return result


def present_metrics(base: str) -> set[str]:
    result = query(base, 'count by (__name__) ({__name__=~"walras_.+"})')
    assert result["status"] == "success", result
    return {sample["metric"]["__name__"] for sample in result["data"]["result"]}


def test_promtool_checks_the_rules() -> None:
    out = subprocess.run([require("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rule_expressions())} rules found" in out.stdout


def test_the_absent_list_is_exactly_what_the_demo_does_not_produce(prometheus: str) -> None:
    present = present_metrics(prometheus)
    used = {m for _, e in dashboard_expressions() + rule_expressions() for m in METRIC.findall(e)}
    assert used - present == ABSENT_IN_DEMO
    assert "walras_pool_price" in present and "walras_solver_duration_seconds_bucket" in present


@pytest.mark.parametrize(("name", "expr"), dashboard_expressions(), ids=[n for n, _ in dashboard_expressions()])
def test_dashboard_query_parses_and_returns_data(prometheus: str, name: str, expr: str) -> None:
    promql = grafana_to_promql(expr)
    result = query(prometheus, promql)
    assert result["status"] == "success", f"{name}: {promql!r} -> {result}"
    samples = result["data"]["result"]
    metrics = set(METRIC.findall(promql))
    if metrics and metrics <= ABSENT_IN_DEMO:
        assert samples == [], f"{name}: {sorted(metrics)} now has data: drop it from ABSENT_IN_DEMO"
    else:
        assert samples, f"{name}: {promql!r} returned no data"


@pytest.mark.parametrize(("name", "expr"), rule_expressions(), ids=[n for n, _ in rule_expressions()])
def test_alert_signal_parses_and_returns_data(prometheus: str, name: str, expr: str) -> None:
    full = query(prometheus, expr)
    assert full["status"] == "success", f"{name}: {expr!r} -> {full}"
    signal_expr = alert_signal(expr)
    result = query(prometheus, signal_expr)
    assert result["status"] == "success", f"{name}: {signal_expr!r} -> {result}"
    metrics = set(METRIC.findall(signal_expr))
    if metrics and metrics <= ABSENT_IN_DEMO:
        assert result["data"]["result"] == [], f"{name}: {sorted(metrics)} now has data: update ABSENT_IN_DEMO"
    else:
        assert result["data"]["result"], f"{name}: {signal_expr!r} returned no data"
        # the alert fires for exactly the series whose signal crosses the threshold (computed here, in Python)
        match = COMPARISON.match(expr)
        assert match is not None
        crossing = OPERATORS[match["op"]]
        threshold = float(match["threshold"])
        expected = sorted(json.dumps(s["metric"], sort_keys=True) for s in result["data"]["result"]
                          if crossing(float(s["value"][1]), threshold))
        firing = sorted(json.dumps(s["metric"], sort_keys=True) for s in full["data"]["result"])
        assert firing == expected, f"{name}: fires for {firing}, the signal crosses the threshold for {expected}"


def test_prometheus_loaded_and_evaluated_every_rule(prometheus: str) -> None:
    names = {name for name, _ in rule_expressions()}

    def evaluated() -> list[dict[str, Any]]:
        rules = json.loads(http_get(f"{prometheus}/api/v1/rules"))["data"]["groups"]
        flat = [r for g in rules for r in g["rules"]]
        done = all(not r["lastEvaluation"].startswith("0001-") for r in flat)
        return flat if done and flat else []

    rules = wait_for(evaluated, "every rule to be evaluated", 20, [])
    assert {r["name"] for r in rules} == names
    for rule in rules:
        assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"
    by_name = {r["name"]: r for r in rules}
    # the demo is scraped and up: the operator-down alert must stay quiet
    assert by_name["WalrasOperatorDown"]["state"] == "inactive"


def test_alert_signal_split_is_not_vacuous() -> None:
    assert alert_signal("max(walras_solver_duality_gap) > 0.05") == "max(walras_solver_duality_gap)"
    assert alert_signal("(sum(up) or vector(0)) < 1") == "(sum(up) or vector(0))"
    with pytest.raises(AssertionError):
        alert_signal("absent(up)")


def alerts() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


def test_promtool_unit_tests_pass() -> None:
    out = subprocess.run([require("promtool"), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    cases = [case for t in tests for case in t.get("alert_rule_test", [])]
    for alert in alerts():
        mine = [c for c in cases if c["alertname"] == alert["alert"]]
        assert any(c["exp_alerts"] for c in mine), f"{alert['alert']}: no case where it fires"
        assert any(not c["exp_alerts"] for c in mine), f"{alert['alert']}: no case where it stays quiet"


def test_the_unit_tests_catch_a_changed_threshold(tmp_path: Path) -> None:
    """Mutation check: the same unit tests against rules whose duality-gap threshold moved must fail."""
    promtool = require("promtool")
    gap = "max(walras_solver_duality_gap / (walras_solver_duality_gap_tolerance > 0)) > 10"
    mutated = RULES.read_text().replace(gap, gap.replace("> 10", "> 50"))
    assert mutated != RULES.read_text()
    (tmp_path / "walras-rules.yaml").write_text(mutated)
    (tmp_path / "walras-rules.test.yaml").write_text(RULE_TESTS.read_text())
    out = subprocess.run([promtool, "test", "rules", str(tmp_path / "walras-rules.test.yaml")], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode != 0 and "WalrasDualityGapHigh" in out.stdout + out.stderr


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_links_its_runbook_section() -> None:
    anchors = {github_anchor(line.lstrip("#")) for line in RUNBOOKS.read_text().splitlines() if line.startswith("## ")}
    for alert in alerts():
        url = alert["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page.endswith("/docs/runbooks.md"), url
        assert anchor in anchors, f"{alert['alert']}: docs/runbooks.md has no section #{anchor}"
        assert anchor == alert["alert"].lower()


def test_ingested_series_keep_their_labels(prometheus: str) -> None:
    """No label collides with a target label (no ``exported_*``), the per-job series name the FungibleJobs' own
    namespaces (those of the bundled examples), and counters/histograms have no ``_created`` series."""
    everything = query(prometheus, '{__name__=~"walras_.+"}')["data"]["result"]
    assert everything
    for sample in everything:
        labels = sample["metric"]
        assert not [k for k in labels if k.startswith("exported_")], labels
        assert labels["namespace"] == TARGET_LABELS["namespace"] and labels["job"] == "walras", labels
    jobs = query(prometheus, "walras_job_throughput")["data"]["result"]
    from walras.manifests import examples

    expected = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in examples.documents()
                if d["kind"] == "FungibleJob"}
    assert {(s["metric"]["fungiblejob_namespace"], s["metric"]["fungiblejob"]) for s in jobs} == expected
    assert query(prometheus, '{__name__=~"walras_.+_created"}')["data"]["result"] == []


def test_no_ingested_sample_is_infinite_or_nan(prometheus: str) -> None:
    """Issue 28: ``walras_job_utility`` exported ``-Inf`` for waiting jobs. Every ``walras_*`` sample Prometheus
    ingested from the demo is a finite number, and the job metrics of issue 28 are among them."""
    import math

    everything = query(prometheus, '{__name__=~"walras_.+"}')["data"]["result"]
    assert everything
    bad = [(s["metric"]["__name__"], s["value"][1]) for s in everything if not math.isfinite(float(s["value"][1]))]
    assert bad == []
    names = {s["metric"]["__name__"] for s in everything}
    assert {"walras_jobs_pending", "walras_replicas_waiting", "walras_job_wait_seconds_bucket",
            "walras_pod_disruptions_total", "walras_job_replicas", "walras_job_allocation_ratio",
            "walras_build_info"} <= names
