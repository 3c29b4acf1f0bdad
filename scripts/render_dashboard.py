"""Render every panel of the Grafana dashboard from a real Prometheus scraping ``walras demo --serve``.

``python scripts/render_dashboard.py [--out docs/images/dashboard] [--seconds 60]`` starts ``walras demo --serve``
(the real operator on the demo's emulated API, /metrics on a free loopback port) and the ``prometheus`` binary
(loopback, a temporary TSDB, 1 s scrapes, with the same target labels as tests/test_prometheus_rules.py), lets it
scrape for ``--seconds``, then runs every query of ``deploy/grafana/walras-dashboard.json`` through
``/api/v1/query_range`` (Grafana's variables replaced as with "All" selected) and draws each panel with matplotlib
into ``<out>/<NN>-<title>.png``: a time series panel as lines, one per series, named by the target's
``legendFormat``, on one y axis labelled with the panel's unit (``fieldConfig.defaults.unit``); a stat panel as its
last value per series. Row panels have no queries and are skipped. Prints one JSON line per panel (file, number of
series, number of points) and exits 1 when a process fails to start.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from walras_testbed.kubelet.controlplane import free_port, http_get, stop_process, wait_for

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "walras-dashboard.json"
TARGET_LABELS = {"namespace": "walras-system", "pod": "walras-7d9f-abcde", "service": "walras"}
#: Grafana's built-in and template variables, replaced the way Grafana would with "All" selected.
VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$pool": ".*", "$namespace": ".*"}
#: Axis labels of Grafana's unit ids (the panel's unit, as Grafana would format the axis).
UNITS = {"s": "seconds", "percentunit": "share (0-1)", "opm": "per minute", "reqps": "requests per second",
         "short": "count", "bool": "true (1) / false (0)", "none": ""}


@dataclass(frozen=True)
class Rendered:
    """One drawn panel: its file, title, the series drawn and their points in all."""

    path: Path
    title: str
    series: int
    points: int


def promql(expr: str) -> str:
    """A panel query with Grafana's variables substituted (``$pool`` and ``$namespace`` as "All")."""
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    if "$" in expr:
        raise ValueError(f"unsubstituted Grafana variable in {expr!r}")
    return expr


def legend(fmt: str, labels: dict[str, str]) -> str:
    """Grafana's ``legendFormat``: ``{{label}}`` replaced by the series' label value."""
    if not fmt:
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def unit_label(unit: str | None) -> str:
    """The y-axis label of a Grafana unit (``suffix: X`` -> ``X``)."""
    if not unit:
        return ""
    if unit.startswith("suffix:"):
        return unit.split(":", 1)[1].strip()
    return UNITS.get(unit, unit)


def query_range(base: str, expr: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
    """The matrix of ``expr`` over ``[start, end]`` (Prometheus's ``/api/v1/query_range``); raises on an error."""
    url = f"{base}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
    try:
        body = http_get(url)
    except urllib.error.HTTPError as exc:
        body = exc.read()
    result = json.loads(body)
    if result.get("status") != "success":
        raise ValueError(f"query {expr!r} failed: {result.get('error')}")
    data: list[dict[str, Any]] = result["data"]["result"]
    return data


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def draw(panel: dict[str, Any], series: list[tuple[str, list[tuple[float, float]]]], path: Path, t0: float) -> None:
    """Draw one panel into ``path``: lines over seconds since the first scrape, or a stat panel's last values."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unit = unit_label(panel.get("fieldConfig", {}).get("defaults", {}).get("unit"))
    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=100)
    if panel["type"] == "stat":
        names = [name for name, _ in series]
        last = [points[-1][1] for _, points in series]
        ax.barh(range(len(last)), last, color="#3274d9")
        ax.set_yticks(range(len(last)), names, fontsize=8)
        for i, v in enumerate(last):
            ax.annotate(f"{v:.4g}", (v, i), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
        ax.set_xlabel(unit or "value")
    else:
        for name, points in series:
            ax.plot([t - t0 for t, _ in points], [v for _, v in points], label=name, linewidth=1.4)
        ax.set_xlabel("seconds since the first scrape")
        ax.set_ylabel(unit)
        if series:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if not series:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="grey")
    ax.set_title(panel["title"], fontsize=11, loc="left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def render(base: str, out: Path, start: float, end: float) -> list[Rendered]:
    """Query and draw every panel with queries of the dashboard; the drawn panels in dashboard order."""
    dashboard = json.loads(DASHBOARD.read_text())
    out.mkdir(parents=True, exist_ok=True)
    rendered = []
    number = 0
    for panel in dashboard["panels"]:
        if not panel.get("targets"):
            continue
        number += 1
        series: list[tuple[str, list[tuple[float, float]]]] = []
        for target in panel["targets"]:
            for s in query_range(base, promql(target["expr"]), start, end):
                points = [(float(t), float(v)) for t, v in s["values"]]
                series.append((legend(target.get("legendFormat", ""), s["metric"]), points))
        path = out / f"{number:02d}-{_slug(panel['title'])}.png"
        draw(panel, series, path, start)
        rendered.append(Rendered(path, panel["title"], len(series), sum(len(p) for _, p in series)))
    return rendered


def run(out: Path, seconds: float, prometheus: str = "prometheus") -> list[Rendered]:
    """Start the demo and Prometheus, scrape for ``seconds``, render every panel into ``out``, stop both."""
    with tempfile.TemporaryDirectory(prefix="walras-dashboard-") as tmp_name:
        tmp = Path(tmp_name)
        metrics_port, prometheus_port = free_port(), free_port()
        demo = subprocess.Popen(
            [sys.executable, "-m", "walras", "demo", "--serve", "--metrics-port", str(metrics_port)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONHASHSEED": "0"})
        procs = [demo]
        try:
            wait_for(lambda: b"walras_pool_price" in http_get(f"http://127.0.0.1:{metrics_port}/metrics"),
                  "walras demo --serve to expose /metrics", 120, procs)
            config = {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [{"job_name": "walras", "static_configs": [
                    {"targets": [f"127.0.0.1:{metrics_port}"], "labels": TARGET_LABELS}]}],
            }
            (tmp / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
            server = subprocess.Popen(
                [prometheus, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
                 f"--web.listen-address=127.0.0.1:{prometheus_port}", "--storage.tsdb.retention.time=1h",
                 "--log.level=warn"], cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            procs.append(server)
            base = f"http://127.0.0.1:{prometheus_port}"
            wait_for(lambda: http_get(f"{base}/-/ready").startswith(b"Prometheus"), "Prometheus to be ready", 60, procs)
            start = time.time()
            time.sleep(seconds)
            return render(base, out, start, time.time())
        finally:
            for proc in reversed(procs):
                stop_process(proc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "dashboard")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long Prometheus scrapes before the queries")
    ap.add_argument("--prometheus", default="prometheus", help="the Prometheus binary")
    args = ap.parse_args(argv)
    try:
        rendered = run(args.out, args.seconds, args.prometheus)
    except RuntimeError as exc:
        print(f"render_dashboard: {exc}", file=sys.stderr)
        return 1
    for r in rendered:
        print(json.dumps({"file": str(r.path.relative_to(ROOT) if r.path.is_relative_to(ROOT) else r.path),
                          "title": r.title, "series": r.series, "points": r.points}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
