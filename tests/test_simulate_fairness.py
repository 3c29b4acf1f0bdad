"""Finish-time fairness in walras simulate's report (Themis, NSDI 2020; Gavel, OSDI 2020, Sec. 4.2): rho = JCT over
the time the job would take on a 1/n equal share of the cluster, n the average number of jobs in the system over its
life. Every expected value is worked out by hand in the test from the trace, not by the code under test."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from walras.simulate.cluster import parse_cluster
from walras.simulate.engine import EngineOptions, simulate
from walras.simulate.report import fairness, markdown, summarise, write_report
from walras.simulate.trace import read_csv

R18 = "ResNet-18 (batch size 16)"  # one GPU: k80 4.79529, p100 35.8692, v100 32.3534 (Gavel's table)
K80, V100 = 4.79529, 32.3534


def _trace(tmp_path: Path, rows: list[tuple[float, str, float, int]]) -> Path:
    path = tmp_path / "t.csv"
    path.write_text("arrival,job_type,work,pods\n" + "".join(f"{a!r},{t},{w!r},{p}\n" for a, t, w, p in rows))
    return path


def test_two_jobs_queued_on_one_gpu(tmp_path: Path) -> None:
    """One V100, two identical 1000 s jobs arriving together, FIFO. Job 0 runs [0, 1000]: two jobs in the system
    throughout, n = 2, its equal share is half the GPU, alone on it 2000 s: rho = 1000 / 2000 = 0.5. Job 1 waits and
    runs [1000, 2000]: n = (2 * 1000 + 1 * 1000) / 2000 = 1.5, share min(1, 1 / 1.5) = 2/3, alone on it 1000 / (2/3) =
    1500 s: rho = 2000 / 1500 = 4/3."""
    work = V100 * 1000.0
    trace = read_csv(_trace(tmp_path, [(0.0, R18, work, 1), (0.0, R18, work, 1)]))
    run = simulate(trace, parse_cluster("v100=1x1"), "fifo", EngineOptions(window=0.0))
    rho = fairness(run, trace.throughput_matrix(("v100",)))
    assert rho.tolist() == pytest.approx([0.5, 4.0 / 3.0], rel=1e-9)
    s = summarise(run, trace.throughput_matrix(("v100",)))
    assert s.rho_mean == pytest.approx((0.5 + 4.0 / 3.0) / 2, rel=1e-9)
    assert s.rho_median == pytest.approx((0.5 + 4.0 / 3.0) / 2, rel=1e-9)
    assert s.rho_p99 == pytest.approx(0.5 + 0.99 * (4.0 / 3.0 - 0.5), rel=1e-9)  # linear interpolation
    assert s.rho_max == pytest.approx(4.0 / 3.0, rel=1e-9)
    assert s.rho_unfair == 0.5


def test_heterogeneous_share_spans_both_types(tmp_path: Path) -> None:
    """A K80 and a V100 (C = 2), two ResNet-18 jobs of work W at 0. FIFO puts job 0 on the K80 (both types have one
    free; ties go to the cluster's first type) and job 1 on the V100. The equal share of a one-pod job among n <= 2
    jobs is (1/2) min(1, 2 / n) = 1/2 of each type: rate (4.79529 + 32.3534) / 2 = 18.574345 whatever n in [1, 2],
    so rho_0 = (W / 4.79529) / (W / 18.574345) = 3.873456 and rho_1 = 18.574345 / 32.3534 = 0.574108."""
    work = 1000.0
    trace = read_csv(_trace(tmp_path, [(0.0, R18, work, 1), (0.0, R18, work, 1)]))
    cluster = parse_cluster("k80=1x1,v100=1x1")
    run = simulate(trace, cluster, "fifo", EngineOptions(window=0.0))
    assert run.finish.tolist() == pytest.approx([work / K80, work / V100], rel=1e-12)
    thr = trace.throughput_matrix(cluster.types)
    equal = (K80 + V100) / 2
    assert fairness(run, thr).tolist() == pytest.approx([equal / K80, equal / V100], rel=1e-9)


def test_a_late_arrival_shortens_the_share_only_while_it_is_there(tmp_path: Path) -> None:
    """One V100; job 0 (3000 s of work alone) at 0, job 1 (1000 s) at 1000. FIFO runs job 0 [0, 3000], job 1
    [3000, 4000]. Job 0: n = (1 * 1000 + 2 * 2000) / 3000 = 5/3, share 3/5, alone on it 3000 / 0.6 = 5000 s, rho
    = 3000 / 5000 = 0.6. Job 1: JCT 3000, n = (2 * 2000 + 1 * 1000) / 3000 = 5/3, alone on 3/5 of the GPU 1000 / 0.6
    s, rho = 3000 * 0.6 / 1000 = 1.8."""
    trace = read_csv(_trace(tmp_path, [(0.0, R18, V100 * 3000.0, 1), (1000.0, R18, V100 * 1000.0, 1)]))
    run = simulate(trace, parse_cluster("v100=1x1"), "fifo", EngineOptions(window=0.0))
    assert run.finish.tolist() == pytest.approx([3000.0, 4000.0], rel=1e-12)
    assert fairness(run, trace.throughput_matrix(("v100",))).tolist() == pytest.approx([0.6, 1.8], rel=1e-9)


def test_report_table_and_json_carry_the_fairness_columns(tmp_path: Path) -> None:
    work = V100 * 1000.0
    trace = read_csv(_trace(tmp_path, [(0.0, R18, work, 1), (0.0, R18, work, 1)]))
    run = simulate(trace, parse_cluster("v100=1x1"), "fifo", EngineOptions(window=0.0))
    thr = trace.throughput_matrix(("v100",))
    write_report([run], thr, tmp_path / "out", title="t", meta={}, plots=False)
    body = json.loads((tmp_path / "out" / "report.json").read_text())["policies"][0]
    assert body["rho_median"] == pytest.approx(0.5 * (0.5 + 4.0 / 3.0)) and body["rho_unfair"] == 0.5
    assert body["rho_p99"] == pytest.approx(0.5 + 0.99 * (4.0 / 3.0 - 0.5))
    table = markdown([summarise(run, thr)], "t")
    head, _, row = table.splitlines()[2:5]
    cells = dict(zip([c.strip() for c in head.split("|")], [c.strip() for c in row.split("|")], strict=True))
    assert cells["rho mean"] == "0.917" and cells["rho median"] == "0.917" and cells["rho p99"] == "1.325"
    assert cells["rho>1"] == "50%"
    assert np.isfinite(body["rho_mean"])
