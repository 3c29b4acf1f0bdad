"""Test-run settings shared by ``tests/`` and ``e2e/``.

Hypothesis runs derandomized under ``CI=true`` (profile ``ci``: the same examples on every run, so ``make test`` is
deterministic) and with its default random search elsewhere (profile ``dev``); ``HYPOTHESIS_PROFILE`` overrides. A
failing example is printed with the seed that reproduces it (``print_blob``).
"""

from __future__ import annotations

import os

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
