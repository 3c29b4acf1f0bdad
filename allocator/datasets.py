"""Measured data shipped with Walras, for realistic examples, tests and benchmarks.

Gavel's throughput table (Narayanan et al., OSDI 2020; MIT licence, see ``allocator/data/README.md``): isolated
throughputs of 83 deep-learning job types on K80, P100 and V100 GPUs, and pairwise space-sharing throughputs of the 26
single-GPU job types. The file is a compact derived copy inside the package; nothing outside the package is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

GAVEL_GPU_TYPES: tuple[str, ...] = ("k80", "p100", "v100")


@dataclass(frozen=True)
class GavelThroughputs:
    """Isolated throughputs: ``throughput[i, g]`` is job type i's iterations/s alone on GPU type ``gpu_types[g]``.

    ``scale_factors[i]`` is the number of GPUs one job of type i uses (its demand per replica, 004 Sec. 7.1).
    Entries Gavel did not measure are NaN; a measured 0 means the type does not run on that GPU.
    """

    job_types: list[str]
    models: list[str]
    batch_sizes: np.ndarray
    scale_factors: np.ndarray
    gpu_types: list[str]
    throughput: np.ndarray


@dataclass(frozen=True)
class GavelColocation:
    """Space-sharing throughputs on one GPU type for the single-GPU job types.

    ``isolated[t]`` is type t's throughput alone; ``paired[t, u]`` its throughput while sharing the GPU with type u
    (NaN where Gavel has no measurement). The slowdown of t next to u is ``1 - paired[t, u] / isolated[t]``.
    """

    gpu: str
    job_types: list[str]
    isolated: np.ndarray
    paired: np.ndarray


@lru_cache(maxsize=1)
def _raw() -> dict[str, Any]:
    text = resources.files("allocator").joinpath("data/gavel.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def _array(rows: Any) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=np.float64)


def gavel_throughputs() -> GavelThroughputs:
    """Load the 83 x 3 isolated-throughput matrix (rows: job types, columns: K80, P100, V100)."""
    raw = _raw()
    jobs = raw["job_types"]
    return GavelThroughputs(
        job_types=[j["name"] for j in jobs],
        models=[j["model"] for j in jobs],
        batch_sizes=np.array([j["batch_size"] or 0 for j in jobs], dtype=np.int64),
        scale_factors=np.array([j["scale_factor"] for j in jobs], dtype=np.int64),
        gpu_types=list(raw["gpu_types"]),
        throughput=_array(raw["throughput"]),
    )


def gavel_colocation(gpu: str = "v100") -> GavelColocation:
    """Load the pairwise space-sharing throughputs of the single-GPU job types on ``gpu`` (k80, p100 or v100)."""
    raw = _raw()
    if gpu not in raw["gpu_types"]:
        raise ValueError(f"gpu must be one of {raw['gpu_types']}, got {gpu!r}")
    index = raw["colocation"]["job_types"]
    column = raw["gpu_types"].index(gpu)
    isolated = _array(raw["throughput"])[index, column]
    return GavelColocation(
        gpu=gpu,
        job_types=[raw["job_types"][i]["name"] for i in index],
        isolated=isolated,
        paired=_array(raw["colocation"]["paired"][gpu]),
    )
