"""``walras.manifests.preload``: after it, a first plan of another cluster (every placement policy, 500 nodes) imports
no module, and the example cluster is not special-cased: it runs in a fresh interpreter, as ``walras run`` and
``walras plan`` use it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_PROBE = """
import json, sys
from walras.manifests.preload import preload
from walras.planner import build_plan
from walras.kube.decode import cluster_from
from bench.planner import POLICIES, cluster
seconds = preload()
before = set(sys.modules)
plan = build_plan(cluster_from(cluster(500, len(set(POLICIES)) * 2, 100, 5)))
policies = sorted({p.policy for p in plan.pools.values() if p.policy})
print(json.dumps({"seconds": seconds, "new": sorted(set(sys.modules) - before), "policies": policies,
                  "placed": sum(1 for p in plan.pods if p.node is not None)}))
"""


def test_after_preload_a_first_plan_of_another_cluster_imports_nothing() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [str(ROOT), *sys.path] if p)}
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    from bench.planner import POLICIES

    assert out["policies"] == sorted(set(POLICIES)), out  # the other cluster uses every policy the bench cycles
    assert out["placed"] > 0
    assert out["new"] == [], out["new"]
