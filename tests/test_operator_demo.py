"""``walras demo --json``: the emulated API, the example cluster and the real operator, end to end in-process."""

from __future__ import annotations

import argparse
import json

import pytest
from walras.cli import demo


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    demo.add_parser(sub)
    return parser.parse_args(argv)


def test_demo_binds_every_example_pod(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.run(parse(["demo", "--json", "--timeout", "90"])) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["emulated"] is True
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


def test_render_lists_pools_jobs_and_pods() -> None:
    data = {"pools": [{"name": "v100", "resource": "nvidia.com/gpu", "policy": "utility", "nodes": 2,
                       "capacity": 8.0, "used": 6.0, "price": 1.25, "utilisation": 0.75}],
            "jobs": [{"namespace": "ml", "name": "resnet", "phase": "Running", "allocation": {"v100": 1.0},
                      "replicas": {"v100": 2}, "throughput": 6.0, "utility": 6.0, "cost": 2.5}],
            "pods": [{"namespace": "ml", "name": "resnet-0", "job": "resnet", "pool": "v100", "node": "gpu-0",
                      "requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}],
            "solver": {"iterations": 3, "gap": 0.0, "converged": True}}
    text = demo.render(data)
    assert "v100  nvidia.com/gpu  utility  2      8         6     1.25   75%" in text
    assert "ml         resnet  Running  v100=1.00   v100=2    6           2.5" in text
    assert "resnet-0  v100  gpu-0  nvidia.com/gpu=1  nvidia.com/gpu=1" in text
