"""The pictures in docs/images/ are what scripts/draw_docs_figures.py draws now from their sources (the phase table
of walras.planner.plan's docstring; docs/budgets.md's worked example, which tests/test_budgets_docs.py reproduces
with ``walras plan --tenants``). Regenerate with ``python scripts/draw_docs_figures.py``."""

from __future__ import annotations

import pytest

from scripts import draw_docs_figures as draw


@pytest.fixture(scope="module")
def drawn() -> dict:
    return draw.figures()


def test_every_committed_picture_is_current(drawn: dict) -> None:
    for path, data in drawn.items():
        assert path.exists(), f"{path} missing: run python scripts/draw_docs_figures.py"
        assert path.read_bytes() == data, f"{path} out of date: run python scripts/draw_docs_figures.py"


def test_the_data_path_shows_every_phase_of_the_planner(drawn: dict) -> None:
    svg = drawn[draw.IMAGES / "data-path.svg"].decode()
    phases = draw.planner_phases()
    names = [p.name for p in phases]
    assert names[0].startswith("decode") and "reconcile" in names and "market/replicas/placement" in names
    for phase in phases[1:]:
        assert f">{phase.name}<" in svg, phase.name
    for box in ("API objects", "decode", "Plan", "encode -&gt; API"):
        assert f">{box}<" in svg, box


def test_the_budgets_figure_uses_the_pages_numbers(drawn: dict) -> None:
    tenants, prices, without = draw.budgets_example()
    page = draw.BUDGETS_PAGE.read_text()
    assert [t.name for t in tenants] == ["team-ml", "namespace/greedy", "namespace/web"]
    assert tenants[0].share == 2 and tenants[0].caps == {"v100": 4} and tenants[0].units["v100"] <= 4
    assert prices == {"v100": 0.1866, "p100": 0.1481, "k80": 0.0446} and without == 8
    for t in tenants:
        assert f"{t.name} " in page
    assert "images/budgets-worked-example.svg" in page, "docs/budgets.md shows the figure"
    svg = drawn[draw.IMAGES / "budgets-worked-example.svg"].decode()
    assert "price 0.1866/GPU-h" in svg and "cap 4" in svg
