"""What every benchmark page says about the machine it ran on (shared by the ``bench.*`` modules)."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as _md
import os
import platform
from pathlib import Path

__all__ = ["cpu_model", "machine_line", "now_utc", "version"]


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def version(package: str) -> str:
    """The installed version of ``package``, or ``absent``."""
    try:
        return _md.version(package)
    except _md.PackageNotFoundError:
        return "absent"


def now_utc() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def machine_line(*packages: str) -> str:
    """``os.cpu_count()``, CPU model, Python and the versions of numpy, torch and ``packages``, on one line."""
    names = ("numpy", "torch", *packages)
    versions = ", ".join(f"{p} {version(p)}" for p in names)
    return f"`os.cpu_count()` = {os.cpu_count()}, CPU: {cpu_model()}, Python {platform.python_version()}, {versions}"
