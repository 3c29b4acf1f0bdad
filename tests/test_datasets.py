"""The shipped Gavel copy: shapes, and values checked against the published table (Gavel, OSDI 2020)."""

import numpy as np
import pytest

from allocator.datasets import gavel_colocation, gavel_throughputs


def test_throughput_table_shape_and_known_entries() -> None:
    t = gavel_throughputs()
    assert t.throughput.shape == (83, 3)
    assert t.gpu_types == ["k80", "p100", "v100"]
    assert sorted(set(t.scale_factors.tolist())) == [1, 2, 4, 8]
    i = t.job_types.index("ResNet-18 (batch size 16)")
    # Values of Gavel's simulation_throughputs.json (k80 / v100 "null" entries), rounded to 6 significant digits.
    assert t.throughput[i, 0] == pytest.approx(4.795294551566172, rel=1e-5)
    assert t.throughput[i, 2] == pytest.approx(32.353384328946916, rel=1e-5)
    assert t.models[i] == "ResNet-18" and t.batch_sizes[i] == 16
    finite = t.throughput[np.isfinite(t.throughput)]
    assert (finite >= 0).all()


def test_colocation_pairs() -> None:
    c = gavel_colocation("k80")
    assert c.paired.shape == (26, 26) and c.isolated.shape == (26,)
    a = c.job_types.index("ResNet-18 (batch size 16)")
    b = c.job_types.index("ResNet-18 (batch size 32)")
    assert c.paired[a, b] == pytest.approx(2.539979567443098, rel=1e-5)
    assert c.paired[a, a] == pytest.approx(2.4081728540044867, rel=1e-5)
    with pytest.raises(ValueError, match="gpu must be one of"):
        gavel_colocation("a100")
