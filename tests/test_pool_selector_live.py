"""Two Walras releases on one real kube-apiserver (``walras run --pool-selector``, walras.operator.ownership,
docs/tasks/two-releases.md): with disjoint selectors each release claims, plans and creates the pods of its own
pools only; a third release whose selector overlaps both refuses them (a Warning Event ``OwnedByAnotherRelease``),
creates no pod, and no pool or job status flips while the three run (no write at all over 20 s of an unchanged
cluster)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from test_ha_support import ROOT, Replica, wait_until
from walras.operator.ownership import ANNOTATION_PLANNED_BY, OWNED_BY_ANOTHER_RELEASE


class Release(Replica):
    """One release's operator (one replica): ``walras run`` in direct mode with its own Lease and pool selector."""

    def __init__(self, kubeconfig: Path, workdir: Path, lease: str, selector: str, namespace: str) -> None:
        super().__init__(kubeconfig, workdir, lease, mode="direct", lease_duration=3.0)
        self.extra = ["--peering", lease, "--pool-selector", selector, "--namespace", namespace]

    def start(self) -> Release:
        self.log = self.log.with_name(f"release-{self.identity}-{time.monotonic_ns()}.log")
        cmd = [sys.executable, str(ROOT / "tests" / "test_ha_support.py"), "replica", "--identity", self.identity,
               "--lease-duration", str(self.lease_duration), "run", "--mode", self.mode, "--kubeconfig",
               str(self.kubeconfig), "--extender-port", str(self.extender_port), "--debounce", "0.1",
               "--plan-period", "2", *self.extra]
        env = {**__import__("os").environ, "WALRAS_NAMESPACE": "default", "WALRAS_LOG_LEVEL": "INFO"}
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        return self


def _pool(name: str, team: str, gpu: str) -> dict[str, Any]:
    return {"apiVersion": "walras.dev/v1alpha1", "kind": "ResourcePool",
            "metadata": {"name": name, "labels": {"walras.dev/release": team}},
            "spec": {"nodeSelector": {"sel.walras.dev/gpu": gpu}, "resource": "nvidia.com/gpu", "degreeLimit": 4,
                     "policy": {"type": "utility"}}}


def _job(name: str, ns: str, throughput: dict[str, float], count: int) -> dict[str, Any]:
    return {"apiVersion": "walras.dev/v1alpha1", "kind": "FungibleJob", "metadata": {"name": name, "namespace": ns},
            "spec": {"throughput": throughput, "utility": {"type": "linear"}, "demand": 1, "replicas": {"count": count},
                     "template": {"spec": {"containers": [{"name": "c", "image": "registry.invalid/x:1"}]}}}}


def test_two_releases_plan_disjoint_pools_and_an_overlapping_one_refuses(control_plane: Any, namespace: str,
                                                                         tmp_path: Path) -> None:
    cp, ns = control_plane, namespace
    cp.kubectl("apply", "-f", str(ROOT / "crds"))
    cp.kubectl("wait", "--for=condition=Established", "crd/resourcepools.walras.dev", "--timeout=60s")
    pa, pb = f"{ns}-pa", f"{ns}-pb"
    for gpu in ("a", "b"):
        cp.ready_node(f"{ns}-node-{gpu}", {"sel.walras.dev/gpu": f"{ns}-{gpu}"},
                      {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "4", "pods": "110"})
    cp.apply_objects([_pool(pa, f"{ns}-a", f"{ns}-a"), _pool(pb, f"{ns}-b", f"{ns}-b"),
                      _job("ja", ns, {pa: 2.0, pb: 1.0}, 2),  # home pool pa: release A plans it (on pa only)
                      _job("jb", ns, {pb: 1.0}, 1)])
    lease_a, lease_b, lease_c = f"{ns}-rel-a", f"{ns}-rel-b", f"{ns}-rel-c"
    releases = [Release(cp.kubeconfig, tmp_path, lease_a, f"walras.dev/release={ns}-a", ns).start(),
                Release(cp.kubeconfig, tmp_path, lease_b, f"walras.dev/release in ({ns}-b)", ns).start()]

    def pods() -> dict[str, list[dict[str, Any]]]:
        by_job: dict[str, list[dict[str, Any]]] = {}
        for pod in cp.get("pods", "-n", ns)["items"]:
            by_job.setdefault(pod["metadata"]["labels"].get("walras.dev/job", ""), []).append(pod)
        return by_job

    def bound() -> dict[str, list[dict[str, Any]]] | None:
        for r in releases:
            assert r.alive(), r.output()[-4000:]
        now = pods()
        placed = {job: [p for p in now.get(job, []) if p["spec"].get("nodeName")] for job in ("ja", "jb")}
        return now if len(placed["ja"]) == 2 and len(placed["jb"]) == 1 else None

    try:
        first = wait_until(bound, 240, "release A's 2 pods of ja and release B's pod of jb bound", interval=0.5)
        annotations = {p: (cp.get("resourcepool", p)["metadata"].get("annotations") or {}) for p in (pa, pb)}
        assert annotations[pa].get(ANNOTATION_PLANNED_BY) == f"default/{lease_a}"
        assert annotations[pb].get(ANNOTATION_PLANNED_BY) == f"default/{lease_b}"
        assert {p["spec"]["nodeName"] for p in first["ja"]} == {f"{ns}-node-a"}  # ja only on A's pool
        assert {p["spec"]["nodeName"] for p in first["jb"]} == {f"{ns}-node-b"}
        wait_until(lambda: all(cp.get("resourcepool", p).get("status") for p in (pa, pb)), 60, "both pools' status")

        releases.append(Release(cp.kubeconfig, tmp_path, lease_c,
                                f"walras.dev/release in ({ns}-a, {ns}-b)", ns).start())

        def refused() -> set[str]:
            assert releases[2].alive(), releases[2].output()[-4000:]
            events = cp.get("events", "-A", "--field-selector", f"reason={OWNED_BY_ANOTHER_RELEASE}")["items"]
            return {e["involvedObject"]["name"] for e in events if lease_c in e.get("message", "")}

        wait_until(lambda: refused() >= {pa, pb}, 240, "release C to refuse both pools", interval=1.0)
        time.sleep(4)  # C's next plans (period 2 s) run meanwhile
        versions = {(kind, name): cp.get(kind, name, *([] if kind == "resourcepool" else ["-n", ns]))
                    ["metadata"]["resourceVersion"] for kind, name in
                    (("resourcepool", pa), ("resourcepool", pb), ("fungiblejob", "ja"), ("fungiblejob", "jb"))}
        uids = {job: sorted(p["metadata"]["uid"] for p in first[job]) for job in ("ja", "jb")}
        time.sleep(20)
        for (kind, name), version in versions.items():
            obj = cp.get(kind, name, *([] if kind == "resourcepool" else ["-n", ns]))
            assert obj["metadata"]["resourceVersion"] == version, (kind, name, json.dumps(obj.get("status"))[:2000])
        assert (cp.get("resourcepool", pa)["metadata"]["annotations"][ANNOTATION_PLANNED_BY] == f"default/{lease_a}")
        assert (cp.get("resourcepool", pb)["metadata"]["annotations"][ANNOTATION_PLANNED_BY] == f"default/{lease_b}")
        now = pods()
        assert {job: sorted(p["metadata"]["uid"] for p in now.get(job, [])) for job in ("ja", "jb")} == uids
        assert set(now) <= {"ja", "jb"}, sorted(now)  # no pod created twice, none by release C
        for r in releases:
            assert r.alive(), r.output()[-4000:]
    finally:
        for r in releases:
            r.stop()
        for kind, name in (("resourcepool", pa), ("resourcepool", pb), ("node", f"{ns}-node-a"),
                           ("node", f"{ns}-node-b")):
            cp.kubectl("delete", kind, name, "--ignore-not-found", "--wait=false", check=False)
        for lease in (lease_a, lease_b, lease_c):
            cp.kubectl("delete", "lease", lease, "-n", "default", "--ignore-not-found", check=False)
