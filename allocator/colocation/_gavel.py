"""Interference matrices from Gavel's measured GPU space-sharing throughputs, in the orientation of paper 001."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# ----------------------------------------------------------------------------------------------------------------
# Measured interference (Gavel)
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GavelInterference:
    """An interference matrix derived from Gavel's space-sharing measurements.

    ``alpha[u, t]`` (paper orientation: influencer ``u``, victim ``t``) is the measured slowdown of class ``t`` while
    it shares a GPU with class ``u``: ``1 - paired[t, u] / isolated[t]``, clipped to ``[0, 1]``, averaged over the
    job types of each class. ``missing`` counts the (type, type) pairs that had no measurement.
    """

    names: list[str]
    alpha: np.ndarray
    members: list[list[str]]
    missing: int


def _model_family(job_type: str) -> str:
    return job_type.split(" (batch size", 1)[0].strip()


def gavel_alpha(data: Any = None, *, gpu: str = "v100", classes: str = "model", nan: str = "max") -> GavelInterference:
    """Asymmetric interference matrix from Gavel's measured pairwise throughputs (``allocator.datasets``).

    Mapping: with one unit-size task per job, eq. (1) gives a job of class ``t`` the cost
    ``alpha[t, t] + sum_{u != me on its GPU} alpha[u, t]``, so ``alpha[u, t]`` must be the slowdown that a ``u``
    inflicts on a ``t``: ``alpha = slowdown.T`` with ``slowdown[t, u] = 1 - paired[t, u] / isolated[t]``. The
    self-term ``alpha[t, t] p_t`` is the same for every partition, so minimising eq. (1) minimises the total modelled
    slowdown. Slowdowns are clipped to ``[0, 1]`` (a pair running faster than alone is noise). ``classes="model"``
    averages over the batch sizes of each model family (ResNet-18, LM, ...); ``"job"`` keeps the 26 job types.
    Unmeasured pairs (NaN): ``nan="max"`` assumes the worst measured slowdown (conservative: unknown pairs are
    avoided), ``"mean"`` the mean measured slowdown.
    """
    if data is None:
        from allocator.datasets import gavel_colocation

        data = gavel_colocation(gpu)
    iso = np.asarray(data.isolated, dtype=np.float64)
    paired = np.asarray(data.paired, dtype=np.float64)
    if nan not in ("max", "mean"):
        raise ValueError(f"nan must be 'max' or 'mean', got {nan!r}")
    with np.errstate(divide="ignore", invalid="ignore"):
        slow = 1.0 - paired / iso[:, None]
    slow[~np.isfinite(iso) | (iso <= 0), :] = np.nan
    missing = int(np.isnan(slow).sum())
    measured = slow[~np.isnan(slow)]
    fill = (
        (float(np.clip(measured, 0, 1).max()) if nan == "max" else float(np.clip(measured, 0, 1).mean()))
        if (measured.size)
        else 1.0
    )
    slow = np.clip(np.where(np.isnan(slow), fill, slow), 0.0, 1.0)
    jobs = list(data.job_types)
    if classes == "job":
        names, members = jobs, [[j] for j in jobs]
        cls_slow = slow
    elif classes == "model":
        names = []
        for j in jobs:
            fam = _model_family(j)
            if fam not in names:
                names.append(fam)
        idx = np.array([names.index(_model_family(j)) for j in jobs])
        members = [[j for j, c in zip(jobs, idx) if c == k] for k in range(len(names))]
        K = len(names)
        onehot = np.zeros((len(jobs), K))
        onehot[np.arange(len(jobs)), idx] = 1.0
        sizes = onehot.sum(axis=0)
        cls_slow = (onehot.T @ slow @ onehot) / np.outer(sizes, sizes)
    else:
        raise ValueError(f"classes must be 'model' or 'job', got {classes!r}")
    return GavelInterference(names=names, alpha=np.ascontiguousarray(cls_slow.T), members=members, missing=missing)
