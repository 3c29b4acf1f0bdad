"""In-place resize on kube-apiserver v1.36 (the session's control plane, the kubelet stand-in as the node): the
operator's write (:meth:`walras.operator.KubeClient.resize_pod`, a strategic-merge patch of ``pods/{name}/resize``) is
accepted and changes the running pod's spec (same uid, new ``resourceVersion``, new requests and limits, which the
node then reports), while the same change as a plain PATCH of the pod is refused by the real server (pod spec
resources are immutable outside the sub-resource). The whole job-level path (FungibleJob resources changed -> the
operator resizes its running pods) runs on the real control plane in
``e2e/test_e2e_direct.py::test_changed_resources_resize_running_pods_in_place``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from walras.kube.client import KubeClient, KubeConfig
from walras_testbed.kubelet.runner import KubeletThread

from tests.controlplane import ControlPlane


def _resources(pod: dict[str, Any]) -> dict[str, Any]:
    return dict(pod["spec"]["containers"][0].get("resources") or {})


def test_pods_resize_changes_a_running_pod_and_a_plain_patch_is_refused(control_plane: ControlPlane,
                                                                        namespace: str) -> None:
    cp, ns = control_plane, namespace
    node = f"{ns}-resize"
    kubelet = KubeletThread(cp.kubeconfig, [{"metadata": {"name": node, "labels": {}},
                                             "status": {"capacity": {"cpu": "8", "memory": "16Gi", "pods": "10"}}}],
                            lease_interval=5.0, status_interval=10.0).start()
    try:
        pods = f"/api/v1/namespaces/{ns}/pods"
        status, created = cp.request("POST", pods, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "worker"},
            "spec": {"nodeName": node, "containers": [{
                "name": "main", "image": "registry.invalid/worker:1",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}]}})
        assert status == 201, created
        deadline = time.monotonic() + 30
        while (pod := cp.request("GET", f"{pods}/worker")[1])["status"].get("phase") != "Running":
            assert time.monotonic() < deadline, pod["status"]
            time.sleep(0.1)
        before = pod
        wanted = {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}

        # a plain PATCH of the pod's spec resources: the real server refuses it (only pods/resize may change them)
        status, refused = cp.plane.request("PATCH", f"{pods}/worker",
                                           {"spec": {"containers": [{"name": "main", "resources": wanted}]}},
                                           content_type="application/strategic-merge-patch+json")
        assert status == 422 and refused["reason"] == "Invalid", (status, refused)
        assert "pod updates may not change fields" in refused["message"], refused["message"]
        assert _resources(cp.request("GET", f"{pods}/worker")[1]) == _resources(before)

        # the operator's write, through pods/resize
        async def resize() -> tuple[bool, bool]:
            client = KubeClient(KubeConfig(server=cp.server, token=cp.token, ca_path=str(cp.ca_file)))
            try:
                served = await client.supports_pod_resize()
                return served, await client.resize_pod(ns, "worker", [{"name": "main", "resources": wanted}])
            finally:
                await client.close()

        assert asyncio.run(resize()) == (True, True)
        after = cp.request("GET", f"{pods}/worker")[1]
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        assert int(after["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
        assert after["spec"]["nodeName"] == node
        assert _resources(after) == wanted, _resources(after)
        # the node (kubelet stand-in) applies the resize: the container status reports the new requests
        deadline = time.monotonic() + 30
        while True:
            pod = cp.request("GET", f"{pods}/worker")[1]
            statuses = pod["status"].get("containerStatuses") or [{}]
            if ((statuses[0].get("resources") or {}).get("requests") or {}).get("cpu") == "2":
                break
            assert time.monotonic() < deadline, pod["status"]
            time.sleep(0.2)
    finally:
        cp.request("DELETE", f"/api/v1/namespaces/{ns}/pods/worker?gracePeriodSeconds=0")
        kubelet.stop(delete_nodes=True)
