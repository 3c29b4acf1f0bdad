"""Traces of jobs for the simulator: generated as Gavel generates them, or read from a CSV file or a Gavel trace.

A job has an arrival time (seconds from the start of the trace), a job type of Gavel's measured table
(:func:`allocator.datasets.gavel_throughputs`; Narayanan et al., OSDI 2020), a number of pods (Gavel's scale factor:
one accelerator per pod) and an amount of work (iterations). Its throughput on accelerator type ``j`` with all its
pods is the table's measurement for that type and scale factor.

The generator follows Gavel's simulator (``scheduler/utils.py``: ``generate_job``, ``_generate_scale_factor``,
``_generate_duration``; ``scheduler.py``: ``_sample_arrival_time_delta``):

* arrivals: a Poisson process, inter-arrival gaps exponential with mean ``lam = 3600 / rate`` seconds, the first job
  at time 0;
* scale factor (multi-GPU trace): 1, 2, 4 or 8 with probabilities 0.7, 0.1, 0.15, 0.05 (its "Philly" distribution;
  mean ``0.7 + 0.2 + 0.6 + 0.4 = 1.9`` accelerators per job); the single-GPU trace (``multi_gpu=False``): always 1;
* template: uniform over the 26 templates of Gavel's job table (ResNet-18 x 5 batch sizes, ResNet-50 x 4,
  Transformer x 5, LM x 5, Recommendation x 5, A3C, CycleGAN) for a scale factor of 1; for a larger one, Gavel draws
  templates until it gets a distributed one, which is a uniform draw over the 19 distributed templates (ResNet-18,
  ResNet-50, Transformer, LM: exactly the rows of the table measured with several GPUs);
* duration: ``60 * 10**x`` seconds with ``x`` uniform in [1.5, 3] with probability 0.8, else uniform in [3, 4];
* work: the duration x the job's throughput on the reference type (V100) with its scale factor, so that the duration
  is what the job takes alone on V100s.

CSV files have a header with the columns ``arrival,job_type,work,pods`` (any order, extra columns ignored):
``arrival`` in seconds, ``job_type`` a name of the table (``ResNet-18 (batch size 16)``), ``work`` in iterations,
``pods`` the scale factor (a row of the table must exist for that name and scale factor).

Gavel's trace files (:func:`read_gavel`, :func:`write_gavel`; what ``utils.parse_trace`` reads and
``--output_trace_file_name`` writes): one job per line, ten tab-separated fields ``job_type, command,
working_directory, num_steps_arg, needs_data_dir, total_steps, scale_factor, priority_weight, SLO, arrival_time``
(arrival in seconds, ``total_steps`` the work in iterations, an integer). The same file then runs in both engines.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from allocator.datasets import GAVEL_GPU_TYPES, gavel_throughputs

#: Scale factors of Gavel's generator and their probabilities.
SCALE_FACTORS = (1, 2, 4, 8)
SCALE_PROBABILITIES = (0.7, 0.1, 0.15, 0.05)
REFERENCE_TYPE = "v100"
COLUMNS = ("arrival", "job_type", "work", "pods")


@dataclass(frozen=True)
class TraceJob:
    """One job: ``throughput[j]`` (iterations/s with all ``pods`` pods on type ``Trace.types[j]``; 0 where it does
    not run)."""

    id: int
    arrival: float
    job_type: str
    pods: int
    work: float
    throughput: tuple[float, ...]


@dataclass(frozen=True)
class Trace:
    """Jobs in arrival order (ties by id), the accelerator types their throughputs refer to, and where they came
    from."""

    jobs: tuple[TraceJob, ...]
    types: tuple[str, ...]
    source: str

    def throughput_matrix(self, types: tuple[str, ...]) -> np.ndarray:
        """(n, m) throughput of every job on each of ``types`` (0 for a type the trace has no measurement of)."""
        cols = [self.types.index(t) if t in self.types else -1 for t in types]
        raw = np.array([job.throughput for job in self.jobs], dtype=np.float64).reshape(len(self.jobs), -1)
        out = np.zeros((len(self.jobs), len(types)))
        for j, c in enumerate(cols):
            if c >= 0:
                out[:, j] = raw[:, c]
        return out


def _table() -> tuple[dict[tuple[str, int], np.ndarray], list[str]]:
    """``(job type name, scale factor) -> throughput row`` for every fully measured row, and the single-GPU names."""
    table = gavel_throughputs()
    rows: dict[tuple[str, int], np.ndarray] = {}
    singles: list[str] = []
    for i, name in enumerate(table.job_types):
        row = table.throughput[i]
        if not np.all(np.isfinite(row)) or not np.any(row > 0):
            continue
        scale = int(table.scale_factors[i])
        rows[(name, scale)] = np.maximum(row, 0.0)
        if scale == 1:
            singles.append(name)
    return rows, singles


#: Gavel's durations: (low, high, probability) of the exponent x of a duration of 10**x minutes.
GAVEL_DURATIONS: tuple[tuple[float, float, float], ...] = ((1.5, 3.0, 0.8), (3.0, 4.0, 0.2))


#: command, working_directory, num_steps_arg, needs_data_dir of a written Gavel trace line (its simulator reads none).
_GAVEL_FIELDS = "-\t-\t-\t0"


def _draw_component(rng: np.random.Generator, probabilities: np.ndarray) -> int:
    """Index of the mixture component a uniform draw falls in (cumulative probabilities)."""
    return int(np.searchsorted(np.cumsum(probabilities), rng.uniform(), side="right").clip(0, len(probabilities) - 1))


def generate(n_jobs: int, rate: float, seed: int = 0,
             durations: tuple[tuple[float, float, float], ...] = GAVEL_DURATIONS,
             multi_gpu: bool = True) -> Trace:
    """``n_jobs`` jobs as Gavel's generator draws them (module docstring), arrivals Poisson at ``rate`` jobs/hour
    (mean gap ``lam = 3600 / rate`` s), the first at time 0; deterministic in ``seed``. ``multi_gpu``: Gavel's
    multi-GPU trace (its ``-m``: scale factors 1/2/4/8), else its single-GPU trace. ``durations``: the mixture of
    ``(low, high, probability)`` ranges of the exponent x of a duration of ``10**x`` minutes (Gavel's by default;
    the shipped small trace uses shorter ones so that a test runs it in seconds)."""
    probabilities = np.array([p for _, _, p in durations], dtype=np.float64)
    if not durations or np.any(probabilities < 0) or abs(float(probabilities.sum()) - 1.0) > 1e-9:
        raise ValueError("durations must be (low, high, probability) ranges whose probabilities sum to 1")
    if n_jobs < 0:
        raise ValueError(f"the number of jobs must be >= 0, got {n_jobs}")
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"the arrival rate must be a positive number of jobs per hour, got {rate}")
    rows, singles = _table()
    templates = {s: [name for name in singles if (name, s) in rows] for s in SCALE_FACTORS}
    scale_p = np.array(SCALE_PROBABILITIES)
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(3600.0 / rate, size=n_jobs)
    arrivals = np.concatenate([[0.0], np.cumsum(gaps[1:])]) if n_jobs else np.zeros(0)
    ref = GAVEL_GPU_TYPES.index(REFERENCE_TYPE)
    jobs = []
    for k in range(n_jobs):
        scale = SCALE_FACTORS[_draw_component(rng, scale_p)] if multi_gpu else 1
        low, high, _ = durations[_draw_component(rng, probabilities)]
        duration = 60.0 * 10.0 ** rng.uniform(low, high)
        choices = templates[scale]
        name = choices[int(rng.integers(len(choices)))]
        row = rows[(name, scale)]
        jobs.append(TraceJob(k, float(arrivals[k]), name, scale, float(duration * row[ref]),
                             tuple(float(v) for v in row)))
    kind = "multi-GPU" if multi_gpu else "single-GPU"
    return Trace(tuple(jobs), GAVEL_GPU_TYPES, f"generated ({kind}): {n_jobs} jobs, {rate:g} jobs/hour, seed {seed}")


def _job(where: str, rows: dict[tuple[str, int], np.ndarray], k: int, arrival: float, name: str, pods: int,
         work: float) -> TraceJob:
    """A checked trace job (``ValueError`` naming ``where`` and what is wrong)."""
    if not (math.isfinite(arrival) and arrival >= 0):
        raise ValueError(f"{where}: arrival must be >= 0 seconds, got {arrival}")
    if not (math.isfinite(work) and work > 0):
        raise ValueError(f"{where}: work must be > 0, got {work}")
    row = rows.get((name, pods))
    if row is None:
        known = sorted(s for n, s in rows if n == name)
        hint = f"measured with pods {known}" if known else "not a job type of Gavel's table"
        raise ValueError(f"{where}: job type {name!r} with {pods} pod(s): {hint}")
    return TraceJob(k, arrival, name, pods, work, tuple(float(v) for v in row))


def _ordered(jobs: list[TraceJob], source: str) -> Trace:
    order = sorted(jobs, key=lambda j: (j.arrival, j.id))
    renumbered = tuple(TraceJob(k, j.arrival, j.job_type, j.pods, j.work, j.throughput) for k, j in enumerate(order))
    return Trace(renumbered, GAVEL_GPU_TYPES, source)


def read_gavel(path: str | Path) -> Trace:
    """Read a trace file of Gavel's (module docstring: ten tab-separated fields per line); jobs renumbered in
    arrival order (Gavel's ids for a file it replays); ``ValueError`` names the line and what is wrong."""
    rows, _ = _table()
    jobs: list[TraceJob] = []
    with open(path) as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            where = f"{path}:{line}"
            fields = text.rstrip("\n").split("\t")
            if len(fields) != 10:
                raise ValueError(f"{where}: a Gavel trace line has 10 tab-separated fields, got {len(fields)}")
            try:
                work = float(int(fields[5]))
                pods = int(fields[6])
                arrival = float(fields[9])
            except ValueError:
                raise ValueError(f"{where}: total_steps and scale_factor must be integers, arrival_time a "
                                 "number") from None
            jobs.append(_job(where, rows, len(jobs), arrival, fields[0].strip(), pods, work))
    return _ordered(jobs, str(path))


def write_gavel(trace: Trace, path: str | Path) -> Trace:
    """Write ``trace`` as a Gavel trace file (module docstring) and return the trace that file holds: Gavel's
    ``total_steps`` is an integer, so work is rounded (to at least 1 iteration); arrivals keep full precision.
    The command and directory fields, which Gavel's simulator does not read, are ``-``; priority 1, no SLO."""
    written = []
    with open(path, "w") as handle:
        for job in trace.jobs:
            steps = max(1, round(job.work))
            handle.write(f"{job.job_type}\t{_GAVEL_FIELDS}\t{steps}\t{job.pods}\t1\t-1\t{job.arrival!r}\n")
            written.append(TraceJob(job.id, job.arrival, job.job_type, job.pods, float(steps), job.throughput))
    return Trace(tuple(written), trace.types, str(path))


def read_csv(path: str | Path) -> Trace:
    """Read a trace from a CSV file (module docstring); ``ValueError`` names the line and what is wrong."""
    rows, _ = _table()
    jobs: list[TraceJob] = []
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: the header lacks column(s) {', '.join(missing)} "
                             f"(expected {','.join(COLUMNS)})")
        for line, record in enumerate(reader, start=2):
            where = f"{path}:{line}"
            try:
                arrival = float(record["arrival"])
                work = float(record["work"])
                pods = int(record["pods"])
            except (TypeError, ValueError):
                raise ValueError(f"{where}: arrival and work must be numbers and pods an integer") from None
            jobs.append(_job(where, rows, len(jobs), arrival, (record["job_type"] or "").strip(), pods, work))
    return _ordered(jobs, str(path))


def write_csv(trace: Trace, path: str | Path) -> None:
    """Write ``trace`` in the CSV format :func:`read_csv` reads (work and arrival with full precision)."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for job in trace.jobs:
            writer.writerow([repr(job.arrival), job.job_type, repr(job.work), job.pods])
