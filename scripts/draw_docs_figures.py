"""Draw the pictures of the user docs into docs/images/ (SVG, matplotlib), from the sources the pages describe.

    python scripts/draw_docs_figures.py           # (re)write every picture
    python scripts/draw_docs_figures.py --check   # exit 1 and name the pictures that are out of date

- ``data-path.svg`` (docs/concepts/placement.md, docs/overview.md): API objects -> decode -> the planner's phases ->
  the frozen plan -> encode -> API writes. The phases and their one-line summaries are read from the phase table
  in the docstring of ``walras.planner.plan`` (read with ``ast``, nothing imported), so the picture follows the code.
- ``budgets-worked-example.svg`` (docs/budgets.md): the worked example's budgets -> shares -> units and spend, read
  from the page's own TENANTS table and text (tests/test_budgets_docs.py checks that ``walras plan --tenants``
  prints that table).

The SVGs are deterministic (fixed ``svg.hashsalt``, no date or creator in the metadata, text kept as text), so
tests/test_docs_figures.py regenerates them and compares bytes with the committed files. matplotlib (in the dev
environment) draws; writing SVG by hand would duplicate its layout and text handling.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
PLAN_MODULE = ROOT / "operator" / "walras" / "planner" / "plan.py"
BUDGETS_PAGE = ROOT / "docs" / "budgets.md"


@dataclass(frozen=True)
class Phase:
    name: str
    summary: str


def planner_phases(source: Path = PLAN_MODULE) -> list[Phase]:
    """The rows of the phase table (a reStructuredText simple table) in ``walras.planner.plan``'s docstring."""
    doc = ast.get_docstring(ast.parse(source.read_text())) or ""
    lines = doc.splitlines()
    rules = [i for i, line in enumerate(lines) if re.fullmatch(r"=+ +=+", line)]
    if len(rules) < 2:
        raise ValueError(f"{source}: no phase table in the module docstring")
    width = lines[rules[0]].index(" ")
    rows: list[list[str]] = []
    for line in lines[rules[0] + 1:rules[1]]:
        name, text = line[:width].strip(), line[width:].strip()
        if name and not (rows and rows[-1][0].endswith("/")):
            rows.append([name, text])
        else:
            if name:
                rows[-1][0] += name
            rows[-1][1] += " " + text
    return [Phase(name, _plain(" ".join(text.split()))) for name, text in rows]


def _plain(text: str) -> str:
    """reStructuredText roles and literals as plain text: ``:class:`~.cluster.Cluster``` -> ``Cluster``."""
    def role(match: re.Match[str]) -> str:
        tilde, target = match.groups()
        return target.rsplit(".", 1)[-1] if tilde or target.startswith(".") else target

    text = re.sub(r":\w+:`(~?)([^`]+)`", role, text)
    return text.replace("``", "")


@dataclass(frozen=True)
class Tenant:
    name: str
    share: float
    spend: float
    priced: float
    units: dict[str, float]
    caps: dict[str, float]


def _pairs(text: str) -> dict[str, float]:
    return {} if text == "-" else {k: float(v) for k, v in (p.split("=") for p in text.split(","))}


def budgets_example(page: Path = BUDGETS_PAGE) -> tuple[list[Tenant], dict[str, float], int]:
    """The worked example of docs/budgets.md: its TENANTS table, the pools' prices it states and how many V100 GPUs
    the greedy job takes without tenants."""
    text = page.read_text()
    table = re.search(r"tenants:\n\n((?:    .*\n)+)", text)
    if table is None:
        raise ValueError(f"{page}: no TENANTS table")
    rows = [line.split() for line in table.group(1).splitlines()[1:]]
    tenants = [Tenant(r[0], float(r[2]), float(r[3]), float(r[4]), _pairs(r[5]), _pairs(r[6])) for r in rows]
    stated = re.search(r"; prices ((?:\w+ \d+\.\d+, )*\w+ \d+\.\d+) credits per GPU-hour", text)
    if stated is None:
        raise ValueError(f"{page}: no sentence with the pools' prices")
    prices = {name: float(value) for name, value in (p.split() for p in stated.group(1).split(", "))}
    without = re.search(r"With `--no-tenants` the greedy job takes all (\d+) V100", text)
    if without is None:
        raise ValueError(f"{page}: no sentence on the plan without tenants")
    return tenants, prices, int(without.group(1))


def _figure_bytes(fig: object) -> bytes:
    import matplotlib.pyplot as plt

    out = io.BytesIO()
    fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None})  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    return out.getvalue()


def _setup() -> None:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams.update({"svg.hashsalt": "walras-docs", "svg.fonttype": "none", "font.size": 9,
                                "font.family": "DejaVu Sans"})


def draw_data_path(phases: list[Phase]) -> bytes:
    """The data path: one row of boxes, the planner's phases stacked inside the middle one."""
    _setup()
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    rows = len(phases)
    height = max(5.0, 0.42 * rows + 1.6)
    fig, ax = plt.subplots(figsize=(14.5, height))
    ax.set_xlim(0, 14.5)
    ax.set_ylim(0, height)
    ax.axis("off")
    mid = height / 2

    def box(x: float, y: float, w: float, h: float, title: str, body: str, colour: str) -> None:
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05", fc=colour, ec="#333333", lw=1))
        ax.text(x + w / 2, y + h - 0.22, title, ha="center", va="top", weight="bold")
        ax.text(x + w / 2, y + h - 0.55, body, ha="center", va="top", fontsize=7.5, linespacing=1.4)

    def arrow(x0: float, x1: float, label: str) -> None:
        ax.add_patch(FancyArrowPatch((x0, mid), (x1, mid), arrowstyle="-|>", mutation_scale=14, lw=1.2))
        ax.text((x0 + x1) / 2, mid + 0.12, label, ha="center", va="bottom", fontsize=7)

    box(0.1, mid - 1.4, 1.8, 2.8, "API objects",
        "Node, Pod,\nResourcePool,\nFungibleJob,\nColocationProfile,\nBudget,\nNamespace\n(watched by the\noperator, "
        "or\nread by\nwalras plan -f)", "#e8f0fe")
    box(2.3, mid - 1.0, 1.6, 2.0, "decode",
        "walras.kube.decode\n.cluster_from\nquantities parsed\nonce, typed,\nfrozen", "#fef7e0")
    arrow(1.95, 2.3, "snapshot")
    px, pw = 4.4, 5.8
    top = height - 0.3
    ax.add_patch(FancyBboxPatch((px, 0.25), pw, top - 0.25, boxstyle="round,pad=0.05", fc="#e6f4ea", ec="#333333"))
    ax.text(px + pw / 2, top - 0.12, "build_plan(cluster, previous, cache=...)", ha="center", va="top", weight="bold")
    ax.text(px + pw / 2, top - 0.42, "walras.planner: pure, one module per phase", ha="center", va="top",
            fontsize=7.5)
    step = (top - 1.0) / max(rows, 1)
    for i, phase in enumerate(phases):
        y = top - 0.85 - i * step
        ax.text(px + 0.15, y, phase.name, ha="left", va="center", weight="bold", fontsize=7.5)
        summary = re.sub(r"\s*\([^()]*\)$", "", phase.summary)
        summary = summary if len(summary) <= 66 else summary[:62].rsplit(" ", 1)[0] + " ..."
        ax.text(px + 2.3, y, summary, ha="left", va="center", fontsize=6.5)
    arrow(3.95, 4.4, "Cluster")
    box(10.65, mid - 1.0, 1.5, 2.0, "Plan", "frozen results:\npools, jobs,\npod actions,\nevents,\nsolver stats",
        "#fce8e6")
    arrow(10.25, 10.65, "plan")
    box(12.55, mid - 1.4, 1.85, 2.8, "encode -> API", "walras.kube.encode\nbuild_pod, job_status,\npool_status, "
        "events\n\ncreate, bind,\nresize, evict\n(Eviction API),\nstatus patches", "#f3e8fd")
    arrow(12.2, 12.55, "")
    ax.text(7.3, 0.05, "an unchanged cluster plans the same and writes nothing; reuse goes through the caller's "
            "PlanCache", ha="center", va="bottom", fontsize=7, style="italic")
    return _figure_bytes(fig)


def draw_budgets(tenants: list[Tenant], prices: dict[str, float], without_v100: int) -> bytes:
    """Three panels: each tenant's share, the GPUs each tenant holds per pool (with the cap, and the greedy job's
    V100s without tenants), and each tenant's spend against its share."""
    _setup()
    import matplotlib.pyplot as plt

    colours = ["#1a73e8", "#d93025", "#188038", "#f9ab00"]
    names = [t.name for t in tenants]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), gridspec_kw={"width_ratios": [1, 1.6, 1.2]})
    share, units, spend = axes
    total = sum(t.share for t in tenants)
    share.bar(range(len(tenants)), [t.share for t in tenants], color=colours[:len(tenants)])
    for i, t in enumerate(tenants):
        share.text(i, t.share, f"{t.share:g}\n({t.share / total:.0%})", ha="center", va="bottom", fontsize=8)
    share.set_xticks(range(len(tenants)), names, rotation=15, fontsize=7.5)
    share.set_ylabel("share B_t (credits per hour)")
    share.set_ylim(0, max(t.share for t in tenants) * 1.35)
    share.set_title("1. budgets")

    pools = sorted(prices, key=lambda p: -prices[p])
    width = 0.8 / (len(tenants) + 1)
    for k, t in enumerate(tenants):
        xs = [j + (k - len(tenants) / 2) * width for j in range(len(pools))]
        units.bar(xs, [t.units.get(p, 0) for p in pools], width, color=colours[k], label=t.name)
        for p, cap in t.caps.items():
            if p in pools:
                j = pools.index(p)
                units.plot([xs[j] - width / 2, xs[j] + width / 2], [cap, cap], color="black", lw=1.5)
                units.text(xs[j], cap + 0.1, f"cap {cap:g}", ha="center", va="bottom", fontsize=7)
    j = pools.index("v100")
    x = j + (len(tenants) / 2) * width
    units.bar([x], [without_v100], width, color="white", edgecolor=colours[1], hatch="//",
              label="greedy with --no-tenants")
    units.set_xticks(range(len(pools)), [f"{p}\nprice {prices[p]:g}/GPU-h" for p in pools], fontsize=7.5)
    units.set_ylabel("GPUs held by placed pods")
    units.set_ylim(0, without_v100 + 1.5)
    units.legend(fontsize=7, loc="upper right")
    units.set_title("2. units per pool at the market's prices")
    others = [f"{t.name}: {', '.join(f'{p}={u:g}' for p, u in t.units.items())}" for t in tenants
              if t.units and not set(t.units) & set(pools)]
    if others:
        units.text(0.02, 0.97, "not GPUs: " + "; ".join(others), transform=units.transAxes, fontsize=7, va="top")

    xs = range(len(tenants))
    spend.bar([i - 0.2 for i in xs], [t.share for t in tenants], 0.4, color="#dadce0", label="share")
    spend.bar([i + 0.2 for i in xs], [t.spend for t in tenants], 0.4, color=colours[:len(tenants)],
              label="spend of placed pods")
    spend.scatter([i + 0.2 for i in xs], [t.priced for t in tenants], marker="D", color="black", zorder=3, s=14,
                  label="market (priced) spend")
    spend.set_xticks(list(xs), names, rotation=15, fontsize=7.5)
    spend.set_ylabel("credits per hour")
    spend.legend(fontsize=7)
    spend.set_title("3. spend <= share")
    fig.tight_layout()
    return _figure_bytes(fig)


def figures() -> dict[Path, bytes]:
    tenants, prices, without = budgets_example()
    phases = [p for p in planner_phases() if not p.name.startswith("decode")]  # decode is its own box
    return {IMAGES / "data-path.svg": draw_data_path(phases),
            IMAGES / "budgets-worked-example.svg": draw_budgets(tenants, prices, without)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report pictures that are out of date (exit 1)")
    args = parser.parse_args(argv)
    stale = []
    for path, data in figures().items():
        if path.exists() and path.read_bytes() == data:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    for path in stale:
        print(f"{'out of date' if args.check else 'wrote'}: {path.relative_to(ROOT)}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
