"""examples/: the packaged copy, coverage of every policy and utility, Gavel numbers, `walras plan` on them, and
that ``kubectl apply -R -f examples/`` is safe on a real cluster (no Node objects, every namespace it uses created).

What a user applies lives in ``examples/``; the emulated nodes the demo (and offline planning) uses live in
``operator/walras/data/emulated-nodes.yaml``; ``operator/walras/data/examples.yaml`` (what ``walras demo`` loads) is
the concatenation of both, in :data:`PACKAGED_SOURCES` order.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from walras import cli
from walras.manifests import examples, load_manifests
from walras.planner.spec import parse_job, parse_pool, parse_profile

from allocator.datasets import gavel_throughputs
from tests.planning import build_plan

ROOT = Path(__file__).resolve().parents[1]
NODES = ROOT / "operator" / "walras" / "data" / "emulated-nodes.yaml"
#: The files ``operator/walras/data/examples.yaml`` concatenates, relative to the repository root.
PACKAGED_SOURCES = ("operator/walras/data/emulated-nodes.yaml", "examples/00-namespaces.yaml", "examples/pools.yaml",
                    "examples/profile.yaml", "examples/jobs/gpu.yaml", "examples/jobs/cpu.yaml")
WALRAS_KINDS = {"ResourcePool", "FungibleJob", "ColocationProfile"}


def packaged_text() -> str:
    """The packaged file built from its sources (documents separated by ``---``, each headed by its path)."""
    parts = [f"# --- {name}\n" + (ROOT / name).read_text().rstrip("\n") + "\n" for name in PACKAGED_SOURCES]
    return "---\n".join(parts)


def test_packaged_copy_equals_examples() -> None:
    packaged = ROOT / "operator" / "walras" / "data" / "examples.yaml"
    assert packaged.read_text() == packaged_text()
    on_disk = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").rglob("*.yaml"))
    assert on_disk == sorted(n for n in PACKAGED_SOURCES if n.startswith("examples/"))


def test_examples_are_safe_to_apply_to_a_real_cluster() -> None:
    """Only Namespaces and Walras objects under examples/ (no Node), every namespace used is created there, and
    the Namespace file sorts first (``kubectl apply -R`` walks files in lexical order)."""
    files = sorted((ROOT / "examples").rglob("*.yaml"))
    docs = [d for f in files for d in yaml.safe_load_all(f.read_text()) if isinstance(d, dict)]
    assert {d["kind"] for d in docs} == WALRAS_KINDS | {"Namespace"}
    created = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    used = {d["metadata"]["namespace"] for d in docs if d["metadata"].get("namespace")}
    assert used and used <= created
    assert files[0].name == "00-namespaces.yaml"
    nodes = [d for d in yaml.safe_load_all(NODES.read_text()) if isinstance(d, dict)]
    assert nodes and {d["kind"] for d in nodes} == {"Node"}


def test_kubectl_apply_recursive_on_a_real_api_server(control_plane: Any) -> None:
    """``kubectl apply -R -f examples/`` after the CRDs, against a real kube-apiserver: it succeeds on the first
    try and creates no Node."""
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        control_plane.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    nodes_before = {n["metadata"]["name"] for n in control_plane.get("nodes")["items"]}
    try:
        out = control_plane.kubectl("apply", "-R", "-f", str(ROOT / "examples"))
        assert "fungiblejob.walras.dev/resnet50 created" in out.stdout, out.stdout
        assert {n["metadata"]["name"] for n in control_plane.get("nodes")["items"]} == nodes_before
        jobs = control_plane.get("fungiblejobs", "-A")["items"]
        assert {(j["metadata"]["namespace"], j["metadata"]["name"]) for j in jobs} >= {("ml", "resnet50"),
                                                                                         ("web", "frontend")}
    finally:
        control_plane.kubectl("delete", "-R", "-f", str(ROOT / "examples"), "--wait=false", "--ignore-not-found",
                              check=False)


def test_packaged_snapshot_equals_directory_snapshot() -> None:
    packaged, directory = examples.snapshot(), load_manifests([ROOT / "examples", NODES])
    for field in ("nodes", "pods", "pools", "jobs", "profiles"):

        def key(obj: dict) -> tuple[str, str]:
            return (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])

        assert sorted(getattr(packaged, field), key=key) == sorted(getattr(directory, field), key=key)
    assert examples.example_paths()[0].is_file()


def test_examples_exercise_every_policy_and_utility() -> None:
    snap = load_manifests(ROOT / "examples")
    pools = [parse_pool(p) for p in snap.pools]
    jobs = [parse_job(j) for j in snap.jobs]
    profiles = [parse_profile(p) for p in snap.profiles]
    assert {p.policy for p in pools} == {"utility", "colocation", "throughput", "fair"}
    assert {j.utility.type for j in jobs} == {"linear", "log", "power", "alpha-fair", "target-priority"}
    assert any(j.elastic for j in jobs)
    assert any(j.curve is not None and j.curve.points for j in jobs)
    assert any(j.curve is not None and j.curve.type for j in jobs)
    assert any(j.throughput_demand for j in jobs)
    assert any(j.gang and j.replicas > 1 for j in jobs)  # a gang: all replicas in one pool or none
    types = {t for p in profiles for t in p.types}
    assert {j.colocation_type for j in jobs if j.colocation_type} <= types
    assert {p.resource for p in pools} == {"nvidia.com/gpu", "cpu"}


def test_gpu_throughputs_are_gavels_measurements() -> None:
    gavel = gavel_throughputs()
    docs = yaml.safe_load_all((ROOT / "examples" / "jobs" / "gpu.yaml").read_text())
    checked = 0
    for doc in docs:
        model = doc["spec"]["template"]["spec"]["containers"][0]["args"][1]
        scale = doc["spec"]["demand"]
        rows = [i for i, (n, s) in enumerate(zip(gavel.job_types, gavel.scale_factors)) if n == model and s == scale]
        assert len(rows) == 1, model
        expected = gavel.throughput[rows[0]]
        got = np.array([doc["spec"]["throughput"][g] for g in gavel.gpu_types])
        assert got == pytest.approx(expected, rel=1e-4)
        checked += 1
    assert checked >= 5


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``walras ARGV`` through the console entry point (user errors: one line on stderr, status 2)."""
    status = cli.main(argv)
    out = capsys.readouterr()
    return status, out.out, out.err


def test_walras_plan_json_on_examples(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_cli(["plan", "-f", str(ROOT / "examples"), "-f", str(NODES), "--json"], capsys)
    assert status == 0
    data = json.loads(out)
    assert set(data["pools"]) == {"k80", "p100", "v100", "cpu"}
    assert {j["name"] for j in data["jobs"]} >= {"resnet50", "frontend"}
    assert data["pods"]
    for pool in data["pools"].values():
        assert {"price", "capacity", "used", "utilisation", "nodeCount"} <= set(pool)


def test_walras_plan_table_and_bad_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, out, _ = run_cli(["plan", "-f", str(ROOT / "examples"), "-f", str(NODES)], capsys)
    assert status == 0
    assert "POOL" in out and "v100" in out and "solver:" in out
    status, _, err = run_cli(["plan", "-f", str(tmp_path / "missing.yaml")], capsys)
    assert status == 2 and "no such file" in err and len(err.strip().splitlines()) == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [unclosed\n")
    status, _, err = run_cli(["plan", "-f", str(bad)], capsys)
    assert status == 2 and "invalid YAML" in err and len(err.strip().splitlines()) == 1


def test_load_manifests_expands_lists_and_ignores_other_kinds(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "kind: List\nitems:\n- {kind: Node, metadata: {name: n1}}\n- {kind: ConfigMap, metadata: {name: c}}\n"
        "---\nkind: ResourcePool\nmetadata: {name: p}\n"
    )
    snap = load_manifests(tmp_path, validate=False)  # the ResourcePool is deliberately incomplete
    assert [n["metadata"]["name"] for n in snap.nodes] == ["n1"]
    assert len(snap.pools) == 1 and snap.jobs == ()
    plan = build_plan(snap)
    assert plan.pools["p"].conditions[0].status == "False"


def test_the_example_gang_runs_whole_in_one_pool_and_no_job_is_granted_more_than_it_asks() -> None:
    """``xgboost-ring`` (``replicas: {count: 4, gang: true}``) on the emulated nodes: its 4 replicas are placed
    together in one pool or none is; and no example job's status says more replicas granted than its count (a gang
    once read "granted 5 of 4")."""
    from walras.kube.decode import cluster_from

    plan = build_plan(cluster_from(load_manifests([ROOT / "examples", NODES], validate=False)))
    gang = plan.jobs[("web", "xgboost-ring")]
    assert sum(gang.replicas.values()) in (0, 4) and len(gang.replicas) <= 1, gang.replicas
    assert gang.count == 4
    for key, jp in plan.jobs.items():
        assert sum(jp.wanted.values()) <= jp.count, (key, jp.wanted, jp.count)
        granted = next((c for c in jp.conditions if c.type == "ReplicasGranted"), None)
        if granted is not None:
            k, n = granted.message.split(" replica(s)")[0].removeprefix("granted ").split(" of ")
            assert int(k) <= int(n.removeprefix("up to ")), granted.message
