"""Issue 30 item 6 and issue 32's RBAC: least privilege for the operator, and roles for users.

* With ``operator.namespaces`` set, the chart's ClusterRole grants no write to pods, their subresources, Events or
  FungibleJobs; a Role in each listed namespace does (and one in ``default`` for Events about cluster-scoped kinds).
* FungibleJobs are aggregated into the namespace ``edit``/``admin`` and ``view`` roles; a separate
  ``<release>-platform-admin`` ClusterRole covers ResourcePools, ColocationProfiles and Budgets.

Checked on the rendered chart (``helm template``) and, after applying the rendered RBAC to a real kube-apiserver,
with ``kubectl auth can-i --as``.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest
import yaml
from realtools import require

from tests.controlplane import CHART, ROOT

RELEASE, NAMESPACE = "walras", "walras-system"
POD_WRITES = {("", "pods"): {"create", "delete", "patch"}, ("", "pods/binding"): {"create"},
              ("", "pods/resize"): {"patch"}, ("", "pods/eviction"): {"create"}, ("", "pods/status"): {"patch"},
              ("", "events"): {"create", "patch"}, ("events.k8s.io", "events"): {"create", "patch"},
              ("walras.dev", "fungiblejobs"): {"patch"}, ("walras.dev", "fungiblejobs/status"): {"patch"}}


def render(*values: str) -> list[dict[str, Any]]:
    args = [require("helm"), "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for value in values:
        args += ["--set", value]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def grants(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def named(objects: list[dict[str, Any]], kind: str, name: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]


def test_with_namespaces_the_operator_writes_only_inside_them() -> None:
    objects = render("operator.namespaces[0]=team-a", "operator.namespaces[1]=team-b")
    (cluster_role,) = named(objects, "ClusterRole", RELEASE)
    cluster = grants(cluster_role)
    for key, verbs in POD_WRITES.items():
        assert not (cluster.get(key, set()) & verbs), (key, cluster.get(key))
    assert cluster[("", "pods")] == {"get", "list", "watch"}  # every namespace's pods occupy the nodes
    roles = {o["metadata"]["namespace"]: o for o in named(objects, "Role", f"{RELEASE}-operator")}
    assert set(roles) == {"team-a", "team-b"}
    for namespace, role in roles.items():
        assert grants(role) == POD_WRITES
        (binding,) = [b for b in named(objects, "RoleBinding", f"{RELEASE}-operator")
                      if b["metadata"]["namespace"] == namespace]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": f"{RELEASE}-operator"}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}]
    (events,) = named(objects, "Role", f"{RELEASE}-events")
    assert events["metadata"]["namespace"] == "default"
    assert grants(events) == {("", "events"): {"create", "patch"}, ("events.k8s.io", "events"): {"create", "patch"}}


def test_without_namespaces_the_cluster_role_is_as_before_and_no_namespaced_role() -> None:
    objects = render()
    cluster = grants(named(objects, "ClusterRole", RELEASE)[0])
    for key, verbs in POD_WRITES.items():
        assert verbs <= cluster[key]
    assert not named(objects, "Role", f"{RELEASE}-operator") and not named(objects, "Role", f"{RELEASE}-events")


def test_user_roles_are_aggregated_and_the_platform_role_is_apart() -> None:
    objects = render()
    (edit,) = named(objects, "ClusterRole", f"{RELEASE}-fungiblejobs-edit")
    labels = edit["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert grants(edit) == {("walras.dev", "fungiblejobs"): {"get", "list", "watch", "create", "update", "patch",
                                                            "delete", "deletecollection"},
                            ("walras.dev", "fungiblejobs/status"): {"get"}}
    (view,) = named(objects, "ClusterRole", f"{RELEASE}-fungiblejobs-view")
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert all(verbs <= {"get", "list", "watch"} for verbs in grants(view).values())
    (admin,) = named(objects, "ClusterRole", f"{RELEASE}-platform-admin")
    assert not any(k.startswith("rbac.authorization.k8s.io/aggregate") for k in admin["metadata"]["labels"])
    for kind in ("resourcepools", "colocationprofiles", "budgets"):
        assert {"create", "update", "patch", "delete"} <= grants(admin)[("walras.dev", kind)]
    assert not render("rbac.userRoles=false") or not named(render("rbac.userRoles=false"), "ClusterRole",
                                                           f"{RELEASE}-platform-admin")


def can_i(cp: Any, user: str, verb: str, resource: str, namespace: str | None) -> bool:
    resource, _, sub = resource.partition("/")
    args = ["auth", "can-i", verb, resource, "--as", user, *([f"--subresource={sub}"] if sub else [])]
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    out = cp.kubectl(*args, check=False)
    answer = out.stdout.strip()
    assert answer in ("yes", "no"), out.stderr
    return answer == "yes"


@pytest.mark.controlplane
def test_can_i_on_a_real_api_server(control_plane: Any) -> None:
    """The rendered RBAC applied to kube-apiserver v1.36 (its aggregation controller running), then asked with
    ``kubectl auth can-i --as``: prints the table it checked."""
    cp = control_plane
    ns_a, ns_b, release_ns = "rbac-team-a", "rbac-team-b", "rbac-walras"
    for namespace in (ns_a, ns_b, release_ns):
        cp.kubectl("create", "namespace", namespace, check=False)
    args = [require("helm"), "template", RELEASE, str(CHART), "--namespace", release_ns,
            "--set", f"operator.namespaces[0]={ns_a}"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True).stdout
    rbac = [o for o in yaml.safe_load_all(out) if o and o["kind"] in
            ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
    for obj in rbac:
        if obj["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            obj["metadata"].setdefault("namespace", release_ns)
    rbac += [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "alice-edit", "namespace": ns_a},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "carol-view", "namespace": ns_a},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "carol"}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "rbac-test-bob-platform"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": f"{RELEASE}-platform-admin"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}]},
    ]
    cp.apply_objects(rbac)
    for path in sorted((ROOT / "crds").glob("*.yaml")):  # kubectl auth can-i resolves walras.dev kinds by discovery
        cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        cp.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    operator = f"system:serviceaccount:{release_ns}:{RELEASE}"
    expected = [
        (operator, "create", "pods", ns_a, True), (operator, "create", "pods/binding", ns_a, True),
        (operator, "patch", "fungiblejobs.walras.dev/status", ns_a, True),
        (operator, "create", "pods", ns_b, False), (operator, "create", "pods", "kube-system", False),
        (operator, "create", "pods/binding", "kube-system", False), (operator, "delete", "pods", ns_b, False),
        (operator, "patch", "pods/status", "kube-system", False), (operator, "create", "pods/eviction", ns_b, False),
        (operator, "patch", "fungiblejobs.walras.dev/status", ns_b, False),
        (operator, "list", "pods", None, True), (operator, "watch", "nodes", None, True),
        (operator, "create", "events", "default", True), (operator, "create", "events", ns_b, False),
        ("alice", "create", "fungiblejobs.walras.dev", ns_a, True),
        ("alice", "delete", "fungiblejobs.walras.dev", ns_a, True),
        ("alice", "patch", "fungiblejobs.walras.dev/status", ns_a, False),
        ("alice", "create", "fungiblejobs.walras.dev", ns_b, False),
        ("alice", "create", "resourcepools.walras.dev", None, False),
        ("alice", "create", "budgets.walras.dev", None, False),  # issue 32: nobody names their own budget
        ("alice", "patch", "budgets.walras.dev", None, False),
        ("carol", "get", "fungiblejobs.walras.dev", ns_a, True),
        ("carol", "create", "fungiblejobs.walras.dev", ns_a, False),
        ("bob", "create", "resourcepools.walras.dev", None, True),
        ("bob", "create", "colocationprofiles.walras.dev", None, True),
        ("bob", "create", "budgets.walras.dev", None, True),
        ("bob", "create", "fungiblejobs.walras.dev", ns_a, False),
    ]
    deadline = time.monotonic() + 60
    while True:  # the aggregation controller fills edit/view in a moment
        got = [(user, verb, resource, ns, can_i(cp, user, verb, resource, ns))
               for user, verb, resource, ns, _ in expected]
        if got == expected or time.monotonic() > deadline:
            break
        time.sleep(1)
    for row in got:
        print("can-i", *row)
    assert got == expected


@pytest.mark.controlplane
def test_the_operator_runs_on_the_namespaced_rbac_alone(control_plane: Any, namespace: str) -> None:
    """The operator authenticated as the chart's ServiceAccount of a release rendered with ``operator.namespaces:
    [NS]`` (no pod rights outside NS), on a real kube-apiserver with the kubelet stand-in: its pods are created,
    bound and Running, its job's status is written, and it never ends."""
    import asyncio

    from test_faults import _renamed_scenario, _wait
    from walras.kube.client import KubeClient, KubeConfig
    from walras.metrics import WalrasMetrics
    from walras.operator import Controller, IndexSource, OperatorOptions, run_operator
    from walras.planner import build_plan
    from walras_testbed.kubelet.client import ApiClient, ApiConfig
    from walras_testbed.kubelet.standin import KubeletStandIn

    from tests.controlplane import render_chart

    cp = control_plane
    ns, release, release_ns = namespace, "nsrbac", f"{namespace}-walras"
    cp.kubectl("create", "namespace", release_ns)
    cp.kubectl("apply", "-f", str(ROOT / "crds"))
    cp.kubectl("wait", "--for=condition=Established", "crd/fungiblejobs.walras.dev", "--timeout=60s")
    objects = render_chart(require("helm"), release_ns, f"operator.namespaces[0]={ns}", "peering.enabled=false",
                           "rbac.userRoles=false", release=release)
    rbac = [o for o in objects if o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                                 "RoleBinding")]
    for obj in rbac:
        if obj["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            obj["metadata"].setdefault("namespace", release_ns)
    cp.apply_objects(rbac)
    account = next(o for o in rbac if o["kind"] == "ServiceAccount"
                   and o["metadata"].get("labels", {}).get("app.kubernetes.io/component", "operator") == "operator")
    kubeconfig = cp.service_account_kubeconfig(release_ns, account["metadata"]["name"])
    docs = _renamed_scenario(ns)
    nodes = [d for d in docs if d["kind"] == "Node"]

    async def scenario() -> None:
        kubelet = KubeletStandIn(ApiClient(ApiConfig.from_kubeconfig(cp.kubeconfig)), nodes, lease_interval=5.0,
                                 status_interval=10.0)
        await kubelet.start()
        cp.apply_objects([d for d in docs if d["kind"] != "Node"])
        kube = KubeConfig.load(str(kubeconfig))
        options = OperatorOptions(mode="direct", debounce=0.1, plan_period=2.0, identity="nsrbac", namespaces=(ns,))
        source = IndexSource(options.namespaces)
        controller = Controller(KubeClient(kube), source, build_plan, options, WalrasMetrics())
        stop = asyncio.Event()
        task = asyncio.create_task(run_operator(controller, source, kube, peering=None, health_port=None,
                                                stop_flag=stop))

        def settled() -> bool:
            items = cp.get("pods", "-n", ns)["items"]
            return len(items) == 5 and all(p["status"].get("phase") == "Running" for p in items)

        try:
            await _wait(lambda: task.done() or settled(), 120, "5 pods running with the namespaced RBAC")
            assert not task.done(), "the operator ended"
            jobs = cp.get("fungiblejobs", "-n", ns)["items"]
            assert jobs and all(j.get("status", {}).get("placedReplicas", 0) > 0 for j in jobs)
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
            await kubelet.stop(delete_nodes=True)
            cp.kubectl("delete", "resourcepools", f"{ns}-v100", f"{ns}-k80", "--ignore-not-found", check=False)
            cp.kubectl("delete", "namespace", release_ns, "--wait=false", check=False)
            for obj in rbac:
                if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                    cp.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found",
                               check=False)

    asyncio.run(scenario())
