"""``walras demo``: the whole system on a local Kubernetes API, in one process.

Where it runs (a route table, ``--cluster``; ``auto`` is the default):

=================  ===========================================================================================
route              cluster
=================  ===========================================================================================
``real``           a local **real control plane** (etcd, kube-apiserver, kube-controller-manager from
                   ``$KUBEBUILDER_ASSETS``: :mod:`walras_testbed.kubelet.controlplane`) whose nodes are played by the
                   kubelet stand-in (:mod:`walras_testbed.kubelet.standin`: pods become Running or are rejected with
                   ``OutOf<resource>`` as a kubelet would); needs ``openssl``; about 10-20 s to start
``emulated``       the in-memory **emulated** API (:mod:`walras_testbed.emulator`, loopback; NOT a real cluster)
``auto``           ``real`` when the four binaries are in ``$KUBEBUILDER_ASSETS`` (``make demo`` unpacks them),
                   else ``emulated``; a real control plane that fails to start is an error, never a fallback
=================  ===========================================================================================

It creates the CRDs and the example nodes, namespaces, pools, profiles and jobs, runs the real operator (kopf,
direct binding mode, standalone) until every planned pod is bound to its planned node, then prints the pools with
their prices, the jobs with allocation, throughput and cost, and the pods with their nodes, phases and limits.
``--json`` prints the same as JSON; ``--serve`` keeps everything running with ``/metrics`` up until interrupted.
``--timeout`` bounds the wait for the pods once the cluster is up.

Module-level imports stay light (``walras --help`` imports this module); the operator, the planner, the emulator
and the kubelet stand-in are imported inside :func:`run`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from walras.planner.model import Plan

ROOT = Path(__file__).resolve().parents[3]
CONTROL_PLANE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo", help="run the operator on a local Kubernetes API with the example cluster",
        description="Start a local control plane (real kube-apiserver from $KUBEBUILDER_ASSETS with a kubelet "
                    "stand-in, else an emulated API, not a real cluster), create the example cluster, run the real "
                    "operator until every example pod is bound, print prices and placements.")
    parser.add_argument("--cluster", choices=("auto", "real", "emulated"), default="auto",
                        help="real: local kube-apiserver + kubelet stand-in; emulated: in-memory API; auto: real "
                             "when $KUBEBUILDER_ASSETS holds the binaries")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--serve", action="store_true", help="keep running with /metrics up until interrupted")
    parser.add_argument("--metrics-port", type=int, default=9847, help="port of /metrics with --serve")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="give up when the pods are not bound this many seconds after the cluster is up and the "
                             "planner is loaded (default: 60)")
    parser.add_argument("--quiet", action="store_true", help="no start-up progress on stderr")
    parser.add_argument("-f", "--file", action="append", default=[], metavar="PATH",
                        help="manifests to use instead of the bundled examples (files or directories)")
    return parser


def crd_paths() -> list[Path]:
    """The CRD manifests (``crds/`` of the project, or the copy packaged with ``walras``)."""
    for base in (Path(__file__).resolve().parents[1] / "crds", ROOT / "crds"):
        found = sorted(base.glob("*.yaml"))
        if found:
            return found
    raise FileNotFoundError("no CRD manifests found (crds/*.yaml)")


def example_paths() -> list[Path]:
    """The bundled example manifests (:mod:`walras.manifests.examples` where present, else ``examples/``)."""
    try:
        from walras.manifests import examples as packaged_examples

        found = [Path(p) for p in packaged_examples.example_paths()]
        if found and all(p.exists() for p in found):
            return found
    except (ImportError, AttributeError):
        pass
    for base in (Path(__file__).resolve().parents[1] / "examples", ROOT / "examples"):
        if base.is_dir() and any(base.rglob("*.yaml")):
            return [base]
    raise FileNotFoundError("no example manifests found (examples/)")


def read_manifests(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every YAML document of the files (directories: ``*.yaml``/``*.yml`` in sorted order)."""
    docs: list[dict[str, Any]] = []
    for path in paths:
        files = sorted([*path.rglob("*.yaml"), *path.rglob("*.yml")]) if path.is_dir() else [path]
        for file in files:
            for doc in yaml.safe_load_all(file.read_text()):
                if isinstance(doc, dict) and doc.get("kind"):
                    docs.append(doc)
    return docs


_ORDER = {"CustomResourceDefinition": 0, "Namespace": 1, "Node": 2, "ColocationProfile": 3, "ResourcePool": 4,
          "FungibleJob": 5}


def report(plan: Plan, pods: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Pools with prices, jobs with allocation/throughput/cost, pods with nodes, phases and limits (from the
    cluster)."""
    from walras.planner.model import LABEL_MANAGED

    managed = []
    for pod in pods:
        meta = pod["metadata"]
        if (meta.get("labels") or {}).get(LABEL_MANAGED) != "true":
            continue
        resources = ((pod.get("spec") or {}).get("containers") or [{}])[0].get("resources") or {}
        managed.append({"namespace": meta["namespace"], "name": meta["name"],
                        "job": meta["labels"].get("walras.dev/job"), "pool": meta["labels"].get("walras.dev/pool"),
                        "node": (pod.get("spec") or {}).get("nodeName"),
                        "phase": (pod.get("status") or {}).get("phase"),
                        "requests": resources.get("requests") or {}, "limits": resources.get("limits") or {}})
    return {
        "pools": [{"name": p.name, "resource": p.resource, "policy": p.policy, "nodes": p.node_count,
                   "capacity": p.capacity, "used": p.used, "price": p.price, "utilisation": p.utilisation}
                  for p in plan.pools.values()],
        "jobs": [{"namespace": j.namespace, "name": j.name, "phase": j.phase, "allocation": j.allocation,
                  "replicas": j.replicas, "count": j.count, "granted": sum(j.wanted.values()),
                  "reason": j.reason or None, "throughput": j.throughput, "utility": j.utility, "cost": j.cost}
                 for j in plan.jobs.values()],
        "pods": sorted(managed, key=lambda p: (p["namespace"], p["name"])),
        "solver": {"iterations": plan.solver.iterations, "gap": plan.solver.gap,
                   "converged": plan.solver.converged},
    }


def render(data: Mapping[str, Any]) -> str:
    def table(rows: list[list[str]]) -> str:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)

    out = ["POOLS", table([["NAME", "RESOURCE", "POLICY", "NODES", "CAPACITY", "USED", "PRICE", "UTIL"]] + [
        [p["name"], p["resource"], p["policy"], str(p["nodes"]), f"{p['capacity']:g}", f"{p['used']:g}",
         f"{p['price']:.4g}", f"{p['utilisation']:.0%}"] for p in data["pools"]]), "", "JOBS"]
    # REPLICAS: placed of spec.replicas.count, then per pool; REASON: the first blocking rule of a job short of its
    # count (docs/troubleshooting.md; `walras explain NAMESPACE/NAME` gives the numbers)
    out.append(table([["NAMESPACE", "NAME", "PHASE", "ALLOCATION", "REPLICAS", "THROUGHPUT", "COST", "REASON"]] + [
        [j["namespace"], j["name"], j["phase"],
         ",".join(f"{k}={v:.2f}" for k, v in j["allocation"].items() if v) or "-",
         f"{sum(j['replicas'].values())}/{j['count']} "
         + (",".join(f"{k}={v}" for k, v in j["replicas"].items() if v) or "-"),
         f"{j['throughput']:.4g}", f"{j['cost']:.4g}", j.get("reason") or "-"] for j in data["jobs"]]))
    out += ["", "PODS"]
    out.append(table([["NAMESPACE", "NAME", "POOL", "NODE", "PHASE", "REQUESTS", "LIMITS"]] + [
        [p["namespace"], p["name"], p["pool"] or "-", p["node"] or "-", p.get("phase") or "-",
         ",".join(f"{k}={v}" for k, v in p["requests"].items()) or "-",
         ",".join(f"{k}={v}" for k, v in p["limits"].items()) or "-"] for p in data["pods"]]))
    s = data["solver"]
    out += ["", f"solver: {s['iterations']} iterations, duality gap {s['gap']:.3g}, converged={s['converged']}"]
    return "\n".join(out)


def unsettled(plan: Plan | None, pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """What keeps the demo waiting: ``namespace/name: reason`` for every pod the plan places on a node that is not
    bound there yet, every surplus pod that still exists, and every pod the plan keeps without a node (which would
    never be bound), and every bound pod not Running yet. Empty when the cluster matches the plan and its pods run;
    ``["no plan yet"]`` before the first plan."""
    if plan is None:
        return ["no plan yet"]
    cluster = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
    out: list[str] = []
    for pod in plan.pods:
        current = cluster.get((pod.namespace, pod.name))
        name = f"{pod.namespace}/{pod.name}"
        if pod.action == "delete":
            if current is not None:
                out.append(f"{name}: planned for deletion, still exists")
            continue
        if pod.node is None:
            out.append(f"{name}: no node in pool {pod.pool!r} has room for it")
            continue
        bound = None if current is None else (current.get("spec") or {}).get("nodeName")
        if bound != pod.node:
            out.append(f"{name}: planned on {pod.node}, {'not created' if current is None else f'bound to {bound}'}")
        elif current is not None and (current.get("status") or {}).get("phase") == "Failed":
            status = current.get("status") or {}
            out.append(f"{name}: Failed on {bound} ({status.get('reason')}: {status.get('message')})")
        elif current is not None and (current.get("status") or {}).get("phase") != "Running":
            # the job's phase follows its pods (issue 28): wait for the kubelet, so the statuses printed have caught up
            out.append(f"{name}: bound to {bound}, not Running yet")
    return out


def settled(plan: Plan | None, pods: Iterable[Mapping[str, Any]]) -> bool:
    """Every planned pod exists, is bound to its planned node and Running, and no surplus or node-less pod is left."""
    return not unsettled(plan, pods)


def binaries_present() -> bool:
    """The four control-plane binaries are in ``$KUBEBUILDER_ASSETS``."""
    import os

    folder = os.environ.get("KUBEBUILDER_ASSETS")
    return folder is not None and bool(folder) and all(
        os.access(Path(folder) / name, os.X_OK) for name in CONTROL_PLANE_BINARIES)


class EmulatedCluster:
    """Route ``emulated``: the in-memory API with every manifest (nodes included) stored directly."""

    description = "emulated Kubernetes API, not a real cluster"
    emulated = True

    async def start(self, docs: list[dict[str, Any]], workdir: Path) -> Path:
        from walras_testbed.emulator import Emulator

        self.emulator = Emulator()
        await self.emulator.start()
        self.emulator.store.apply_manifests(docs)
        self.pod_type = self.emulator.store.types[("", "v1", "pods")]
        return Path(self.emulator.write_kubeconfig(workdir / "kubeconfig"))

    @property
    def url(self) -> str:
        return str(self.emulator.url)

    async def pods(self) -> list[dict[str, Any]]:
        return list(self.emulator.store.list(self.pod_type, None))

    async def stop(self) -> None:
        await self.emulator.stop()


class RealCluster:
    """Route ``real``: a local control plane; Nodes registered by the kubelet stand-in, the rest created through
    the API (CRDs first, waited for until Established; every namespace a document names, waited for until its
    ``default`` ServiceAccount exists)."""

    description = "local kube-apiserver v1.36 with a kubelet stand-in"
    emulated = False

    async def start(self, docs: list[dict[str, Any]], workdir: Path) -> Path:
        from walras_testbed.kubelet import ApiClient, ApiConfig, KubeletStandIn
        from walras_testbed.kubelet.controlplane import LocalControlPlane

        self.plane = await asyncio.to_thread(LocalControlPlane.start, workdir / "control-plane")
        config = ApiConfig.from_kubeconfig(self.plane.kubeconfig)
        self.client = ApiClient(config)
        await create_objects(self.client, [d for d in docs if d["kind"] != "Node"])
        self.kubelet = KubeletStandIn(ApiClient(config), [d for d in docs if d["kind"] == "Node"],
                                      lease_interval=5.0)
        await self.kubelet.start()
        return self.plane.kubeconfig

    @property
    def url(self) -> str:
        return self.plane.server

    async def pods(self) -> list[dict[str, Any]]:
        return list((await self.client.call("GET", "/api/v1/pods"))["items"])

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.kubelet.stop()
        with contextlib.suppress(Exception):
            await self.client.close()
        await asyncio.to_thread(self.plane.stop)


async def create_objects(client: Any, docs: list[dict[str, Any]], timeout: float = 60.0) -> None:
    """Create ``docs`` (CRDs, Namespaces, custom resources) through the API, in ``_ORDER``."""
    crds = {(d["spec"]["group"], d["spec"]["names"]["kind"]): d for d in docs
            if d["kind"] == "CustomResourceDefinition"}
    deadline = time.monotonic() + timeout

    async def wait(path: str, ready: Any, what: str) -> None:
        while True:
            status, body = await client.request("GET", path)
            if status == 200 and ready(body):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"walras demo: {what} not ready after {timeout:g} s")
            await asyncio.sleep(0.2)

    for crd in crds.values():
        await client.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    for crd in crds.values():
        await wait(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}",
                   lambda b: any(c.get("type") == "Established" and c.get("status") == "True"
                                 for c in (b.get("status") or {}).get("conditions") or []),
                   f"CRD {crd['metadata']['name']}")
    namespaces = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    for d in docs:
        group = d["apiVersion"].split("/")[0] if "/" in d["apiVersion"] else ""
        found = crds.get((group, d["kind"]))
        if found is not None and found["spec"]["scope"] == "Namespaced":
            namespaces.add(d["metadata"].get("namespace") or "default")
    explicit = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Namespace"}
    for name in sorted(namespaces):
        body = explicit.get(name) or {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        status, out = await client.request("POST", "/api/v1/namespaces", body)
        if status not in (201, 409):
            raise RuntimeError(f"walras demo: namespace {name}: {status} {out}")
    for name in sorted(namespaces):
        await wait(f"/api/v1/namespaces/{name}/serviceaccounts/default", lambda b: True,
                   f"the default ServiceAccount of {name}")
    for d in docs:
        if d["kind"] in ("CustomResourceDefinition", "Namespace"):
            continue
        group = d["apiVersion"].split("/")[0] if "/" in d["apiVersion"] else ""
        kind = crds.get((group, d["kind"]))
        if kind is None:
            raise ValueError(f"walras demo: cannot create a {d['kind']} (only CRDs, Namespaces, Nodes and the "
                             "custom resources of the CRDs)")
        base = f"/apis/{d['apiVersion']}"
        if kind["spec"]["scope"] == "Namespaced":
            base += f"/namespaces/{d['metadata'].get('namespace') or 'default'}"
        await client.call("POST", f"{base}/{kind['spec']['names']['plural']}", d)


async def demo(args: argparse.Namespace) -> int:
    from walras.cli.run import Servers, metrics_app
    from walras.kube.client import KubeClient, KubeConfig
    from walras.metrics import WalrasMetrics
    from walras.operator import Controller, IndexSource, OperatorOptions, run_operator
    from walras.planner import build_plan
    from walras.planner.model import Plan

    route = args.cluster if args.cluster != "auto" else ("real" if binaries_present() else "emulated")
    backend: EmulatedCluster | RealCluster = RealCluster() if route == "real" else EmulatedCluster()
    docs = read_manifests(crd_paths()) + read_manifests([Path(f) for f in args.file] or example_paths())
    docs.sort(key=lambda d: _ORDER.get(d["kind"], 9))

    from walras.cli.progress import step
    from walras.manifests.preload import preload

    show = not getattr(args, "quiet", False)
    with tempfile.TemporaryDirectory(prefix="walras-demo-") as tmp:
        begun = time.monotonic()
        # What the first plan loads on first use (the LP solver, the compiled kernels: compiled just in time on the
        # first run after an install without the ahead-of-time modules, up to a minute on a loaded machine), paid
        # before the cluster starts and before --timeout's clock (issue 29: a first demo timed out compiling).
        with step("walras demo", "loading the planner (the first run after an install compiles its kernels)",
                  enabled=show):
            await asyncio.to_thread(preload)
        loaded_at = time.monotonic()
        loaded = loaded_at - begun
        with step("walras demo", f"starting the {backend.description}", enabled=show):
            kubeconfig = await backend.start(docs, Path(tmp))
        started = time.monotonic()
        kube = KubeConfig.load(str(kubeconfig))
        metrics = WalrasMetrics()
        options = OperatorOptions(mode="direct", debounce=0.2, plan_period=5.0, identity="walras-demo")
        source = IndexSource()
        controller = Controller(KubeClient(kube), source, build_plan, options, metrics)
        stop = asyncio.Event()
        operator = asyncio.create_task(run_operator(controller, source, kube, peering=None, priority=0,
                                                    health_port=None, stop_flag=stop))
        servers = None
        status = 0
        try:
            while True:
                await asyncio.sleep(0.2)
                if operator.done():
                    operator.result()
                    print("walras demo: the operator stopped early", file=sys.stderr)
                    return 1
                if controller.plans and settled(controller.plan, await backend.pods()):
                    # one more pass, so that statuses and the report see the pods bound
                    passes = controller.plans
                    controller.trigger("demo: final pass")
                    while controller.plans == passes and time.monotonic() - started < args.timeout:
                        await asyncio.sleep(0.05)
                    if settled(controller.plan, await backend.pods()):
                        break
                if time.monotonic() - started > args.timeout:
                    waiting = unsettled(controller.plan, await backend.pods())
                    print(f"walras demo: not every planned pod was bound to its planned node within "
                          f"{args.timeout:g} s ({len(waiting)} left):", file=sys.stderr)
                    for line in waiting[:20]:
                        print(f"  {line}", file=sys.stderr)
                    print(f"walras demo: the {args.timeout:g} s started once the cluster was up and the planner "
                          f"loaded (its kernels compiled, {loaded:.0f} s); a plan that compiles more kernels on first "
                          "use, or a loaded machine, may need longer: walras demo --timeout SECONDS",
                          file=sys.stderr)
                    status = 1
                    break
            plan = controller.plan or Plan()
            data = report(plan, await backend.pods())
            data["seconds"] = round(time.monotonic() - started, 3)
            data["startup_seconds"] = round(started - loaded_at, 3)
            data["planner_load_seconds"] = round(loaded, 3)
            data["emulated"] = backend.emulated
            data["cluster"] = route
            print(json.dumps(data, indent=2) if args.json else render(data)
                  + f"\n\n({backend.description}; planner loaded in {data['planner_load_seconds']:.1f} s, "
                    f"cluster up in {data['startup_seconds']:.1f} s, "
                    f"pods placed {data['seconds']:.1f} s later)")
            if args.serve and status == 0:
                servers = await Servers.start([(metrics_app(metrics), "127.0.0.1", args.metrics_port, None)])
                print(f"serving http://127.0.0.1:{args.metrics_port}/metrics (API at {backend.url}, kubeconfig "
                      f"{kubeconfig}); Ctrl-C stops", flush=True)
                done = asyncio.Event()
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGINT, signal.SIGTERM):
                    with contextlib.suppress(NotImplementedError, RuntimeError):
                        loop.add_signal_handler(sig, done.set)
                await done.wait()
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(operator, 10)
            if servers is not None:
                await servers.stop()
            await backend.stop()
    return status


def run(args: argparse.Namespace) -> int:
    import logging
    import os

    logging.basicConfig(level=getattr(logging, os.environ.get("WALRAS_LOG_LEVEL", "WARNING").upper(), 30))
    logging.getLogger("kopf").setLevel(logging.ERROR)
    from walras_testbed.kubelet.controlplane import ControlPlaneError

    from walras.cli.errors import UsageError

    try:
        return asyncio.run(demo(args))
    except ControlPlaneError as exc:  # --cluster real without binaries, or a control plane that did not start
        raise UsageError(str(exc).splitlines()[0]) from None
    except KeyboardInterrupt:
        return 0
