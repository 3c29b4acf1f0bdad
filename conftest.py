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
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "dev"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test`` runs ``-n 2 --dist loadgroup``), every test that uses the session's real
    control plane (the ``control_plane`` fixture, directly or through another fixture, and every e2e scenario, which
    asks for it at run time) goes to one worker, so the run starts one control plane, not one per worker; the other
    tests spread over the workers."""
    root = config.rootpath / "e2e"
    for item in items:
        if "control_plane" in getattr(item, "fixturenames", ()) or root in item.path.parents:
            item.add_marker(pytest.mark.xdist_group("controlplane"))
