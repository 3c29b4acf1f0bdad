"""The command outputs shown in the user pages (docs/overview.md, docs/concepts/, docs/tasks/): find them, run them,
and refresh them after a change of the planner's behaviour.

    python scripts/docs_outputs.py           # rewrite every shown output with what the command prints now
    python scripts/docs_outputs.py --check   # exit 1 and name each shown output that differs

A shown output is a ``$ walras plan ...`` / ``$ walras explain ...`` line of a ``console`` block followed by output
lines (up to the next ``$`` line). It must be offline (``-f`` manifests, no ``--kubeconfig``); a YAML block of the
same page whose first line is ``# NAME.yaml`` provides the file NAME.yaml; the rest of the line after `` | ``
(``head -5``, ``grep ...``) is run by the shell on the command's stdout. tests/test_docs_outputs.py checks them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def pages() -> list[Path]:
    return sorted([DOCS / "overview.md", *(DOCS / "concepts").glob("*.md"), *(DOCS / "tasks").glob("*.md")])


@dataclass(frozen=True)
class Shown:
    """One shown output: the page, the 1-based line of its command, the command (without ``$ ``) and the lines."""

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
            match = re.fullmatch(r"# ([\w.-]+\.yaml)", block.group(2).split("\n", 1)[0])
            if match:
                named[match.group(1)] = block.group(2)
    return named


def run(case: Shown) -> tuple[int, list[str]]:
    """Run the shown command in this process (from the repository's root) and return its exit status and its stdout,
    piped through the rest of the line, as lines without trailing blanks."""
    from walras.cli import main

    command, _, pipe = case.command.partition(" | ")
    argv = shlex.split(command)[1:]
    if "--kubeconfig" in argv or not ({"-f", "--filename"} & set(argv)):
        raise ValueError(f"{case.page}:{case.line}: not an offline command: {case.command}")
    named = files(case.page)
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in named.items():
            Path(tmp, name).write_text(text)
        argv = [str(Path(tmp, a)) if a in named else a for a in argv]
        out = io.StringIO()
        here = os.getcwd()
        os.chdir(ROOT)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                code = main(argv)
        finally:
            os.chdir(here)
    text = out.getvalue()
    if pipe:
        text = subprocess.run(["sh", "-c", pipe], input=text, capture_output=True, text=True, check=False).stdout
    return code, [line.rstrip() for line in text.rstrip("\n").splitlines()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report outputs that differ (exit 1)")
    args = parser.parse_args(argv)
    stale = 0
    for page in pages():
        lines = page.read_text().split("\n")
        for case in reversed(shown(page)):  # from the bottom: earlier line numbers stay valid
            code, now = run(case)
            if code != 0:
                print(f"{page.relative_to(ROOT)}:{case.line}: exit {code}: {case.command}")
                stale += 1
                continue
            if now == [line.rstrip() for line in case.output]:
                continue
            stale += 1
            print(f"{'differs' if args.check else 'refreshed'}: {page.relative_to(ROOT)}:{case.line}: {case.command}")
            if not args.check:
                lines[case.line:case.line + len(case.output)] = now
        if not args.check:
            page.write_text("\n".join(lines))
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
