"""The command outputs shown in the user pages (docs/overview.md, docs/troubleshooting.md, docs/concepts/,
docs/tasks/): find them, run them, and refresh them after a change of the planner's behaviour.

    python scripts/docs_outputs.py           # rewrite every shown output with what the command prints now
    python scripts/docs_outputs.py --check   # exit 1 and name each shown output that differs

A shown output is a ``$ walras plan ...`` / ``$ walras explain ...`` line of a ``console`` block followed by output
lines (up to the next ``$`` line). It must be offline (``-f`` manifests, no ``--kubeconfig``); a YAML block of the
same page whose first line is ``# NAME.yaml`` provides the file NAME.yaml; the rest of the line after `` | ``
(``head -5``, ``grep ...``) is run by the shell on the command's stdout. tests/test_docs_outputs.py checks them.
A ``$ walras simulate ...`` line (offline by nature: a trace file and a virtual cluster) is shown the same way: its
``-o DIR`` goes to a temporary directory and its report's :data:`WALL_COLUMNS` are left out (the page says so).

docs/simulate.md's example table is the report ``walras simulate`` prints for :data:`SIMULATE_ARGV` (the shipped
trace, every policy; the simulated quantities are deterministic), written between :data:`SIMULATE_BEGIN` and
:data:`SIMULATE_END` without the ``sim s`` column (wall seconds of the machine, not a property of the policy).
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
SIMULATE_PAGE = DOCS / "simulate.md"
#: The command of docs/simulate.md's example (``-o DIR`` added by :func:`simulate_block`).
SIMULATE_ARGV = ("simulate", "--trace", "operator/walras/data/traces/small.csv",
                 "--cluster", "k80=1x4,p100=1x4,v100=1x4", "--no-plots")
SIMULATE_BEGIN = "<!-- begin: the report of the command above, written by scripts/docs_outputs.py -->"
SIMULATE_END = "<!-- end: the report -->"
#: Columns of the report left out of the page: they measure the machine, not the policy.
WALL_COLUMNS = ("sim s",)


def pages() -> list[Path]:
    return sorted([DOCS / "overview.md", DOCS / "troubleshooting.md", *(DOCS / "concepts").glob("*.md"),
                   *(DOCS / "tasks").glob("*.md")])


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
    simulate = argv[:1] == ["simulate"]
    if not simulate and ("--kubeconfig" in argv or not ({"-f", "--filename"} & set(argv))):
        raise ValueError(f"{case.page}:{case.line}: not an offline command: {case.command}")
    named = files(case.page)
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in named.items():
            Path(tmp, name).write_text(text)
        argv = [str(Path(tmp, a)) if a in named else a for a in argv]
        if simulate:
            argv = _output_in(argv, str(Path(tmp, "simulation")))
        out = io.StringIO()
        here = os.getcwd()
        os.chdir(ROOT)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                code = main(argv)
        finally:
            os.chdir(here)
    text = out.getvalue()
    if simulate:
        text = "\n".join(without_wall_columns(text.splitlines())) + "\n"
    if pipe:
        text = subprocess.run(["sh", "-c", pipe], input=text, capture_output=True, text=True, check=False).stdout
    return code, [line.rstrip() for line in text.rstrip("\n").splitlines()]


def _output_in(argv: list[str], where: str) -> list[str]:
    """``walras simulate`` arguments with their output directory (``-o DIR``, ``--output DIR`` or ``--output=DIR``,
    added when absent) replaced by ``where``, so that a shown command writes nothing into the repository."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("-o", "--output"):
            skip = True
        elif not arg.startswith("--output="):
            out.append(arg)
    return [*out, "-o", where]


def without_wall_columns(lines: list[str]) -> list[str]:
    """The lines of a ``walras simulate`` report with the cells of :data:`WALL_COLUMNS` left out of every table (the
    columns are found anew at each table's header row, whose first cell is ``policy``)."""
    drop: list[int] = []
    kept = []
    for line in lines:
        if line.startswith("|"):
            cells = line.strip().strip("|").split("|")
            if cells[0].strip() == "policy":
                drop = [i for i, cell in enumerate(cells) if cell.strip() in WALL_COLUMNS]
            line = "|" + "|".join(c for i, c in enumerate(cells) if i not in drop) + "|"
        kept.append(line)
    return kept


def simulate_block() -> str:
    """The lines docs/simulate.md shows between its markers: the report of ``walras`` :data:`SIMULATE_ARGV` (run in
    this process from the repository's root) without its title and without :data:`WALL_COLUMNS`."""
    from walras.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        out = io.StringIO()
        here = os.getcwd()
        os.chdir(ROOT)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                code = main([*SIMULATE_ARGV, "-o", tmp])
        finally:
            os.chdir(here)
    if code != 0:
        raise RuntimeError(f"walras {' '.join(SIMULATE_ARGV)} exited {code}")
    lines = [line for line in out.getvalue().strip().splitlines() if not line.startswith("# ")]
    drop: list[int] = []
    kept = []
    for line in lines:
        if line.startswith("|"):
            cells = line.strip().strip("|").split("|")
            if not drop and "policy" in cells[0]:
                drop = [i for i, cell in enumerate(cells) if cell.strip() in WALL_COLUMNS]
            line = "|" + "|".join(c for i, c in enumerate(cells) if i not in drop) + "|"
        kept.append(line)
    return "\n".join(kept).strip("\n")


def shown_simulate_block(text: str) -> str:
    """What docs/simulate.md shows between its markers (empty if they are missing)."""
    if SIMULATE_BEGIN not in text or SIMULATE_END not in text:
        return ""
    return text.split(SIMULATE_BEGIN, 1)[1].split(SIMULATE_END, 1)[0].strip("\n")


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
    text = SIMULATE_PAGE.read_text()
    now = simulate_block()
    if shown_simulate_block(text) != now:
        stale += 1
        print(f"{'differs' if args.check else 'refreshed'}: {SIMULATE_PAGE.relative_to(ROOT)}: walras simulate report")
        if not args.check:
            head, rest = text.split(SIMULATE_BEGIN, 1)
            SIMULATE_PAGE.write_text(f"{head}{SIMULATE_BEGIN}\n{now}\n{SIMULATE_END}{rest.split(SIMULATE_END, 1)[1]}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
