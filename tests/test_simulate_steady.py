"""Steady-state measurement (issue 31): the engine stops when a window of jobs finished (as Gavel's ``-s``/``-e``),
and :func:`walras.simulate.report.steady_state` reports that window; checked against values recomputed here from the
run's arrival and finish times, and on hand-made traces whose outcome is known."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
from walras.cli import simulate as cli
from walras.cli.errors import UsageError
from walras.simulate.cluster import parse_cluster
from walras.simulate.engine import EngineOptions, simulate
from walras.simulate.gavel import max_min_fairness, max_min_fairness_as_gavel, time_slice_as_gavel
from walras.simulate.policies import GavelFifoAllocation
from walras.simulate.report import in_system, steady_state
from walras.simulate.state import SimState
from walras.simulate.trace import Trace, TraceJob, generate, write_gavel

R18 = "ResNet-18 (batch size 16)"
R18_V100 = 32.3534  # iterations/s of one ResNet-18 (batch size 16) on one V100 (Gavel's table)


def _serial(n: int, gap: float, seconds: float) -> Trace:
    """n one-GPU ResNet-18 jobs, one every ``gap`` seconds, each ``seconds`` long alone on a V100."""
    row = (4.79529, 35.8692, R18_V100)
    jobs = tuple(TraceJob(k, k * gap, R18, 1, seconds * R18_V100, row) for k in range(n))
    return Trace(jobs, ("k80", "p100", "v100"), "serial")


@pytest.mark.parametrize("policy", ["fifo", "gavel"])
def test_until_stops_when_the_window_finished(policy: str) -> None:
    trace = generate(120, 6.0, seed=4, multi_gpu=False)
    cluster = parse_cluster("k80=2x1,p100=2x1,v100=2x1")
    run = simulate(trace, cluster, policy, EngineOptions(check=False, until=(20, 40)))
    window = np.arange(20, 40)
    assert np.isfinite(run.finish[window]).all()
    last = float(run.finish[window].max())
    assert last <= run.end <= last + EngineOptions().window + 1e-6  # the batch of the last finish, then stop
    assert not np.isfinite(run.finish).all()  # an overloaded 6-GPU cluster: later jobs are still in the system
    s = steady_state(run, trace.throughput_matrix(cluster.types), 20, 40)
    jct = (run.finish[window] - run.arrival[window]) / 3600.0
    assert s.finished == 20 and s.avg_jct == pytest.approx(jct.mean()) and s.p99_jct == pytest.approx(
        np.percentile(jct, 99))
    brute_start = sum(1 for a, f in zip(run.arrival, run.finish, strict=True)
                      if a <= run.arrival[20] and not (np.isfinite(f) and f <= run.arrival[20]))
    assert s.in_system_start == brute_start == in_system(run, float(run.arrival[20]))
    assert s.makespan == pytest.approx(run.end / 3600.0)
    assert (s.jct_first_half, s.jct_second_half) == pytest.approx((jct[:10].mean(), jct[10:].mean()))
    assert s.growing  # 6 jobs/h of ~17 h jobs on 6 GPUs: more jobs waiting, and longer


def test_steady_when_every_job_runs_alone() -> None:
    # a job every hour, each 30 min alone on a V100, two V100s: nobody waits, JCT is exactly 0.5 h
    trace = _serial(40, 3600.0, 1800.0)
    run = simulate(trace, parse_cluster("v100=2x1"), "fifo", EngineOptions(check=False, until=(10, 30)))
    s = steady_state(run, trace.throughput_matrix(("v100",)), 10, 30)
    assert s.avg_jct == pytest.approx(0.5) and s.median_jct == pytest.approx(0.5)
    assert (s.in_system_start, s.in_system_end, s.growing) == (1, 1, False)
    assert s.moves_per_job_hour == 0.0
    assert np.isnan(run.finish[35])  # stopped at job 29's finish: job 35 never arrived before
    with pytest.raises(ValueError, match="window"):
        steady_state(run, trace.throughput_matrix(("v100",)), 30, 50)
    with pytest.raises(ValueError, match="window of jobs"):
        simulate(trace, parse_cluster("v100=2x1"), "fifo", EngineOptions(until=(5, 41)))


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    return parser.parse_args(["simulate", *argv])


def test_cli_measures_a_window_of_a_gavel_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "g.trace"
    write_gavel(generate(60, 4.0, seed=5, multi_gpu=False), path)
    out = tmp_path / "report"
    status = cli.run(_args("--gavel-trace", str(path), "--cluster", "k80=4x1,p100=4x1,v100=4x1", "--measure",
                           "10,30", "--policies", "fifo,walras", "-o", str(out), "--no-progress", "--no-plots"))
    assert status == 0
    body = json.loads((out / "report.json").read_text())
    assert [(s["policy"], s["first"], s["last"], s["finished"]) for s in body["steady_state"]] == [
        ("fifo", 10, 30, 20), ("walras", 10, 30, 20)]
    assert "Steady state: jobs 10-29" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (("--generate", "--measure", "5"), "--measure: FIRST,LAST"),
    (("--generate", "--jobs", "20", "--measure", "10,30"), "LAST <= 20"),
    (("--generate", "--measure", "a,b"), "--measure"),
    (("--gavel-trace", "/nonexistent.trace"), "no such file"),
])
def test_cli_steady_errors_are_one_line(tmp_path: Path, argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(UsageError, match=message) as err:
        cli.run(_args(*argv, "-o", str(tmp_path)))
    assert "\n" not in str(err.value)


def _state(pods: list[int], v100: list[float], capacity: str) -> SimState:
    row = [(1.0, 2.0, t) for t in v100]
    trace = Trace(tuple(TraceJob(k, 0.0, R18, p, 100.0, r) for k, (p, r) in enumerate(zip(pods, row, strict=True))),
                  ("k80", "p100", "v100"), "hand-made")
    cluster = parse_cluster(capacity)
    return SimState(trace, cluster, trace.throughput_matrix(cluster.types), np.array(pods, dtype=np.int64),
                    np.full(len(pods), 100.0))


def _types(x: np.ndarray) -> list[list[str]]:
    return [[t for t, v in zip(("k80", "p100", "v100"), r, strict=True) if v == 1.0] for r in x]


def test_gavel_fifo_allocates_as_gavels_code() -> None:
    # Expected values: Gavel's own FIFOPolicy(seed=0).get_allocation (scheduler/policies/fifo.py, c4fa400) called on
    # the same inputs, run once by hand in Gavel's venv (the tests never read ../shared); see GavelFifoAllocation.
    six = _state([1] * 6, [3.0] * 6, "k80=2x1,p100=2x1,v100=2x1")
    x, _ = GavelFifoAllocation()(six, list(range(6)))
    assert _types(x) == [["v100"]] * 6  # every job on the last type name with a free GPU: V100 over-subscribed
    # sizes 2, 1, 1 (no V100 throughput), 8 (fits no type: blocks the queue), 1 on 4 + 4 + 4
    state = _state([2, 1, 1, 8, 1], [3.0, 3.0, 0.0, 3.0, 3.0], "k80=4x1,p100=4x1,v100=4x1")
    policy = GavelFifoAllocation()
    x, _ = policy(state, [0, 1, 2, 3, 4])
    assert _types(x) == [["v100"], ["v100"], [], [], []]
    x, _ = policy(state, [1, 2, 3, 4])  # job 0 left: its type goes to the head (job 2) only if it runs there
    assert _types(x) == [["v100"], [], [], []]


def test_gavel_fifo_runs_clean_through_the_engine() -> None:
    trace = generate(40, 8.0, seed=6)
    cluster = parse_cluster("k80=4x2,p100=4x2,v100=4x2")
    run = simulate(trace, cluster, "gavel-fifo", EngineOptions(check=True))
    assert run.violations == [] and np.isfinite(run.finish).all()
    alone = np.array([j.work / max(j.throughput) for j in trace.jobs])
    assert (run.jct >= alone * (1 - 1e-9)).all()  # no job beats running alone on its fastest type


def test_gavels_own_lp_matches_an_independent_solve() -> None:
    # Gavel's max_min_fairness_perf LP (its code's formulation) against CVXPY + Clarabel written here from the paper's
    # statement; the point inside the optimal face may differ (interior-point methods), the optimum may not.
    import cvxpy as cp

    rng = np.random.default_rng(7)
    print("seed 7")
    thr = rng.uniform(0.5, 6.0, size=(12, 3)) * np.array([0.3, 0.8, 1.0])
    thr[3, 0] = 0.0
    s = rng.choice([1.0, 2.0, 4.0], size=12)
    cap = np.array([8.0, 8.0, 8.0])
    got = max_min_fairness_as_gavel(thr, s, cap)
    x, t = cp.Variable((12, 3), nonneg=True), cp.Variable()
    prop = thr @ (cap / cap.sum())
    fair = [cp.multiply(s / prop, cp.sum(cp.multiply(thr, x), axis=1)) >= t]
    cp.Problem(cp.Maximize(t), [*fair, cp.sum(x, axis=1) <= 1, s @ x <= cap, x <= 1]).solve(solver="CLARABEL")
    assert got.status == "optimal" and got.objective == pytest.approx(float(t.value), rel=1e-5)
    a = got.allocation
    assert (a >= 0).all() and (a.sum(axis=1) <= 1 + 1e-6).all() and (s @ a <= cap + 1e-6).all()
    assert a[3, 0] == 0.0
    assert np.min(s * (thr * a).sum(axis=1) / prop) == pytest.approx(got.objective, rel=1e-5)
    # Low load: Gavel's ECOS point (run by hand in Gavel's venv on these three jobs and 4 + 4 + 4 GPUs) gives job 1
    # K80 0.187, P100 0.339, V100 0.356 and job 2 0.023 / 0.072 / 0.883 where V100s are spare: the single LP wastes
    # fast capacity; max_min_fairness's tie-breaking LP gives every job V100 only.
    low = np.array([[1.0, 3.0, 4.0], [2.0, 5.0, 6.0], [0.5, 2.0, 3.0]])
    spread = max_min_fairness_as_gavel(low, np.array([1.0, 2.0, 1.0]), np.array([4.0, 4.0, 4.0])).allocation
    assert spread[1, :2].sum() > 0.2 and spread[1].sum() < 0.95
    tie = max_min_fairness(low, np.array([1.0, 2.0, 1.0]), np.array([4.0, 4.0, 4.0])).allocation
    assert tie[:, 2] == pytest.approx([1.0, 1.0, 1.0])


def test_gavel_round_picking() -> None:
    # types k80, p100, v100; Gavel visits V100 first, then P100, then K80 (its *_perf policies)
    x = np.array([[0.0, 0.7, 0.3], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    thr = np.ones((3, 3))
    order = [2, 1, 0]
    zero = np.zeros((3, 3))
    # nothing run yet: equal counters, priority = X / (1/3); job 1 (X=1 on V100) first, then job 0 (0.3) on the V100s;
    # job 2 (X only on K80) fills the free P100 first: the types are visited in order, the fill included
    got = time_slice_as_gavel(x, thr, np.array([1.0, 1.0, 1.0]), np.array([1.0, 1.0, 2.0]), zero, order)
    assert got.tolist() == [2, 2, 1]
    # one V100: job 0 goes to P100; work-conserving: job 2 (X=0 on V100 and P100) still fills the K80
    got = time_slice_as_gavel(x, thr, np.array([1.0, 1.0, 1.0]), np.array([1.0, 1.0, 1.0]), zero, order)
    assert got.tolist() == [1, 2, 0]
    x_fifo = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    got = time_slice_as_gavel(x_fifo, thr, np.ones(3), np.array([4.0, 4.0, 1.0]), zero, order, fill=False)
    assert got.tolist() == [2, -1, -1]  # V100 over-subscribed: one runs, the other waits; no fill for FIFO
    # the job that received less of the V100s' time comes first
    got = time_slice_as_gavel(x_fifo, thr, np.ones(3), np.array([4.0, 4.0, 1.0]),
                              np.array([[0.0, 0.0, 3600.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), order, fill=False)
    assert got.tolist() == [-1, 2, -1]
