"""Wheel tagging only (everything else is in pyproject.toml): a wheel that carries the ahead-of-time kernels
(``_kernels_aot*.so`` of ``allocator/pricing/_compiled``, ``allocator/degree``, ``allocator/colocation`` and
``allocator/fairness``, built by ``make wheel``) is tagged for this interpreter and platform
(``cp311-cp311-linux_x86_64``); without them it stays ``py3-none-any`` and the kernels are compiled just in time on
first use."""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent
AOT = (
    "allocator/pricing/_compiled/_kernels_aot*.so",
    "allocator/degree/_kernels_aot*.so",
    "allocator/colocation/_kernels_aot*.so",
    "allocator/fairness/_kernels_aot*.so",
)


def has_aot_kernels() -> bool:
    """Whether every ahead-of-time extension module (:data:`AOT`) is in the source tree."""
    return all(any(ROOT.glob(pattern)) for pattern in AOT)


class KernelDistribution(Distribution):
    """A distribution that counts as binary (a platform wheel) when it carries the ahead-of-time kernels."""

    def has_ext_modules(self) -> bool:
        return has_aot_kernels()


setup(distclass=KernelDistribution)
