"""The Helm chart ``helm/walras``: linted and rendered by the real ``helm`` (4.x), every rendered object validated
against the Kubernetes JSON schemas of ``kubernetes-validate``, and the chart's contracts checked object by object.

What is validated how:

* built-in kinds (Deployment, Service, RBAC, ConfigMap, CRDs, ...): ``kubernetes_validate.validate`` in strict mode
  (no unknown fields) for Kubernetes 1.35 (the bundled kubectl's version) and for the newest version the package
  ships;
* ``ServiceMonitor`` and ``PrometheusRule`` (prometheus-operator CRDs, not in those schemas): against strict JSON
  schemas in ``tests/test_helm_data/prometheus-operator-v0.80.1.schema.json``, generated once (no runtime
  dependency) from the pydantic models of the PyPI package ``cloudcoil-models-prometheus-operator`` 0.80.1.0
  (Apache-2.0) with ``model_json_schema(by_alias=True)`` and made strict (``additionalProperties: false`` on every
  object with declared properties); their fields are also checked by hand, and the rule groups of the PrometheusRule
  go through the real ``promtool check rules``. To regenerate the schemas:
  ``pip install --target /tmp/cc cloudcoil-models-prometheus-operator==0.80.1.0``, then with ``PYTHONPATH=/tmp/cc``
  dump ``v1.ServiceMonitor`` and ``v1.PrometheusRule`` (``cloudcoil.models.prometheus_operator``) the same way;
* leader election: the chart renders no kopf peering object or CRD; its namespaced Role grants on ``leases`` exactly
  the verbs :class:`walras.operator.leader.LeaseElector` uses (recorded from the elector itself), and on the real
  control plane the chart's ServiceAccount acquires, renews, loses and releases the Lease with that Role;
* the ``KubeSchedulerConfiguration`` inside the scheduler ConfigMap: compared with the sample
  ``deploy/scheduler/kube-scheduler-config.yaml`` and checked field by field (kube-scheduler's config API has no
  JSON schema in ``kubernetes-validate``).
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import subprocess
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

import jsonschema
import kubernetes_validate
import pytest
import yaml
from realtools import require

ROOT = Path(__file__).resolve().parents[1]
MONITORING_SCHEMAS = json.loads(
    (ROOT / "tests" / "test_helm_data" / "prometheus-operator-v0.80.1.schema.json").read_text()
)
CHART = ROOT / "helm" / "walras"
RELEASE = "walras"
NAMESPACE = "walras-system"

#: The chart's own scheduler with the mutual TLS it requires (the extender then listens on 0.0.0.0).
SCHEDULER_VALUES = {
    "operator.mode": "extender",
    "scheduler.enabled": "true",
    "extender.tls.enabled": "true",
    "extender.tls.secretName": "walras-extender-tls",
    "scheduler.extender.clientCertSecretName": "walras-scheduler-client",
}

ALL_ON = {
    **SCHEDULER_VALUES,
    "operator.replicas": "2",
    "operator.namespaces[0]": "team-a",
    "operator.namespaces[1]": "team-b",
    "scheduler.extender.managedResources[0].name": "nvidia.com/gpu",
    "metrics.serviceMonitor.enabled": "true",
    "metrics.prometheusRule.enabled": "true",
    "dashboard.enabled": "true",
}


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require("helm"), *args], capture_output=True, text=True, timeout=120, check=False)


def set_args(values: dict[str, str]) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


@cache
def render(extra: tuple[tuple[str, str], ...] = ()) -> tuple[dict[str, Any], ...]:
    out = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds", *set_args(dict(extra)))
    assert out.returncode == 0, out.stderr
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def default_objects() -> tuple[dict[str, Any], ...]:
    return render()


def all_on_objects() -> tuple[dict[str, Any], ...]:
    return render(tuple(ALL_ON.items()))


def find(objects: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def crd_sources() -> Iterator[dict[str, Any]]:
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        yield from (doc for doc in yaml.safe_load_all(path.read_text()) if doc)


# --- lint and render ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [{}, ALL_ON], ids=["defaults", "all-optional-parts"])
def test_helm_lint_passes(values: dict[str, str]) -> None:
    out = helm("lint", str(CHART), "--strict", "--namespace", NAMESPACE, *set_args(values))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


def test_default_render_has_the_core_objects_and_no_optional_ones() -> None:
    kinds = sorted(o["kind"] for o in default_objects())
    for kind in ("Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
        assert kind in kinds
    for kind in ("ServiceMonitor", "PrometheusRule", "ConfigMap", "NetworkPolicy", "PodDisruptionBudget",
                 "ClusterKopfPeering", "KopfPeering"):
        assert kind not in kinds
    assert len(find(default_objects(), "Deployment")) == 1
    assert [o["metadata"]["name"] for o in find(default_objects(), "Role")] == [f"{RELEASE}-leader-election"]


def test_all_on_render_has_every_optional_part() -> None:
    objects = all_on_objects()
    one(objects, "ServiceMonitor")
    one(objects, "PrometheusRule")
    one(objects, "ConfigMap", f"{RELEASE}-dashboard")
    one(objects, "ConfigMap", f"{RELEASE}-scheduler")
    one(objects, "Deployment", f"{RELEASE}-scheduler")
    one(objects, "ServiceAccount", f"{RELEASE}-scheduler")
    one(objects, "NetworkPolicy", f"{RELEASE}-extender")


def builtin(objects: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [o for o in objects if not o["apiVersion"].startswith("monitoring.coreos.com/")]


@pytest.mark.parametrize("version", ["1.35.0", kubernetes_validate.latest_version()])
@pytest.mark.parametrize("which", ["defaults", "all-optional-parts"])
def test_every_builtin_object_validates_against_kubernetes_schemas(which: str, version: str) -> None:
    objects = default_objects() if which == "defaults" else all_on_objects()
    checked = builtin(objects)
    assert len(checked) >= 8
    for obj in checked:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:  # pragma: no cover - the message is the point
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} invalid for {version}: {exc.message} at {exc.path}")


def test_schema_validation_is_not_vacuous() -> None:
    deployment = json.loads(json.dumps(one(default_objects(), "Deployment")))
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.35.0", strict=True)
    deployment = json.loads(json.dumps(one(default_objects(), "Deployment")))
    deployment["spec"]["replicaz"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.35.0", strict=True)


# --- CRDs -----------------------------------------------------------------------------------------------------------


def test_chart_crds_equal_the_single_source() -> None:
    """The chart's walras.dev CRDs are byte-equal copies of the files of crds/ (copies, not links: a copied chart has
    no ../../crds; ``make chart``), and nothing else claims that group."""
    sources = list(crd_sources())
    assert {d["spec"]["names"]["kind"] for d in sources} >= {"ResourcePool", "FungibleJob", "ColocationProfile"}
    chart_walras = []
    for path in sorted((CHART / "crds").iterdir()):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        if any(d["spec"]["group"] == "walras.dev" for d in docs):
            assert not path.is_symlink(), f"{path.name} must be a copy of crds/{path.name} (make chart), not a link"
            assert path.read_bytes() == (ROOT / "crds" / path.name).read_bytes(), f"{path.name}: run make chart"
            chart_walras.extend(docs)
    assert sorted(chart_walras, key=lambda d: d["metadata"]["name"]) == sorted(
        sources, key=lambda d: d["metadata"]["name"]
    )
    rendered = {o["metadata"]["name"]: o for o in find(default_objects(), "CustomResourceDefinition")}
    for source in sources:
        assert rendered[source["metadata"]["name"]] == source


def lease_rules(objects: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rules on ``coordination.k8s.io/leases`` of the operator's own Roles (not the scheduler's)."""
    roles = [o for o in objects if o["kind"] == "Role"
             and o["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"]
    return [r for role in roles for r in role["rules"] if "leases" in r["resources"]]


def test_no_kopf_peering_object_crd_or_permission_is_rendered() -> None:
    """kopf runs standalone; leader election is a Lease, so nothing of kopf's peering remains."""
    for objects in (default_objects(), all_on_objects()):
        assert not [o for o in objects if o["apiVersion"].startswith("kopf.dev/")]
        crds = find(objects, "CustomResourceDefinition")
        assert crds and all(c["spec"]["group"] == "walras.dev" for c in crds)
        for role in find(objects, "ClusterRole"):
            assert not any("kopf.dev" in r["apiGroups"] for r in role["rules"])
    assert not (CHART / "crds" / "kopf-peering.yaml").exists()
    assert not (CHART / "templates" / "peering.yaml").exists()


class RecordingLeaseAPI:
    """A Lease API in memory that records each request as the RBAC verb it needs (``GET``/``POST``/``PUT``/``PATCH``/
    ``DELETE`` on a named object: get/create/update/patch/delete; ``GET`` on the collection: list)."""

    VERBS: ClassVar[dict[str, str]] = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch",
                                       "DELETE": "delete"}

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.calls: list[tuple[str, str]] = []  # (verb, path)

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        from walras.kube.errors import ApiError

        named = not path.endswith("/leases")
        self.calls.append((self.VERBS[method] if named or method != "GET" else "list", path))
        if method == "GET":
            if self.lease is None:
                raise ApiError(404, "NotFound", path)
            return copy.deepcopy(self.lease)
        if method in ("POST", "PUT"):
            self.version += 1
            self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
            return copy.deepcopy(self.lease)
        raise AssertionError(f"unexpected {method} {path}")


def test_the_lease_role_grants_exactly_what_the_elector_uses() -> None:
    """Drive :class:`walras.operator.leader.LeaseElector` through create, renew, release and a take-over by a second
    identity, record the verbs its requests need, and compare them with the chart's Role: the same verbs, the named
    ones limited to the Lease the chart passes as ``--peering``."""
    from walras.operator.leader import LeaseElector

    api = RecordingLeaseAPI()
    args = one(default_objects(), "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"][0]["args"]
    (lease_name,) = [a.split("=", 1)[1] for a in args if a.startswith("--peering=")]

    async def scenario() -> None:
        first = LeaseElector(api, NAMESPACE, lease_name, "pod-a")  # type: ignore[arg-type]
        second = LeaseElector(api, NAMESPACE, lease_name, "pod-b")  # type: ignore[arg-type]
        assert await first.try_acquire_or_renew()  # absent: created
        assert not await second.try_acquire_or_renew()  # held by a live peer
        assert await first.try_acquire_or_renew()  # renewed
        await first._set_leading(True)
        await first.release()
        assert api.lease is not None and api.lease["spec"]["holderIdentity"] == ""
        assert await second.try_acquire_or_renew()  # released: taken over

    asyncio.run(scenario())
    used = {verb for verb, _ in api.calls}
    assert used == {"get", "create", "update"}
    named_path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{lease_name}"
    assert {path for verb, path in api.calls if verb != "create"} == {named_path}

    rules = lease_rules(default_objects())
    granted = {verb for r in rules for verb in r["verbs"]}
    assert granted == used
    for rule in rules:
        assert rule["apiGroups"] == ["coordination.k8s.io"] and rule["resources"] == ["leases"]
        if rule["verbs"] == ["create"]:
            assert "resourceNames" not in rule  # the API server cannot limit create by name
        else:
            assert rule["resourceNames"] == [lease_name]
    role = one(default_objects(), "Role", f"{RELEASE}-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE
    binding = one(default_objects(), "RoleBinding", f"{RELEASE}-leader-election")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    account = one(default_objects(), "ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]


def test_the_chart_identity_elects_through_the_lease_on_a_real_api_server(control_plane: Any) -> None:
    """The chart's ServiceAccount with the chart's RBAC, against a real kube-apiserver: creates the Lease, renews it,
    releases it, a second identity takes it over, and a Lease of another name is forbidden (the Role names it)."""
    from controlplane import install_chart_identity
    from walras.kube.client import KubeClient, KubeConfig
    from walras.kube.errors import ApiError
    from walras.operator.leader import LeaseElector

    namespace = "walras-lease-test"
    kubeconfig, objects = install_chart_identity(control_plane, require("helm"), namespace)
    args = one(tuple(objects), "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"][0]["args"]
    (lease_name,) = [a.split("=", 1)[1] for a in args if a.startswith("--peering=")]
    control_plane.kubectl("delete", "lease", lease_name, "-n", namespace, "--ignore-not-found")

    async def scenario() -> None:
        client = KubeClient(KubeConfig.load(str(kubeconfig)))
        try:
            first = LeaseElector(client, namespace, lease_name, "pod-a")
            second = LeaseElector(client, namespace, lease_name, "pod-b")
            assert await first.try_acquire_or_renew()
            assert not await second.try_acquire_or_renew()
            assert await first.try_acquire_or_renew()
            await first._set_leading(True)
            await first.release()
            assert await second.try_acquire_or_renew()
            other = LeaseElector(client, namespace, "not-the-chart-lease", "pod-c")
            with pytest.raises(ApiError) as denied:
                await other.try_acquire_or_renew()
            assert denied.value.code == 403
        finally:
            await client.close()

    asyncio.run(scenario())
    lease = control_plane.get("lease", lease_name, "-n", namespace)
    assert lease["spec"]["holderIdentity"] == "pod-b"
    assert lease["spec"]["leaseTransitions"] == 1


def test_peering_off_runs_standalone_without_the_lease_role() -> None:
    objects = render((("peering.enabled", "false"),))
    assert not lease_rules(objects)
    args = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--standalone" in args and not any(a.startswith("--peering") for a in args)
    assert one(objects, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}


# --- operator Deployment --------------------------------------------------------------------------------------------


def test_operator_deployment_is_hardened_and_probed() -> None:
    deployment = one(default_objects(), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert set(container["resources"]) == {"requests", "limits"}
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    # liveness: kopf's /healthz on the health port; readiness: /readyz on the metrics port (200 on the Lease holder
    # only; not the extender port, whose mutual TLS a kubelet probe cannot pass)
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"extender": 8888, "metrics": 9847, "health": 8080}
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in container["env"]
    assert "--extender-host=127.0.0.1" in container["args"] and "--peering=walras" in container["args"]
    assert container["image"] == "walras:0.1.0"
    assert container["args"][0] == "run"
    assert {"--mode=direct", "--scheduler-name=walras-scheduler", "--extender-port=8888", "--metrics-port=9847",
            "--health-port=8080", "--plan-period=30", "--debounce=1", "--job-metrics-limit=500"} <= set(
        container["args"]
    )
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_two_replicas_and_namespaces_and_tls_reach_the_args() -> None:
    deployment = one(all_on_objects(), "Deployment", RELEASE)
    assert deployment["spec"]["replicas"] == 2
    # only the Lease holder is Ready: a roll-out that waited for Ready new pods before stopping the old leader would
    # never finish, so the old pods may all go (the Lease keeps one active)
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxSurge": 1, "maxUnavailable": "100%"}}
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert "--mode=extender" in args
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert "--extender-host=0.0.0.0" in args
    assert "--extender-tls-cert=/etc/walras/tls/tls.crt" in args
    assert "--extender-tls-key=/etc/walras/tls/tls.key" in args
    assert "--extender-client-ca=/etc/walras/tls/client-ca.crt" in args
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "walras-extender-tls"
    assert {"key": "ca.crt", "path": "client-ca.crt"} in volumes["tls"]["secret"]["items"]
    service = one(all_on_objects(), "Service")
    assert {p["name"]: p["appProtocol"] for p in service["spec"]["ports"]} == {
        "extender-https": "https",
        "metrics": "http",
    }


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"operator.replicas": "2", "peering.enabled": "false"}, "needs peering.enabled=true"),
        ({"scheduler.enabled": "true"}, "needs operator.mode=extender"),
        ({"extender.tls.enabled": "true"}, "needs extender.tls.secretName"),
        # the chart's scheduler reaches the extender over the pod network: never without mutual TLS
        ({"operator.mode": "extender", "scheduler.enabled": "true"}, "needs mutual TLS"),
        ({**SCHEDULER_VALUES, "extender.tls.clientCA": ""}, "needs mutual TLS"),
        ({"extender.host": "0.0.0.0"}, "listens on 0.0.0.0 (beyond loopback) and needs mutual TLS"),
        ({"extender.host": "0.0.0.0", "extender.tls.enabled": "true", "extender.tls.secretName": "s",
          "extender.tls.clientCA": ""}, "needs mutual TLS"),
        ({**SCHEDULER_VALUES, "scheduler.extender.clientCertSecretName": ""}, "clientCertSecretName must name"),
        ({**SCHEDULER_VALUES, "extender.host": "127.0.0.1"}, "cannot reach an extender on loopback"),
        ({"extender.host": "any"}, "extender/host"),
        ({"podDisruptionBudget.enabled": "true", "operator.replicas": "2"},
         "maxUnavailable must be >= operator.replicas"),
        ({"podDisruptionBudget.enabled": "true", "operator.replicas": "2", "podDisruptionBudget.maxUnavailable": "50%"},
         "maxUnavailable must be >= operator.replicas"),
        ({"operator.mode": "fast"}, "operator/mode"),
        ({"operator.ports.metrics": "70000"}, "operator/ports/metrics"),
        ({"scheduler.extender.httpTimeout": "soon"}, "httpTimeout"),
        ({"scheduler.extender.managedResources[0].name": "cpu"}, "managedResources"),
        ({"operator.replicaz": "1"}, "replicaz"),
    ],
)
def test_bad_values_are_refused(values: dict[str, str], message: str) -> None:
    out = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *set_args(values))
    assert out.returncode != 0
    assert message in out.stderr


# --- RBAC -----------------------------------------------------------------------------------------------------------

EXPECTED_RULES = {
    ("", "nodes"): {"get", "list", "watch"},
    ("", "pods"): {"get", "list", "watch", "create", "delete", "patch"},
    ("", "pods/binding"): {"create"},
    ("", "pods/resize"): {"patch"},
    ("", "pods/eviction"): {"create"},
    ("", "pods/status"): {"patch"},
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
    ("", "namespaces"): {"list", "watch"},
    ("", "resourcequotas"): {"list", "watch"},  # the namespaces' limits in the plan (docs/refusals.md)
    ("walras.dev", "resourcepools"): {"get", "list", "watch", "patch"},
    ("walras.dev", "fungiblejobs"): {"get", "list", "watch", "patch"},
    ("walras.dev", "colocationprofiles"): {"get", "list", "watch", "patch"},
    ("walras.dev", "resourcepools/status"): {"patch"},
    ("walras.dev", "fungiblejobs/status"): {"patch"},
    ("walras.dev", "colocationprofiles/status"): {"patch"},
    ("walras.dev", "budgets"): {"get", "list", "watch"},
    ("walras.dev", "budgets/status"): {"patch"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
    ("scheduling.k8s.io", "priorityclasses"): {"get", "list", "watch"},  # a job's priority (docs/preemption.md)
}


def test_operator_rbac_is_exactly_least_privilege() -> None:
    role = one(default_objects(), "ClusterRole", RELEASE)  # the users' aggregated roles are others (test_hostile_rbac)
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert "*" not in group and "*" not in resource and "*" not in rule["verbs"]
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == EXPECTED_RULES
    binding = one(default_objects(), "ClusterRoleBinding", RELEASE)
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = one(default_objects(), "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": NAMESPACE}]
    pod = one(default_objects(), "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]


# --- second scheduler -----------------------------------------------------------------------------------------------


def scheduler_config(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    configmap = one(objects, "ConfigMap", f"{RELEASE}-scheduler")
    loaded: dict[str, Any] = yaml.safe_load(configmap["data"]["kube-scheduler-config.yaml"])
    return loaded


def test_sample_scheduler_config_is_what_the_chart_renders() -> None:
    sample = yaml.safe_load((ROOT / "deploy" / "scheduler" / "kube-scheduler-config.yaml").read_text())
    rendered = scheduler_config(render(tuple(SCHEDULER_VALUES.items())))
    assert rendered == sample


def test_scheduler_config_points_the_profile_at_the_extender_service() -> None:
    sample = yaml.safe_load((ROOT / "deploy" / "scheduler" / "kube-scheduler-config.yaml").read_text())
    assert sample["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert sample["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in sample["profiles"]] == ["walras-scheduler"]
    (extender,) = sample["extenders"]
    service = one(render(tuple(SCHEDULER_VALUES.items())), "Service")
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "extender-https")
    assert extender["urlPrefix"] == f"https://{service['metadata']['name']}.{NAMESPACE}.svc:{port}/scheduler"
    assert extender["enableHTTPS"] is True
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"], extender["preemptVerb"]) == (
        "filter", "prioritize", "bind", "preempt")
    assert extender["nodeCacheCapable"] is True and extender["ignorable"] is False
    assert extender["weight"] >= 1 and extender["httpTimeout"] == "5s"
    assert extender["managedResources"] == []
    # the operator's pods use the same scheduler name as the profile
    args = one(default_objects(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--scheduler-name=walras-scheduler" in args


def test_scheduler_with_tls_and_managed_resources() -> None:
    objects = all_on_objects()
    (extender,) = scheduler_config(objects)["extenders"]
    assert extender["urlPrefix"].startswith(f"https://{RELEASE}.{NAMESPACE}.svc:8888/")
    assert extender["enableHTTPS"] is True
    assert extender["tlsConfig"] == {"insecure": False, "serverName": f"{RELEASE}.{NAMESPACE}.svc",
                                     "caFile": "/etc/walras/extender-ca/ca.crt",
                                     "certFile": "/etc/walras/extender-client/tls.crt",
                                     "keyFile": "/etc/walras/extender-client/tls.key"}
    assert extender["managedResources"] == [{"name": "nvidia.com/gpu"}]
    deployment = one(objects, "Deployment", f"{RELEASE}-scheduler")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--config=/etc/walras-scheduler/kube-scheduler-config.yaml" in container["command"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["extender-ca"] == "/etc/walras/extender-ca"
    assert mounts["extender-client"] == "/etc/walras/extender-client"
    volumes = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    assert volumes["extender-client"]["secretName"] == "walras-scheduler-client"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["serviceAccountName"] == f"{RELEASE}-scheduler"
    roles = {b["roleRef"]["name"] for b in find(objects, "ClusterRoleBinding")
             if b["subjects"][0]["name"] == f"{RELEASE}-scheduler"}
    assert roles == {"system:kube-scheduler", "system:volume-scheduler"}
    lease = one(objects, "Role", f"{RELEASE}-scheduler-leader-election")
    assert any(r.get("resourceNames") == ["walras-scheduler"] for r in lease["rules"])
    auth = one(objects, "RoleBinding", f"{RELEASE}-scheduler-auth-reader")
    assert auth["metadata"]["namespace"] == "kube-system"
    assert auth["roleRef"]["name"] == "extension-apiserver-authentication-reader"


def mounted_files(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Every file a container sees from a Secret volume: path -> (Secret name, key)."""
    volumes = {v["name"]: v["secret"] for v in pod.get("volumes", []) if "secret" in v}
    files = {}
    for mount in container.get("volumeMounts", []):
        secret = volumes.get(mount["name"])
        if secret is not None:
            for item in secret["items"]:
                files[f"{mount['mountPath']}/{item['path']}"] = (secret["secretName"], item["key"])
    return files


def test_mutual_tls_files_are_mounted_where_both_sides_read_them() -> None:
    """Each certificate path the operator's args and the scheduler's tlsConfig name is a mounted Secret key: the
    operator's server pair and client CA, the scheduler's server CA and client pair."""
    objects = all_on_objects()
    operator = one(objects, "Deployment", RELEASE)["spec"]["template"]["spec"]
    files = mounted_files(operator, operator["containers"][0])
    flags = dict(a.split("=", 1) for a in operator["containers"][0]["args"] if a.startswith("--extender-"))
    assert files[flags["--extender-tls-cert"]] == ("walras-extender-tls", "tls.crt")
    assert files[flags["--extender-tls-key"]] == ("walras-extender-tls", "tls.key")
    assert files[flags["--extender-client-ca"]] == ("walras-extender-tls", "ca.crt")
    scheduler = one(objects, "Deployment", f"{RELEASE}-scheduler")["spec"]["template"]["spec"]
    files = mounted_files(scheduler, scheduler["containers"][0])
    tls = scheduler_config(objects)["extenders"][0]["tlsConfig"]
    assert files[tls["caFile"]] == ("walras-extender-tls", "ca.crt")
    assert files[tls["certFile"]] == ("walras-scheduler-client", "tls.crt")
    assert files[tls["keyFile"]] == ("walras-scheduler-client", "tls.key")
    custom = one(render((*SCHEDULER_VALUES.items(), ("extender.tls.clientCA", "client-ca.pem"))), "Deployment",
                 RELEASE)["spec"]["template"]["spec"]
    assert mounted_files(custom, custom["containers"][0])["/etc/walras/tls/client-ca.crt"] == (
        "walras-extender-tls", "client-ca.pem")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([require("openssl"), *args], check=True, capture_output=True, cwd=cwd, timeout=60)


def _mutual_tls_secrets(tmp: Path, server_name: str) -> dict[tuple[str, str], Path]:
    """The two Secrets the chart's mutual TLS needs, as files made with the real ``openssl``: (Secret, key) -> file.
    ``walras-extender-tls``: a server certificate for ``server_name`` and its CA; ``walras-scheduler-client``: a
    client certificate (CN ``walras-scheduler``) of the same CA."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=walras-test-ca", "-keyout",
             "ca.key", "-out", "ca.crt", cwd=tmp)
    for name, cn, ext in (("server", "walras-extender", f"subjectAltName=DNS:{server_name}"),
                          ("client", "walras-scheduler", "extendedKeyUsage=clientAuth")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}", "-keyout", f"{name}.key", "-out",
                 f"{name}.csr", cwd=tmp)
        (tmp / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=tmp)
    return {("walras-extender-tls", "tls.crt"): tmp / "server.crt",
            ("walras-extender-tls", "tls.key"): tmp / "server.key",
            ("walras-extender-tls", "ca.crt"): tmp / "ca.crt",
            ("walras-scheduler-client", "tls.crt"): tmp / "client.crt",
            ("walras-scheduler-client", "tls.key"): tmp / "client.key"}


def test_the_real_kube_scheduler_calls_the_extender_over_the_charts_mutual_tls(control_plane: Any, namespace: str,
                                                                              tmp_path: Path) -> None:
    """The real kube-scheduler with the chart's KubeSchedulerConfiguration (only ``urlPrefix`` pointed at a local
    port, each certificate path replaced by the file of the Secret key the chart mounts there) reaches an HTTPS
    server built like the operator's (``server_tls`` with the client CA the chart passes as
    ``--extender-client-ca``): the handshake needs the scheduler's client certificate, and its ``filter`` and
    ``bind`` calls arrive with that certificate's subject."""
    import http.server
    import threading

    from walras.extender import server_tls

    objects = render(tuple(SCHEDULER_VALUES.items()))  # managedResources: [], so every pod of the profile goes
    config = scheduler_config(objects)
    (extender,) = config["extenders"]
    secrets = _mutual_tls_secrets(tmp_path, extender["tlsConfig"]["serverName"])
    operator = one(objects, "Deployment", RELEASE)["spec"]["template"]["spec"]
    operator_files = mounted_files(operator, operator["containers"][0])
    flags = dict(a.split("=", 1) for a in operator["containers"][0]["args"] if a.startswith("--extender-"))
    context = server_tls(*(str(secrets[operator_files[flags[f]]]) for f in
                           ("--extender-tls-cert", "--extender-tls-key", "--extender-client-ca")))
    seen: list[tuple[str, str]] = []  # (verb, client certificate CN) of requests about this test's pod

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            verb = self.path.rsplit("/", 1)[-1]
            subject = dict(pair[0] for pair in self.connection.getpeercert()["subject"])  # type: ignore[attr-defined]
            if verb == "filter":
                ours = body["Pod"]["metadata"]["namespace"] == namespace
                answer: Any = {"NodeNames": body["NodeNames"], "FailedNodes": {}, "Error": ""}
            elif verb == "prioritize":
                ours = body["Pod"]["metadata"]["namespace"] == namespace
                answer = [{"Host": n, "Score": 1} for n in body["NodeNames"]]
            else:  # bind
                ours = body["PodNamespace"] == namespace
                answer = {"Error": ""}
            if ours:
                seen.append((verb, subject["commonName"]))
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    chart_scheduler = one(objects, "Deployment", f"{RELEASE}-scheduler")["spec"]["template"]["spec"]
    scheduler_files = mounted_files(chart_scheduler, chart_scheduler["containers"][0])
    extender["urlPrefix"] = f"https://127.0.0.1:{server.server_address[1]}/scheduler"
    for field in ("caFile", "certFile", "keyFile"):
        extender["tlsConfig"][field] = str(secrets[scheduler_files[extender["tlsConfig"][field]]])
    config["leaderElection"] = {"leaderElect": False}
    path = tmp_path / "kube-scheduler-config.yaml"
    path.write_text(yaml.safe_dump(config))

    node = f"helm-{namespace}"
    control_plane.ready_node(node, {"helm-test": namespace}, {"cpu": "4", "memory": "8Gi", "pods": "10"})
    scheduler = control_plane.start_scheduler(path)
    try:
        control_plane.kubectl("run", "p", "-n", namespace, "--image=registry.invalid/none", "--overrides",
                              json.dumps({"spec": {"schedulerName": config["profiles"][0]["schedulerName"],
                                                   "nodeSelector": {"helm-test": namespace}}}))
        deadline = time.monotonic() + 60
        while ("bind", "walras-scheduler") not in seen and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        scheduler.stop()
        server.shutdown()
        control_plane.kubectl("delete", "node", node, "--wait=false", check=False)
    log = [line for line in scheduler.log.read_text(errors="replace").splitlines()
           if any(word in line for word in ("xtender", "x509", "tls", "TLS", "rror"))]
    assert ("filter", "walras-scheduler") in seen and ("bind", "walras-scheduler") in seen, (seen, "\n".join(log[-25:]))


def test_extender_exposure_defaults_to_loopback_without_the_charts_scheduler() -> None:
    """Direct mode, and extender mode with a scheduler of one's own: loopback, no Service port, no NetworkPolicy."""
    for values in ((), (("operator.mode", "extender"),)):
        objects = render(values)
        args = one(objects, "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--extender-host=127.0.0.1" in args
        assert not any(a.startswith(("--extender-tls", "--extender-client-ca")) for a in args)
        assert [p["name"] for p in one(objects, "Service")["spec"]["ports"]] == ["metrics"]
        assert not find(objects, "NetworkPolicy")


def test_network_policy_admits_the_extender_port_only_from_the_charts_scheduler() -> None:
    objects = all_on_objects()
    policy = one(objects, "NetworkPolicy", f"{RELEASE}-extender")
    operator_labels = one(objects, "Deployment", RELEASE)["spec"]["template"]["metadata"]["labels"]
    scheduler_labels = one(objects, "Deployment", f"{RELEASE}-scheduler")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= operator_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    extender_rule, open_rule = policy["spec"]["ingress"]
    assert extender_rule["ports"] == [{"port": 8888, "protocol": "TCP"}]
    (peer,) = extender_rule["from"]
    assert set(peer) == {"podSelector"}
    selector = peer["podSelector"]["matchLabels"]
    assert selector.items() <= scheduler_labels.items()
    assert not selector.items() <= operator_labels.items()  # the operator's own pods are not admitted
    assert "from" not in open_rule  # metrics (Prometheus, readiness probe) and health (liveness probe)
    assert open_rule["ports"] == [{"port": 9847, "protocol": "TCP"}, {"port": 8080, "protocol": "TCP"}]
    extra = render((*SCHEDULER_VALUES.items(),
                    ("extender.networkPolicy.extraFrom[0].namespaceSelector.matchLabels.team", "sched")))
    peers = one(extra, "NetworkPolicy")["spec"]["ingress"][0]["from"]
    assert peers[1] == {"namespaceSelector": {"matchLabels": {"team": "sched"}}}
    assert not find(render((*SCHEDULER_VALUES.items(), ("extender.networkPolicy.enabled", "false"))),
                    "NetworkPolicy")


# --- monitoring objects ---------------------------------------------------------------------------------------------


def test_service_monitor_scrapes_the_metrics_port_as_job_walras() -> None:
    objects = all_on_objects()
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) == {"jobLabel", "selector", "namespaceSelector", "endpoints"}
    service = one(objects, "Service")
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "walras"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert selector.items() <= service["spec"]["selector"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics" and endpoint["port"] == "metrics"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}


def test_prometheus_rule_embeds_the_rules_file_and_passes_promtool(tmp_path: Path) -> None:
    rule = one(all_on_objects(), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    source = yaml.safe_load((ROOT / "deploy" / "prometheus" / "walras-rules.yaml").read_text())
    assert rule["spec"] == source
    for group in rule["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules"}
        for r in group["rules"]:
            assert set(r) <= {"alert", "record", "expr", "for", "labels", "annotations", "keep_firing_for"}
    extracted = tmp_path / "rules.yaml"
    extracted.write_text(yaml.safe_dump(rule["spec"]))
    out = subprocess.run([require("promtool"), "check", "rules", str(extracted)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dashboard_configmap_carries_the_dashboard_for_the_sidecar() -> None:
    configmap = one(all_on_objects(), "ConfigMap", f"{RELEASE}-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    embedded = json.loads(configmap["data"]["walras-dashboard.json"])
    assert embedded == json.loads((ROOT / "deploy" / "grafana" / "walras-dashboard.json").read_text())
    for name, source in (("walras-dashboard.json", "deploy/grafana"), ("walras-rules.yaml", "deploy/prometheus")):
        copy = CHART / "files" / name
        assert not copy.is_symlink() and copy.read_bytes() == (ROOT / source / name).read_bytes(), name


def test_notes_render_for_both_modes() -> None:
    for values in ({}, ALL_ON):
        out = helm("install", RELEASE, str(CHART), "--dry-run=client", "--namespace", NAMESPACE, *set_args(values))
        assert out.returncode == 0, out.stderr
        notes = out.stdout.split("NOTES:", 1)[1]
        assert "kubectl apply -R -f examples/" in notes  # -R: the FungibleJobs are in examples/jobs/
        assert f"deployment/{RELEASE}" in notes
    assert "Second scheduler: walras-scheduler" in notes


def test_operator_args_parse_with_the_real_walras_run_parser() -> None:
    """The chart's container args are accepted by ``walras run``'s own argument parser (both renders)."""
    import argparse

    from walras.cli import run as run_command

    expected = {  # render -> (extender_host, extender_client_ca, peering, standalone)
        "defaults": ("127.0.0.1", None, "walras", False),
        "all-optional-parts": ("0.0.0.0", "/etc/walras/tls/client-ca.crt", "walras", False),
        "standalone": ("127.0.0.1", None, "walras", True),
        "lease-name": ("127.0.0.1", None, "my-lease", False),
    }
    renders = {"defaults": default_objects(), "all-optional-parts": all_on_objects(),
               "standalone": render((("peering.enabled", "false"),)),
               "lease-name": render((("peering.name", "my-lease"),))}
    for which, objects in renders.items():
        args = one(objects, "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"][0]["args"]
        parser = argparse.ArgumentParser(prog="walras", exit_on_error=False)
        run_command.add_parser(parser.add_subparsers(dest="command"))
        parsed = parser.parse_args(args)
        assert parsed.command == "run"
        assert parsed.metrics_port == 9847 and parsed.extender_port == 8888 and parsed.health_port == 8080
        assert (parsed.extender_host, parsed.extender_client_ca, parsed.peering, parsed.standalone) == expected[which]
        if which == "lease-name":
            assert lease_rules(objects)[1]["resourceNames"] == ["my-lease"]


def monitoring_errors(kind: str, obj: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator(MONITORING_SCHEMAS[kind])
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)]


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PrometheusRule"])
def test_monitoring_objects_validate_against_the_prometheus_operator_schema(kind: str) -> None:
    obj = one(all_on_objects(), kind)
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitoring_errors(kind, obj) == []


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("ServiceMonitor", ("spec", "endpointz"), []),
        ("ServiceMonitor", ("spec", "endpoints", 0, "port"), 9847),
        ("ServiceMonitor", ("spec", "selector", "matchLabelz"), {}),
        ("PrometheusRule", ("spec", "groups", 0, "rules", 0, "expresion"), "up"),
        ("PrometheusRule", ("spec", "groups", 0, "rules", 0, "expr"), ["up"]),
    ],
)
def test_the_prometheus_operator_schema_rejects_broken_objects(kind: str, path: tuple[Any, ...], value: Any) -> None:
    obj = copy.deepcopy(one(all_on_objects(), kind))
    node = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert monitoring_errors(kind, obj), f"{kind} with {path}={value!r} was accepted"


#: Field names of kubescheduler.config.k8s.io/v1 (k8s.io/kube-scheduler/config/v1: KubeSchedulerConfiguration,
#: LeaderElectionConfiguration, Extender, ExtenderTLSConfig, ExtenderManagedResource); kubernetes-validate has no
#: schema for this config API, so the sample is checked for unknown (misspelt) fields against these lists.
SCHEDULER_CONFIG_FIELDS = {
    "": {"apiVersion", "kind", "parallelism", "leaderElection", "clientConnection", "healthzBindAddress",
         "metricsBindAddress", "enableProfiling", "enableContentionProfiling", "percentageOfNodesToScore",
         "podInitialBackoffSeconds", "podMaxBackoffSeconds", "profiles", "extenders", "delayCacheUntilActive"},
    "leaderElection": {"leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock", "resourceName",
                       "resourceNamespace"},
    "extenders": {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
                  "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable"},
    "tlsConfig": {"insecure", "serverName", "certFile", "keyFile", "caFile", "certData", "keyData", "caData"},
    "managedResources": {"name", "ignoredByScheduler"},
    "profiles": {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"},
}


@pytest.mark.parametrize("which", ["sample", "all-optional-parts"])
def test_scheduler_config_uses_only_known_fields(which: str) -> None:
    if which == "sample":
        config = yaml.safe_load((ROOT / "deploy" / "scheduler" / "kube-scheduler-config.yaml").read_text())
    else:
        config = scheduler_config(all_on_objects())
    assert set(config) <= SCHEDULER_CONFIG_FIELDS[""]
    assert set(config["leaderElection"]) <= SCHEDULER_CONFIG_FIELDS["leaderElection"]
    for profile in config["profiles"]:
        assert set(profile) <= SCHEDULER_CONFIG_FIELDS["profiles"]
    for extender in config["extenders"]:
        assert set(extender) <= SCHEDULER_CONFIG_FIELDS["extenders"]
        assert set(extender.get("tlsConfig", {})) <= SCHEDULER_CONFIG_FIELDS["tlsConfig"]
        for resource in extender["managedResources"]:
            assert set(resource) <= SCHEDULER_CONFIG_FIELDS["managedResources"]
        assert isinstance(extender["weight"], int) and extender["weight"] > 0
        assert re.fullmatch(r"([0-9]+(\.[0-9]+)?(ms|s|m|h))+", extender["httpTimeout"])


# --- two releases, disruption budget, anti-affinity, image, runbooks (issue 18) ----------------------------------


def render_release(release: str, namespace: str, *values: tuple[str, str]) -> list[dict[str, Any]]:
    out = helm("template", release, str(CHART), "--namespace", namespace, *set_args(dict(values)))
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


#: Kinds without a namespace that a release's templates create (CRDs come from crds/, shared and never templated).
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "PriorityClass"}


def test_every_cluster_scoped_name_derives_from_the_release() -> None:
    """Two releases in one cluster must not share a cluster-scoped object (Helm refuses to adopt another release's
    object: 'invalid ownership metadata')."""
    all_on = tuple(ALL_ON.items())
    first = render_release("alpha", "team-a", *all_on)
    second = render_release("beta", "team-b", *all_on)
    names = [{(o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] in CLUSTER_SCOPED}
             for objs in (first, second)]
    assert ("ClusterRole", "alpha-walras") in names[0] and ("ClusterRole", "beta-walras") in names[1]
    assert names[0] & names[1] == set()
    for objs in (first, second):
        for o in objs:
            if o["kind"] in CLUSTER_SCOPED:
                assert o["metadata"]["name"].startswith(("alpha", "beta")), o["metadata"]["name"]
            assert o["apiVersion"] != "kopf.dev/v1"
    args = one(tuple(first), "Deployment", "alpha-walras")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--peering=alpha-walras" in args


def test_two_releases_in_one_namespace_elect_through_different_leases() -> None:
    """The Lease is namespaced but named after the release: two releases in one namespace never compete for it, and
    neither Role lets one release's operator touch the other's Lease."""
    leases = []
    names = []
    for release in ("alpha", "beta"):
        objects = render_release(release, "shared")
        deployment = one(tuple(objects), "Deployment", f"{release}-walras")
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        (lease,) = [a.split("=", 1)[1] for a in args if a.startswith("--peering=")]
        named = [r for r in lease_rules(objects) if "resourceNames" in r]
        assert [r["resourceNames"] for r in named] == [[lease]]
        leases.append(lease)
        names.append({(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] in ("Role", "RoleBinding")})
    assert leases == ["alpha-walras", "beta-walras"]
    assert names[0] and names[0] & names[1] == set()


def test_two_releases_install_into_a_real_api_server(control_plane: Any, tmp_path: Path) -> None:
    """``helm install`` twice (two releases, two namespaces) against a real kube-apiserver: no cluster-scoped object
    shared (Helm refuses to adopt another release's), each release's Lease Role in its namespace, no kopf object."""
    helm_bin = require("helm")
    env_kubeconfig = str(control_plane.kubeconfig)
    installed = []
    try:
        for release in ("rel-one", "rel-two"):
            out = subprocess.run([helm_bin, "install", release, str(CHART), "--namespace", f"ns-{release}",
                                  "--create-namespace", "--kubeconfig", env_kubeconfig, "--timeout", "60s"],
                                 capture_output=True, text=True, timeout=180, check=False)
            assert out.returncode == 0, out.stdout + out.stderr
            installed.append(release)
        roles = control_plane.get("roles", "-A")["items"]
        assert {("ns-rel-one", "rel-one-walras-leader-election"), ("ns-rel-two", "rel-two-walras-leader-election")} <= {
            (r["metadata"]["namespace"], r["metadata"]["name"]) for r in roles}
        crds = control_plane.get("crds")["items"]
        assert not [c for c in crds if c["spec"]["group"] == "kopf.dev"
                    and c["metadata"].get("annotations", {}).get("meta.helm.sh/release-name")]
        deployments = control_plane.get("deployments", "-A")["items"]
        for release in ("rel-one", "rel-two"):
            (deployment,) = [d for d in deployments if d["metadata"]["name"] == f"{release}-walras"]
            container = deployment["spec"]["template"]["spec"]["containers"][0]
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
            assert f"--peering={release}-walras" in container["args"]
    finally:
        for release in installed:
            subprocess.run([helm_bin, "uninstall", release, "--namespace", f"ns-{release}", "--kubeconfig",
                            env_kubeconfig, "--wait=false"], capture_output=True, text=True, timeout=120, check=False)


#: High availability: two operator replicas electing a leader through the Lease, the chart's own kube-scheduler (two
#: leader-elected replicas) with the mutual TLS it requires, and a PodDisruptionBudget that allows evicting both.
HA_VALUES = {**SCHEDULER_VALUES, "operator.replicas": "2", "scheduler.replicas": "2",
             "podDisruptionBudget.enabled": "true", "podDisruptionBudget.maxUnavailable": "2"}

@pytest.mark.parametrize("values", [{}, HA_VALUES], ids=["defaults", "ha"])
def test_install_and_uninstall_on_a_real_api_server_leave_only_what_the_docs_say(control_plane: Any,
                                                                                 values: dict[str, str],
                                                                                 tmp_path: Path) -> None:
    """``helm install`` into kube-apiserver v1.36 with the default and the HA values: every rendered object is
    accepted and present; ``helm uninstall`` then leaves nothing of the release but what docs/install.md section 7
    says: the CRDs (Helm never deletes ``crds/``) and the operator's Lease (the operator creates it; none runs here, as
    there is no kubelet); the namespace holds only what it held before the install (what kube-controller-manager puts
in every namespace; Events aside)."""
    cp = control_plane
    release = "ha" if values else "plain"
    ns = f"helm-{release}"
    kubeconfig = str(cp.kubeconfig)
    template = helm("template", release, str(CHART), "--namespace", ns, *set_args(values))
    assert template.returncode == 0, template.stderr
    rendered = [doc for doc in yaml.safe_load_all(template.stdout) if doc]
    for obj in rendered:  # the release namespace where the chart leaves it implicit (kube-system is explicit)
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"):
            obj["metadata"].setdefault("namespace", ns)
    (tmp_path / "rendered.yaml").write_text(yaml.safe_dump_all(rendered))
    expected = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in rendered)
    assert "Deployment/" + f"{release}-walras" in expected
    if values:
        assert {"PodDisruptionBudget/ha-walras", "Deployment/ha-walras-scheduler"} <= set(expected)

    def present() -> list[str]:
        out = cp.kubectl("get", "-f", str(tmp_path / "rendered.yaml"), "--ignore-not-found", "-o", "json")
        return sorted(f"{o['kind']}/{o['metadata']['name']}" for o in json.loads(out.stdout or "{}").get("items", []))

    def namespace_contents() -> set[tuple[str, str]]:
        kinds = cp.kubectl("api-resources", "--verbs=list", "--namespaced", "-o", "name").stdout.split()
        kinds = [k for k in kinds if k not in ("events", "events.events.k8s.io")]
        items = json.loads(cp.kubectl("get", ",".join(kinds), "-n", ns, "-o", "json").stdout)["items"]
        return {(o["kind"], o["metadata"]["name"]) for o in items}

    cp.kubectl("create", "namespace", ns)
    try:
        # what the namespace holds before the install (kube-controller-manager fills a new namespace in a moment)
        deadline = time.monotonic() + 60
        while ("ServiceAccount", "default") not in (before := namespace_contents()) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1.0)
        before = namespace_contents()
        out = subprocess.run([require("helm"), "install", release, str(CHART), "--namespace", ns,
                              "--kubeconfig", kubeconfig, "--timeout", "60s", *set_args(values)],
                             capture_output=True, text=True, timeout=180, check=False)
        assert out.returncode == 0, out.stdout + out.stderr
        assert present() == expected
        out = subprocess.run([require("helm"), "uninstall", release, "--namespace", ns, "--kubeconfig", kubeconfig,
                              "--wait", "--timeout", "60s"], capture_output=True, text=True, timeout=120, check=False)
        assert out.returncode == 0, out.stdout + out.stderr
        assert present() == []
        # the Deployments' ReplicaSets and Pods go through the garbage collector, a moment after the uninstall
        deadline = time.monotonic() + 60
        while (left := namespace_contents() - before) and time.monotonic() < deadline:
            time.sleep(1)
        assert left == set()
        crds = {c["metadata"]["name"] for c in cp.get("crds")["items"]}
        assert {"fungiblejobs.walras.dev", "resourcepools.walras.dev", "colocationprofiles.walras.dev"} <= crds
    finally:
        subprocess.run([require("helm"), "uninstall", release, "--namespace", ns, "--kubeconfig", kubeconfig,
                        "--ignore-not-found"], capture_output=True, text=True, timeout=120, check=False)
        cp.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false", check=False)


def test_pod_disruption_budget_is_off_by_default_and_never_blocks_the_leader() -> None:
    """Only the Lease holder is Ready and a budget counts Ready pods: a budget below the replica count would never
    allow evicting the leader, so it is off by default and refused below ``operator.replicas``."""
    assert not find(default_objects(), "PodDisruptionBudget")
    objects = render((("podDisruptionBudget.enabled", "true"),))
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    pod_labels = one(objects, "Deployment", RELEASE)["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    two = render((("podDisruptionBudget.enabled", "true"), ("operator.replicas", "2"),
                  ("podDisruptionBudget.maxUnavailable", "2")))
    assert one(two, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 2
    percent = render((("podDisruptionBudget.enabled", "true"), ("operator.replicas", "2"),
                      ("podDisruptionBudget.maxUnavailable", "100%")))
    assert one(percent, "PodDisruptionBudget")["spec"]["maxUnavailable"] == "100%"


def _affinity(*values: tuple[str, str]) -> dict[str, Any]:
    spec = one(render(tuple(values)), "Deployment", RELEASE)["spec"]["template"]["spec"]
    return dict(spec.get("affinity") or {})


def test_replicas_spread_over_nodes_by_default() -> None:
    pod_labels = one(default_objects(), "Deployment", RELEASE)["spec"]["template"]["metadata"]["labels"]
    soft = _affinity()["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    term = soft[0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    hard = _affinity(("operator.podAntiAffinity", "hard"))["podAntiAffinity"]
    assert hard["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert _affinity(("operator.podAntiAffinity", "")) == {}
    custom = _affinity(("operator.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                        ".nodeSelectorTerms[0].matchExpressions[0].key", "pool"),
                       ("operator.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                        ".nodeSelectorTerms[0].matchExpressions[0].operator", "Exists"))
    assert set(custom) == {"nodeAffinity"}


def test_default_image_is_what_the_dockerfile_builds_with_the_chart_app_version() -> None:
    import tomllib

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version
    image = one(default_objects(), "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"walras:{chart['appVersion']}"
    assert f"docker build -t walras:{chart['appVersion']} ." in (ROOT / "Dockerfile").read_text()
    install = (ROOT / "docs" / "install.md").read_text()
    assert "docker build -t" in install and "docker push" in install and "image.repository" in install


def test_runbook_urls_follow_the_configured_base() -> None:
    rule = one(render((("metrics.prometheusRule.enabled", "true"),
                       ("metrics.prometheusRule.runbookBaseURL", "https://wiki.example/walras"))), "PrometheusRule")
    urls = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert urls and all(u.startswith("https://wiki.example/walras#walras") for u in urls)


def test_pool_selector_reaches_the_args_as_one_argument() -> None:
    """``operator.poolSelector`` becomes ``walras run --pool-selector`` (docs/tasks/two-releases.md), one argument
    even with commas, spaces and parentheses; unset, no flag (every pool no other release claimed)."""
    from walras.cli.run import pool_selector

    def args(*values: tuple[str, str]) -> list[str]:
        deployment = one(tuple(render_release("team-a", "walras-a", *values)), "Deployment", "team-a-walras")
        return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])

    assert not [a for a in args() if a.startswith("--pool-selector")]
    text = "walras.dev/release in (team-a, team-a2),!legacy"
    escaped = text.replace(",", "\\,")  # helm --set splits on unescaped commas
    (flag,) = [a for a in args(("operator.poolSelector", escaped)) if a.startswith("--pool-selector")]
    assert flag == f"--pool-selector={text}"
    parsed = pool_selector(type("Args", (), {"pool_selector": flag.split("=", 1)[1]})())  # type: ignore[arg-type]
    assert parsed is not None and parsed.matches({"walras.dev/release": "team-a2"}) and not parsed.matches({})
