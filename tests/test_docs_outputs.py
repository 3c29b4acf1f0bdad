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
