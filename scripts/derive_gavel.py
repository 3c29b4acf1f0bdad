"""Derive the compact Gavel data file shipped in ``allocator/data/gavel.json``.

Source: Gavel's measured throughput table (Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies for Deep
Learning Workloads", OSDI 2020; repository stanford-futuredata/gavel, file ``scheduler/simulation_throughputs.json``,
commit c4fa40097339e9608ab71fd64c8bdea96a5e4a4c; MIT licence, copied to ``allocator/data/LICENSE-gavel``).

Run from the repository root with the shared data checked out beside it::

    python scripts/derive_gavel.py ../shared/data/gavel/simulation_throughputs.json allocator/data/gavel.json

The project never reads ``../shared`` at run or test time: only this one-off script does.
"""

from __future__ import annotations

import ast
import json
import math
import re
import sys

GPUS = ("k80", "p100", "v100")


def _round(x: float) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.6g}")


def main(src: str, dst: str) -> None:
    raw = json.load(open(src))
    keys = list(raw["v100"])
    parsed = [ast.literal_eval(k) for k in keys]
    job_types = []
    for name, scale in parsed:
        m = re.match(r"^(.*?) \(batch size (\d+)\)$", name)
        model, batch = (m.group(1), int(m.group(2))) if m else (name, None)
        job_types.append({"name": name, "model": model, "batch_size": batch, "scale_factor": int(scale)})
    throughput = [[_round(raw[g].get(k, {}).get("null", float("nan"))) for g in GPUS] for k in keys]
    single = [i for i, (_, s) in enumerate(parsed) if s == 1]
    colocation = {}
    for g in GPUS:
        table = []
        for i in single:
            row = []
            for j in single:
                pair = raw[g][keys[i]].get(keys[j])
                row.append(_round(pair[0]) if pair else None)
            table.append(row)
        colocation[g] = table
    out = {
        "source": "Gavel (Narayanan et al., OSDI 2020), stanford-futuredata/gavel scheduler/simulation_throughputs.json"
        " at commit c4fa40097339e9608ab71fd64c8bdea96a5e4a4c; MIT licence (LICENSE-gavel)",
        "units": "training iterations per second",
        "gpu_types": list(GPUS),
        "job_types": job_types,
        "throughput": throughput,
        "colocation": {
            "job_types": single,
            "note": "paired[gpu][a][b]: throughput of job type a while it shares one GPU of that type with job type b",
            "paired": colocation,
        },
    }
    with open(dst, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
