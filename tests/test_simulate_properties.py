"""Property tests of the simulator (issue 21): every policy conserves work, no job beats its best-case throughput,
and no re-plan over-commits a node or breaks the planner's invariants (walras.planner.invariants)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from walras.simulate.cluster import parse_cluster
from walras.simulate.engine import TIME_TOLERANCE, EngineOptions, simulate
from walras.simulate.policies import POLICIES
from walras.simulate.state import Decision, SimState
from walras.simulate.trace import read_csv

TYPES = ["ResNet-18 (batch size 16)", "LM (batch size 5)", "Transformer (batch size 32)"]  # measured on 1 and 2 GPUs
CLUSTER = "k80=1x2,v100=1x2"
PLANNER = {"walras", "walras-migrate", "walras-timeslice"}

jobs = st.lists(st.tuples(st.floats(0.0, 1500.0), st.sampled_from(TYPES), st.floats(200.0, 40000.0),
                          st.sampled_from([1, 1, 2])), min_size=1, max_size=4)


def _write(tmp: Path, rows: list[tuple[float, str, float, int]]) -> Path:
    path = tmp / "t.csv"
    path.write_text("arrival,job_type,work,pods\n" + "".join(f"{a!r},{t},{w!r},{p}\n" for a, t, w, p in rows))
    return path


def _check(run_rows: list[tuple[float, str, float, int]], policy: str, window: float, tmp: Path) -> None:
    trace = read_csv(_write(tmp, run_rows))
    run = simulate(trace, parse_cluster(CLUSTER), policy, EngineOptions(window=window, record=True, check=True))
    assert run.violations == []
    assert run.finished.all()
    np.testing.assert_array_equal(run.progress, run.work)
    done = np.zeros(len(trace.jobs))
    last_end = np.full(len(trace.jobs), -np.inf)
    for i, begin, end, rate in sorted(run.segments, key=lambda s: (s[0], s[1])):
        assert begin >= last_end[i] - 1e-9 and end > begin  # a job's stretches of progress never overlap
        assert run.arrival[i] - 1e-9 <= begin and end <= run.finish[i] + 1e-9
        assert 0.0 < rate <= run.best_rate[i] * (1 + 1e-12)
        done[i] += rate * (end - begin)
        last_end[i] = end
    np.testing.assert_allclose(done, run.work, rtol=1e-9)  # the work integrated over the segments is the work
    # no job beats its best rate; the engine admits arrivals within TIME_TOLERANCE of an event at that event (a job
    # arriving 1e-10 s after another starts with it), so a JCT may be short of work/rate by that much, no more
    assert np.all(run.finish - run.arrival >= run.work / run.best_rate * (1 - 1e-12) - TIME_TOLERANCE)


@pytest.mark.parametrize("policy", [p for p in POLICIES if p not in PLANNER])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=jobs, window=st.sampled_from([0.0, 60.0, 600.0]))
def test_baselines_conserve_work_and_never_over_commit(tmp_path: Path, policy: str,
                                                      rows: list[tuple[float, str, float, int]],
                                                      window: float) -> None:
    _check(rows, policy, window, tmp_path)


@pytest.mark.parametrize("policy", sorted(PLANNER))
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=jobs, window=st.sampled_from([0.0, 60.0]))
def test_planner_policies_conserve_work_and_keep_the_invariants(tmp_path: Path, policy: str,
                                                                rows: list[tuple[float, str, float, int]],
                                                                window: float) -> None:
    _check(rows, policy, window, tmp_path)


class _Greedy:
    """A broken policy: every active job on node 0, whatever it holds."""

    name = "broken"

    def decide(self, state: SimState) -> Decision:
        return Decision({i: np.zeros(int(state.pods[i]), dtype=np.int64) for i in state.active})


def test_the_checks_catch_an_over_committing_policy(tmp_path: Path) -> None:
    rows = [(0.0, TYPES[0], 1000.0, 2), (0.0, TYPES[1], 1000.0, 2)]
    trace = read_csv(_write(tmp_path, rows))
    run = simulate(trace, parse_cluster(CLUSTER), _Greedy(), EngineOptions(window=0.0))
    kinds = {v.split(":")[0].split(" ")[-1] for v in run.violations}
    assert "OverCommitted" in kinds  # the engine's own count and walras.planner.invariants.check_cluster
    assert any("broken at 0.000: OverCommitted: Node/k80-0000" in v for v in run.violations)
