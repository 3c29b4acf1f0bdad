"""The real control plane fixture: RBAC and service-account tokens are enforced, the chart's identity gets exactly
the chart's permissions, kube-scheduler starts with a given configuration, and stopping leaves no process behind."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.controlplane import (
    ControlPlane,
    assets_folder,
    install_chart_identity,
    missing_message,
    session_control_plane,
)
from tests.realtools import require


def test_admin_is_authenticated_and_anonymous_is_not(control_plane: ControlPlane) -> None:
    status, body = control_plane.request("GET", "/readyz")
    assert status == 200, body
    status, _ = control_plane.request("GET", "/api/v1/namespaces", token="not-a-token")
    assert status == 401
    who = json.loads(control_plane.kubectl("auth", "whoami", "-o", "json").stdout)
    assert who["status"]["userInfo"]["username"] == "admin"
    assert "system:masters" in who["status"]["userInfo"]["groups"]


def test_service_account_token_authenticates_and_rbac_denies(control_plane: ControlPlane, namespace: str) -> None:
    control_plane.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    kc = control_plane.service_account_kubeconfig(namespace, "nobody")
    who = json.loads(control_plane.kubectl("auth", "whoami", "-o", "json", kubeconfig=kc).stdout)
    assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:nobody"
    denied = control_plane.kubectl("get", "pods", "-n", namespace, kubeconfig=kc, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
    control_plane.kubectl("create", "role", "pod-reader", "-n", namespace, "--verb=list", "--resource=pods")
    control_plane.kubectl("create", "rolebinding", "nobody-reads", "-n", namespace, "--role=pod-reader",
                          f"--serviceaccount={namespace}:nobody")
    assert control_plane.kubectl("auth", "can-i", "list", "pods", "-n", namespace, kubeconfig=kc,
                                 check=False).stdout.strip() == "yes"


def test_chart_identity_has_the_chart_permissions_and_no_more(control_plane: ControlPlane) -> None:
    kc, objects = install_chart_identity(control_plane, require("helm"), "walras-cp-test")
    assert {o["kind"] for o in objects} >= {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    token = yaml.safe_load(kc.read_text())["users"][0]["user"]["token"]

    def can(verb: str, resource: str, group: str = "", subresource: str = "", namespace: str = "x") -> bool:
        status, body = control_plane.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": verb, "resource": resource, "group": group,
                                            "subresource": subresource, "namespace": namespace}}}, token=token)
        assert status == 201, body
        return bool(body["status"]["allowed"])

    assert can("create", "pods")
    assert can("create", "pods", subresource="binding")
    assert can("patch", "resourcepools", "walras.dev", "status", namespace="")
    assert not can("delete", "nodes", namespace="")
    assert not can("get", "secrets", namespace="kube-system")
    assert not can("update", "pods")


def test_the_default_scheduler_binds_a_pod_to_a_ready_node(control_plane: ControlPlane, namespace: str) -> None:
    node = f"cp-{namespace}"
    control_plane.ready_node(node, {"cp-test": namespace}, {"cpu": "4", "memory": "8Gi", "pods": "10"})
    scheduler = control_plane.start_scheduler()
    try:
        control_plane.kubectl("run", "p", "-n", namespace, "--image=registry.invalid/none", "--overrides",
                              json.dumps({"spec": {"nodeSelector": {"cp-test": namespace}}}))
        control_plane.kubectl("wait", "-n", namespace, "pod/p", "--for=jsonpath={.spec.nodeName}=" + node,
                              "--timeout=30s")
    finally:
        scheduler.stop()
        control_plane.kubectl("delete", "node", node, "--wait=false", check=False)
    assert scheduler.popen.poll() is not None
    # a stopped scheduler is not a dead control plane: the session keeps using this one
    assert control_plane.plane.alive()
    assert session_control_plane(control_plane.kubectl_bin) is control_plane


@pytest.mark.controlplane
def test_stop_leaves_no_process_behind() -> None:
    folder, missing = assets_folder()
    if folder is None or missing:
        if os.environ.get("CI") == "true":
            pytest.fail(missing_message(missing))
        pytest.skip(missing_message(missing))
    with tempfile.TemporaryDirectory(prefix="walras-cp-") as tmp:
        cp = ControlPlane.start(require("kubectl"), Path(tmp), folder)
        pids = [p.popen.pid for p in cp.plane.processes]
        assert len(pids) == 3
        cp.stop()
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
