"""Issue 30: the Pod Security level of a job's namespace is honoured by the template policy. A template that the
namespace's ``pod-security.kubernetes.io/enforce`` level refuses creates no pod; the job gets ``PodSecurity=False``
(reason ``PodSecurityRefused``, naming the failed checks) and one Warning Event, instead of a create refused with 403
at every plan. One test per check of :mod:`walras.planner.podsecurity`, the planner's handling, and a live test
that the real kube-apiserver (``kubectl create --dry-run=server`` in labelled namespaces) agrees with the checks on a
set of templates."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from walras.planner import Snapshot
from walras.planner.model import LABEL_JOB, LABEL_MANAGED, LABEL_POOL, rfc3339
from walras.planner.plan import PlanOptions
from walras.planner.podsecurity import ENFORCE_LABEL, level_of, violations

from tests.planning import build_plan
from tests.test_lifecycle_planner import NOW, job, node, pool

#: A template every level admits (restricted's requirements met).
RESTRICTED_OK: dict[str, Any] = {"spec": {
    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                    "securityContext": {"allowPrivilegeEscalation": False,
                                        "capabilities": {"drop": ["ALL"]}}}]}}
#: A template baseline admits but restricted does not (a plain container).
PLAIN: dict[str, Any] = {"spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}


def _with(template: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``template`` with ``value`` set at the dotted ``path`` (``containers.0.x`` indexes a list)."""
    out = copy.deepcopy(template)
    here: Any = out["spec"]
    keys = path.split(".")
    for key in keys[:-1]:
        here = here[int(key)] if isinstance(here, list) else here.setdefault(key, {})
    here[keys[-1]] = value
    return out


# (name, template, the check it fails, level at which it fails first)
CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("privileged", _with(PLAIN, "containers.0.securityContext", {"privileged": True}), "privileged", "baseline"),
    ("hostNetwork", _with(PLAIN, "hostNetwork", True), "host namespaces", "baseline"),
    ("hostPID", _with(PLAIN, "hostPID", True), "host namespaces", "baseline"),
    ("hostIPC", _with(PLAIN, "hostIPC", True), "host namespaces", "baseline"),
    ("hostPath", _with(PLAIN, "volumes", [{"name": "root", "hostPath": {"path": "/"}}]), "hostPath volumes",
     "baseline"),
    ("hostPort", _with(PLAIN, "containers.0.ports", [{"containerPort": 80, "hostPort": 8080}]), "hostPort",
     "baseline"),
    ("SYS_ADMIN", _with(PLAIN, "containers.0.securityContext", {"capabilities": {"add": ["SYS_ADMIN"]}}),
     "non-default capabilities", "baseline"),
    ("procMount", _with(_with(PLAIN, "containers.0.securityContext", {"procMount": "Unmasked"}), "hostUsers", False),
     "procMount", "restricted"),  # baseline admits Unmasked in a user namespace (hostUsers: false), restricted not
    ("seccomp Unconfined", _with(PLAIN, "securityContext", {"seccompProfile": {"type": "Unconfined"}}),
     "seccompProfile", "baseline"),
    ("unsafe sysctl", _with(PLAIN, "securityContext", {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}),
     "forbidden sysctls", "baseline"),
    ("hostProcess", _with(_with(PLAIN, "securityContext", {"windowsOptions": {"hostProcess": True}}), "hostNetwork",
                          True), "hostProcess", "baseline"),
    ("escalation", _with(RESTRICTED_OK, "containers.0.securityContext.allowPrivilegeEscalation", True),
     "allowPrivilegeEscalation != false", "restricted"),
    ("no drop ALL", _with(RESTRICTED_OK, "containers.0.securityContext.capabilities", {}),
     "unrestricted capabilities", "restricted"),
    ("adds NET_RAW", _with(RESTRICTED_OK, "containers.0.securityContext.capabilities",
                           {"drop": ["ALL"], "add": ["NET_RAW"]}), "non-default capabilities", "baseline"),
    ("root allowed", _with(RESTRICTED_OK, "securityContext.runAsNonRoot", False), "runAsNonRoot != true",
     "restricted"),
    ("uid 0", _with(RESTRICTED_OK, "securityContext.runAsUser", 0), "runAsUser=0", "restricted"),
    ("no seccomp", _with(RESTRICTED_OK, "securityContext", {"runAsNonRoot": True}), "seccompProfile",
     "restricted"),
    ("gitRepo volume", _with(RESTRICTED_OK, "volumes", [{"name": "g", "gitRepo": {"repository": "x"}}]),
     "restricted volume types", "restricted"),
]


#: Where restricted names a baseline failure by its own check (pod-security-admission's OverrideCheckIDs).
RESTRICTED_NAME = {"hostPath volumes": "restricted volume types", "non-default capabilities":
                   "unrestricted capabilities", "seccompProfile": "seccompProfile"}


@pytest.mark.parametrize(("name", "template", "check", "first"), CASES, ids=[c[0] for c in CASES])
def test_each_check(name: str, template: dict[str, Any], check: str, first: str) -> None:
    """The template fails ``check`` at its level and at every stricter one (restricted names some baseline failures
    by its own check), and nothing at a looser one."""
    levels = ("privileged", "baseline", "restricted")
    for level in levels:
        found = violations(template, level)
        if levels.index(level) >= levels.index(first):
            name_here = RESTRICTED_NAME.get(check, check) if level == "restricted" else check
            assert any(v.startswith(name_here) for v in found), (level, found)
        else:
            assert found == (), (level, found)


def test_admitted_templates_and_levels() -> None:
    assert violations(RESTRICTED_OK, "restricted") == ()
    assert violations(PLAIN, "baseline") == ()
    assert {v.split(" (")[0] for v in violations(PLAIN, "restricted")} == {
        "allowPrivilegeEscalation != false", "unrestricted capabilities", "runAsNonRoot != true", "seccompProfile"}
    # the container's own settings are enough without the pod's
    per_container = _with(RESTRICTED_OK, "securityContext", {})
    per_container["spec"]["containers"][0]["securityContext"].update(
        {"runAsNonRoot": True, "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}})
    assert violations(per_container, "restricted") == ()
    # default capabilities may be added under baseline; restricted allows NET_BIND_SERVICE only
    chown = _with(PLAIN, "containers.0.securityContext", {"capabilities": {"add": ["CHOWN", "NET_BIND_SERVICE"]}})
    assert violations(chown, "baseline") == ()
    bind = _with(RESTRICTED_OK, "containers.0.securityContext.capabilities", {"drop": ["ALL"],
                                                                              "add": ["NET_BIND_SERVICE"]})
    assert violations(bind, "restricted") == ()
    # init containers count too; malformed parts are no crash
    init = _with(RESTRICTED_OK, "initContainers", [{"name": "i", "image": "x"}])
    assert any('container "i"' in v for v in violations(init, "restricted"))
    assert violations({"spec": {"containers": "nonsense", "volumes": [3]}}, "restricted") == ()
    assert violations({"spec": {"containers": [3, {"name": "c", "securityContext": []}]}}, "restricted")
    assert level_of({ENFORCE_LABEL: "restricted"}) == "restricted"
    assert level_of({}) == level_of(None) == "privileged"
    assert level_of({ENFORCE_LABEL: "bogus"}) == "restricted"  # fail-closed (tests/test_podsecurity_level.py)


def _snapshot(level: str | None, template: dict[str, Any], pods: tuple[dict[str, Any], ...] = ()) -> Snapshot:
    labels = {ENFORCE_LABEL: level} if level else {}
    j = job("j", {"a": 1.0}, count=2)
    j["spec"]["template"] = template
    other = job("ok", {"a": 1.0}, count=1)
    other["spec"]["template"] = copy.deepcopy(RESTRICTED_OK)
    return Snapshot(nodes=(node("a0", "a"),), pools=(pool("a"),), jobs=(j, other), pods=pods,
                    namespaces=({"kind": "Namespace", "metadata": {"name": "ml", "labels": labels}},))


def test_the_planner_refuses_a_template_the_namespace_refuses_before_creating_a_pod() -> None:
    privileged = _with(PLAIN, "containers.0.securityContext", {"privileged": True})
    plan = build_plan(_snapshot("restricted", privileged), options=PlanOptions(now=NOW))
    assert not [p for p in plan.pods if p.job == "j" and p.action == "create"]
    (condition,) = [c for c in plan.jobs[("ml", "j")].conditions if c.type == "PodSecurity"]
    assert condition.status == "False" and condition.reason == "PodSecurityRefused"
    assert '"restricted:latest"' in condition.message and "privileged (" in condition.message
    assert "allowPrivilegeEscalation != false" in condition.message
    events = [e for e in plan.events if e.reason == "PodSecurityRefused"]
    assert len(events) == 1 and events[0].name == "j"
    # the other job of the namespace is admitted and planned
    assert [p.action for p in plan.pods if p.job == "ok"] == ["create"]
    # re-planning the same cluster reports nothing new (one Event for the refusal, not one per plan)
    again = build_plan(_snapshot("restricted", privileged), plan, options=PlanOptions(now=NOW + 5))
    assert not [e for e in again.events if e.reason == "PodSecurityRefused"]
    assert any(c.type == "PodSecurity" for c in again.jobs[("ml", "j")].conditions)
    # a plain container: restricted refuses it, baseline and no label (privileged) admit it, and it is planned
    plain = build_plan(_snapshot("restricted", PLAIN), options=PlanOptions(now=NOW))
    assert not [p for p in plain.pods if p.job == "j" and p.action == "create"]
    for level in ("baseline", None):
        free = build_plan(_snapshot(level, PLAIN), options=PlanOptions(now=NOW))
        assert len([p for p in free.pods if p.job == "j" and p.action == "create"]) == 2, level
        assert not any(c.type == "PodSecurity" for c in free.jobs[("ml", "j")].conditions)


def test_running_pods_admitted_before_the_label_are_kept() -> None:
    """Pod Security never removes running pods: a job whose namespace became restricted keeps its running pod and
    creates no new one."""
    running = {"kind": "Pod", "metadata": {"name": "j-0", "namespace": "ml", "uid": "u0",
                                           "labels": {LABEL_JOB: "j", LABEL_POOL: "a", LABEL_MANAGED: "true"}},
               "spec": {"nodeName": "a0", "containers": [{"name": "c", "resources": {"requests": {
                   "nvidia.com/gpu": "1"}}}]},
               "status": {"phase": "Running", "startTime": rfc3339(NOW - 3600)}}
    plan = build_plan(_snapshot("restricted", PLAIN, (running,)), options=PlanOptions(now=NOW))
    assert [p.action for p in plan.pods if p.job == "j"] == ["keep"]


@pytest.mark.controlplane
def test_the_real_api_server_agrees(control_plane: Any) -> None:
    """Each template of :data:`CASES` (and the two admitted ones) created with ``kubectl create --dry-run=server`` in
    a namespace labelled baseline and one labelled restricted: the API server refuses it exactly when
    :func:`violations` is not empty, and its message names every check :func:`violations` names."""
    import secrets

    cp = control_plane
    names = {}
    for level in ("baseline", "restricted"):
        ns = f"psa-{level}-{secrets.token_hex(3)}"
        cp.kubectl("create", "namespace", ns)
        cp.kubectl("label", "namespace", ns, f"{ENFORCE_LABEL}={level}")
        names[level] = ns
    try:
        disagreements = []
        userns_root = _with(_with(RESTRICTED_OK, "securityContext.runAsNonRoot", False), "hostUsers", False)
        assert violations(userns_root, "restricted") == ()  # a user namespace may run as root under restricted
        templates = [(c[0], c[1]) for c in CASES] + [("restricted-ok", RESTRICTED_OK), ("plain", PLAIN),
                                                     ("userns-root", userns_root)]
        for level, ns in names.items():
            for name, template in templates:
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": ns},
                       "spec": template["spec"]}
                answer = cp.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(pod), check=False)
                ours = violations(template, level)
                refused = answer.returncode != 0 and "violates PodSecurity" in answer.stderr
                if refused != bool(ours):
                    disagreements.append(f"{level}/{name}: API server refused={refused} ({answer.stderr.strip()}), "
                                         f"Walras: {ours}")
                    continue
                for check in (v.split(" (")[0] for v in ours):
                    if check not in answer.stderr:
                        disagreements.append(f"{level}/{name}: the API server does not name {check!r}: "
                                             f"{answer.stderr.strip()}")
        assert disagreements == [], "\n".join(disagreements)
    finally:
        for ns in names.values():
            cp.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# --- the enforce-version label -----------------------------------------------------------------------------------

#: Templates whose verdict depends on the policy version (the module docstring's table of
#: :mod:`walras.planner.podsecurity`), each with the (level, version) pairs around its boundary and the verdict
#: there: True = admitted. The expected verdicts are written from pod-security-admission's check versions, not
#: computed; the live test asks the real API server the same.
def _sysctl(name: str) -> dict[str, Any]:
    return _with(PLAIN, "securityContext", {"sysctls": [{"name": name, "value": "1"}]})


def _probe_host(host: str) -> dict[str, Any]:
    return _with(PLAIN, "containers.0.livenessProbe", {"httpGet": {"port": 8080, "host": host}})


WINDOWS = {"spec": {"os": {"name": "windows"}, "securityContext": {"runAsNonRoot": True},
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}
VERSIONED: list[tuple[str, dict[str, Any], str, dict[str, bool]]] = [
    ("reserved ports", _sysctl("net.ipv4.ip_local_reserved_ports"), "baseline",
     {"v1.26": False, "v1.27": True, "latest": True}),
    ("keepalive", _sysctl("net.ipv4.tcp_keepalive_time"), "baseline", {"v1.28": False, "v1.29": True}),
    ("tcp_rmem", _sysctl("net.ipv4.tcp_rmem"), "baseline", {"v1.31": False, "v1.32": True, "latest": True}),
    ("probe host", _probe_host("10.0.0.1"), "baseline", {"v1.33": True, "v1.34": False, "latest": False}),
    ("probe loopback", _probe_host("127.0.0.1"), "baseline", {"v1.33": True, "v1.34": False}),  # loopback too
    ("userns unmasked", _with(_with(PLAIN, "containers.0.securityContext", {"procMount": "Unmasked"}), "hostUsers",
                              False), "baseline", {"v1.34": False, "v1.35": True, "latest": True}),
    ("userns root", _with(_with(RESTRICTED_OK, "securityContext.runAsNonRoot", False), "hostUsers", False),
     "restricted", {"v1.34": False, "v1.35": True, "latest": True}),
    ("no drop ALL", _with(RESTRICTED_OK, "containers.0.securityContext.capabilities", {}), "restricted",
     {"v1.21": True, "v1.22": False}),
    ("uid 0", _with(RESTRICTED_OK, "securityContext.runAsUser", 0), "restricted", {"v1.22": True, "v1.23": False}),
    ("windows", WINDOWS, "restricted", {"v1.24": False, "v1.25": True, "latest": True}),
]


def _version(text: str) -> tuple[int, int] | None:
    return None if text == "latest" else (1, int(text.split(".")[1]))


@pytest.mark.parametrize(("name", "template", "level", "verdicts"), VERSIONED, ids=[c[0] for c in VERSIONED])
def test_an_older_policy_version_applies_that_versions_checks(name: str, template: dict[str, Any], level: str,
                                                                verdicts: dict[str, bool]) -> None:
    for version, admitted in verdicts.items():
        found = violations(template, level, _version(version))
        assert (found == ()) == admitted, (version, found)
    # a version newer than any check's is latest
    assert violations(template, level, (1, 99)) == violations(template, level, None)


def test_the_version_label_is_parsed_as_pod_security_admission_parses_it() -> None:
    from walras.planner.podsecurity import NEWEST, VERSION_LABEL, Policy, policy_of

    base = {ENFORCE_LABEL: "baseline"}
    assert policy_of(base) == policy_of({**base, VERSION_LABEL: "latest"}) == Policy("baseline")
    assert policy_of({**base, VERSION_LABEL: "v1.30"}) == Policy("baseline", (1, 30))
    assert policy_of({**base, VERSION_LABEL: "v1.0"}) == Policy("baseline", (1, 0))
    assert policy_of({**base, VERSION_LABEL: f"v1.{NEWEST[1] + 4}"}) == Policy("baseline")  # newer: latest
    assert policy_of({**base, VERSION_LABEL: "v1.30"}).text == "baseline:v1.30"
    for bad in ("1.30", "v1.030", "v2.0", "v1", "v1.x", "Latest", "", "v1.30.1"):
        policy = policy_of({**base, VERSION_LABEL: bad})
        assert policy.version is None and repr(bad) in policy.note and "'latest' apply" in policy.note, bad


def test_an_invalid_version_label_gives_a_clear_condition_and_latest_applies() -> None:
    from walras.planner.podsecurity import VERSION_LABEL

    def planned(version: str, template: dict[str, Any]) -> Any:
        snap = _snapshot("baseline", template)
        ns = {"kind": "Namespace", "metadata": {"name": "ml", "labels": {ENFORCE_LABEL: "baseline",
                                                                          VERSION_LABEL: version}}}
        return build_plan(Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=snap.jobs, namespaces=(ns,)),
                          options=PlanOptions(now=NOW))

    # admitted at latest: the job is planned, and its condition says the label is invalid and what applied
    plan = planned("1.30", PLAIN)
    assert len([p for p in plan.pods if p.job == "j" and p.action == "create"]) == 2
    (condition,) = [c for c in plan.jobs[("ml", "j")].conditions if c.type == "PodSecurity"]
    assert (condition.status, condition.reason) == ("True", "InvalidEnforceVersion")
    assert "'1.30'" in condition.message and '"baseline:latest"' in condition.message
    # refused at latest (a probe host, a v1.34 check): refused, the message says both
    host = _probe_host("10.0.0.1")
    refused = planned("v1.x", host)
    assert not [p for p in refused.pods if p.job == "j" and p.action == "create"]
    (condition,) = [c for c in refused.jobs[("ml", "j")].conditions if c.type == "PodSecurity"]
    assert condition.reason == "PodSecurityRefused" and "'v1.x'" in condition.message
    assert "probe or lifecycle host" in condition.message
    # the same template pinned to v1.33 is admitted and planned, with no condition
    pinned = planned("v1.33", host)
    assert len([p for p in pinned.pods if p.job == "j" and p.action == "create"]) == 2
    assert not [c for c in pinned.jobs[("ml", "j")].conditions if c.type == "PodSecurity"]


@pytest.mark.controlplane
def test_the_real_api_server_agrees_on_each_version(control_plane: Any) -> None:
    """Each template of :data:`VERSIONED`, created with a server-side dry run (``?dryRun=All``) in a namespace
    labelled with its level and each version: the API server refuses it exactly when :func:`violations` at that
    version is not empty (and as :data:`VERSIONED` says), naming the same checks; and it refuses an invalid version
    label on a namespace."""
    import secrets

    from walras.planner.podsecurity import VERSION_LABEL

    cp = control_plane
    made: dict[tuple[str, str], str] = {}
    try:
        for _, _, level, verdicts in VERSIONED:
            for version in verdicts:
                if (level, version) not in made:
                    ns = f"psv-{level[:4]}-{version.replace('.', '')}-{secrets.token_hex(2)}"
                    status, body = cp.request("POST", "/api/v1/namespaces", {
                        "apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": ns, "labels": {ENFORCE_LABEL: level, VERSION_LABEL: version}}})
                    assert status == 201, body
                    made[(level, version)] = ns
        disagreements = []
        for name, template, level, verdicts in VERSIONED:
            for version, admitted in verdicts.items():
                ns = made[(level, version)]
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": ns},
                       "spec": template["spec"]}
                status, body = cp.request("POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All", pod)
                message = body.get("message", "") if isinstance(body, dict) else str(body)
                refused = status == 403 and "violates PodSecurity" in message
                if status not in (201, 403):
                    disagreements.append(f"{name} {level}:{version}: HTTP {status}: {message}")
                    continue
                ours = violations(template, level, _version(version))
                if refused != bool(ours) or refused == admitted:
                    disagreements.append(f"{name} {level}:{version}: API server refused={refused} ({message}), "
                                         f"Walras: {ours}, expected admitted={admitted}")
                for check in (v.split(" (")[0] for v in ours):
                    if check not in message:
                        disagreements.append(f"{name} {level}:{version}: the API server does not name {check!r}")
        assert disagreements == [], "\n".join(disagreements)
        status, body = cp.request("POST", "/api/v1/namespaces", {
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": f"psv-bad-{secrets.token_hex(2)}", "labels": {ENFORCE_LABEL: "baseline",
                                                                               VERSION_LABEL: "1.30"}}})
        if status == 201:
            made[("bad", "bad")] = body["metadata"]["name"]
        assert status == 422, (status, body)
    finally:
        for ns in made.values():
            cp.request("DELETE", f"/api/v1/namespaces/{ns}")
