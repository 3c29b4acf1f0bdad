"""``make bench``: run every benchmark module in turn, then assemble ``docs/benchmarks.md`` from ``docs/bench/*.md``.

Usage::

    python -m bench                 # every benchmark, full size
    python -m bench --quick         # smoke-sized runs
    python -m bench --only pricing aa
    python -m bench --assemble      # only rebuild docs/benchmarks.md from the fragments already written

Each benchmark module writes its own fragment (command, machine, median of at least 5 runs, the paper's figures beside
ours); this driver never edits a fragment.
"""

from __future__ import annotations

import argparse
import posixpath
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRAGMENTS = ROOT / "docs" / "bench"
OUTPUT = ROOT / "docs" / "benchmarks.md"
MODULES = ("pricing", "aa", "colocation", "degree", "fairness", "planner", "extender", "cli", "simulate")

HEADER = """# Benchmarks

Produced by `make bench` (`python -m bench`), which runs each module below as `python -m bench.<name>` and assembles
this page from the fragments in `docs/bench/`. Every timing is the median of at least 5 runs; each section names the
exact command, the machine and the versions it ran with. Benchmarks are scripts, not timed unit tests.

"""


_LINK = re.compile(r"(!?\[[^\]]*\]\()([^()\s#]+)")


def relink(fragment: str) -> str:
    """A fragment's relative links (written from docs/bench/) rewritten to resolve from docs/benchmarks.md."""
    def fix(match: re.Match[str]) -> str:
        target = match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
            return match.group(0)
        return match.group(1) + posixpath.normpath(posixpath.join("bench", target))
    return _LINK.sub(fix, fragment)


def assemble() -> None:
    """Concatenate the fragments in module order (unknown extra fragments last, alphabetically)."""
    present = {p.stem: p for p in FRAGMENTS.glob("*.md")}
    order = [m for m in MODULES if m in present] + sorted(set(present) - set(MODULES))
    parts = [HEADER]
    for name in order:
        parts.append(relink(present[name].read_text().strip()) + "\n\n")
    OUTPUT.write_text("".join(parts).rstrip() + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke-sized runs")
    parser.add_argument("--only", nargs="+", choices=MODULES, help="run only these modules")
    parser.add_argument("--assemble", action="store_true", help="only rebuild docs/benchmarks.md")
    args = parser.parse_args(argv)
    failures = []
    if not args.assemble:
        for name in args.only or MODULES:
            if not (ROOT / "bench" / f"{name}.py").exists():
                print(f"== bench.{name}: missing", flush=True)
                failures.append(name)
                continue
            cmd = [sys.executable, "-m", f"bench.{name}"] + (["--quick"] if args.quick else [])
            print(f"== {' '.join(cmd[1:])}", flush=True)
            start = time.perf_counter()
            rc = subprocess.call(cmd, cwd=ROOT)
            print(f"== bench.{name}: exit {rc} after {time.perf_counter() - start:.1f} s", flush=True)
            if rc != 0:
                failures.append(name)
    assemble()
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
