"""``walras demo --json``: the example cluster and the real operator, end to end in-process, on both routes: the
emulated API, and a local real control plane with the kubelet stand-in (skipped without the binaries, failing
under ``CI=true``)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pytest
from walras.cli import demo

from tests.controlplane import assets_folder, missing_message


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    demo.add_parser(sub)
    return parser.parse_args(argv)


def check_demo_output(data: dict[str, Any]) -> None:
    assert data["pools"] and data["jobs"] and data["pods"]
    manifests = demo.read_manifests(demo.example_paths())
    nodes = {d["metadata"]["name"] for d in manifests if d["kind"] == "Node"}
    jobs = {(d["metadata"].get("namespace", "default"), d["metadata"]["name"])
            for d in manifests if d["kind"] == "FungibleJob"}
    assert {(j["namespace"], j["name"]) for j in data["jobs"]} == jobs
    for pod in data["pods"]:
        assert pod["node"] in nodes, pod
        assert (pod["namespace"], pod["job"]) in jobs
        assert pod["limits"] or pod["requests"], pod
    replicas = sum(sum(j["replicas"].values()) for j in data["jobs"])
    assert replicas == len(data["pods"])
    for pool in data["pools"]:
        assert pool["price"] >= 0 and 0 <= pool["utilisation"] <= 1


def test_demo_binds_every_example_pod_on_the_emulated_api(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.run(parse(["demo", "--json", "--cluster", "emulated", "--timeout", "90"])) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["emulated"] is True and data["cluster"] == "emulated"
    check_demo_output(data)


@pytest.mark.controlplane
def test_demo_runs_every_example_pod_on_a_real_control_plane(capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    folder, missing = assets_folder()
    if folder is None or missing:
        if os.environ.get("CI") == "true":
            pytest.fail(missing_message(missing))
        pytest.skip(missing_message(missing))
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(folder))
    assert demo.binaries_present()
    assert demo.run(parse(["demo", "--json", "--timeout", "120"])) == 0  # auto picks the real control plane
    data = json.loads(capsys.readouterr().out)
    assert data["emulated"] is False and data["cluster"] == "real"
    check_demo_output(data)
    # the kubelet stand-in admitted every pod: Running, none rejected with OutOf<resource>
    assert {p["phase"] for p in data["pods"]} == {"Running"}


def test_auto_route_needs_all_four_binaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    assert not demo.binaries_present()
    for name in demo.CONTROL_PLANE_BINARIES[:3]:
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    assert not demo.binaries_present()
    (tmp_path / "kube-scheduler").write_text("#!/bin/sh\n")
    (tmp_path / "kube-scheduler").chmod(0o755)
    assert demo.binaries_present()


def test_render_lists_pools_jobs_and_pods() -> None:
    data = {"pools": [{"name": "v100", "resource": "nvidia.com/gpu", "policy": "utility", "nodes": 2,
                       "capacity": 8.0, "used": 6.0, "price": 1.25, "utilisation": 0.75}],
            "jobs": [{"namespace": "ml", "name": "resnet", "phase": "Running", "allocation": {"v100": 1.0},
                      "replicas": {"v100": 2}, "count": 3, "granted": 3, "reason": "DegreeLimited",
                      "throughput": 6.0, "utility": 6.0, "cost": 2.5}],
            "pods": [{"namespace": "ml", "name": "resnet-0", "job": "resnet", "pool": "v100", "node": "gpu-0",
                      "phase": "Running", "requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}],
            "solver": {"iterations": 3, "gap": 0.0, "converged": True}}
    text = demo.render(data)
    assert "v100  nvidia.com/gpu  utility  2      8         6     1.25   75%" in text
    assert "ml         resnet  Running  v100=1.00   2/3 v100=2  6           2.5   DegreeLimited" in text
    assert "resnet-0  v100  gpu-0  Running  nvidia.com/gpu=1  nvidia.com/gpu=1" in text


def test_demo_fails_with_the_pods_left_when_the_timeout_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.run(parse(["demo", "--json", "--cluster", "emulated", "--timeout", "0.01"])) == 1
    err = capsys.readouterr().err
    assert "not every planned pod was bound to its planned node within 0.01 s" in err


def test_unsettled_names_unbound_surplus_and_nodeless_pods() -> None:
    from walras.planner.model import Plan, PodPlan

    plan = Plan(pods=(
        PodPlan("ml", "bound", "j", "v100", "gpu-0", action="keep"),
        PodPlan("ml", "elsewhere", "j", "v100", "gpu-0", action="bind"),
        PodPlan("ml", "missing", "j", "v100", "gpu-1", action="create"),
        PodPlan("ml", "surplus", "j", "v100", "gpu-0", action="delete"),
        PodPlan("ml", "nowhere", "j", "k80", None, action="keep"),
    ))

    def pod(name: str, node: str | None, phase: str = "Running") -> dict[str, object]:
        return {"metadata": {"namespace": "ml", "name": name}, "spec": {"nodeName": node} if node else {},
                "status": {"phase": phase}}

    cluster = [pod("bound", "gpu-0"), pod("elsewhere", "gpu-1"), pod("surplus", "gpu-0"), pod("nowhere", None)]
    left = demo.unsettled(plan, cluster)
    # a bound pod the kubelet has not started yet keeps the demo waiting too (its job's phase follows its pods)
    assert demo.unsettled(plan, [pod("bound", "gpu-0", "Pending")])[0] == "ml/bound: bound to gpu-0, not Running yet"
    assert left == [
        "ml/elsewhere: planned on gpu-0, bound to gpu-1",
        "ml/missing: planned on gpu-1, not created",
        "ml/surplus: planned for deletion, still exists",
        "ml/nowhere: no node in pool 'k80' has room for it",
    ]
    assert not demo.settled(plan, cluster)
    assert demo.unsettled(None, cluster) == ["no plan yet"]
    assert demo.settled(Plan(), [])
