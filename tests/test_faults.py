"""Faults a real API server does not make on demand, injected by ``tests/faultproxy.py`` between the operator (its own
writes, kopf's lists and watches, the Lease) and the API: 409 / 429 / 500 answers, latency and dropped watches at set,
seeded rates. The operator must survive every one, reconcile every job, never bind a pod twice and never delete a
running pod its job still wants; restarted after SIGKILL it leads again within one lease duration.

Against the emulated API (``tests/controlplane.py`` brings the real control plane for the same checks where present).
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import requests
from faultproxy import FaultProxy, FaultRates, ProxyThread
from test_ha_support import NAMESPACE, POD, Replica, load_scenario, scenario_documents, wait_until
from walras.metrics import WalrasMetrics
from walras.operator import Controller, IndexSource, KubeClient, KubeConfig, OperatorOptions, run_operator
from walras.operator.leader import LeaseElector
from walras.planner import build_plan
from walras_emulator import Emulator
from walras_emulator.server import EmulatorThread, write_kubeconfig
from walras_emulator.store import Store

#: The rates of the main run: every kind of fault on about one request in ten.
RATES = FaultRates(conflict=0.10, throttle=0.10, error=0.10, latency=0.10, latency_s=0.3, drop_watch=0.30,
                   watch_life_s=3.0)


def _pods(store: Store) -> list[dict[str, Any]]:
    return store.list(store.types[POD], NAMESPACE)


def _settled(store: Store, count: int) -> bool:
    pods = _pods(store)
    return len(pods) == count and all(p["spec"].get("nodeName") and p["status"].get("phase") == "Running"
                                      for p in pods)


def _extra_job(name: str, replicas: int) -> dict[str, Any]:
    job = copy.deepcopy(next(d for d in scenario_documents() if d["kind"] == "FungibleJob"))
    job["metadata"] = {"name": name, "namespace": NAMESPACE}
    job["spec"]["replicas"] = {"count": replicas}
    return job


async def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.1)


@pytest.mark.asyncio
async def test_operator_survives_injected_faults_and_keeps_wanted_pods(tmp_path: Path) -> None:
    emulator = Emulator(Store())
    await emulator.start()
    store = emulator.store
    load_scenario(store)
    proxy = FaultProxy(emulator.url, RATES, seed=17)
    await proxy.start()
    kube = KubeConfig.load(str(write_kubeconfig(tmp_path / "kubeconfig", proxy.url)))
    options = OperatorOptions(mode="direct", debounce=0.1, plan_period=2.0, identity="faulty")
    source = IndexSource()
    controller = Controller(KubeClient(kube), source, build_plan, options, WalrasMetrics())
    elector = LeaseElector(KubeClient(kube), "default", "walras", "faulty", lease_duration=3.0, renew_deadline=2.0,
                           renew_period=0.5, retry_period=0.5)
    stop = asyncio.Event()
    task = asyncio.create_task(run_operator(controller, source, kube, peering="walras", health_port=None,
                                            stop_flag=stop, elector=elector))
    try:
        await _wait(lambda: _settled(store, 5) or task.done(), 120, "5 pods bound and running")
        assert not task.done(), "the operator ended"
        first = {p["metadata"]["name"]: p["metadata"]["uid"] for p in _pods(store)}
        store.apply_manifests([_extra_job("extra", 3)])
        # 240 s: under the injected 429/500s the leader Lease can be lost and won again several times (seen in a
        # full run on a loaded machine: the 3 pods came after 120 s); the operator must get there, not fast
        await _wait(lambda: _settled(store, 8) or task.done(), 240, "the new job's 3 pods bound and running")
        await asyncio.sleep(6)  # three more plan periods under faults with nothing to change
        assert not task.done(), "the operator ended"
        now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in _pods(store)}
        assert {n: now.get(n) for n in first} == first, "a running pod its job still wants was deleted or replaced"
        deleted = [e.obj["metadata"]["name"] for e in store.history[POD] if e.type == "DELETED"]
        assert deleted == [], f"pods deleted: {deleted}"
        uids = Counter(b["uid"] for b in store.bindings)
        assert len(uids) == 8 and max(uids.values()) == 1, "a pod was bound twice"
        # every kind of fault was injected, on the operator's writes and on kopf's watches alike
        for fault in ("409", "429", "500", "latency", "watch-dropped"):
            assert proxy.counts[fault] > 0, (fault, dict(proxy.counts))
        assert any(method != "GET" for fault, method, _ in proxy.log if fault == "409")
        print("fault-proxy counts:", dict(proxy.counts))
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await proxy.stop()
        await emulator.stop()


def test_sigkill_restarts_under_faults_lead_again_within_one_lease(tmp_path: Path) -> None:
    """Three SIGKILL restarts of the only replica under 10 % faults: a restart with the same identity leads again
    within a few retry periods of coming up, one with a new identity within one lease duration plus those; every new
    job is reconciled after each restart, and no pod is ever deleted."""
    lease = 4.0
    retry = lease / 6
    thread = EmulatorThread()
    with thread as emulator:
        store = emulator.store
        thread.call(load_scenario, store)
        with ProxyThread(FaultProxy(emulator.url, RATES, seed=23)) as proxy:
            kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", proxy.url)
            replica = Replica(kubeconfig, tmp_path, "r0", mode="direct", lease_duration=lease).start()
            rounds: list[dict[str, Any]] = []
            try:
                wait_until(lambda: thread.call(_settled, store, 5), 180, "5 pods bound and running")
                for round_, identity in enumerate(("r0", "r1", "r1")):
                    same = identity == replica.identity
                    replica.kill()
                    replica = Replica(kubeconfig, tmp_path, identity, mode="direct", lease_duration=lease,
                                      extender_port=replica.extender_port).start()
                    up = wait_until(lambda r=replica: _readyz(r) and time.monotonic(), 120, "the extender up")
                    led = wait_until(lambda r=replica: _readyz(r) == 200 and time.monotonic(), 30, "leadership",
                                     interval=0.05)
                    job = f"after-{round_}"
                    thread.call(store.apply_manifests, [_extra_job(job, 1)])
                    applied = time.monotonic()
                    # 180 s: in a fresh checkout the restarted process may JIT-compile the placement kernels on
                    # its first plan (numba caches them on disk after); typical here is 4-8 s
                    wait_until(lambda n=6 + round_: thread.call(_settled, store, n), 180, f"{job} reconciled")
                    rounds.append({"identity": identity, "same": same, "election_s": round(led - up, 2),
                                   "new_job_s": round(time.monotonic() - applied, 2)})
                print("restarts:", rounds, "faults:", dict(proxy.counts))
                for r in rounds:
                    # a new identity honours the dead holder's claim for one lease duration; injected faults can
                    # fail an election round or two (each costs a retry period); 1 s for the probe and the load
                    bound = 3 * retry + 1.0 if r["same"] else lease + 3 * retry + 1.0
                    assert r["election_s"] <= bound, r
                deleted = thread.call(lambda: [e.obj["metadata"]["name"] for e in store.history[POD]
                                               if e.type == "DELETED"])
                assert deleted == [], f"pods deleted across restarts: {deleted}"
                assert proxy.counts["500"] > 0 and proxy.counts["409"] > 0
            finally:
                replica.stop()
                print(replica.output()[-3000:])


def _readyz(replica: Replica) -> int:
    """The replica's ``/readyz`` status, 0 while it does not answer."""
    assert replica.alive(), replica.output()
    try:
        return requests.get(replica.url("/readyz"), timeout=2).status_code
    except requests.RequestException:
        return 0


def _renamed_scenario(ns: str) -> list[dict[str, Any]]:
    """The e2e scenario with names of its own (pools ``NS-v100``/``NS-k80``, nodes ``NS-v100-0`` ...), jobs in
    ``ns``: the session's control plane is shared with other tests."""
    docs = [d for d in scenario_documents() if d["kind"] in ("Node", "ResourcePool", "FungibleJob")]
    pool_names = {d["metadata"]["name"]: f"{ns}-{d['metadata']['name'].split('-')[-1]}" for d in docs
                  if d["kind"] == "ResourcePool"}
    out = []
    for doc in copy.deepcopy(docs):
        meta = doc["metadata"]
        if doc["kind"] == "Node":
            meta["name"] = f"{ns}-{meta['name'].split('-', 1)[1]}"
            meta["labels"]["walras.dev/fault-test"] = ns
            doc["status"] = {"capacity": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "4"}}
        elif doc["kind"] == "ResourcePool":
            meta["name"] = pool_names[meta["name"]]
            doc["spec"]["nodeSelector"] = {**doc["spec"]["nodeSelector"], "walras.dev/fault-test": ns}
        else:
            meta["namespace"] = ns
            doc["spec"]["throughput"] = {pool_names[k]: v for k, v in doc["spec"]["throughput"].items()}
        out.append(doc)
    return out


def test_operator_survives_injected_faults_on_the_real_control_plane(control_plane: Any, namespace: str,
                                                                      tmp_path: Path) -> None:
    """The main fault run against kube-apiserver v1.36 (faults between the operator and the real server; the
    kubelet stand-in plays the nodes): the operator survives, binds every pod once and deletes none."""
    import ssl

    from test_ha_support import ROOT
    from walras.kubelet.client import ApiClient, ApiConfig
    from walras.kubelet.standin import KubeletStandIn

    cp = control_plane
    ns = namespace
    cp.kubectl("apply", "-f", str(ROOT / "crds"))
    cp.kubectl("wait", "--for=condition=Established", "crd/fungiblejobs.walras.dev", "--timeout=60s")
    docs = _renamed_scenario(ns)
    nodes = [d for d in docs if d["kind"] == "Node"]

    async def scenario() -> dict[str, int]:
        kubelet = KubeletStandIn(ApiClient(ApiConfig.from_kubeconfig(cp.kubeconfig)), nodes, lease_interval=5.0,
                                 status_interval=10.0)
        await kubelet.start()
        cp.apply_objects([d for d in docs if d["kind"] != "Node"])
        upstream_ssl = ssl.create_default_context(cafile=str(cp.ca_file))
        proxy = FaultProxy(cp.server, RATES, seed=29, upstream_ssl=upstream_ssl)
        await proxy.start()
        kube = KubeConfig(server=proxy.url, token=cp.token, namespace="default")
        options = OperatorOptions(mode="direct", debounce=0.1, plan_period=2.0, identity="faulty-real",
                                  namespaces=(ns,))
        source = IndexSource(options.namespaces)
        controller = Controller(KubeClient(kube), source, build_plan, options, WalrasMetrics())
        elector = LeaseElector(KubeClient(kube), "default", f"walras-{ns}", "faulty-real", lease_duration=3.0,
                               renew_deadline=2.0, renew_period=0.5, retry_period=0.5)
        stop = asyncio.Event()
        task = asyncio.create_task(run_operator(controller, source, kube, peering=f"walras-{ns}",
                                                health_port=None, stop_flag=stop, elector=elector))

        def pods() -> list[dict[str, Any]]:
            return cp.get("pods", "-n", ns)["items"]

        def settled(count: int) -> bool:
            items = pods()
            return len(items) == count and all(p["status"].get("phase") == "Running" for p in items)

        try:
            await _wait(lambda: task.done() or settled(5), 180, "5 pods running on the real control plane")
            assert not task.done(), "the operator ended"
            first = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods()}
            extra = _extra_job("extra", 3)
            extra["metadata"]["namespace"] = ns
            extra["spec"]["throughput"] = next(d for d in docs if d["kind"] == "FungibleJob")["spec"]["throughput"]
            cp.apply_objects([extra])
            await _wait(lambda: task.done() or settled(8), 180, "the new job's pods running")
            await asyncio.sleep(6)
            assert not task.done(), "the operator ended"
            now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods()}
            assert {n: now.get(n) for n in first} == first, "a running pod its job still wants was deleted"
            assert all(reason == "Running" for *_, reason in kubelet.decisions), kubelet.decisions
            for fault in ("409", "429", "500", "latency"):
                assert proxy.counts[fault] > 0, (fault, dict(proxy.counts))
            return dict(proxy.counts)
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
            await proxy.stop()
            await kubelet.stop(delete_nodes=True)
            cp.kubectl("delete", "resourcepools", f"{ns}-v100", f"{ns}-k80", "--ignore-not-found", check=False)

    counts = asyncio.run(scenario())
    print("fault-proxy counts (real control plane):", counts)
