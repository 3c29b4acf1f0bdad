"""A real Kubernetes control plane for the tests (no pytest in here: usable from scripts too).

:class:`ControlPlane` wraps :class:`walras_testbed.kubelet.controlplane.LocalControlPlane` (etcd, kube-apiserver and
kube-controller-manager from ``$KUBEBUILDER_ASSETS`` on loopback ports, RBAC, service-account tokens; see that module)
with what tests need: the real ``kubectl``, a kube-scheduler per test with a given KubeSchedulerConfiguration, a
kubeconfig for the chart's ServiceAccount with the chart's RBAC applied (``helm template helm/walras``), and the API
server's own record of the writes the operator sends: kube-apiserver runs with an audit policy (:data:`AUDIT_POLICY`)
that logs, at level ``Metadata``, every write by a ServiceAccount of the chart's namespace ``walras-system`` and
nothing else, and :meth:`ControlPlane.audited_writes` reads it back (``e2e/test_e2e_quiet.py`` counts them).

Where the binaries come from: ``$KUBEBUILDER_ASSETS`` (``make test`` / ``make controlplane`` unpack
``../shared/k8s/*.tar.xz`` into ``.tools/k8s/bin`` and export it), else ``.tools/k8s/bin`` when it holds them (so a
plain ``.venv/bin/pytest`` after ``make controlplane`` finds them too).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from walras_testbed.kubelet.controlplane import BINARIES, HOW_TO_GET, LocalControlPlane, Process, find_binaries

ROOT = Path(__file__).resolve().parents[1]
LOCAL_ASSETS = ROOT / ".tools" / "k8s" / "bin"
CHART = ROOT / "helm" / "walras"
#: The kinds of the chart that make up its identity and permissions.
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
#: The namespace of the chart's identity in the tests (:func:`install_chart_identity`'s default).
CHART_NAMESPACE = "walras-system"
#: Writes in the sense of the audit log: every verb that can change an object.
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")
#: kube-apiserver's audit policy (``--audit-policy-file``): one event per write request (stage ``ResponseComplete``;
#: a refused request is logged too) of any ServiceAccount of :data:`CHART_NAMESPACE`, at level ``Metadata`` (who, verb,
#: object, response code; no bodies); everything else, reads and watches included, is not logged.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [{"level": "Metadata", "userGroups": [f"system:serviceaccounts:{CHART_NAMESPACE}"],
               "verbs": list(WRITE_VERBS)},
              {"level": "None"}]}


@dataclass(frozen=True)
class AuditedWrite:
    """One write request as kube-apiserver's audit log records it."""

    user: str
    verb: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int

    def __str__(self) -> str:
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.verb} {what} {where} -> {self.code} by {self.user}"


def assets_folder() -> tuple[Path | None, list[str]]:
    """``(folder, missing binaries)``: ``$KUBEBUILDER_ASSETS``, else ``.tools/k8s/bin``."""
    if os.environ.get("KUBEBUILDER_ASSETS"):
        return find_binaries()
    if LOCAL_ASSETS.is_dir():
        return find_binaries(LOCAL_ASSETS)
    return None, list(BINARIES)


def missing_message(missing: list[str]) -> str:
    where = os.environ.get("KUBEBUILDER_ASSETS") or "KUBEBUILDER_ASSETS unset"
    return f"Kubernetes control-plane binaries missing ({', '.join(missing)}; {where}): {HOW_TO_GET}"


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl call; the message includes kubectl's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr}"


@dataclass
class ControlPlane:
    """A running control plane: admin kubeconfig, API server URL, admin token, its CA and its folder."""

    kubeconfig: Path
    server: str
    token: str
    ca_file: Path
    workdir: Path
    kubectl_bin: str
    plane: LocalControlPlane = field(repr=False)

    @classmethod
    def start(cls, kubectl_bin: str, workdir: Path | None = None, binaries: Path | None = None) -> ControlPlane:
        """Start a control plane in ``workdir`` (a fresh temporary folder by default) whose API server audits by
        :data:`AUDIT_POLICY` into ``WORKDIR/audit.log``."""
        workdir = (workdir or Path(tempfile.mkdtemp(prefix="walras-k8s-"))).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY, sort_keys=False))
        plane = LocalControlPlane.start(workdir, binaries, apiserver_args=(
            "--audit-policy-file", str(workdir / "audit-policy.yaml"), "--audit-log-path", str(workdir / "audit.log"),
            "--audit-log-format", "json", "--audit-log-mode", "blocking"))
        return cls(plane.kubeconfig, plane.server, plane.token, plane.ca_file, plane.workdir, kubectl_bin, plane)

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    def audit_mark(self) -> int:
        """Where the audit log ends now (its size in bytes): the ``since`` of a later :meth:`audited_writes`."""
        return self.audit_log.stat().st_size if self.audit_log.exists() else 0

    def audited_writes(self, since: int = 0, user: str | None = None) -> list[AuditedWrite]:
        """The writes the API server logged after byte ``since`` of its audit log (see :data:`AUDIT_POLICY`), in
        order, by ``user`` only when given (e.g. ``system:serviceaccount:walras-system:walras``). The log backend
        runs in ``blocking`` mode: a request's event is in the file before its response is sent."""
        if not self.audit_log.exists():
            return []
        with self.audit_log.open("rb") as log:
            log.seek(since)
            lines = log.read().splitlines()
        out = []
        for line in lines:
            event = json.loads(line)
            ref = event.get("objectRef") or {}
            write = AuditedWrite(user=event["user"]["username"], verb=event["verb"], resource=ref.get("resource", ""),
                                 subresource=ref.get("subresource", ""), namespace=ref.get("namespace", ""),
                                 name=ref.get("name", ""), code=int((event.get("responseStatus") or {}).get("code", 0)))
            if user is None or write.user == user:
                out.append(write)
        return out

    def stop(self) -> None:
        self.plane.stop()

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True, kubeconfig: Path | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl against this control plane (as admin unless ``kubeconfig`` says otherwise)."""
        env = {**os.environ, "KUBECONFIG": str(kubeconfig or self.kubeconfig),
               "KUBECACHEDIR": str(self.workdir / "kubectl-cache")}
        proc = subprocess.run([self.kubectl_bin, *args], input=stdin, capture_output=True, text=True, env=env,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, ["kubectl", *args], proc.stdout, proc.stderr)
        return proc

    def get(self, *args: str) -> Any:
        """``kubectl get ARGS -o json``, decoded."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply_objects(self, objects: list[dict[str, Any]], kubeconfig: Path | None = None) -> None:
        if objects:
            self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects), kubeconfig=kubeconfig)

    def ready_node(self, name: str, labels: dict[str, str], allocatable: dict[str, str]) -> None:
        """Create the Node ``name`` (``labels``; capacity = allocatable = ``allocatable``) and make it Ready and
        schedulable now, as a kubelet would: its status gets ``Ready=True`` and the ``node.kubernetes.io/not-ready``
        taint that the API server puts on every new Node (TaintNodesByCondition) is removed here rather than waiting for
        the node lifecycle controller, which lifts it on its next pass (a planner that reads the Node before that pass
        sees a tainted node; a test that does so races the controller). Tests that need heartbeats use the kubelet
        stand-in (:mod:`walras_testbed.kubelet`) instead."""
        import time

        self.kubectl("create", "-f", "-", stdin=json.dumps({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels)}}))
        status = {"capacity": dict(allocatable), "allocatable": dict(allocatable),
                  "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test"}]}
        self.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p",
                     json.dumps({"status": status}))
        deadline = time.monotonic() + 30
        while True:
            taints = [t for t in self.get("node", name)["spec"].get("taints", [])
                      if t["key"] == "node.kubernetes.io/not-ready"]
            if not taints:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"node {name} keeps its not-ready taint: {taints}")
            for taint in taints:
                self.kubectl("taint", "node", name, f"{taint['key']}:{taint['effect']}-", check=False)

    def request(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        """One raw API call (admin unless ``token``): ``(status, decoded body)``."""
        return self.plane.request(method, path, body, token)

    def start_scheduler(self, config: Path | None = None) -> Process:
        """A kube-scheduler with the KubeSchedulerConfiguration ``config``; ``.stop()`` it at the end of the test."""
        return self.plane.start_scheduler(config)

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path | None = None) -> Path:
        """A kubeconfig with a TokenRequest token of ServiceAccount ``namespace/name``."""
        path = path or self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        return self.plane.service_account_kubeconfig(path, namespace, name)

    def impersonating_kubeconfig(self, user: str, groups: tuple[str, ...] = (), path: Path | None = None) -> Path:
        """An admin kubeconfig that impersonates ``user`` (kubectl honours ``as``/``as-groups``)."""
        path = path or self.workdir / f"as-{user.replace(':', '-')}.kubeconfig"
        doc = yaml.safe_load(self.kubeconfig.read_text())
        doc["users"][0]["user"]["as"] = user
        if groups:
            doc["users"][0]["user"]["as-groups"] = list(groups)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path


def render_chart(helm_bin: str, namespace: str, *values: str, release: str = "walras") -> list[dict[str, Any]]:
    """``helm template RELEASE helm/walras --namespace NAMESPACE --set VALUE ...``, as objects."""
    args = [helm_bin, "template", release, str(CHART), "--namespace", namespace]
    for value in values:
        args += ["--set", value]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def install_chart_identity(cp: ControlPlane, helm_bin: str, namespace: str = CHART_NAMESPACE,
                           *values: str) -> tuple[Path, list[dict[str, Any]]]:
    """Create ``namespace``, apply the chart's ServiceAccounts and RBAC (nothing else), and return a kubeconfig of
    the operator's ServiceAccount (a TokenRequest token) with the rendered chart."""
    objects = render_chart(helm_bin, namespace, *values)
    cp.kubectl("create", "namespace", namespace, check=False)
    rbac = [o for o in objects if o.get("kind") in RBAC_KINDS]
    cp.apply_objects(rbac)
    operator_sa = next(o for o in rbac if o["kind"] == "ServiceAccount"
                       and o["metadata"].get("labels", {}).get("app.kubernetes.io/component", "operator") == "operator")
    return cp.service_account_kubeconfig(namespace, operator_sa["metadata"]["name"]), objects


def scheduler_config_from_chart(objects: list[dict[str, Any]], extender_url: str, kubeconfig: Path,
                                path: Path, leader_election: bool = False) -> Path:
    """The chart's KubeSchedulerConfiguration (ConfigMap ``*-scheduler``) with the extender's ``urlPrefix`` pointed
    at ``extender_url`` and ``clientConnection.kubeconfig`` set; the chart's leader election kept when
    ``leader_election``, else switched off. An ``http://`` URL (an extender on loopback) also drops the chart's
    ``enableHTTPS``/``tlsConfig`` (mutual TLS with files mounted from Secrets in the cluster); profile, verbs,
    weight, ``nodeCacheCapable``, ``ignorable`` and timeouts stay as the chart renders them."""
    cm = next(o for o in objects if o.get("kind") == "ConfigMap" and "kube-scheduler-config.yaml" in o.get("data", {}))
    doc = yaml.safe_load(cm["data"]["kube-scheduler-config.yaml"])
    for ext in doc.get("extenders", []):
        ext["urlPrefix"] = extender_url
        if extender_url.startswith("http://"):
            ext["enableHTTPS"] = False
            ext.pop("tlsConfig", None)
    doc["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    if not leader_election:
        doc["leaderElection"] = {"leaderElect": False}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


_SESSION: ControlPlane | None = None


def session_control_plane(kubectl_bin: str) -> ControlPlane:
    """The one control plane of this process (started on first use, stopped by :func:`stop_session_control_plane`
    or at exit), shared by the ``control_plane`` fixtures of ``tests/`` and ``e2e/``."""
    global _SESSION
    if _SESSION is None or not _SESSION.plane.alive():
        folder, missing = assets_folder()
        if folder is None or missing:
            raise FileNotFoundError(missing_message(missing))
        _SESSION = ControlPlane.start(kubectl_bin, binaries=folder)
    return _SESSION


def stop_session_control_plane() -> None:
    global _SESSION
    if _SESSION is not None:
        _SESSION.stop()
        _SESSION = None
