"""The real external tools some tests run (helm, kubectl, prometheus, promtool, openssl), found the same way.

A tool is looked up in ``.tools/bin`` (where ``make tools`` puts kubectl and helm) and then on ``PATH`` (Debian
packages from ``make system``). A missing tool fails the test under ``CI=true`` and skips it elsewhere.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: How each tool gets installed, for the failure message.
INSTALLED_BY = {
    "helm": "make tools / scripts/install_k8s_tools.sh",
    "kubectl": "make tools / scripts/install_k8s_tools.sh",
    "prometheus": "make system / scripts/install_system_packages.sh",
    "promtool": "make system / scripts/install_system_packages.sh",
    "openssl": "make system / scripts/install_system_packages.sh",
}


def require(name: str) -> str:
    """Path of the real tool ``name``; fails under ``CI=true`` and skips elsewhere when it is missing."""
    local = ROOT / ".tools" / "bin" / name
    found = str(local) if local.is_file() and os.access(local, os.X_OK) else shutil.which(name)
    if found is None:
        message = f"{name} is not installed ({INSTALLED_BY.get(name, 'see README.md, Development')})"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found
