"""``walras plan`` as a pipeable dry run (``-o json|yaml|table``, ``--emit-pods``) and ``walras check``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from walras.cli import main
from walras.kube.encode import plan_document
from walras.manifests import examples

ROOT = Path(__file__).resolve().parents[1]


def _plan(capsys: pytest.CaptureFixture[str], *files: Path, extra: tuple[str, ...] = ()) -> dict:
    args = ["plan", *[a for f in files for a in ("-f", str(f))], "-o", "json", *extra]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_outputs_json_yaml_and_table(cluster_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-f", str(cluster_dir), "-o", "json"]) == 0
    text = capsys.readouterr().out
    assert text.count("\n") == 1  # compact by default
    as_json = json.loads(text)
    assert main(["plan", "-f", str(cluster_dir), "-o", "yaml"]) == 0
    as_yaml = yaml.safe_load(capsys.readouterr().out)
    assert [j["name"] for j in as_json["jobs"]] == [j["name"] for j in as_yaml["jobs"]]
    assert main(["plan", "-f", str(cluster_dir), "--json", "--indent", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["pools"].keys() == as_json["pools"].keys()
    assert main(["plan", "-f", str(cluster_dir)]) == 0
    table = capsys.readouterr().out
    assert "POOL" in table and "ALLOCATION" in table and "ml/transformer" in table


def test_compact_json_carries_the_values_json_dumps_writes(cluster_dir: Path) -> None:
    """``walras plan -o json`` writes with orjson: the same values as the standard library's ``json.dumps`` of
    ``walras.kube.encode.plan_document`` (checked independently of the writer), non-ASCII text as UTF-8, one line."""
    from walras.cli.plan import plan_json
    from walras.kube.decode import cluster_from
    from walras.manifests import load_manifests
    from walras.planner import build_plan

    plan = build_plan(cluster_from(load_manifests([cluster_dir])))
    compact = plan_json(plan)
    assert b"\n" not in compact
    assert json.loads(compact) == json.loads(json.dumps(plan_document(plan)))
    assert json.loads(plan_json(plan, 3)) == json.loads(compact)
    assert plan_json(plan, 3).startswith(b'{\n   "')


def test_plan_pauses_the_collector_and_restores_it(cluster_dir: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``walras plan`` runs with the cyclic collector paused (a one-shot command: its objects live until it ends) and
    leaves the caller's setting as it found it, also after a user error."""
    import gc

    from walras.cli import plan as plan_cli

    seen: list[bool] = []
    real = plan_cli.render
    monkeypatch.setattr(plan_cli, "render", lambda plan: (seen.append(gc.isenabled()), real(plan))[1])
    assert gc.isenabled()
    assert main(["plan", "-f", str(cluster_dir)]) == 0
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        assert main(["plan", "-f", str(cluster_dir)]) == 0
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert main(["plan", "-f", str(cluster_dir / "missing.yaml")]) == 2
    assert gc.isenabled()
    capsys.readouterr()


@pytest.mark.parametrize("tenants", [False, True])
@pytest.mark.parametrize("unbound", [False, True])
def test_emitted_pods_fed_back_give_no_action(cluster_dir: Path, tmp_path: Path, unbound: bool, tenants: bool,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The plan of the applied plan (its pods bound, or pending) makes no action but the binds, with tenants
    (Budgets' Fisher market, as ``walras run`` plans by default) and without."""
    pods = tmp_path / "pods.yaml"
    market = ("--tenants",) if tenants else ()
    first = _plan(capsys, cluster_dir, extra=("--emit-pods", str(pods), *(("--unbound",) if unbound else ()), *market))
    created = [p for p in first["pods"] if p["action"] == "create"]
    emitted = list(yaml.safe_load_all(pods.read_text()))
    assert created and len(emitted) == len(created)
    assert all(bool(p["spec"].get("nodeName")) != unbound for p in emitted)
    again = _plan(capsys, cluster_dir, pods, extra=market)
    planned_node = {p["name"]: p["node"] for p in created}
    for pod in again["pods"]:
        # no create, delete or resize; a pending pod is planned to the node it was planned to before
        assert pod["action"] == ("bind" if unbound else "keep"), pod
        assert pod["node"] == planned_node[pod["name"]]
    assert [j["replicas"] for j in again["jobs"]] == [j["replicas"] for j in first["jobs"]]
    # and the cluster with the pods bound passes every invariant
    if not unbound:
        assert main(["check", "-f", str(cluster_dir), "-f", str(pods)]) == 0


def test_check_reports_an_over_committed_node(cluster_dir: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (node,) = [d for d in examples.documents() if d.get("kind") == "Node"][:1]
    hog = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hog", "namespace": "default"},
           "spec": {"nodeName": node["metadata"]["name"],
                    "containers": [{"name": "c", "resources": {"requests": {"cpu": "100000"}}}]},
           "status": {"phase": "Running"}}
    (tmp_path / "hog.yaml").write_text(yaml.safe_dump(hog))
    capsys.readouterr()
    assert main(["check", "-f", str(cluster_dir), "-f", str(tmp_path / "hog.yaml"), "-o", "json"]) == 1
    (violation,) = json.loads(capsys.readouterr().out)
    assert violation["kind"] == "OverCommitted" and violation["object"] == f"Node/{node['metadata']['name']}"
    assert "cpu requested" in violation["message"]


def test_plan_of_a_directory_without_manifests_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("nothing here")
    assert main(["plan", "-f", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no *.yaml" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_plan_refuses_a_misspelled_field(cluster_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (job,) = [d for d in examples.documents() if d.get("kind") == "FungibleJob"][:1]
    job = json.loads(json.dumps(job))
    job["spec"]["replica"] = job["spec"].pop("replicas")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    assert main(["plan", "-f", str(tmp_path / "job.yaml")]) == 2
    err = capsys.readouterr().err
    assert "spec.replica" in err and "Traceback" not in err


def test_check_reads_a_live_cluster(control_plane: Any, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``walras check --kubeconfig`` on the real kube-apiserver: a node over-committed by a bound pod is reported
    (the API server itself accepts such a pod: only a kubelet would refuse it)."""
    control_plane.kubectl("apply", "-f", str(ROOT / "crds"))
    name = f"check-{namespace}"
    control_plane.apply_objects([{"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}])
    status = {"status": {"capacity": {"cpu": "2", "memory": "4Gi", "pods": "10"},
                         "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "10"}}}
    control_plane.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(status))
    try:
        capsys.readouterr()  # the control plane is shared by the session: look only at this test's node
        main(["check", "--kubeconfig", str(control_plane.kubeconfig), "-o", "json"])
        assert not [v for v in json.loads(capsys.readouterr().out) if v["object"] == f"Node/{name}"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hog", "namespace": namespace},
               "spec": {"nodeName": name, "containers": [
                   {"name": "c", "image": "x", "resources": {"requests": {"cpu": "3"}}}]}}
        control_plane.apply_objects([pod])
        assert main(["check", "--kubeconfig", str(control_plane.kubeconfig), "-o", "json"]) == 1
        found = json.loads(capsys.readouterr().out)
        assert {"kind": "OverCommitted", "object": f"Node/{name}",
                "message": "cpu requested 3 > allocatable 2"} in found
    finally:
        control_plane.kubectl("delete", "pod", "hog", "-n", namespace, "--grace-period=0", "--force",
                              "--ignore-not-found", check=False)
        control_plane.kubectl("delete", "node", name, "--ignore-not-found", check=False)


def test_check_without_a_reachable_cluster_is_a_usage_error(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--kubeconfig", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "kubeconfig" in err and "Traceback" not in err


def test_json_manifests_plan_like_their_yaml(cluster_dir: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``.json`` files (an object per file, an array, or a kubectl ``List``) are read as JSON and give the plan their
    YAML gives; a broken JSON file is one error line naming it."""
    docs = examples.documents()
    (tmp_path / "nodes.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                                                     "items": [d for d in docs if d["kind"] == "Node"]}))
    (tmp_path / "rest.json").write_text(json.dumps([d for d in docs if d["kind"] != "Node"]))
    from_yaml = _plan(capsys, cluster_dir)
    from_json = _plan(capsys, tmp_path)
    for plan in (from_yaml, from_json):
        plan.pop("seconds")
        plan["solver"].pop("seconds")
    assert from_json == from_yaml
    (tmp_path / "broken.json").write_text('{"kind": "Pod",')
    assert main(["plan", "-f", str(tmp_path), "-o", "json"]) == 2
    err = capsys.readouterr().err
    assert "broken.json: invalid JSON" in err and len(err.strip().splitlines()) == 1
