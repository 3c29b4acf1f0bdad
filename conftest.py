"""Test-run settings shared by ``tests/`` and ``e2e/``.

Hypothesis runs derandomized under ``CI=true`` (profile ``ci``: the same examples on every run, so ``make test`` is
deterministic) and with its default random search elsewhere (profile ``dev``); ``HYPOTHESIS_PROFILE`` overrides. A
failing example is printed with the seed that reproduces it (``print_blob``).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    print_blob=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", print_blob=True, deadline=None)

# The one-line notice that numba kernels are being compiled (allocator._aot.notice) is for people: in a fresh clone
# every kernel is uncached, and the line would land in whichever test's captured stderr first imports one.
# tests/test_compile_notice.py removes the variable for the processes it checks.
os.environ.setdefault("WALRAS_COMPILE_NOTICE", "0")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "dev"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "controlplane: runs against a real kube-apiserver (counted in the run's control-plane summary)"
    )
    _TALLY.clear()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test`` runs ``-n 2 --dist loadgroup``), every test that uses the session's real
    control plane (the ``control_plane`` fixture, directly or through another fixture, and every e2e scenario, which
    asks for it at run time) goes to one worker, so the run starts one control plane, not one per worker; the other
    tests spread over the workers. Those tests, and the ones marked ``controlplane`` that start a control plane of
    their own, are counted in the summary at the end of the run (:func:`pytest_terminal_summary`)."""
    root = config.rootpath / "e2e"
    real_e2e = bool(os.environ.get("KUBEBUILDER_ASSETS"))  # without the binaries e2e/ runs on the emulator
    for item in items:
        if "control_plane" in getattr(item, "fixturenames", ()) or root in item.path.parents:
            item.add_marker(pytest.mark.xdist_group("controlplane"))
            if root not in item.path.parents or real_e2e:
                item.add_marker(pytest.mark.controlplane)


class _RealPlaneTally:
    """Outcomes and wall-clock seconds (set-up + call + tear-down) of the tests marked ``controlplane``; fed by the
    reports that reach the main process (also from pytest-xdist workers)."""

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}
        self.seconds = 0.0

    def clear(self) -> None:
        self.outcomes.clear()
        self.seconds = 0.0

    def add(self, report: pytest.TestReport) -> None:
        if "controlplane" not in report.keywords:
            return
        self.seconds += report.duration
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.outcomes[report.outcome] = self.outcomes.get(report.outcome, 0) + 1
        elif report.when == "teardown" and report.failed:
            self.outcomes["error"] = self.outcomes.get("error", 0) + 1


_TALLY = _RealPlaneTally()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _TALLY.add(report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    """One line: how many tests ran against a real kube-apiserver and the time they took (issue 17's evidence)."""
    tally = _TALLY
    if not tally.outcomes:
        return
    counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(tally.outcomes.items()))
    terminalreporter.write_line(
        f"real control plane: {sum(tally.outcomes.values())} tests ({counts}), {tally.seconds:.1f} s of test time"
    )
