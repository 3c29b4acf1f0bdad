"""The docs hold together: every relative link in docs/ and README.md resolves (a file, a directory, or a heading of
a markdown page), every ``walras ...`` command in a code block of docs/tasks/ parses with the real argparse parser
of walras.cli (so only sub-commands and flags that exist are shown), and every ``helm --set KEY=...`` there names a
key of helm/walras/values.yaml."""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
TASKS = sorted((ROOT / "docs" / "tasks").glob("*.md"))
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)

#: Broken links of the measurement pages, which the benchmarks in bench/ write (not the docs' owners): the plots of
#: docs/bench/simulate/ linked as if from docs/bench/ (bench/simulate_steady.py writes the page). The test requires
#: exactly these, so a fix must shrink the list.
KNOWN_BROKEN = {
    "docs/bench/simulate/steady.md": {"simulate/steady_jct_vs_rate.png", "simulate/steady_in_system_multi.png",
                                      "simulate/steady_in_system_single.png"},
}


def _strip_code(text: str) -> str:
    """The page without fenced code blocks and inline code (a link-like text there is not a link)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped except '-' and '_', spaces to '-'."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    found: set[str] = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        if line.startswith("#"):
            base = slug(line.lstrip("#"))
            name, n = base, 1
            while name in found:
                name, n = f"{base}-{n}", n + 1
            found.add(name)
    return frozenset(found)


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(_strip_code(page.read_text()))]


def test_the_link_checker_sees_links_and_headings(tmp_path: Path) -> None:
    page = tmp_path / "a.md"
    page.write_text("# A `b` title: c\n\n## Two words\n\n[x](b.md#two) `[no](none.md)` ![p](img.svg \"t\")\n"
                    "```\n[code](nowhere.md)\n```\n")
    assert links(page) == ["b.md#two", "img.svg"]
    assert anchors(page) == {"a-b-title-c", "two-words"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif fragment and where.suffix == ".md" and fragment not in anchors(where):
            broken.append(f"{target}: no heading #{fragment}")
    known = KNOWN_BROKEN.get(str(page.relative_to(ROOT)), set())
    assert {b.split(": ")[0] for b in broken} == known, broken


def commands(page: Path) -> list[tuple[int, list[str]]]:
    """The ``walras ...`` (and ``kubectl walras ...``) commands in the page's code blocks: (line, argv after walras).
    A ``$ `` prompt is dropped, backslash continuations are joined, and a command ends at a pipe, ``&&``, ``;``, a
    redirection or a comment."""
    text = page.read_text()
    found = []
    for block in FENCE.finditer(text):
        first = text[:block.start()].count("\n") + 2
        joined: list[tuple[int, str]] = []
        for i, line in enumerate(block.group(1).splitlines()):
            line = line.removeprefix("$ ")
            if joined and joined[-1][1].endswith("\\"):
                joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.strip())
            else:
                joined.append((first + i, line))
        for number, line in joined:
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue
            for cut in ("|", "&&", ";", ">", "2>", ">>", "||"):
                if cut in words:
                    words = words[:words.index(cut)]
            if words[:2] == ["kubectl", "walras"]:
                words = words[1:]
            if words[:1] == ["walras"]:
                found.append((number, words[1:]))
    return found


@cache
def _parser():  # type: ignore[no-untyped-def]
    from walras.cli import build_parser

    return build_parser()


def test_the_command_checker_finds_and_rejects(tmp_path: Path) -> None:
    page = tmp_path / "t.md"
    page.write_text("```console\n$ walras plan -f examples/ \\\n    --tenants | head\nkubectl walras explain ml/a\n"
                    "walras plan --no-such-flag\n```\n")
    found = commands(page)
    assert [argv for _, argv in found] == [["plan", "-f", "examples/", "--tenants"], ["explain", "ml/a"],
                                           ["plan", "--no-such-flag"]]
    _parser().parse_args(found[0][1])
    with pytest.raises(SystemExit):
        _parser().parse_args(found[2][1])


def test_the_task_pages_exist_and_show_commands() -> None:
    names = {p.stem for p in TASKS}
    assert {"install", "run-a-job", "budgets", "grafana", "pending-job", "drain-a-node", "upgrade"} <= names
    assert sum(len(commands(p)) for p in TASKS) >= 10


@pytest.mark.parametrize("page", TASKS, ids=lambda p: p.name)
def test_every_walras_command_in_the_tasks_parses(page: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = []
    for number, argv in commands(page):
        try:
            _parser().parse_args(argv)
        except SystemExit as exc:
            if exc.code not in (0, None):  # --help and --version exit 0
                bad.append(f"{page.name}:{number}: walras {' '.join(argv)}: {capsys.readouterr().err.strip()}")
    assert not bad, "\n".join(bad)


def _keys(values: object, prefix: str = "") -> set[str]:
    if not isinstance(values, dict):
        return set()
    out = set()
    for key, value in values.items():
        out.add(prefix + key)
        out |= _keys(value, f"{prefix}{key}.")
    return out


@pytest.mark.parametrize("page", TASKS, ids=lambda p: p.name)
def test_every_helm_value_in_the_tasks_exists(page: Path) -> None:
    values = yaml.safe_load((ROOT / "helm" / "walras" / "values.yaml").read_text())
    known = _keys(values)
    maps = {k for k in known if _get(values, k) == {}}  # free-form maps (labels, annotations): any key below
    used = re.findall(r"--set(?:-string)?[ =]([\w.\-]+)=", page.read_text())
    unknown = {k for k in used if k not in known and not any(k.startswith(m + ".") for m in maps)}
    assert not unknown, sorted(unknown)


def _get(values: object, key: str) -> object:
    for part in key.split("."):
        values = values.get(part) if isinstance(values, dict) else None
    return values
