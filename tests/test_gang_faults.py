"""A gang never runs partially, through operator restarts (SIGKILL) and API faults, on the REAL control plane
(kube-apiserver, kube-controller-manager; nodes played by the kubelet stand-in): issue 28, docs/gangs.md.

Gang jobs (a gang of 4, a gang of 3 and the gangs that replace it) and a non-gang job compete for 3 nodes of 4, 4 and
2 GPUs. The only operator replica (``walras run``, forked by ``tests/gang_faults_zygote.py``, which checks every plan
it makes with :func:`walras.planner.invariants.check_plan`) reaches the API through the fault proxy
(``tests/faultproxy.py``: 10 % each of 409/429/500 and latency, 30 % of watches dropped) and is killed with SIGKILL
at seeded moments, half of them right when its log says it created the first pod of a gang (so the gang has some of
its pods and not the others). Between kills the jobs are scaled (``count`` changed), a gang is deleted and another
created, straight on the API server (a user, not through the proxy).

A watcher polls the pods every 0.5 s as admin. A gang job with ``0 < k < N`` pods Running (terminating ones
included: they still run) is in a *partial episode*; N is its ``count`` less its Succeeded pods. No stretch of an
episode without a SIGKILL in it may last longer than :data:`GANG_TRANSITION_BOUND_S` (a kill restarts the clock: the
dead replica can finish nothing). The bound: a replica started after a kill leads within 3 lease durations (12 s,
asserted by ``test_faults``' churn run, the same machinery), but plans only once kopf has listed the API, and kopf's
discovery retries through the injected 429/500 answers with backoff (1, 2, 4, 8 s: up to ~16 s seen); its first plan
comes within a plan period (2 s); the <= 5 writes that complete or release a gang are retried through 429
(``Retry-After: 1``), 500 and 409 answers and a blocked eviction is asked again after 2 s (a few seconds at 10 % each);
the stand-in reports a bound pod Running within its next status round. 16 + 2 + 6 + 2 + the 0.5 s poll, rounded up,
is 30 s. At the end the cluster must be reconciled with no invariant violation of
``walras check`` (``PartialGang`` among them) and no plan may have broken ``check_plan``.

The seed is ``WALRAS_GANG_FAULTS_SEED`` (printed).
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import random
import re
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from faultproxy import FaultProxy, FaultRates, ProxyThread
from test_faults import RATES, _ForkedReplica, _live_state, _readyz, _Zygote
from test_ha_support import ROOT, wait_until

from tests.lifecycle_support import fungible_job, gpu_node, pool

#: SIGKILLs of the operator in the run (half of them in the middle of a gang's creation).
KILLS = 6
#: The longest a gang may run partially with no SIGKILL in between (module docstring).
GANG_TRANSITION_BOUND_S = 30.0
#: How long the cluster may take to reconcile after the last change.
SETTLE_BOUND_S = 40.0
POLL_S = 0.5
#: After it settled, the cluster must stay so this long (two plan periods).
STABLE_S = 4.0
GPUS = (4, 4, 2)


class _CheckingZygote(_Zygote):
    """The fork server of ``tests/gang_faults_zygote.py``: replicas whose plans are checked and recorded."""

    def __init__(self, checks: Path) -> None:
        # the replicas inherit the zygote's environment: each appends its plans' checks to ``checks``
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("gang_faults_zygote.py"))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                     env={**os.environ, "WALRAS_PLAN_CHECK_LOG": str(checks)})


@dataclass
class _Episode:
    job: str
    uid: str
    start: float
    end: float | None = None
    worst: tuple[int, int] = (0, 0)  # (k, N) seen with the fewest pods running


@dataclass
class _GangWatch:
    """Every ``POLL_S`` s as admin: per gang job of ``ns`` (by uid) its Running pods k and its size N, and the
    episodes with ``0 < k < N``."""

    cp: Any
    ns: str
    episodes: list[_Episode] = field(default_factory=list)
    open: dict[str, _Episode] = field(default_factory=dict)
    polls: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sample(self, now: float) -> dict[str, tuple[int, int]]:
        """Per gang job (uid) ``(k, N)`` now; the episodes updated (the watcher and the test both sample)."""
        with self.lock:
            return self._sample(now)

    def _sample(self, now: float) -> dict[str, tuple[int, int]]:
        _, jobs = self.cp.request("GET", f"/apis/walras.dev/v1alpha1/namespaces/{self.ns}/fungiblejobs")
        _, pods = self.cp.request("GET", f"/api/v1/namespaces/{self.ns}/pods")
        running: Counter[str] = Counter()
        succeeded: Counter[str] = Counter()
        for pod in pods.get("items", []):
            owner = next((r["uid"] for r in pod["metadata"].get("ownerReferences") or [] if r.get("controller")), "")
            phase = (pod.get("status") or {}).get("phase")
            if phase == "Running" and pod["spec"].get("nodeName"):
                running[owner] += 1
            elif phase == "Succeeded":
                succeeded[owner] += 1
        seen: dict[str, tuple[int, int]] = {}
        for job in jobs.get("items", []):
            replicas = job["spec"].get("replicas") or {}
            if not replicas.get("gang"):
                continue
            uid = job["metadata"]["uid"]
            k, big_n = running[uid], int(replicas.get("count", 0)) - succeeded[uid]
            seen[uid] = (k, big_n)
            if 0 < k < big_n:
                episode = self.open.get(uid)
                if episode is None:
                    episode = self.open[uid] = _Episode(job["metadata"]["name"], uid, now, worst=(k, big_n))
                    self.episodes.append(episode)
                elif k / big_n < episode.worst[0] / episode.worst[1]:
                    episode.worst = (k, big_n)
        for uid in [u for u in self.open if u not in seen or not 0 < seen[u][0] < seen[u][1]]:
            self.open.pop(uid).end = now
        self.polls += 1
        return seen

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.sample(time.monotonic())
                self.stop.wait(POLL_S)
        except BaseException as exc:  # reported by the test
            self.error = exc


def _plan_checks(path: Path, zygote: int) -> tuple[int, list[str]]:
    """``(plans checked, what broke)`` from the replicas' ``WALRAS_PLAN_CHECK_LOG`` (a line cut by SIGKILL skipped;
    the zygote's own warm-up plan, pid ``zygote``, not counted)."""
    plans, broken = 0, []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record["pid"] == zygote:
            continue
        plans += 1
        broken.extend(record["broken"])
    return plans, broken


def _created_gang_pod(replica: _ForkedReplica, ns: str, jobs: set[str], timeout: float) -> str | None:
    """The gang job (of ``jobs``) whose first pod the replica's log says it created, waiting at most ``timeout``
    s (polled every 20 ms); None if it created none."""
    pattern = re.compile(rf"created pod {re.escape(ns)}/\S+ for job (\S+) in pool")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for match in pattern.finditer(replica.output()):
            if match.group(1) in jobs:
                return match.group(1)
        time.sleep(0.02)
    return None


def test_gang_never_runs_partially_through_sigkill_restarts_and_api_faults(control_plane: Any, namespace: str,
                                                                            tmp_path: Path) -> None:
    from walras_testbed.kubelet.runner import KubeletThread

    checks = tmp_path / "plan-checks.jsonl"
    zygote = _CheckingZygote(checks)  # imports while the cluster is set up
    seed = int(os.environ.get("WALRAS_GANG_FAULTS_SEED", "2828"))
    print(f"gang faults seed: {seed} (WALRAS_GANG_FAULTS_SEED)")
    rng = random.Random(seed)
    cp, ns = control_plane, namespace
    started = time.monotonic()
    cp.kubectl("apply", "-f", str(ROOT / "crds"))
    cp.kubectl("wait", "--for=condition=Established", "crd/fungiblejobs.walras.dev", "--timeout=60s")
    pool_name = f"{ns}-gp"
    label = {"walras.dev/fault-test": ns, "gang-pool": pool_name}
    nodes = [gpu_node(f"{ns}-g-{i}", label, gpus) for i, gpus in enumerate(GPUS)]
    node_names = {n["metadata"]["name"] for n in nodes}
    jobs_path = f"/apis/walras.dev/v1alpha1/namespaces/{ns}/fungiblejobs"

    def job(name: str, count: int, throughput: float, gang: bool) -> dict[str, Any]:
        doc = fungible_job(name, ns, {pool_name: throughput}, count)
        doc["spec"]["replicas"] = {"count": count, "gang": True} if gang else {"count": count}
        return doc

    def create(doc: dict[str, Any]) -> None:
        status, body = cp.request("POST", jobs_path, doc)
        assert status == 201, (status, body)
        changes["created"] += 1

    def delete(name: str) -> None:
        status, body = cp.request("DELETE", f"{jobs_path}/{name}")
        assert status == 200, (status, body)
        changes["deleted"] += 1

    def scale(name: str, count: int) -> None:
        status, body = cp.plane.request("PATCH", f"{jobs_path}/{name}", {"spec": {"replicas": {"count": count}}},
                                        content_type="application/merge-patch+json")
        assert status == 200, (status, body)
        changes["scaled"] += 1

    def pods_of(name: str) -> tuple[int, int]:
        """The job's pods (not terminating) that exist and that are bound to a node."""
        _, body = cp.request("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=walras.dev%2Fjob%3D{name}")
        items = [p for p in body.get("items", []) if not p["metadata"].get("deletionTimestamp")]
        return len(items), sum(bool(p["spec"].get("nodeName")) for p in items)

    changes: Counter[str] = Counter()
    kubelet = KubeletThread(cp.kubeconfig, nodes, lease_interval=5.0, status_interval=10.0).start()
    watch = _GangWatch(cp, ns)
    watcher = threading.Thread(target=watch.run, name="gang-watch", daemon=True)
    kubeconfig = tmp_path / "kubeconfig"
    replica: _ForkedReplica | None = None
    try:
        cp.apply_objects([pool(pool_name, label)])
        gangs = {"ga": 4, "gb": 3}  # the gang jobs now, name -> count
        extra = "gb"  # the gang that is replaced in the creation rounds
        for name, count in gangs.items():
            create(job(name, count, 2.0, gang=True))
        create(job("solo", 2, 1.0, gang=False))  # competes for the spare GPUs
        upstream_ssl = ssl.create_default_context(cafile=str(cp.ca_file))
        # no faults while the first replica starts and places the gangs (kopf's discovery backs off through them for
        # tens of seconds); every fault from the first round on, through all the kills and restarts
        with ProxyThread(FaultProxy(cp.server, FaultRates(), seed=seed, upstream_ssl=upstream_ssl)) as proxy:
            kubeconfig.write_text(yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "gang",
                "clusters": [{"name": "gang", "cluster": {"server": proxy.url}}],
                "users": [{"name": "gang", "user": {"token": cp.token}}],
                "contexts": [{"name": "gang", "context": {"cluster": "gang", "user": "gang", "namespace": ns}}]}))
            zygote.ready()
            watcher.start()
            replica = _ForkedReplica(zygote, kubeconfig, tmp_path, "gang", ns).start()
            # the first replica places the gangs whole (its kopf start is slow under the faults: discovery backs off)
            wait_until(lambda: sorted(watch.sample(time.monotonic()).values()) == [(3, 3), (4, 4)], 60,
                       "the gangs of 4 and 3 running whole")
            placed_s = time.monotonic() - started
            proxy.rates = copy.deepcopy(RATES)
            kills: list[dict[str, Any]] = []
            serial = 0
            for round_ in range(KILLS):
                wait_until(lambda r=replica: _readyz(r) == 200, 60, "the restarted replica leading")
                led = time.monotonic()
                creating = round_ % 2 == 0
                if creating:  # a gang deleted, another created: its pods come in the next plans
                    delete(extra)
                    gangs.pop(extra)
                    serial += 1
                    extra = f"gc{serial}"
                    gangs[extra] = rng.randint(2, 3)
                    create(job(extra, gangs[extra], 2.0, gang=True))
                    targets = {extra}
                else:  # a job scaled: a gang past the room is released whole, one within it grows
                    name = rng.choice([*gangs, "solo"])
                    count = rng.randint(3, 5) if name == "ga" else rng.randint(1, 3)
                    scale(name, count)
                    if name in gangs:
                        gangs[name] = count
                    targets = set()
                if creating:  # killed at once when it logs the first pod it created of the gang
                    gang = _created_gang_pod(replica, ns, targets, 30.0)
                else:
                    gang = None
                    time.sleep(rng.uniform(0.3, 3.0))
                replica.kill()
                created, bound = pods_of(gang) if gang else (-1, -1)
                kills.append({"at_s": round(time.monotonic() - started, 1), "led_s": round(time.monotonic() - led, 2),
                              "gang": gang, "created": created, "bound": bound, "of": gangs.get(gang or "", 0)})
                print(f"SIGKILL {len(kills)}: {kills[-1]}", flush=True)
                replica = _ForkedReplica(zygote, kubeconfig, tmp_path, "gang", ns, replica.extender_port).start()
            wait_until(lambda r=replica: _readyz(r) == 200, 60, "the last replica leading")
            last_change = time.monotonic()
            pending, violations = ["not checked yet"], ["not checked yet"]
            while time.monotonic() - last_change < SETTLE_BOUND_S:
                pending, violations = _live_state(cp, ns, node_names)
                if not pending and not violations:
                    break
                time.sleep(POLL_S)
            settle_s = time.monotonic() - last_change
            if not pending and not violations:  # and still so two plan periods later
                time.sleep(STABLE_S)
                pending, violations = _live_state(cp, ns, node_names)
            watch.stop.set()
            watcher.join(10)
            faults = dict(proxy.counts)
        final = watch.sample(time.monotonic())
        kill_times = [started + k["at_s"] for k in kills]
        plans, broken = _plan_checks(checks, zygote.proc.pid)
        now = time.monotonic()
        lengths = []
        for e in watch.episodes:
            end = e.end if e.end is not None else now
            cuts = [e.start, *[t for t in kill_times if e.start < t < end], end]
            stretch = max(b - a for a, b in itertools.pairwise(cuts))  # the longest with no SIGKILL in it
            lengths.append((round(end - e.start, 1), round(stretch, 1), e.job, e.worst))
            print(f"partial-gang episode: {e.job} from {e.start - started:.1f} s for {end - e.start:.1f} s "
                  f"(longest stretch without a SIGKILL {stretch:.1f} s), fewest running {e.worst}")
        worst = max(lengths, default=(0.0, 0.0, "", (0, 0)))
        worst_since = max(lengths, key=lambda x: x[1], default=(0.0, 0.0, "", (0, 0)))
        mid = [k for k in kills if k["gang"] and 0 <= k["bound"] < k["of"]]
        print(f"gang faults: {len(kills)} SIGKILLs ({len(mid)} while a gang had fewer than N pods bound: {mid}); "
              f"changes "
              f"{dict(changes)}; faults injected {faults}; {plans} plans checked, {len(broken)} broken; "
              f"{watch.polls} polls, {len(watch.episodes)} partial-gang episodes, longest {worst[0]} s ({worst[2]}, "
              f"fewest running {worst[3]}), longest stretch without a SIGKILL {worst_since[1]} s "
              f"({worst_since[2]}); first placement {placed_s:.1f} s; settled {settle_s:.1f} s after the last change; "
              f"gangs at the end {final}")
        assert watch.error is None, repr(watch.error)
        assert replica.alive(), replica.output()[-3000:]
        assert broken == [], broken[:20]
        assert plans >= 5, f"only {plans} plans checked: the planner hook did not run"
        late = [x for x in lengths if x[1] > GANG_TRANSITION_BOUND_S]
        assert late == [], f"partial gangs past {GANG_TRANSITION_BOUND_S} s (total s, longest stretch without a " \
                           f"SIGKILL, job, worst (k, N)): {late}"
        assert not pending and not violations, (pending, violations)
        assert not any(0 < k < big_n for k, big_n in final.values()), final
        # and the run was what it claims
        assert len(kills) == KILLS and len(mid) >= 2, kills
        assert watch.polls >= 40, watch.polls
        for fault in ("409", "429", "500", "latency", "watch-dropped"):
            assert faults.get(fault, 0) > 0, (fault, faults)
    finally:
        watch.stop.set()
        if replica is not None:
            replica.stop()
            print(replica.output()[-2000:])
        zygote.close()
        kubelet.stop(delete_nodes=True)
        cp.kubectl("delete", "resourcepools", pool_name, "--ignore-not-found", check=False)

