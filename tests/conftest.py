"""Fixtures for tests that need a real Kubernetes control plane (also imported by ``e2e/conftest.py``).

``control_plane`` (session scope) starts etcd, kube-apiserver and kube-controller-manager once per test run (see
:mod:`tests.controlplane`); ``namespace`` (function scope) gives each test a fresh namespace whose ``default``
ServiceAccount exists. When the binaries are missing the tests that use them are skipped with a message saying how to
get them, and FAIL under ``CI=true``.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.controlplane import ControlPlane, session_control_plane, stop_session_control_plane
from tests.realtools import require


@pytest.fixture(scope="session", name="control_plane")
def control_plane() -> Iterator[ControlPlane]:
    """The session's real control plane (admin kubeconfig, server, token, CA file, folder, kubectl)."""
    kubectl = require("kubectl")
    try:
        cp = session_control_plane(kubectl)
    except FileNotFoundError as err:
        if os.environ.get("CI") == "true":
            pytest.fail(str(err))
        pytest.skip(str(err))
    yield cp
    stop_session_control_plane()


@pytest.fixture(name="namespace")
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace (``t-<hex>``) with its ``default`` ServiceAccount; deleted after the test."""
    name = f"t-{secrets.token_hex(4)}"
    control_plane.kubectl("create", "namespace", name)
    deadline = time.monotonic() + 30
    while control_plane.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] != 200:
        if time.monotonic() > deadline:
            raise AssertionError(f"namespace {name}: no default ServiceAccount after 30 s")
        time.sleep(0.1)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session", name="cluster_dir")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded example cluster (emulated nodes, pools, jobs, profile) as one manifest file (`walras plan -f`)."""
    from walras.manifests import examples

    out = tmp_path_factory.mktemp("cluster")
    (out / "cluster.yaml").write_text(yaml.safe_dump_all(examples.documents()))
    return out
