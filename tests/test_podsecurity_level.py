"""Issue 30: an invalid ``pod-security.kubernetes.io/enforce`` level (``bogus``, ``Restricted``, ``""``) is read as
kube-apiserver's Pod Security admission reads it: fail-closed, the checks of ``restricted`` at the namespace's
``enforce-version`` (``api.ParseLevel`` returns ``restricted`` with its error and ``ValidatePod`` skips the
privileged short-cut when the labels did not parse). Before, :func:`walras.planner.podsecurity.level_of` read such a
label as ``privileged`` (nothing checked) and the API server refused the pods at every plan.

The unit tests' expected policies are written from pod-security-admission's rules, not computed; the live test
labels namespaces on the real kube-apiserver (the label is refused on create and update, so it is set through the
namespace's ``status`` sub-resource, which Pod Security admission does not check), creates pods with a server-side
dry run, and asserts that :func:`~walras.planner.podsecurity.policy_of` and
:func:`~walras.planner.podsecurity.violations` of the labels the API server stored give its answer."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from walras.planner import Snapshot
from walras.planner.plan import PlanOptions
from walras.planner.podsecurity import ENFORCE_LABEL, VERSION_LABEL, Policy, level_of, policy_of, violations

from tests.planning import build_plan
from tests.test_lifecycle_planner import NOW, job, node, pool
from tests.test_pod_security import PLAIN, RESTRICTED_OK, _with

PRIVILEGED = _with(PLAIN, "containers.0.securityContext", {"privileged": True})
#: restricted refuses uid 0 from policy v1.23 on, so restricted:v1.22 admits this template and restricted:latest not
UID0 = _with(RESTRICTED_OK, "securityContext.runAsUser", 0)
#: baseline refuses a probe host from policy v1.34 on
PROBE_HOST = _with(PLAIN, "containers.0.livenessProbe", {"httpGet": {"port": 8080, "host": "10.0.0.1"}})


def test_an_invalid_level_is_restricted() -> None:
    assert level_of(None) == level_of({}) == level_of({"other": "x"}) == "privileged"
    for level in ("privileged", "baseline", "restricted"):
        assert level_of({ENFORCE_LABEL: level}) == level
    for bad in ("bogus", "Restricted", "PRIVILEGED", "", " baseline", "baseline:latest"):
        assert level_of({ENFORCE_LABEL: bad}) == "restricted", bad


def test_the_policy_of_an_invalid_level_says_so_and_keeps_the_version() -> None:
    policy = policy_of({ENFORCE_LABEL: "bogus"})
    assert (policy.level, policy.version, policy.invalid_level, policy.text) == (
        "restricted", None, True, "restricted:latest")
    assert "'bogus'" in policy.note and "privileged, baseline, restricted" in policy.note
    assert "the checks of 'restricted' apply" in policy.note
    # the version label still applies to the fail-closed level, as PolicyToEvaluate parses both labels
    pinned = policy_of({ENFORCE_LABEL: "bogus", VERSION_LABEL: "v1.22"})
    assert (pinned.level, pinned.version, pinned.invalid_level, pinned.text) == (
        "restricted", (1, 22), True, "restricted:v1.22")
    # both invalid: both named, restricted:latest
    both = policy_of({ENFORCE_LABEL: "bogus", VERSION_LABEL: "1.30"})
    assert (both.level, both.version, both.invalid_level) == ("restricted", None, True)
    assert "'bogus'" in both.note and "'1.30'" in both.note
    # a valid level with an invalid version is the version's case only; a valid pair has no note
    assert policy_of({ENFORCE_LABEL: "baseline", VERSION_LABEL: "1.30"}).invalid_level is False
    assert policy_of({ENFORCE_LABEL: "baseline", VERSION_LABEL: "v1.30"}) == Policy("baseline", (1, 30))
    assert policy_of({}) == Policy()


def test_an_invalid_level_refuses_what_restricted_refuses() -> None:
    policy = policy_of({ENFORCE_LABEL: "bogus"})
    assert violations(RESTRICTED_OK, policy.level, policy.version) == ()
    assert violations(PLAIN, policy.level, policy.version)  # baseline would admit it; restricted does not
    privileged = violations(PRIVILEGED, policy.level, policy.version)
    assert privileged[0].startswith("privileged (") and any(
        v.startswith("allowPrivilegeEscalation != false") for v in privileged)
    pinned = policy_of({ENFORCE_LABEL: "bogus", VERSION_LABEL: "v1.22"})
    assert violations(UID0, pinned.level, pinned.version) == ()
    assert [v.split(" (")[0] for v in violations(UID0, policy.level, policy.version)] == ["runAsUser=0"]


def _plan(labels: dict[str, str], template: dict[str, Any]) -> Any:
    j = job("j", {"a": 1.0}, count=2)
    j["spec"]["template"] = template
    snap = Snapshot(nodes=(node("a0", "a"),), pools=(pool("a"),), jobs=(j,),
                    namespaces=({"kind": "Namespace", "metadata": {"name": "ml", "labels": labels}},))
    return build_plan(snap, options=PlanOptions(now=NOW))


def _creates(plan: Any) -> int:
    return len([p for p in plan.pods if p.job == "j" and p.action == "create"])


def _condition(plan: Any) -> Any:
    (condition,) = [c for c in plan.jobs[("ml", "j")].conditions if c.type == "PodSecurity"]
    return condition


def test_the_planner_refuses_a_privileged_template_in_a_namespace_with_an_invalid_level() -> None:
    bogus = {ENFORCE_LABEL: "bogus"}
    refused = _plan(bogus, PRIVILEGED)
    assert _creates(refused) == 0
    condition = _condition(refused)
    assert (condition.status, condition.reason) == ("False", "PodSecurityRefused")
    assert '"restricted:latest"' in condition.message and "'bogus'" in condition.message
    assert "privileged (container" in condition.message
    assert [e.reason for e in refused.events if e.reason == "PodSecurityRefused"] == ["PodSecurityRefused"]
    # a plain container, which baseline admits, is refused too: the level is restricted, not privileged
    assert _creates(_plan(bogus, PLAIN)) == 0 and _condition(_plan(bogus, PLAIN)).reason == "PodSecurityRefused"
    # a restricted-clean template is planned, and its condition says the label is invalid and what applied
    admitted = _plan(bogus, RESTRICTED_OK)
    assert _creates(admitted) == 2
    condition = _condition(admitted)
    assert (condition.status, condition.reason) == ("True", "InvalidEnforceLevel")
    assert "'bogus'" in condition.message and 'meets "restricted:latest"' in condition.message
    # with a valid version pinned, that version's checks: uid 0 is admitted at v1.22, refused at latest
    pinned = _plan({**bogus, VERSION_LABEL: "v1.22"}, UID0)
    assert _creates(pinned) == 2 and _condition(pinned).reason == "InvalidEnforceLevel"
    assert 'meets "restricted:v1.22"' in _condition(pinned).message
    assert _creates(_plan(bogus, UID0)) == 0
    # both labels invalid: the level's reason, both named
    both = _condition(_plan({**bogus, VERSION_LABEL: "1.30"}, RESTRICTED_OK))
    assert both.reason == "InvalidEnforceLevel" and "'bogus'" in both.message and "'1.30'" in both.message
    # an invalid version alone keeps its own reason
    version_only = _condition(_plan({ENFORCE_LABEL: "baseline", VERSION_LABEL: "1.30"}, PLAIN))
    assert version_only.reason == "InvalidEnforceVersion"


@pytest.mark.controlplane
def test_the_real_api_server_reads_an_invalid_level_as_restricted(control_plane: Any) -> None:
    """On the real kube-apiserver: the invalid level is refused on a namespace's create and update (422, Pod
    Security admission's ``ValidateNamespace``) but kept when written through the ``status`` sub-resource (and on
    later updates that leave it as it is); pods created with a server-side dry run in such namespaces are refused
    exactly when :func:`violations` at :func:`policy_of` of the stored labels is not empty, the refusal names that
    policy (``restricted:latest``, ``restricted:v1.22``) and every check Walras names. The same for an invalid
    version label next to a valid level (``latest`` applies)."""
    cp = control_plane
    invalid = "must be one of privileged, baseline, restricted"
    made: list[str] = []
    try:
        name = f"psl-create-{secrets.token_hex(2)}"
        status, body = cp.request("POST", "/api/v1/namespaces", {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {ENFORCE_LABEL: "bogus"}}})
        if status == 201:
            made.append(name)
        assert status == 422 and invalid in body.get("message", ""), (status, body)
        cases = {"bogus": {ENFORCE_LABEL: "bogus"},
                 "bogus-v122": {ENFORCE_LABEL: "bogus", VERSION_LABEL: "v1.22"},
                 "baseline-bad-version": {ENFORCE_LABEL: "baseline", VERSION_LABEL: "1.30"}}
        stored: dict[str, tuple[str, dict[str, str]]] = {}
        for case, labels in cases.items():
            ns = f"psl-{case}-{secrets.token_hex(2)}"
            status, body = cp.request("POST", "/api/v1/namespaces",
                                      {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            assert status == 201, body
            made.append(ns)
            body["metadata"]["labels"] = {**body["metadata"].get("labels", {}), **labels}
            status, refused = cp.request("PUT", f"/api/v1/namespaces/{ns}", body)
            assert status == 422 and "metadata.labels[pod-security.kubernetes.io/" in refused.get("message", ""), (
                case, status, refused)
            status, written = cp.request("PUT", f"/api/v1/namespaces/{ns}/status", body)
            assert status == 200, (case, status, written)
            status, read = cp.request("GET", f"/api/v1/namespaces/{ns}")
            assert status == 200 and labels.items() <= read["metadata"]["labels"].items(), read["metadata"]
            read["metadata"]["labels"]["team"] = "a"  # an update that leaves the invalid labels as they are
            status, updated = cp.request("PUT", f"/api/v1/namespaces/{ns}", read)
            assert status == 200, (case, status, updated)
            stored[case] = (ns, updated["metadata"]["labels"])
        templates = {"privileged": PRIVILEGED, "plain": PLAIN, "restricted-ok": RESTRICTED_OK, "uid0": UID0,
                     "probe-host": PROBE_HOST}
        expected = {  # written from pod-security-admission's rules: True = admitted
            "bogus": {"privileged": False, "plain": False, "restricted-ok": True, "uid0": False, "probe-host": False},
            "bogus-v122": {"privileged": False, "plain": False, "restricted-ok": True, "uid0": True,
                           "probe-host": False},
            "baseline-bad-version": {"privileged": False, "plain": True, "restricted-ok": True, "uid0": True,
                                     "probe-host": False}}
        disagreements = []
        for case, (ns, labels) in stored.items():
            policy = policy_of(labels)
            assert policy.note, (case, labels)
            for name, template in templates.items():
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": ns},
                       "spec": template["spec"]}
                status, body = cp.request("POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All", pod)
                message = body.get("message", "") if isinstance(body, dict) else str(body)
                if status not in (201, 403):
                    disagreements.append(f"{case}/{name}: HTTP {status}: {message}")
                    continue
                refused = status == 403 and "violates PodSecurity" in message
                ours = violations(template, policy.level, policy.version)
                if refused != bool(ours) or refused == expected[case][name]:
                    disagreements.append(f"{case}/{name}: API server refused={refused} ({message}), Walras "
                                         f"({policy.text}): {ours}, expected admitted={expected[case][name]}")
                if refused and f'violates PodSecurity "{policy.text}"' not in message:
                    disagreements.append(f"{case}/{name}: the API server's policy is not {policy.text}: {message}")
                for check in (v.split(" (")[0] for v in ours):
                    if check not in message:
                        disagreements.append(f"{case}/{name}: the API server does not name {check!r}: {message}")
        assert disagreements == [], "\n".join(disagreements)
    finally:
        for ns in made:
            cp.request("DELETE", f"/api/v1/namespaces/{ns}")
