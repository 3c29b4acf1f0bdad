"""Every output the user pages show is what the command prints now: each ``$ walras plan ...`` / ``$ walras explain
...`` line of a console block in docs/overview.md, docs/concepts/ and docs/tasks/ that is followed by output lines
is run (offline: its ``-f`` manifests; a YAML block of the same page whose first line is ``# NAME.yaml`` provides the
file NAME.yaml) and its stdout, piped through the rest of the line (``| head -5``, ``| grep ...``) by the shell,
must equal the lines shown."""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from walras.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted([DOCS / "overview.md", *(DOCS / "concepts").glob("*.md"), *(DOCS / "tasks").glob("*.md")])
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Shown:
    page: Path
    line: int
    command: str
    output: tuple[str, ...]


def shown(page: Path) -> list[Shown]:
    """The walras commands of the page's console blocks that are followed by output."""
    text = page.read_text()
    found = []
    for block in FENCE.finditer(text):
        if block.group(1) != "console":
            continue
        first = text[:block.start()].count("\n") + 2
        lines = block.group(2).splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("$ walras "):
                continue
            output = []
            for later in lines[i + 1:]:
                if later.startswith("$ "):
                    break
                output.append(later)
            if output:
                found.append(Shown(page, first + i, line[2:], tuple(output)))
    return found


def files(page: Path) -> dict[str, str]:
    """The page's YAML blocks named by their first line ``# NAME.yaml``."""
    named = {}
    for block in FENCE.finditer(page.read_text()):
        if block.group(1) == "yaml":
            head = block.group(2).split("\n", 1)[0]
            match = re.fullmatch(r"# ([\w.-]+\.yaml)", head)
            if match:
                named[match.group(1)] = block.group(2)
    return named


CASES = [case for page in PAGES for case in shown(page)]


def test_the_pages_show_outputs() -> None:
    assert len(CASES) >= 5
    assert {c.page.name for c in CASES} >= {"overview.md", "market.md", "pending-job.md", "run-a-job.md", "budgets.md"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.page.relative_to(DOCS)}:{c.line}")
def test_the_shown_output_is_what_the_command_prints(case: Shown, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    command, _, pipe = case.command.partition(" | ")
    argv = shlex.split(command)[1:]
    assert "--kubeconfig" not in argv and ("-f" in argv or "--filename" in argv), "an offline command"
    named = files(case.page)
    for name, text in named.items():
        (tmp_path / name).write_text(text)
    argv = [str(tmp_path / a) if a in named else a for a in argv]
    monkeypatch.chdir(ROOT)
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    if pipe:
        out = subprocess.run(["sh", "-c", pipe], input=out, capture_output=True, text=True, check=False).stdout
    assert [line.rstrip() for line in out.rstrip("\n").splitlines()] == [line.rstrip() for line in case.output]
