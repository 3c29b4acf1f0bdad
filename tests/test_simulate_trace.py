"""The trace generator against the statistics of Gavel's generator, derived from its formulas (issue 31), and Gavel's
trace file format.

Gavel (``scheduler/utils.py``): scale factor 1/2/4/8 with probabilities 0.7/0.1/0.15/0.05 (``_generate_scale_factor``:
``r`` uniform, 2 on [0.7, 0.8], 4 on [0.8, 0.95], 8 above); a multi-GPU scale redraws the template until it is a
distributed one (19 of the 26 templates: ResNet-18 x 5, ResNet-50 x 4, Transformer x 5, LM x 5); a duration of
``60 * 10**x`` s, ``x ~ U[1.5, 3]`` with probability 0.8 else ``U[3, 4]`` (``_generate_duration``); inter-arrival
gaps exponential with mean ``lam = 3600 / rate`` (``scheduler.py``, ``_sample_arrival_time_delta``). Every expected
value below is computed from those numbers, not by the generator.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from walras.simulate.trace import generate, read_gavel, write_gavel

N = 20_000
SEED = 11
RATE = 2.5
# Gavel's scale-factor distribution and what follows from it.
P_SCALE = {1: 0.7, 2: 0.8 - 0.7, 4: 0.95 - 0.8, 8: 1.0 - 0.95}
MEAN_GPUS = 1 * 0.7 + 2 * 0.1 + 4 * 0.15 + 8 * 0.05  # 1.9
SD_GPUS = math.sqrt(1 * 0.7 + 4 * 0.1 + 16 * 0.15 + 64 * 0.05 - MEAN_GPUS**2)
SINGLE_ONLY = ("A3C", "CycleGAN", *(f"Recommendation (batch size {b})" for b in (512, 1024, 2048, 4096, 8192)))


def _log10_quantile(q: float) -> float:
    """The q-quantile of log10(duration in minutes): the inverse of the mixture CDF 0.8 U[1.5, 3] + 0.2 U[3, 4]."""
    return 1.5 + 1.5 * q / 0.8 if q <= 0.8 else 3.0 + (q - 0.8) / 0.2


def test_multi_gpu_trace_matches_gavels_formulas() -> None:
    print(f"seed {SEED}, {N} jobs")
    trace = generate(N, RATE, seed=SEED)
    pods = np.array([j.pods for j in trace.jobs])
    # mean accelerators per job: 1.9 (the old generator, which kept 1 GPU for single-only templates, gave ~1.66)
    assert pods.mean() == pytest.approx(MEAN_GPUS, abs=4 * SD_GPUS / math.sqrt(N))
    for scale, p in P_SCALE.items():
        assert np.mean(pods == scale) == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / N)), scale
    # job-type mix: a single-only template is drawn only with scale 1, uniformly among 26: 7 x 0.7 / 26
    single_only = np.mean([j.job_type in SINGLE_ONLY for j in trace.jobs])
    p_single_only = 7 * 0.7 / 26
    assert single_only == pytest.approx(p_single_only, abs=4 * math.sqrt(p_single_only * (1 - p_single_only) / N))
    assert all(j.pods == 1 for j in trace.jobs if j.job_type in SINGLE_ONLY)
    # a distributed template: 0.7 / 26 + 0.3 / 19 each
    resnet18_16 = np.mean([j.job_type == "ResNet-18 (batch size 16)" for j in trace.jobs])
    p_t = 0.7 / 26 + 0.3 / 19
    assert resnet18_16 == pytest.approx(p_t, abs=4 * math.sqrt(p_t * (1 - p_t) / N))
    # durations: minutes on the reference type (work / V100 throughput at the job's scale)
    minutes = np.array([j.work / j.throughput[2] for j in trace.jobs]) / 60.0
    logs = np.log10(minutes)
    assert logs.min() >= 1.5 - 1e-9 and logs.max() <= 4.0 + 1e-9
    for q in (0.1, 0.25, 0.5, 0.75, 0.8, 0.9, 0.99):
        assert np.quantile(logs, q) == pytest.approx(_log10_quantile(q), abs=0.03), q
    assert np.quantile(minutes, 0.5) == pytest.approx(10**2.4375, rel=0.07)  # 273.8 minutes
    assert np.mean(logs > 3.0) == pytest.approx(0.2, abs=4 * math.sqrt(0.16 / N))
    # arrivals: Poisson, gaps exponential with mean lam = 3600 / rate
    arrivals = np.array([j.arrival for j in trace.jobs])
    assert arrivals[0] == 0.0
    gaps = np.diff(arrivals)
    lam = 3600.0 / RATE
    assert gaps.mean() == pytest.approx(lam, rel=4 / math.sqrt(N))
    assert stats.kstest(gaps, "expon", args=(0, lam)).pvalue > 1e-3


def test_single_gpu_trace() -> None:
    trace = generate(5000, RATE, seed=SEED, multi_gpu=False)
    assert {j.pods for j in trace.jobs} == {1}
    counts = np.array([sum(j.job_type == t for j in trace.jobs) for t in sorted({j.job_type for j in trace.jobs})])
    assert counts.size == 26  # every template, uniformly
    assert stats.chisquare(counts).pvalue > 1e-3
    assert "single-GPU" in trace.source


# A line as Gavel's Job.__str__ writes it (``--output_trace_file_name``), with its command fields.
GAVEL_LINES = (
    "ResNet-18 (batch size 16)\tpython3 main.py --data_dir=%s/cifar10 --batch_size 16\timage_classification/cifar10"
    "\t--num_steps\t1\t123456\t2\t1\t-1.000000\t0.000000\n"
    "A3C\tpython3 main.py --env PongDeterministic-v4 --workers 4 --amsgrad True\trl\t--max-steps\t0\t9876\t1\t1"
    "\t-1.000000\t1800.500000\n"
)


def test_gavel_format_read_and_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "gavel.trace"
    path.write_text(GAVEL_LINES)
    trace = read_gavel(path)
    assert [(j.id, j.job_type, j.pods, j.work, j.arrival) for j in trace.jobs] == [
        (0, "ResNet-18 (batch size 16)", 2, 123456.0, 0.0), (1, "A3C", 1, 9876.0, 1800.5)]
    generated = generate(50, 3.0, seed=2)
    out = tmp_path / "ours.trace"
    written = write_gavel(generated, out)
    again = read_gavel(out)
    assert [(j.arrival, j.job_type, j.pods, j.work) for j in again.jobs] == \
        [(j.arrival, j.job_type, j.pods, j.work) for j in written.jobs]
    assert all(abs(a.work - b.work) <= 0.5 for a, b in zip(written.jobs, generated.jobs, strict=True))
    assert all(len(line.split("\t")) == 10 for line in out.read_text().splitlines())
    for text, message in [("x\ty\n", "10 tab-separated fields"),
                          ("A3C\t-\t-\t-\t0\t10\t4\t1\t-1\t0\n", "measured with pods [1]"),
                          ("A3C\t-\t-\t-\t0\tx\t1\t1\t-1\t0\n", "must be integers")]:
        path.write_text(text)
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
            read_gavel(path)
