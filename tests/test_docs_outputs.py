"""Every output the user pages show is what the command prints now: each ``$ walras plan ...`` / ``$ walras explain
...`` line of a console block in docs/overview.md, docs/concepts/ and docs/tasks/ that is followed by output lines
is run offline (see scripts/docs_outputs.py; ``python scripts/docs_outputs.py`` refreshes them after a change of the
planner's behaviour) and its stdout must equal the lines shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import docs_outputs

CASES = [case for page in docs_outputs.pages() for case in docs_outputs.shown(page)]


def test_the_pages_show_outputs() -> None:
    assert len(CASES) >= 5
    assert {c.page.name for c in CASES} >= {"overview.md", "market.md", "pending-job.md", "run-a-job.md", "budgets.md"}


def test_the_finder_reads_commands_outputs_and_named_files(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("```yaml\n# a.yaml\nkind: X\n```\n\n```console\n$ walras plan -f a.yaml | head -1\nPOOL\n"
                    "$ kubectl get pods\n$ walras explain x -f a.yaml\n```\n```sh\n$ walras plan -f b\nout\n```\n")
    found = docs_outputs.shown(page)
    assert [(c.line, c.command, c.output) for c in found] == [(7, "walras plan -f a.yaml | head -1", ("POOL",))]
    assert docs_outputs.files(page) == {"a.yaml": "# a.yaml\nkind: X\n"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.page.relative_to(docs_outputs.DOCS)}:{c.line}")
def test_the_shown_output_is_what_the_command_prints(case: docs_outputs.Shown) -> None:
    code, now = docs_outputs.run(case)
    assert code == 0
    assert now == [line.rstrip() for line in case.output]


def test_the_simulate_report_is_what_walras_simulate_prints() -> None:
    shown = docs_outputs.shown_simulate_block(docs_outputs.SIMULATE_PAGE.read_text())
    assert shown.count("\n| ") >= 6, "docs/simulate.md lost its report markers or rows"
    assert shown == docs_outputs.simulate_block(), "run: python scripts/docs_outputs.py"
    assert " sim s " not in shown


def test_the_shipped_trace_is_as_docs_simulate_describes_it() -> None:
    import csv

    text = docs_outputs.SIMULATE_PAGE.read_text()
    with open(docs_outputs.ROOT / "operator/walras/data/traces/small.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    pods = {int(r["pods"]) for r in rows}
    minutes = round(max(float(r["arrival"]) for r in rows) / 60)
    assert f"({len(rows)} jobs, {min(pods)} to {max(pods)} pods, arrivals over {minutes} minutes)" in text
