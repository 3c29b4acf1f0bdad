"""Faults a real API server does not make on demand, injected by ``tests/faultproxy.py`` between the operator (its own
writes, kopf's lists and watches, the Lease) and the API: 409 / 429 / 500 answers, latency and dropped watches at set,
seeded rates. The operator must survive every one, reconcile every job, never bind a pod twice and never delete a
running pod its job still wants; restarted after SIGKILL it leads again within one lease duration.

Against the emulated API (``tests/controlplane.py`` brings the real control plane for the same checks where present).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import random
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from faultproxy import FaultProxy, FaultRates, ProxyThread
from test_ha_support import NAMESPACE, POD, ROOT, free_port, load_scenario, scenario_documents, wait_until
from walras.kube.client import KubeClient, KubeConfig
from walras.metrics import WalrasMetrics
from walras.operator import Controller, IndexSource, OperatorOptions, run_operator
from walras.operator.leader import LeaseElector
from walras.planner import build_plan
from walras_testbed.emulator import Emulator
from walras_testbed.emulator.server import write_kubeconfig
from walras_testbed.emulator.store import Store

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
        await _wait(lambda: _settled(store, 5) or task.done(), 90, "5 pods bound and running")
        assert not task.done(), "the operator ended"
        first = {p["metadata"]["name"]: p["metadata"]["uid"] for p in _pods(store)}
        store.apply_manifests([_extra_job("extra", 3)])
        # 90 s: a failed Lease renewal is retried within the renew deadline (walras.operator.leader), so the 429/500s
        # no longer make the Lease flap; before that fix this wait needed 240 s on a loaded machine
        await _wait(lambda: _settled(store, 8) or task.done(), 90, "the new job's 3 pods bound and running")
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


#: The churn run: SIGKILLs of the operator, the bound on reconciliation after the last change, the time it churns.
CHURN_KILLS = 10
CHURN_SETTLE_BOUND_S = 60.0
CHURN_LEASE_S = 4.0


class _Zygote:
    """``tests/operator_zygote.py``: imports ``walras run``'s modules once and forks replica processes on request."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("operator_zygote.py"))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)

    def ready(self) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "ready", f"the operator fork server did not start: {line!r}"

    def fork(self, argv: list[str], log: Path, env: dict[str, str]) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"argv": argv, "log": str(log), "env": env}) + "\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class _ForkedReplica:
    """One operator replica (``walras run``'s pieces with short Lease periods, :mod:`test_ha_support`) forked by the
    :class:`_Zygote`, watching one namespace only (the session's control plane is shared with other tests)."""

    def __init__(self, zygote: _Zygote, kubeconfig: Path, workdir: Path, identity: str, namespace: str,
                 extender_port: int | None = None) -> None:
        self.zygote, self.kubeconfig, self.workdir = zygote, kubeconfig, workdir
        self.identity, self.namespace = identity, namespace
        self.extender_port = extender_port or free_port()
        self.log = workdir / "replica.log"
        self.pid = 0

    def start(self) -> _ForkedReplica:
        self.log = self.workdir / f"replica-{self.identity}-{time.monotonic_ns()}.log"
        argv = ["--identity", self.identity, "--lease-duration", str(CHURN_LEASE_S), "run", "--mode", "direct",
                "--kubeconfig", str(self.kubeconfig), "--extender-port", str(self.extender_port), "--debounce",
                "0.1", "--plan-period", "2", "--peering", f"walras-{self.namespace}", "--namespace", self.namespace]
        self.pid = self.zygote.fork(argv, self.log, {"WALRAS_NAMESPACE": "default", "WALRAS_LOG_LEVEL": "INFO"})
        return self

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.extender_port}{path}"

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)  # the zygote ignores SIGCHLD: a dead child's pid is gone at once
        except ProcessLookupError:
            return False
        return True

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no cleanup, no Lease release, as a crashed or evicted operator."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        wait_until(lambda: not self.alive(), 10, f"replica {self.pid} gone", interval=0.02)

    def stop(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
            try:
                wait_until(lambda: not self.alive(), 20, f"replica {self.pid} stopped")
            except AssertionError:
                self.kill()


class _Churn:
    """Pod-affecting changes applied straight to the API server (users and nodes, not through the fault proxy),
    drawn from a seeded RNG: FungibleJobs created, deleted and scaled, running pods completed or failed through the
    kubelet stand-in, nodes added, cordoned and uncordoned."""

    def __init__(self, cp: Any, kubelet: Any, ns: str, docs: list[dict[str, Any]], rng: random.Random) -> None:
        self.cp, self.kubelet, self.ns, self.rng = cp, kubelet, ns, rng
        self.template = next(d for d in docs if d["kind"] == "FungibleJob")
        self.node_template = next(d for d in docs if d["kind"] == "Node")
        self.nodes = [d["metadata"]["name"] for d in docs if d["kind"] == "Node"]
        self.jobs = [d["metadata"]["name"] for d in docs if d["kind"] == "FungibleJob"]
        self.counts: Counter[str] = Counter()
        self.serial = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def jobs_path(self, name: str = "") -> str:
        return f"/apis/walras.dev/v1alpha1/namespaces/{self.ns}/fungiblejobs" + (f"/{name}" if name else "")

    def _ok(self, kind: str, status: int) -> None:
        if 200 <= status < 300:
            self.counts[kind] += 1

    def _running(self) -> list[str]:
        _, body = self.cp.request("GET", f"/api/v1/namespaces/{self.ns}/pods")
        return sorted(p["metadata"]["name"] for p in body.get("items", [])
                      if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp"))

    def step(self) -> None:
        rng = self.rng
        action = rng.choices(("create", "delete", "scale", "complete", "fail", "node", "cordon"),
                             weights=(4, 2, 6, 3, 3, 1, 2))[0]
        if action == "create" or (action in ("delete", "scale") and not self.jobs):
            self.serial += 1
            job = copy.deepcopy(self.template)
            job["metadata"] = {"name": f"churn-{self.serial}", "namespace": self.ns}
            job["spec"]["replicas"] = {"count": rng.randint(1, 3)}
            status, _ = self.cp.request("POST", self.jobs_path(), job)
            if status == 201:
                self.jobs.append(job["metadata"]["name"])
            self._ok("job created", status)
        elif action == "delete" and len(self.jobs) > 2:
            name = self.jobs.pop(rng.randrange(len(self.jobs)))
            self._ok("job deleted", self.cp.request("DELETE", self.jobs_path(name))[0])
        elif action in ("scale", "delete"):
            name = rng.choice(self.jobs)
            status, _ = self.cp.plane.request("PATCH", self.jobs_path(name),
                                              {"spec": {"replicas": {"count": rng.randint(1, 4)}}},
                                              content_type="application/merge-patch+json")
            self._ok("job scaled", status)
        elif action in ("complete", "fail"):
            running = self._running()
            if running:
                from walras_testbed.kubelet.client import ApiError

                name = rng.choice(running)
                try:
                    if action == "complete":
                        self.kubelet.complete_pod(self.ns, name)
                    else:
                        self.kubelet.fail_pod(self.ns, name, "Error", "injected by the churn test")
                except ApiError as exc:  # the operator deleted it since it was listed
                    if exc.status != 404:
                        raise
                    return
                self.counts["pod completed" if action == "complete" else "pod failed"] += 1
        elif action == "node" and len(self.nodes) < 7:
            doc = copy.deepcopy(self.node_template)
            doc["metadata"]["name"] = f"{self.ns}-extra-{len(self.nodes)}"
            self.kubelet.add_node(doc)
            self.nodes.append(doc["metadata"]["name"])
            self.counts["node added"] += 1
        else:
            name = rng.choice(self.nodes)
            cordon = rng.random() < 0.5
            status, _ = self.cp.plane.request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"unschedulable": cordon}},
                                              content_type="application/merge-patch+json")
            self._ok("node cordoned" if cordon else "node uncordoned", status)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.step()
                self.stop.wait(self.rng.uniform(0.02, 0.12))
        except BaseException as exc:  # reported by the test
            self.error = exc

    @property
    def total(self) -> int:
        return sum(self.counts.values())


ACTION = re.compile(r"INFO walras\.operator: (created|bound|deleted|evicted|resized) pod")


def _wait_for_action(replica: _ForkedReplica, timeout: float) -> float | None:
    """When the replica first wrote a pod (its log), waiting at most ``timeout`` s; None if it did not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ACTION.search(replica.output()):
            return time.monotonic()
        time.sleep(0.05)
    return None


class _ContextAdapter(requests.adapters.HTTPAdapter):
    """requests with the control plane's own SSL context (its CA file holds the serving chain)."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["ssl_context"] = self.context
        super().init_poolmanager(*args, **kwargs)


class _BindingWatch:
    """Every pod of namespace ``ns`` as the API server reports it (a watch as admin, not through the proxy): the
    nodes each pod object (uid) was ever seen bound to. Two different nodes for one uid is a double binding."""

    def __init__(self, cp: Any, ns: str) -> None:
        self.cp, self.ns = cp, ns
        self.nodes: dict[str, set[str]] = {}
        self.names: dict[str, str] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="binding-watch", daemon=True)

    def _run(self) -> None:
        version = ""
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {self.cp.token}"
        session.mount("https://", _ContextAdapter(self.cp.plane.ssl_context()))
        while not self.stop.is_set():
            params = {"watch": "1", "timeoutSeconds": "5", "allowWatchBookmarks": "false"}
            if version:
                params["resourceVersion"] = version
            try:
                with session.get(f"{self.cp.server}/api/v1/namespaces/{self.ns}/pods", params=params, stream=True,
                                 timeout=15) as resp:
                    for line in resp.iter_lines():
                        event = json.loads(line)
                        if event.get("type") == "ERROR":
                            version = ""  # expired: start again from a fresh list
                            break
                        pod = event["object"]
                        version = pod["metadata"]["resourceVersion"]
                        uid = pod["metadata"]["uid"]
                        self.names[uid] = pod["metadata"]["name"]
                        node = pod["spec"].get("nodeName")
                        if node:
                            self.nodes.setdefault(uid, set()).add(node)
            except (requests.RequestException, ValueError):
                time.sleep(0.2)

    def double_bound(self) -> list[str]:
        return [f"{self.names[uid]} ({uid}) on {sorted(nodes)}" for uid, nodes in self.nodes.items() if len(nodes) > 1]


def _job_summary(jobs: dict[str, Any], name: str) -> str:
    """A FungibleJob's spec replicas and status (phase, replicas, failures, conditions), for a failure message."""
    job = next((j for j in jobs["items"] if j["metadata"]["name"] == name), None)
    if job is None:
        return "gone"
    status = job.get("status") or {}
    conditions = [(c.get("type"), c.get("status"), c.get("reason")) for c in status.get("conditions") or []]
    return (f"replicas {job['spec'].get('replicas')}, status {status.get('phase')} "
            f"placed {status.get('placedReplicas')} failed {status.get('failedPods')} "
            f"last failure {status.get('lastFailureTime')} {conditions}")


def _live_state(cp: Any, ns: str, nodes: set[str]) -> tuple[list[str], list[str]]:
    """``(what is not reconciled yet, invariant violations)`` for namespace ``ns`` and ``nodes`` on the live cluster:
    :func:`walras.planner.invariants.check_cluster` on the snapshot ``walras check`` reads, restricted to this test's
    objects; a plan of that snapshot with nothing but ``keep``; every bound pod Running and every job's status
    written for its generation."""
    from walras.cli.check import live_snapshot
    from walras.kube.decode import cluster_from
    from walras.planner import build_plan
    from walras.planner.cluster import TenantOptions
    from walras.planner.invariants import check_cluster
    from walras.planner.plan import PlanOptions

    snapshot = live_snapshot(str(cp.kubeconfig), None)
    violations = [str(v) for v in check_cluster(cluster_from(snapshot))
                  if v.object.startswith((f"Pod/{ns}/", f"FungibleJob/{ns}/"))
                  or v.object.removeprefix("Node/") in nodes]
    pending: list[str] = []
    _, pods = cp.request("GET", f"/api/v1/namespaces/{ns}/pods")
    for pod in pods["items"]:
        if pod["status"].get("phase") in ("Succeeded", "Failed") or pod["metadata"].get("deletionTimestamp"):
            continue
        if pod["spec"].get("nodeName") and pod["status"].get("phase") != "Running":
            pending.append(f"pod {pod['metadata']['name']} {pod['status'].get('phase')} on "
                           f"{pod['spec'].get('nodeName')}")
    _, jobs = cp.request("GET", f"/apis/walras.dev/v1alpha1/namespaces/{ns}/fungiblejobs")
    for job in jobs["items"]:
        seen = (job.get("status") or {}).get("observedGeneration")
        if seen != job["metadata"].get("generation"):
            pending.append(f"job {job['metadata']['name']} status for generation {seen}, "
                           f"spec at {job['metadata'].get('generation')}")
    if not pending and not violations:
        # reconciled = the planner has nothing left to do: a plan of the live cluster keeps every pod of this test's
        # jobs (an unbound pod kept only where no node has room for it) and creates none (planned only here: a plan
        # per poll would compete with the operator for the 2 cores)
        # with the operator's clock: a job whose failed pods are in backoff (status.lastFailureTime) gets no
        # replacement before the backoff ends, in the operator's plans and in this one
        # and with the operator's market: `walras run` plans tenants (Budgets' Fisher market) by default
        plan = build_plan(cluster_from(snapshot), options=PlanOptions(now=time.time(), tenants=TenantOptions()))
        pending = [f"plan: {p.action} {p.name} (node {p.node}; job {p.job}: "
                   f"{_job_summary(jobs, p.job)})" for p in plan.pods if p.namespace == ns and p.action != "keep"]
    return pending, violations


def test_churn_with_sigkill_restarts_under_faults_on_the_real_control_plane(control_plane: Any, namespace: str,
                                                                            tmp_path: Path) -> None:
    """Issue 17's churn run on kube-apiserver v1.36: hundreds of pod-affecting changes (jobs created, deleted and
    scaled, pods completed and failed by the kubelet stand-in, nodes added and cordoned) while the only operator
    replica is killed with SIGKILL at seeded random moments >= 10 times, all its API traffic through the fault proxy
    (10 % each of 409/429/500 and latency, 30 % of watches dropped). A restart with the same identity leads again
    within a few retry periods. At the end: no over-commit at any time (no kubelet admission refused a pod), no pod
    admitted twice, no invariant violation of ``walras check`` (over-commit, pods on missing nodes, orphaned pods,
    status disagreeing with the pods) and everything reconciled within ``CHURN_SETTLE_BOUND_S`` of the last change."""
    from walras_testbed.kubelet.runner import KubeletThread

    zygote = _Zygote()  # imports while the scenario is set up
    seed = int(os.environ.get("WALRAS_CHURN_SEED", "1717"))
    print(f"churn seed: {seed} (WALRAS_CHURN_SEED)")
    rng = random.Random(seed)  # the kill schedule; the churn thread draws from its own generator
    cp, ns = control_plane, namespace
    started = time.monotonic()
    cp.kubectl("apply", "-f", str(ROOT / "crds"))
    cp.kubectl("wait", "--for=condition=Established", "crd/fungiblejobs.walras.dev", "--timeout=60s")
    docs = _renamed_scenario(ns)
    kubelet = KubeletThread(cp.kubeconfig, [d for d in docs if d["kind"] == "Node"], lease_interval=5.0,
                            status_interval=10.0).start()
    churn = _Churn(cp, kubelet, ns, docs, random.Random(seed + 1))
    upstream_ssl = ssl.create_default_context(cafile=str(cp.ca_file))
    kubeconfig = tmp_path / "kubeconfig"
    replica: _ForkedReplica | None = None
    watch = _BindingWatch(cp, ns)
    try:
        cp.apply_objects([d for d in docs if d["kind"] != "Node"])
        with ProxyThread(FaultProxy(cp.server, RATES, seed=seed, upstream_ssl=upstream_ssl)) as proxy:
            kubeconfig.write_text(yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "churn",
                "clusters": [{"name": "churn", "cluster": {"server": proxy.url}}],
                "users": [{"name": "churn", "user": {"token": cp.token}}],
                "contexts": [{"name": "churn", "context": {"cluster": "churn", "user": "churn", "namespace": ns}}]}))
            zygote.ready()
            replica = _ForkedReplica(zygote, kubeconfig, tmp_path, "churn", ns).start()
            watch.thread.start()
            changer = threading.Thread(target=churn.run, name="churn", daemon=True)
            changer.start()
            kills: list[dict[str, float]] = []
            for _ in range(CHURN_KILLS):
                came = time.monotonic()
                wait_until(lambda r=replica: _readyz(r) == 200, 90, "the restarted replica leading")
                led = time.monotonic()
                # some kills come while it starts (lists, first plan), most once it writes pods (creates, binds,
                # deletes, resizes), a moment later, in the middle of that
                acted = None if rng.random() < 0.3 else _wait_for_action(replica, 15.0)
                time.sleep(rng.uniform(0.3, 3.0) if acted is None else rng.uniform(0.1, 1.0))
                replica.kill()
                kills.append({"to_lead_s": round(led - came, 2), "to_act_s": round(acted - led, 2) if acted else -1,
                              "led_s": round(time.monotonic() - led, 2)})
                print(f"SIGKILL {len(kills)} at {time.monotonic() - started:.1f} s: {kills[-1]}, "
                      f"{churn.total} changes so far", flush=True)
                replica = _ForkedReplica(zygote, kubeconfig, tmp_path, "churn", ns, replica.extender_port).start()
            wait_until(lambda r=replica: _readyz(r) == 200, 90, "the last replica leading")
            churn.stop.set()
            changer.join(30)
            assert churn.error is None, repr(churn.error)
            last_change = time.monotonic()
            churn_s = last_change - started
            pending, violations = ["not checked yet"], ["not checked yet"]
            while time.monotonic() - last_change < CHURN_SETTLE_BOUND_S + 15:
                pending, violations = _live_state(cp, ns, set(churn.nodes))
                if not pending and not violations:
                    time.sleep(2.0)  # still so two plan periods later
                    pending, violations = _live_state(cp, ns, set(churn.nodes))
                    if not pending and not violations:
                        break
                time.sleep(0.5)
            settle_s = time.monotonic() - last_change
            faults = {k: v for k, v in proxy.counts.items()}
            print(f"churn: {len(kills)} SIGKILL restarts {kills}; {churn.total} changes {dict(churn.counts)}; "
                  f"{len(watch.nodes)} pods bound; "
                  f"faults injected {faults}; churn {churn_s:.1f} s, settled {settle_s:.1f} s after the last change")
            assert replica.alive(), replica.output()[-3000:]
            # safety first: no over-commit at any time, no pod on two nodes, no invariant violation at the end
            decisions = kubelet.standin.decisions
            refused = [d for d in decisions if d[3] != "Running"]
            assert refused == [], f"kubelet admission refused (over-commit): {refused}"
            assert watch.double_bound() == [], watch.double_bound()
            assert len(watch.nodes) >= 10, "the watch saw too few bound pods to mean anything"
            assert not pending and not violations, (pending, violations)
            assert settle_s <= CHURN_SETTLE_BOUND_S, f"reconciled only {settle_s:.1f} s after the last change"
            # and the run was what it claims
            assert len(kills) >= 10 and churn.total >= 200, (len(kills), dict(churn.counts))
            # a restart with the same identity finds itself the Lease holder: no wait for the dead one's lease
            assert max(k["to_lead_s"] for k in kills) <= 3 * CHURN_LEASE_S, kills
            assert sum(k["to_act_s"] >= 0 for k in kills) >= 3, "too few kills in the middle of writing pods"
            for fault in ("409", "429", "500", "latency", "watch-dropped"):
                assert faults.get(fault, 0) > 0, (fault, faults)
    finally:
        if replica is not None:
            replica.stop()
            print(replica.output()[-2000:])
        zygote.close()
        watch.stop.set()
        churn.stop.set()
        kubelet.stop(delete_nodes=True)
        cp.kubectl("delete", "resourcepools", f"{ns}-v100", f"{ns}-k80", "--ignore-not-found", check=False)


def _readyz(replica: Any) -> int:
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

    from test_ha_support import ROOT
    from walras_testbed.kubelet.client import ApiClient, ApiConfig
    from walras_testbed.kubelet.standin import KubeletStandIn

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
            await _wait(lambda: task.done() or settled(5), 90, "5 pods running on the real control plane")
            assert not task.done(), "the operator ended"
            first = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods()}
            extra = _extra_job("extra", 3)
            extra["metadata"]["namespace"] = ns
            extra["spec"]["throughput"] = next(d for d in docs if d["kind"] == "FungibleJob")["spec"]["throughput"]
            cp.apply_objects([extra])
            await _wait(lambda: task.done() or settled(8), 90, "the new job's pods running")
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
