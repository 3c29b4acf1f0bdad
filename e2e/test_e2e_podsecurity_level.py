"""End to end, an invalid Pod Security level (issue 30, docs/security.md): the real ``walras run`` (direct mode)
against the real control plane (kubelet stand-in). A namespace whose ``pod-security.kubernetes.io/enforce`` label is
``bogus`` (written through the namespace's ``status`` sub-resource: kube-apiserver refuses it on create and update)
is ``restricted`` to kube-apiserver's Pod Security admission, and to Walras: a job whose template is a plain
container (``baseline`` admits it, ``restricted`` does not) gets ``PodSecurity=False`` (``PodSecurityRefused``,
naming ``restricted:latest`` and the label) and no pod, without a single create refused by the API server (no
``AdmissionRefused`` Event); a restricted-clean job's pods run, and it gets ``PodSecurity=True`` (reason
``InvalidEnforceLevel``). Before, Walras read the label as ``privileged`` and the plain job's creations were refused
with 403 and retried. The shared invariants hold at the end."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.conftest import Cluster, Operator, check, wait_until
from e2e.invariants import violations

pytestmark = pytest.mark.e2e
NS = "e2e-bad-level"
ENFORCE = "pod-security.kubernetes.io/enforce"
CLEAN = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
         "containers": [{"name": "c", "image": "registry.invalid/x:1",
                         "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}
PLAIN = {"containers": [{"name": "c", "image": "registry.invalid/x:1"}]}


def _job(name: str, spec: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": "walras.dev/v1alpha1", "kind": "FungibleJob",
                       "metadata": {"name": name, "namespace": NS},
                       "spec": {"throughput": {"e2e-v100": 1.0}, "utility": {"type": "linear"}, "demand": 1,
                                "replicas": {"count": 2}, "template": {"spec": spec}}})


@pytest.fixture(scope="module")
def setup(cluster: Cluster) -> Iterator[Cluster]:
    if not cluster.real:
        pytest.skip("Pod Security admission needs the real kube-apiserver")
    cp = cluster.control_plane
    assert cp is not None
    status, body = cp.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                             "metadata": {"name": NS}})
    assert status in (201, 409), body
    _, body = cp.request("GET", f"/api/v1/namespaces/{NS}")
    body["metadata"]["labels"] = {**body["metadata"].get("labels", {}), ENFORCE: "bogus"}
    status, refused = cp.request("PUT", f"/api/v1/namespaces/{NS}", body)
    assert status == 422, (status, refused)  # the label is refused on an update...
    status, written = cp.request("PUT", f"/api/v1/namespaces/{NS}/status", body)
    assert status == 200 and written["metadata"]["labels"][ENFORCE] == "bogus", (status, written)  # ...not here
    try:
        yield cluster
    finally:
        for name in [i["metadata"]["name"] for i in cluster.get("fungiblejobs", "-n", NS)["items"]]:
            cluster.kc("patch", "fungiblejob", name, "-n", NS, "--type=merge", "-p",
                       '{"metadata":{"finalizers":null}}', check=False)
            cluster.kc("delete", "fungiblejob", name, "-n", NS, "--wait=false", check=False)
        cluster.kc("delete", "pods", "--all", "-n", NS, "--grace-period=0", "--force", check=False)
        cluster.kc("delete", "namespace", NS, "--wait=false", check=False)


def _condition(cluster: Cluster, job: str) -> dict[str, Any] | None:
    status = cluster.get("fungiblejob", job, "-n", NS).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == "PodSecurity"), None)


def _events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.get("events", "-n", NS)["items"] if e["reason"] == reason]


def test_an_invalid_level_is_restricted_for_walras_as_for_the_api_server(setup: Cluster) -> None:
    cluster = setup
    # what the API server does with the label: restricted (a server-side dry run of each template)
    plain = cluster.kc("run", "probe", "-n", NS, "--image=registry.invalid/x:1", "--dry-run=server", check=False)
    assert plain.returncode != 0 and 'violates PodSecurity "restricted:latest"' in plain.stderr, plain.stderr
    op = Operator(cluster, "direct").start()
    try:
        cluster.apply_text("\n---\n".join([_job("clean", CLEAN), _job("plain", PLAIN)]))
        started = time.monotonic()
        try:
            wait_until(lambda: check(sum(1 for p in cluster.pods(NS, "walras.dev/job=clean")
                                         if p["status"].get("phase") == "Running"), lambda n: n == 2), 90,
                       "clean's 2 pods Running")
            refused = wait_until(lambda: check(_condition(cluster, "plain"), lambda c: c is not None), 60,
                                 "plain's PodSecurity condition")
            admitted = wait_until(lambda: check(_condition(cluster, "clean"), lambda c: c is not None), 60,
                                  "clean's PodSecurity condition")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{op.output()[-4000:]}") from None
        while time.monotonic() - started < 20:  # > 6 plan periods: a 403 loop would show meanwhile
            time.sleep(1)
        assert (refused["status"], refused["reason"]) == ("False", "PodSecurityRefused"), refused
        assert '"restricted:latest"' in refused["message"] and "'bogus'" in refused["message"], refused
        assert (admitted["status"], admitted["reason"]) == ("True", "InvalidEnforceLevel"), admitted
        assert "'bogus'" in admitted["message"] and 'meets "restricted:latest"' in admitted["message"], admitted
        warnings = _events(cluster, "PodSecurityRefused")
        assert [e["involvedObject"]["name"] for e in warnings] == ["plain"], warnings
        assert _events(cluster, "AdmissionRefused") == []  # the API server was never asked to create plain's pods
        assert cluster.pods(NS, "walras.dev/job=plain") == []
        print(f"live: clean Running 2 ({admitted['reason']}), plain 0 pods ({refused['reason']}), "
              f"AdmissionRefused events 0, PodSecurityRefused events {len(warnings)}")
        assert violations(cluster) == []
        assert "Traceback" not in op.output()
    finally:
        op.stop()
