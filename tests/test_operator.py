"""walras.operator: translations, the API client's retries against the emulator, and the kopf operator end to end
with a stand-in planner (the real planner is tested in the planner's own tests and in e2e/).

The stand-in planner below is deliberately trivial and lives here only to drive the operator: job ``j`` wants
``metadata.annotations["test/replicas"]`` pods named ``j-0, j-1, ...`` on the alphabetically first node, with the
requests from ``test/cpu``; surplus pods are deleted, bound pods kept (or resized when ``test/cpu`` changed).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import glob
from pathlib import Path
from typing import Any

import pytest
import yaml
from walras.kube.client import KubeClient, KubeConfig, RetryPolicy
from walras.kube.encode import pod_manifest, status_patch
from walras.kube.errors import Conflict, InternalError
from walras.kube.snapshot import fingerprint, snapshot_from
from walras.metrics import WalrasMetrics
from walras.operator import Controller, IndexSource, OperatorOptions, run_operator
from walras.planner.cluster import Cluster
from walras.planner.model import JobPlan, Plan, PodPlan, PoolPlan
from walras_testbed.emulator import Emulator, Fault
from walras_testbed.emulator.store import Store

ROOT = Path(__file__).resolve().parents[1]
POD = ("", "v1", "pods")
JOB = ("walras.dev", "v1alpha1", "fungiblejobs")
POOL = ("walras.dev", "v1alpha1", "resourcepools")


def job_obj(name: str, replicas: int, cpu: str = "1", ns: str = "default") -> dict[str, Any]:
    return {"apiVersion": "walras.dev/v1alpha1", "kind": "FungibleJob",
            "metadata": {"name": name, "namespace": ns, "annotations": {"test/replicas": str(replicas),
                                                                        "test/cpu": cpu}},
            "spec": {"throughput": {"p": 1.0}, "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]}}}}


def stand_in_planner(store: Store) -> Any:
    """The stand-in planner of the module docstring, as the controller calls a planner (a typed cluster, the previous
    plan, the caller's caches): the jobs' ``test/*`` annotations are read from ``store`` (the typed cluster does not
    carry annotations), everything else from the cluster."""

    def plan(cluster: Cluster, previous: Plan | None, **_: Any) -> Plan:
        node = sorted(n.name for n in cluster.nodes)[0]
        pools = {pool.name: PoolPlan(pool.name, "cpu", "utility", len(cluster.nodes), (node,), 8.0, 1.0, 0.25, 0.125)
                 for pool in cluster.pools}
        annotations = {(j["metadata"]["namespace"], j["metadata"]["name"]): j["metadata"]["annotations"]
                       for j in store.list(store.types[JOB], None)}
        existing = {pod.key: pod for pod in cluster.pods}
        jobs: dict[tuple[str, str], JobPlan] = {}
        all_pods: list[PodPlan] = []
        for job in cluster.jobs:
            ns, name = job.key
            marks = annotations.get(job.key)
            if marks is None:  # deleted since the snapshot
                continue
            want, cpu = int(marks["test/replicas"]), marks["test/cpu"]
            pods = []
            for i in range(want):
                pp = PodPlan(ns, f"{name}-{i}", name, "p", node, {"cpu": cpu}, {"cpu": cpu}, "create")
                current = existing.get((ns, pp.name))
                if current is not None:
                    if current.node is None:
                        action = "bind"
                    elif dict(current.first[0]).get("cpu") != cpu:
                        action = "resize"
                    else:
                        action = "keep"
                    pp = dataclasses.replace(pp, exists=True, action=action)
                pods.append(pp)
            for (pns, pname), pod in existing.items():
                if pns == ns and pod.job == name and int(pname.rsplit("-", 1)[1]) >= want:
                    pods.append(PodPlan(ns, pname, name, "p", None, action="delete", exists=True))
            jobs[(ns, name)] = JobPlan(ns, name, "Running", {"p": 1.0}, {"p": want}, float(want), 1.0, 0.25,
                                       pods=tuple(pods))
            all_pods.extend(pods)
        return Plan(pools=pools, jobs=jobs, pods=tuple(all_pods))

    return plan


# ---------------------------------------------------------------------------------------------- translations


def test_pod_manifest_from_template() -> None:
    job = job_obj("resnet", 1)
    job["metadata"]["uid"] = "uid-1"
    pp = PodPlan("default", "resnet-0", "resnet", "v100", "gpu-1", {"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "1"})
    pod = pod_manifest(job, pp, "walras-scheduler")
    assert pod["metadata"]["labels"] == {"app": "resnet", "walras.dev/job": "resnet", "walras.dev/pool": "v100",
                                         "walras.dev/managed": "true"}
    assert pod["metadata"]["annotations"]["walras.dev/planned-node"] == "gpu-1"
    assert pod["metadata"]["ownerReferences"][0] == {
        "apiVersion": "walras.dev/v1alpha1", "kind": "FungibleJob", "name": "resnet", "uid": "uid-1",
        "controller": True, "blockOwnerDeletion": True}
    assert pod["spec"]["schedulerName"] == "walras-scheduler"
    assert pod["spec"]["containers"][0]["resources"] == {"requests": {"nvidia.com/gpu": "1"},
                                                         "limits": {"nvidia.com/gpu": "1"}}
    assert "resources" not in job["spec"]["template"]["spec"]["containers"][0]  # the job is not mutated
    del job["metadata"]["uid"]
    with pytest.raises(ValueError, match="uid"):
        pod_manifest(job, pp, "walras-scheduler")


def test_status_patch_nulls_stale_keys_and_skips_equal() -> None:
    current = {"phase": "Running", "allocation": {"a": 0.5, "b": 0.5}, "kopf": {"x": 1}}
    desired = {"phase": "Running", "allocation": {"a": 1.0}}
    assert status_patch(current, desired) == {"status": {"phase": "Running", "allocation": {"a": 1.0, "b": None}}}
    assert status_patch({"phase": "Running", "n": 1, "kopf": {}}, {"phase": "Running", "n": 1.0}) is None


def test_snapshot_namespace_filter_and_fingerprint() -> None:
    jobs = [job_obj("a", 1, ns="x"), job_obj("b", 1, ns="y")]
    pods = [{"metadata": {"name": "a-0", "namespace": "x", "labels": {"walras.dev/managed": "true"}}},
            {"metadata": {"name": "b-0", "namespace": "y", "labels": {"walras.dev/managed": "true"}}},
            {"metadata": {"name": "web", "namespace": "y"}}]
    snap = snapshot_from([], pods, [], jobs, [], namespaces=["x"])
    assert [j["metadata"]["name"] for j in snap.jobs] == ["a"]
    assert [p["metadata"]["name"] for p in snap.pods] == ["a-0", "web"]
    job = {"metadata": {"generation": 1, "labels": {}}, "status": {"phase": "Pending"}}
    same = {"metadata": {"generation": 1, "labels": {}, "resourceVersion": "9"}, "status": {"phase": "Running"}}
    assert fingerprint("FungibleJob", job) == fingerprint("FungibleJob", same)
    node = {"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "8"}}}
    bigger = {"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "16"}}}
    assert fingerprint("Node", node) != fingerprint("Node", bigger)


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="mode"):
        OperatorOptions(mode="magic")
    with pytest.raises(ValueError, match="plan_period"):
        OperatorOptions(plan_period=0)


# ---------------------------------------------------------------------------------------------- API client


async def started_emulator(tmp_path: Path) -> tuple[Emulator, KubeClient]:
    emulator = Emulator(Store())
    await emulator.start()
    emulator.store.apply_manifests(
        d for f in sorted(glob.glob(str(ROOT / "crds" / "*.yaml"))) for d in yaml.safe_load_all(open(f)) if d)
    emulator.store.apply_manifests([
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "8"}}},
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}, "status": {"allocatable": {"cpu": "8"}}}])
    kube = KubeConfig.load(str(emulator.write_kubeconfig(tmp_path / "kubeconfig")))
    return emulator, KubeClient(kube, RetryPolicy(attempts=6, base=0.01, cap=0.05))


@pytest.mark.asyncio
async def test_client_retries_and_never_binds_twice(tmp_path: Path) -> None:
    emulator, client = await started_emulator(tmp_path)
    store = emulator.store
    try:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
               "spec": {"containers": [{"name": "c", "image": "x"}]}}
        store.faults += [Fault("create", "pods", 429, 1), Fault("create", "pods", 503, 1)]
        created, fresh = await client.create_pod("default", pod)
        assert fresh and client.retries == 2
        again, fresh = await client.create_pod("default", pod)  # AlreadyExists: the existing pod, not an error
        assert not fresh and again["metadata"]["uid"] == created["metadata"]["uid"]
        uid = created["metadata"]["uid"]
        store.faults += [Fault("create", "pods", 409, 2, subresource="binding"),
                         Fault("create", "pods", 500, 1, subresource="binding")]
        assert await client.bind("default", "p", uid, "n1") is True
        assert await client.bind("default", "p", uid, "n1") is False  # already there: not bound again
        with pytest.raises(Conflict, match="already bound to n1"):
            await client.bind("default", "p", uid, "n2")
        assert [b["node"] for b in store.bindings] == ["n1"]
        store.faults.append(Fault("patch", "fungiblejobs", 409, 1, subresource="status"))
        store.apply_manifests([job_obj("j", 1)])
        result = await client.patch_status("/apis/walras.dev/v1alpha1/namespaces/default/fungiblejobs/j",
                                           {"status": {"phase": "Running"}})
        assert result["status"] == {"phase": "Running"}
        store.faults.append(Fault("patch", "fungiblejobs", 500, 10, subresource="status"))
        with pytest.raises(InternalError) as err:
            await client.patch_status("/apis/walras.dev/v1alpha1/namespaces/default/fungiblejobs/j",
                                      {"status": {"phase": "Pending"}})
        assert err.value.code == 500
        assert await client.delete_pod("default", "p") is True
        assert await client.delete_pod("default", "p") is False
    finally:
        await client.close()
        await emulator.stop()


# ---------------------------------------------------------------------------------------------- kopf operator


async def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_operator_creates_binds_scales_resizes_and_writes_status(tmp_path: Path) -> None:
    emulator, client = await started_emulator(tmp_path)
    store = emulator.store
    metrics = WalrasMetrics()
    options = OperatorOptions(debounce=0.05, plan_period=1.0, identity="test-operator")
    source = IndexSource()
    controller = Controller(client, source, stand_in_planner(store), options, metrics)
    kube = client.config
    stop = asyncio.Event()
    store.apply_manifests([{"apiVersion": "walras.dev/v1alpha1", "kind": "ResourcePool", "metadata": {"name": "p"},
                            "spec": {}},
                           job_obj("j", 2)])
    # a pod labelled with the job's name but created by someone else: adopted
    store.apply_manifests([{"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": "j-1", "namespace": "default", "labels": {"walras.dev/job": "j"}},
                            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}])
    store.faults += [Fault("create", "pods", 409, 1, subresource="binding"),
                     Fault("patch", "resourcepools", 503, 1, subresource="status")]
    task = asyncio.create_task(run_operator(controller, source, kube, peering="walras", priority=7,
                                            health_port=None, stop_flag=stop))
    pods = store.types[POD]

    def bound(n: int) -> bool:
        items = store.list(pods, "default")
        return len(items) == n and all(p["spec"].get("nodeName") == "n1" for p in items)

    try:
        await wait_for(lambda: bound(2))
        j1 = store.get(pods, "default", "j-1")
        assert j1["metadata"]["ownerReferences"][0]["kind"] == "FungibleJob"  # adopted
        j0 = store.get(pods, "default", "j-0")
        assert j0["spec"]["schedulerName"] == "walras-scheduler"
        assert j0["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "1"}
        assert sorted(b["pod"] for b in store.bindings) == ["j-0", "j-1"]  # each bound exactly once
        await wait_for(lambda: store.get(store.types[POOL], "", "p").get("status", {}).get("price") == 0.25)
        await wait_for(lambda: store.get(store.types[JOB], "default", "j").get("status", {}).get("replicas")
                       == {"p": 2})
        assert 'walras_pods_bound_total{mode="direct",pool="p"} 2.0' in metrics.exposition().decode()
        # the leader Lease (named by peering=) is held by this operator
        lease = store.get(store.types[("coordination.k8s.io", "v1", "leases")], "default", "walras")
        assert lease["spec"]["holderIdentity"] == "test-operator"

        # scale down: the surplus pod goes
        store.patch(store.types[JOB], "default", "j", {"metadata": {"annotations": {"test/replicas": "1"}},
                                                       "spec": {"weight": 2}}, "application/merge-patch+json")
        await wait_for(lambda: bound(1))

        # resize in place where supported
        store.patch(store.types[JOB], "default", "j", {"metadata": {"annotations": {"test/cpu": "2"}},
                                                       "spec": {"weight": 3}}, "application/merge-patch+json")
        await wait_for(lambda: store.get(pods, "default", "j-0")["spec"]["containers"][0]["resources"]
                       ["requests"] == {"cpu": "2"})

        # where the cluster has no in-place resize, the job says the change waits for the next pod
        store.faults.append(Fault("patch", "pods", 404, 1000, subresource="resize"))
        store.patch(store.types[JOB], "default", "j", {"metadata": {"annotations": {"test/cpu": "3"}},
                                                       "spec": {"weight": 4}}, "application/merge-patch+json")

        def resize_pending() -> bool:
            conds = store.get(store.types[JOB], "default", "j").get("status", {}).get("conditions", [])
            return any(c["type"] == "ResizePending" and "next pod" in c["message"] for c in conds)

        await wait_for(resize_pending)
        assert len(store.bindings) == 2  # nothing was ever bound twice
        events = store.list(store.types[("", "v1", "events")], "default")
        reasons = {(e["involvedObject"]["kind"], e["involvedObject"]["name"], e["reason"]) for e in events}
        assert ("FungibleJob", "j", "SuccessfulCreate") in reasons
        assert ("Pod", "j-0", "Scheduled") in reasons
        assert ("FungibleJob", "j", "SuccessfulDelete") in reasons
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        await emulator.stop()


@pytest.mark.asyncio
async def test_only_the_replica_holding_the_lease_acts(tmp_path: Path) -> None:
    emulator, client = await started_emulator(tmp_path)
    store = emulator.store
    store.apply_manifests([{"apiVersion": "walras.dev/v1alpha1", "kind": "ResourcePool", "metadata": {"name": "p"},
                            "spec": {}}, job_obj("j", 1)])
    replicas = []
    for identity in ("first", "second"):
        options = OperatorOptions(debounce=0.05, plan_period=60.0, identity=identity)
        source = IndexSource()
        controller = Controller(KubeClient(client.config), source, stand_in_planner(store), options,
                                WalrasMetrics())
        stop = asyncio.Event()
        task = asyncio.create_task(run_operator(controller, source, client.config, peering="walras",
                                                health_port=None, stop_flag=stop))
        replicas.append((controller, stop, task))
        if identity == "first":
            await wait_for(lambda c=controller: c.plans > 0)
    first, second = replicas[0][0], replicas[1][0]
    lease = store.types[("coordination.k8s.io", "v1", "leases")]
    try:
        assert store.get(lease, "default", "walras")["spec"]["holderIdentity"] == "first"
        await asyncio.sleep(1.0)  # the second replica has listed everything and found the Lease held
        first_plans = first.plans
        store.apply_manifests([job_obj("k", 2)])
        await wait_for(lambda: len(store.list(store.types[POD], "default")) == 3)
        await asyncio.sleep(0.5)
        assert first.plans > first_plans
        assert second.plans == 0, "the standby planned"
        assert sorted(b["pod"] for b in store.bindings) == ["j-0", "k-0", "k-1"]
    finally:
        for _, stop, _task in replicas:
            stop.set()
        for _, _, task in replicas:
            # two kopf operators in one event loop: each cancels the tasks the other spawned after it started
            # (kopf's "hung tasks" sweep at exit), so a replica's task may end cancelled here
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 15)
        await client.close()
        await emulator.stop()


def test_walras_run_rejects_half_a_tls_pair(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from walras.cli import run as run_cli

    parser = argparse.ArgumentParser()
    run_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["run", "--extender-tls-cert", "/nonexistent.pem"])
    assert args.mode == "direct" and args.extender_port == 8888 and args.metrics_port == 9847
    assert args.health_port == 8080 and args.peering == "walras" and args.plan_period == 30.0
    from walras.cli.errors import UsageError

    with pytest.raises(UsageError, match="go together"):  # walras.cli.main prints it as one line, exit 2
        run_cli.run(args)
