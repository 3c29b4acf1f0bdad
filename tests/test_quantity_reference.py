"""walras.planner.quantity.parse_quantity against the Kubernetes client's own parser (the reference).

The planner may not import the Kubernetes client (import-linter contract), so it keeps its own parser; this test
checks it against ``kubernetes.utils.parse_quantity`` on generated quantities (every suffix, integers and decimals)
and on malformed strings both must reject. ``docs/design-choices.md`` has the speed comparison (``bench/quantity.py``).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity as reference
from walras.planner.quantity import parse_quantity

SUFFIXES = ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]

mantissas = st.one_of(
    st.integers(min_value=0, max_value=10**9).map(str),
    st.builds(lambda i, f: f"{i}.{f}", st.integers(0, 10**6), st.integers(0, 10**6)),
)


@given(mantissa=mantissas, suffix=st.sampled_from(SUFFIXES))
def test_agrees_with_the_kubernetes_client(mantissa: str, suffix: str) -> None:
    text = mantissa + suffix
    expected = float(reference(text))
    assert parse_quantity(text) == pytest.approx(expected, rel=1e-12, abs=0.0)


@pytest.mark.parametrize("text", ["four", "1.2.3", "5Q", "Gi", "", "0x10", "1ki"])
def test_both_reject_malformed_quantities(text: str) -> None:
    with pytest.raises(ValueError):
        reference(text)
    with pytest.raises(ValueError):
        parse_quantity(text)
