"""walras simulate (issue 21): hand-computed runs, the trace generator, the report and the CLI."""

from __future__ import annotations

import argparse
import json
import re
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from walras.cli import simulate as cli
from walras.cli.errors import UsageError
from walras.simulate.cluster import parse_cluster
from walras.simulate.engine import EngineOptions, simulate
from walras.simulate.policies import POLICIES, fit
from walras.simulate.report import equal_rows, summarise
from walras.simulate.trace import generate, read_csv, write_csv

from allocator.datasets import gavel_throughputs

SMALL = Path(str(resources.files("walras").joinpath("data/traces/small.csv")))


def _row(name: str, scale: int) -> np.ndarray:
    table = gavel_throughputs()
    k = next(i for i, (n, s) in enumerate(zip(table.job_types, table.scale_factors, strict=True))
             if n == name and s == scale)
    return table.throughput[k]


def _trace(tmp_path: Path, rows: list[tuple[float, str, float, int]]) -> Path:
    path = tmp_path / "t.csv"
    path.write_text("arrival,job_type,work,pods\n" + "".join(f"{a!r},{t},{w!r},{p}\n" for a, t, w, p in rows))
    return path


R18 = "ResNet-18 (batch size 16)"  # k80 4.79529, p100 35.8692, v100 32.3534 (one GPU)
LM = "LM (batch size 5)"


@pytest.mark.parametrize("policy", POLICIES)
def test_one_job_alone_finishes_at_arrival_plus_work_over_throughput(tmp_path: Path, policy: str) -> None:
    trace = read_csv(_trace(tmp_path, [(100.0, R18, 3600.0, 1)]))
    run = simulate(trace, parse_cluster("v100=1x1"), policy, EngineOptions(window=0.0))
    assert run.finish[0] == pytest.approx(100.0 + 3600.0 / 32.3534, rel=1e-12)
    assert run.start[0] == 100.0
    assert run.pods_moved == 0 and run.violations == []
    summary = summarise(run, trace.throughput_matrix(("v100",)))
    assert summary.utilisation["v100"] == pytest.approx(3600.0 / 32.3534 / (100.0 + 3600.0 / 32.3534))
    assert summary.rho_mean == pytest.approx(1.0)  # alone: its equal share is the whole (one-GPU) cluster


def test_fifo_queues_the_second_job_behind_the_first(tmp_path: Path) -> None:
    trace = read_csv(_trace(tmp_path, [(0.0, R18, 1000.0, 1), (10.0, LM, 2000.0, 1)]))
    run = simulate(trace, parse_cluster("v100=1x1"), "fifo", EngineOptions(window=0.0))
    first = 1000.0 / 32.3534
    assert run.finish[0] == pytest.approx(first, rel=1e-12)
    assert run.finish[1] == pytest.approx(first + 2000.0 / 109.167, rel=1e-12)
    assert run.jct.tolist() == pytest.approx([first, first + 2000.0 / 109.167 - 10.0], rel=1e-12)


def test_kueue_takes_the_fastest_type_first_and_fifo_ignores_speed(tmp_path: Path) -> None:
    trace = read_csv(_trace(tmp_path, [(0.0, R18, 1000.0, 1), (0.0, R18, 1000.0, 1)]))
    cluster = parse_cluster("k80=1x1,p100=1x1")
    kueue = simulate(trace, cluster, "kueue", EngineOptions(window=0.0))
    # p100 is faster for most job types: job 0 there, job 1 falls back to the k80
    assert kueue.finish.tolist() == pytest.approx([1000.0 / 35.8692, 1000.0 / 4.79529], rel=1e-12)
    fifo = simulate(trace, parse_cluster("k80=1x2,p100=1x1"), "fifo", EngineOptions(window=0.0))
    # the type with the most free accelerators (k80: 2) takes job 0; then k80 (1) ties p100 (1): k80 again
    assert fifo.finish.tolist() == pytest.approx([1000.0 / 4.79529] * 2, rel=1e-12)


def test_round_policy_time_slices_two_jobs_on_one_gpu_with_restart_delays(tmp_path: Path) -> None:
    # two identical jobs, one GPU: gavel's max-min fair share is 1/2 each, realised by alternating 360 s rounds;
    # every resume after a pause costs the 30 s restart delay
    work = 32.3534 * 1000.0  # 1000 s alone
    trace = read_csv(_trace(tmp_path, [(0.0, R18, work, 1), (0.0, R18, work, 1)]))
    run = simulate(trace, parse_cluster("v100=1x1"), "gavel", EngineOptions(window=0.0, record=True))
    # rounds: A [0,360) runs 360; B [360,720) runs 360; A [720,1080) runs 330 (delay) -> 690; B 690;
    # A [1440,1800): 310 left after its 30 s delay -> finishes at 1440+30+310 = 1780; B then runs alone from 1800
    assert run.finish[0] == pytest.approx(1780.0, rel=1e-12)
    assert run.finish[1] == pytest.approx(1800.0 + 30.0 + 310.0, rel=1e-12)
    assert run.pods_moved == 4 and run.preemptions == 4  # each paused twice (A at 360 and 1080, B at 720 and 1440)


def test_fit_is_consolidated_first_fit() -> None:
    free = np.array([1, 3, 4, 2])
    assert fit(free, np.arange(4), 2).tolist() == [3, 3]  # the fullest node that holds both
    assert free.tolist() == [1, 3, 4, 0]
    assert sorted(fit(free, np.arange(4), 6).tolist()) == [1, 1, 2, 2, 2, 2]  # most free first: 4 then 3 (takes 2)
    assert fit(free, np.arange(4), 5) is None


def test_generator_follows_gavels_distributions() -> None:
    trace = generate(3000, 30.0, seed=3)
    arrivals = np.array([j.arrival for j in trace.jobs])
    assert arrivals[0] == 0.0
    assert np.mean(np.diff(arrivals)) == pytest.approx(120.0, rel=0.06)  # 3600 / 30
    ref = np.array([j.work / j.throughput[2] for j in trace.jobs]) / 60.0  # minutes on V100s
    assert ref.min() >= 10**1.5 * (1 - 1e-9) and ref.max() <= 10**4 * (1 + 1e-9)
    assert np.mean(ref > 10**3) == pytest.approx(0.2, abs=0.03)
    pods = np.array([j.pods for j in trace.jobs])
    assert set(pods.tolist()) == {1, 2, 4, 8}
    assert np.mean(pods == 8) == pytest.approx(0.05, abs=0.015)  # a multi-GPU scale draws a distributed template
    for job in trace.jobs[:50]:
        assert job.throughput == pytest.approx(tuple(_row(job.job_type, job.pods)))
    assert generate(5, 30.0, seed=3) == generate(5, 30.0, seed=3)


def test_csv_round_trip_and_errors(tmp_path: Path) -> None:
    trace = generate(20, 60.0, seed=1)
    write_csv(trace, tmp_path / "x.csv")
    again = read_csv(tmp_path / "x.csv")
    assert [(j.arrival, j.job_type, j.work, j.pods) for j in again.jobs] == \
        [(j.arrival, j.job_type, j.work, j.pods) for j in trace.jobs]
    bad = tmp_path / "bad.csv"
    for text, message in [("arrival,job_type,work\n", "lacks column(s) pods"),
                          ("arrival,job_type,work,pods\n0,Nope,1,1\n", "not a job type"),
                          ("arrival,job_type,work,pods\n0,A3C,1,4\n", "measured with pods [1]"),
                          ("arrival,job_type,work,pods\n-1,A3C,1,1\n", "arrival must be >= 0"),
                          ("arrival,job_type,work,pods\n0,A3C,x,1\n", "must be numbers")]:
        bad.write_text(text)
        with pytest.raises(ValueError, match=re.escape(message)):
            read_csv(bad)


def test_cluster_parsing() -> None:
    cluster = parse_cluster("k80=2x4,v100=1x8")
    assert cluster.capacity.tolist() == [8, 8]
    assert cluster.node_names == ("k80-0000", "k80-0001", "v100-0000")
    for text in ("k80=2", "k80=0x4", "k80=1x4,k80=1x4", "K80=1x1"):
        with pytest.raises(ValueError):
            parse_cluster(text)


def test_equal_rows_is_gavels_equal_share() -> None:
    from walras.simulate.gavel import equal_share

    scale, cap = np.array([1.0, 2.0, 8.0]), np.array([4.0, 8.0])
    assert equal_rows(scale, cap, np.full(3, 3.0)) == pytest.approx(equal_share(scale, cap, 3))


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    return parser.parse_args(["simulate", *argv])


def test_cli_runs_the_shipped_trace_with_every_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    status = cli.run(_args("--trace", str(SMALL), "--cluster", "k80=1x4,p100=1x4,v100=1x4", "--window", "1800",
                           "-o", str(out), "--no-progress"))
    assert status == 0
    body = json.loads((out / "report.json").read_text())
    assert [p["policy"] for p in body["policies"]] == list(POLICIES)
    trace = read_csv(SMALL)
    assert len(trace.jobs) == 24
    for p in body["policies"]:
        assert p["finished"] == 24 and p["violations"] == 0
        assert 0.0 < p["avg_jct"] and p["median_jct"] <= p["p99_jct"] <= p["makespan"]
        assert all(0.0 < u <= 1.0 for u in p["utilisation"].values())
        # no job beats running alone on its fastest type
        assert p["avg_jct"] >= np.mean([j.work / max(j.throughput) for j in trace.jobs]) / 3600.0
    assert {"walras", "walras-migrate", "walras-timeslice"} <= set(body["prices"])
    for name in ("report.md", "jct_cdf.png", "utilisation.png", "prices.png"):
        assert (out / name).stat().st_size > 0
    table = capsys.readouterr().out
    assert table.count("| walras") == 3 and "avg JCT (h)" in table


@pytest.mark.parametrize(("argv", "message"), [
    (("--generate", "--cluster", "k80=1"), "--cluster"),
    (("--generate", "--policies", "fifo,lottery"), "unknown lottery"),
    (("--generate", "--policies", "fifo,fifo"), "twice"),
    (("--generate", "--window", "-1"), "--window"),
    (("--generate", "--rate", "0"), "arrival rate"),
    (("--trace", "/nonexistent.csv"), "no such file"),
    (("--trace", "EIGHT", "--cluster", "v100=1x4"), "needs 8 accelerators"),
    (("--trace", "EIGHT", "--cluster", "cpu=1x4"), "no job type is measured on 'cpu'"),
])
def test_cli_errors_are_one_line(tmp_path: Path, argv: tuple[str, ...], message: str) -> None:
    eight = _trace(tmp_path, [(0.0, R18, 10.0, 1), (5.0, R18, 10.0, 8)])
    argv = tuple(str(eight) if a == "EIGHT" else a for a in argv)
    with pytest.raises(UsageError, match=re.escape(message)) as err:
        cli.run(_args(*argv, "-o", str(tmp_path)))
    assert "\n" not in str(err.value)


def test_help_text() -> None:
    assert cli.HELP == "simulate a trace of jobs over time and compare scheduling policies"
