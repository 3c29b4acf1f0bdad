"""End to end, refused pods (issue 30 item 5, docs/refusals.md): the real ``walras run`` (direct mode) against the
real control plane (kubelet stand-in). In a namespace where a ValidatingAdmissionPolicy (CEL, in-process admission of
kube-apiserver) denies every pod creation, a job's pods are refused by the API server: the job gets a Warning Event
``AdmissionRefused`` and the condition with the API server's message, creations are retried with backoff (counted
over 30 s), and the capacity it would have held goes to another namespace's job, whose pods run. In a namespace
with a ResourceQuota of 1 GPU, a 3-replica job gets one pod and the condition ``QuotaLimited``, and the API server
refuses nothing (the plan never asks for more than the quota admits). The shared invariants hold at the end.

(A Pod Security level is not the refusal used here: Walras checks the namespace's level itself before creating a pod,
docs/security.md, so such a job never reaches the API server; tests/test_pod_security.py covers that live.)"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.conftest import Cluster, Operator, check, wait_until
from e2e.invariants import violations

pytestmark = pytest.mark.e2e
OPEN, LOCKED, QUOTA = "e2e", "e2e-restricted", "e2e-quota"
POLICY = "e2e-refuse-pods"
REFUSED = "pods are refused in this namespace by the e2e admission policy"


def _job(name: str, namespace: str, replicas: int, weight: float) -> str:
    return json.dumps({"apiVersion": "walras.dev/v1alpha1", "kind": "FungibleJob",
                       "metadata": {"name": name, "namespace": namespace},
                       "spec": {"throughput": {"e2e-v100": 1.0}, "utility": {"type": "linear", "weight": weight},
                                "demand": 1, "replicas": {"count": replicas},
                                "template": {"spec": {"containers": [{"name": "c",
                                                                      "image": "registry.invalid/x:1"}]}}}})


@pytest.fixture(scope="module")
def setup(cluster: Cluster) -> Iterator[Cluster]:
    if not cluster.real:
        pytest.skip("Pod Security and ResourceQuota admission need the real kube-apiserver")
    for ns in (LOCKED, QUOTA):
        cluster.kc("create", "namespace", ns, check=False)
    cluster.kc("label", "namespace", LOCKED, "walras-e2e/refuse-pods=true", "--overwrite")
    policy = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
              "metadata": {"name": POLICY},
              "spec": {"failurePolicy": "Fail",
                       "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                               "operations": ["CREATE"], "resources": ["pods"]}]},
                       "validations": [{"expression": "false", "message": REFUSED}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": POLICY},
               "spec": {"policyName": POLICY, "validationActions": ["Deny"],
                        "matchResources": {"namespaceSelector": {"matchLabels": {"walras-e2e/refuse-pods": "true"}}}}}
    cluster.apply_text("\n---\n".join([json.dumps(policy), json.dumps(binding)]))

    def refuses() -> bool:  # the policy is in force once a server-side dry run is denied with its message
        probe = cluster.kc("run", "probe", "-n", LOCKED, "--image=registry.invalid/x:1", "--dry-run=server",
                           check=False)
        return probe.returncode != 0 and REFUSED in probe.stderr

    wait_until(refuses, 60, "the admission policy in force")
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "one-gpu", "namespace": QUOTA},
             "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}}
    cluster.apply_text("\n---\n".join([json.dumps(quota), _job("locked", LOCKED, 4, 10.0),
                                       _job("capped", QUOTA, 3, 10.0), _job("open", OPEN, 6, 1.0)]))
    try:
        yield cluster
    finally:
        for ns in (OPEN, LOCKED, QUOTA):
            for name in [i["metadata"]["name"] for i in cluster.get("fungiblejobs", "-n", ns)["items"]]:
                cluster.kc("patch", "fungiblejob", name, "-n", ns, "--type=merge", "-p",
                           '{"metadata":{"finalizers":null}}', check=False)
                cluster.kc("delete", "fungiblejob", name, "-n", ns, "--wait=false", check=False)
            cluster.kc("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", check=False)
        cluster.kc("delete", "resourcequota", "one-gpu", "-n", QUOTA, check=False)
        cluster.kc("delete", "validatingadmissionpolicybinding", POLICY, check=False)
        cluster.kc("delete", "validatingadmissionpolicy", POLICY, check=False)


def _refusal_events(cluster: Cluster) -> list[dict[str, Any]]:
    return [e for e in cluster.get("events", "-n", LOCKED)["items"]
            if e["reason"] == "AdmissionRefused" and e["involvedObject"]["kind"] == "FungibleJob"]


def _attempts(cluster: Cluster) -> int:
    """Refused creations so far: the aggregated Events' counts."""
    return sum(int(e.get("count") or 1) for e in _refusal_events(cluster))


def _condition(cluster: Cluster, namespace: str, job: str, kind: str) -> dict[str, Any] | None:
    status = cluster.get("fungiblejob", job, "-n", namespace).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), None)


def _running(cluster: Cluster, namespace: str, job: str) -> int:
    return sum(1 for p in cluster.pods(namespace, f"walras.dev/job={job}") if p["status"].get("phase") == "Running")


def test_refused_pods_are_visible_backed_off_and_release_their_capacity(setup: Cluster) -> None:
    cluster = setup
    op = Operator(cluster, "direct").start()
    try:
        try:
            wait_until(lambda: _refusal_events(cluster), 60, "a Warning Event AdmissionRefused on the job")
            condition = wait_until(lambda: _condition(cluster, LOCKED, "locked", "AdmissionRefused"), 60,
                                   "the AdmissionRefused condition")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{op.output()[-4000:]}") from None
        event = _refusal_events(cluster)[0]
        assert event["type"] == "Warning" and REFUSED in event["message"], event
        assert condition["status"] == "True" and REFUSED in condition["message"], condition
        assert "refused" in condition["message"] and "pod(s)" in condition["message"]
        # the capacity the refused job's share would have held runs the other namespace's job
        wait_until(lambda: check(_running(cluster, OPEN, "open"), lambda n: n == 6), 90, "open's 6 pods Running")
        assert cluster.pods(LOCKED, "walras.dev/job=locked") == []
        # the quota: one pod of capped, and the job told why; the API server refused nothing there
        wait_until(lambda: check(_running(cluster, QUOTA, "capped"), lambda n: n == 1), 90, "capped's pod Running")
        limited = wait_until(lambda: _condition(cluster, QUOTA, "capped", "QuotaLimited"), 60, "QuotaLimited")
        assert "1 of 3" in limited["message"] and "one-gpu" in limited["message"], limited
        assert not [e for e in cluster.get("events", "-n", QUOTA)["items"] if e["reason"] == "AdmissionRefused"]
        # retries are backed off: over 30 s (10 plan periods of 3 s), at most 2 more attempts (10 s, then 20 s later;
        # one pod each, where a node has room), where every plan asking would have made >= 40
        before = _attempts(cluster)
        started = time.monotonic()
        time.sleep(30)
        after = _attempts(cluster)
        print(f"live: refused creations {before} at the first refusal, {after} after {time.monotonic() - started:.0f}"
              f" s more; open Running {_running(cluster, OPEN, 'open')}, capped {_running(cluster, QUOTA, 'capped')}")
        assert 1 <= before <= 4 and after - before <= 2, (before, after)
        assert _running(cluster, OPEN, "open") == 6  # never displaced by the retries
        assert violations(cluster) == []
        assert "Traceback" not in op.output()
    finally:
        op.stop()
