"""docs/reference/metrics.md is what scripts/gen_api_reference.py generates from walras.metrics now (regenerate with
``python scripts/gen_api_reference.py``), and it lists every metric the operator exposes: checked against the text
exposition of a real ``WalrasMetrics`` after a plan, parsed by prometheus-client's own parser, independently of the
generator's walk over the metric objects."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from scripts import gen_api_reference as gen


def test_the_metrics_reference_is_current() -> None:
    assert gen.METRICS_PAGE.read_text() == gen.render_metrics(), "run: python scripts/gen_api_reference.py"


def test_every_exported_family_has_a_row_with_its_type_labels_and_help() -> None:
    from walras.metrics import WalrasMetrics

    from tests.test_metrics import make_plan

    metrics = WalrasMetrics()
    metrics.update(make_plan())
    metrics.bound("a100", "direct")
    metrics.binding_error("a100", 409)
    metrics.extender_request("filter", 200, 0.01)
    page = gen.METRICS_PAGE.read_text()
    table = page.split("\n## ", 1)[0]  # the metrics table, before the section of initial label values
    rows = {line.split(" | ")[0].removeprefix("| "): line
            for line in table.splitlines() if line.startswith("| `walras_")}
    families = list(text_string_to_metric_families(metrics.exposition().decode()))
    assert len(families) >= 30
    for family in families:
        exposed = f"`{family.name}{ {'counter': '_total', 'histogram': '_bucket'}.get(family.type, '')}`"
        row = next((line for key, line in rows.items() if key.split(", ")[0] == exposed), None)
        assert row is not None, family.name
        assert f" | {family.type} | " in row, (family.name, family.type)
        assert family.documentation in row, family.name
        labels = {k for s in family.samples for k in s.labels if k not in ("le", "quantile")}
        for label in labels:
            assert f"`{label}`" in row.split(" | ")[2], (family.name, label)
    assert "| `walras_pool_price` | gauge | `pool`, `resource` |" in page
    assert "| `walras_solver_duration_seconds_bucket`, " in page
    assert "| `walras_jobs_pending` | `reason` |" in page
