"""scripts/render_dashboard.py: every panel of deploy/grafana/walras-dashboard.json drawn from a real Prometheus
scraping a real ``walras demo --serve``, with data wherever the demo produces the panel's metrics; the committed
screenshots (docs/images/dashboard/) are one per panel and shown on the Grafana task page."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from realtools import require
from test_prometheus_rules import ABSENT_IN_DEMO, METRIC

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images" / "dashboard"
PAGE = ROOT / "docs" / "tasks" / "grafana.md"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_dashboard", ROOT / "scripts" / "render_dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["render_dashboard"] = module
    spec.loader.exec_module(module)
    return module


def _panels() -> list[dict]:
    return [p for p in json.loads((ROOT / "deploy" / "grafana" / "walras-dashboard.json").read_text())["panels"]
            if p.get("targets")]


def _expected_files(script: ModuleType) -> list[str]:
    return [f"{n:02d}-{script._slug(p['title'])}.png" for n, p in enumerate(_panels(), start=1)]


def test_legend_units_and_variables() -> None:
    script = _script()
    assert script.legend("{{pool}} used ({{resource}})", {"pool": "v100", "resource": "nvidia.com/gpu"}) == \
        "v100 used (nvidia.com/gpu)"
    assert script.unit_label("suffix: credits/h") == "credits/h"
    assert script.unit_label("percentunit") == "share (0-1)"
    assert script.promql('rate(x{pool=~"$pool"}[$__rate_interval])') == 'rate(x{pool=~".*"}[1m])'
    with pytest.raises(ValueError, match="unsubstituted"):
        script.promql("x{a=\"$unknown\"}")


@pytest.mark.slow
def test_every_panel_is_rendered_with_data_where_the_demo_has_it(tmp_path: Path) -> None:
    prometheus = require("prometheus")
    script = _script()
    rendered = script.run(tmp_path, 8.0, prometheus)
    panels = _panels()
    assert [r.title for r in rendered] == [p["title"] for p in panels]
    assert [r.path.name for r in rendered] == _expected_files(script)
    for panel, r in zip(panels, rendered):
        assert r.path.is_file() and r.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", r.path
        metrics = {m for t in panel["targets"] for m in METRIC.findall(t["expr"])}
        if metrics and metrics <= ABSENT_IN_DEMO:  # the demo has none of its series (every job runs; no tenants)
            assert r.series == 0, (panel["title"], r.series)
        else:
            assert r.series > 0 and r.points >= r.series, (panel["title"], r.series, r.points)


def test_the_committed_screenshots_are_one_per_panel_and_on_the_grafana_page() -> None:
    script = _script()
    expected = _expected_files(script)
    assert sorted(p.name for p in IMAGES.glob("*.png")) == sorted(expected)
    page = PAGE.read_text()
    for name in expected:
        assert f"../images/dashboard/{name}" in page, name
