"""``walras explain``'s start-time estimate of a waiting job (issue 28): the simulator
(:mod:`walras.simulate.forecast` over :mod:`walras.simulate.engine`) run forward over the plan's jobs and the work
they have left. Each case's answer is computed by hand in its docstring; the cases where the simulator's model is not
the plan's say why there is no estimate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_explain import gpu_node, job, managed, pool
from walras.cli import main
from walras.kube.decode import cluster_from
from walras.planner import Snapshot
from walras.simulate.forecast import estimate_start

from tests.planning import build_plan


def running(name: str, count: int, left: float | None, on: str = "a0") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A log job of ``count`` replicas (throughput 1 in pool a) running all of them on ``on``, with ``left`` work
    left (None: not reported)."""
    spec = job(name, {"a": 1.0}, count=count)
    if left is not None:
        spec["metadata"]["annotations"] = {"walras.dev/remaining-work": f"{left:g}"}
    return spec, [managed(f"{name}-a-{k}", name, "a", on, "Running") for k in range(count)]


def estimate(jobs: list[dict[str, Any]], pods: list[dict[str, Any]], rule: str = "Never", name: str = "w",
             nodes: list[dict[str, Any]] | None = None) -> Any:
    snap = Snapshot(nodes=tuple(nodes or [gpu_node("a0")]), pods=tuple(pods),
                    pools=(pool("a", "a", preemption={"rule": rule}),), jobs=tuple(jobs))
    cluster = cluster_from(snap)
    plan = build_plan(cluster)
    assert plan.jobs[("ml", name)].replicas == {} and plan.jobs[("ml", name)].queue_position is not None
    return estimate_start(cluster, plan, ("ml", name))


def test_a_waiting_job_starts_when_the_running_one_ends() -> None:
    """One pool of 4 GPUs (preemption Never), a running job of 4 replicas of throughput 1 with 7200 work left: it
    runs at ``1 * 4 / 4 = 1`` per second and ends in 7200 s = 2 h; the waiting job of 4 GPUs starts then."""
    r, pods = running("r", 4, 7200)
    got = estimate([r, job("w", {"a": 1.0}, count=4)], pods)
    assert got.seconds == pytest.approx(7200.0, abs=1.0), got
    assert got.jobs == 2 and "simulated" in got.note


def test_a_waiting_job_starts_with_the_first_freed_gpus() -> None:
    """Two running jobs of 2 replicas each: r1 with 3600 work left (ends in 1 h), r2 with 10800 (3 h). The waiting
    job of 4 replicas (a fixed count, not a gang) gets the 2 GPUs r1 frees after 1 h: it starts then, not after r2."""
    r1, p1 = running("r1", 2, 3600)
    r2, p2 = running("r2", 2, 10800)
    got = estimate([r1, r2, job("w", {"a": 1.0}, count=4)], p1 + p2)
    assert got.seconds == pytest.approx(3600.0, abs=1.0), got


def test_no_estimate_without_the_remaining_work() -> None:
    r, pods = running("r", 4, None)
    got = estimate([r, job("w", {"a": 1.0}, count=4)], pods)
    assert got.seconds is None
    assert got.note == "the remaining work of ml/r is unknown (annotation walras.dev/remaining-work)"


def test_no_estimate_beyond_the_horizon() -> None:
    """10^7 s of work left (115 days) is beyond the week the simulation covers."""
    r, pods = running("r", 4, 1e7)
    got = estimate([r, job("w", {"a": 1.0}, count=4)], pods)
    assert got.seconds is None and got.note == "it does not start within the 168 h the simulation covers"


def test_no_estimate_outside_the_simulators_model() -> None:
    r, pods = running("r", 4, 7200)
    got = estimate([r, job("w", {"a": 1.0}, count=2, demand=2)], pods)
    assert got.seconds is None and got.note == "ml/w asks for 2 units per replica; the simulator's pods hold one"
    gang = job("w", {"a": 1.0}, replicas={"count": 4, "gang": True})
    assert estimate([r, gang], pods).note == "ml/w is a gang; the simulator's jobs have a fixed count"


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Path:
    r, pods = running("r", 4, 7200)
    docs = [gpu_node("a0"), pool("a", "a", preemption={"rule": "Never"}), r, job("w", {"a": 1.0}, count=4), *pods]
    for doc in docs:
        doc.setdefault("apiVersion", "v1" if doc["kind"] in ("Node", "Pod") else "walras.dev/v1alpha1")
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump_all(docs))
    return tmp_path


def test_explain_shows_the_estimate(cluster_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "ml/w", "--no-tenants", "-f", str(cluster_dir), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    start = doc["queue"]["start"]
    assert start["seconds"] == pytest.approx(7200.0, abs=1.0) and start["horizonSeconds"] == 7 * 86400
    assert main(["explain", "ml/w", "--no-tenants", "-f", str(cluster_dir)]) == 0
    out = capsys.readouterr().out
    assert "Queue: position 1 of 1 waiting job(s)" in out
    assert "Estimated start: in 2 h 00 min (simulated: 2 job(s) over pool(s) a with their remaining work" in out
    # a running job has no estimate
    assert main(["explain", "ml/r", "--no-tenants", "-f", str(cluster_dir), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["queue"] is None
