"""Quantity parsing: the planner's ``walras.planner.quantity.parse_quantity`` against the Kubernetes client's
``kubernetes.utils.parse_quantity`` on the same 20,000 quantities, side by side in one process.

Two inputs, each a list of 20,000 strings:

* ``repeated``: what a cluster snapshot holds - pods and nodes repeat a few dozen distinct strings (``"500m"``,
  ``"16Gi"``, ``"4"``, ...), 64 distinct values drawn with a fixed seed;
* ``distinct``: 20,000 different strings (random mantissas with every suffix), the worst case for the planner's
  ``lru_cache``.

Each timing is the wall-clock of parsing the whole list to floats, median of ``--repeats`` runs (at least 5), the
two parsers interleaved run by run; the planner's cache is cleared before each of its runs. The values are compared
(relative difference at most 1e-12). Prints a Markdown table; ``docs/design-choices.md`` quotes a run.

Usage: ``python -m bench.quantity [--repeats 7]``
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable

SUFFIXES = ("", "n", "u", "m", "k", "M", "G", "T", "Ki", "Mi", "Gi", "Ti")


def distinct_quantities(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        mantissa = f"{rng.randint(1, 99999)}" if rng.random() < 0.6 else f"{rng.uniform(0.001, 999):.3f}"
        text = mantissa + rng.choice(SUFFIXES)
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def repeated_quantities(n: int, distinct: int = 64, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    pool = [*distinct_quantities(distinct - 8, seed), "500m", "250m", "1", "2", "4", "16Gi", "512Mi", "110"]
    return [rng.choice(pool) for _ in range(n)]


def time_once(parse: Callable[[str], float], values: list[str]) -> tuple[float, list[float]]:
    start = time.perf_counter()
    out = [parse(v) for v in values]
    return time.perf_counter() - start, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    repeats = max(5, args.repeats)

    from kubernetes.utils import parse_quantity as k8s_parse
    from walras.planner import quantity

    def ours(text: str) -> float:
        return quantity.parse_quantity(text)

    def theirs(text: str) -> float:
        return float(k8s_parse(text))

    print(f"load average before: {os.getloadavg()}")
    print("| input | n | walras.planner.quantity (ms) | kubernetes.utils.parse_quantity (ms) | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for label, values in (("repeated (64 distinct)", repeated_quantities(20_000)),
                          ("distinct", distinct_quantities(20_000))):
        mine: list[float] = []
        client: list[float] = []
        for _ in range(repeats):
            quantity._parse_text.cache_clear()
            t, a = time_once(ours, values)
            mine.append(t)
            t, b = time_once(theirs, values)
            client.append(t)
        worst = max(abs(x - y) / max(abs(y), 1e-300) for x, y in zip(a, b))
        assert worst <= 1e-12, worst
        m, c = statistics.median(mine) * 1e3, statistics.median(client) * 1e3
        print(f"| {label} | {len(values)} | {m:.1f} | {c:.1f} | {c / m:.1f}x |")
    print(f"load average after: {os.getloadavg()}; medians of {repeats} interleaved runs; values agree to 1e-12")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
