"""``walras run``: the operator (kopf), the scheduler extender and the metrics endpoint in one process.

Module-level imports stay light: ``walras run --help`` imports this module to build its parser, and kopf, aiohttp,
the Kubernetes client, the metrics and the operator (3-9 s to import on a loaded 2-core machine) are imported by the
functions that use them (``tests/test_cli_help.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from walras.cli.errors import UsageError

if TYPE_CHECKING:
    import ssl

    from aiohttp import web

    from walras.extender import Extender
    from walras.kube.client import KubeConfig
    from walras.metrics import WalrasMetrics
    from walras.operator import Controller, IndexSource, OperatorOptions
    from walras.operator.handlers import ApiHealth
    from walras.operator.ownership import PoolScope
    from walras.planner.cluster import LabelSelector, TenantOptions

#: The extender's default listen address, :data:`walras.extender.DEFAULT_HOST` (loopback; kept here so that the
#: parser needs no import of the extender; ``tests/test_cli_help.py`` checks the two are equal).
DEFAULT_HOST = "127.0.0.1"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "run", help="run the operator, the scheduler extender and the metrics endpoint",
        description="Run the Walras operator (kopf) with the scheduler extender and Prometheus metrics. "
                    "Connects with $KUBECONFIG / ~/.kube/config, else the in-cluster service account. "
                    "Log level: $WALRAS_LOG_LEVEL (default INFO).")
    parser.add_argument("--mode", choices=("direct", "extender"), default="direct",
                        help="direct: the operator binds pods itself; extender: kube-scheduler calls the extender")
    parser.add_argument("--namespace", action="append", default=[], metavar="NS",
                        help="only FungibleJobs in this namespace (repeatable; default: all namespaces)")
    parser.add_argument("--pool-selector", default="", metavar="SELECTOR",
                        help="only ResourcePools whose labels match this label selector (kubectl syntax, e.g. "
                             "walras.dev/release=team-a; default: all pools; docs/tasks/two-releases.md)")
    parser.add_argument("--scheduler-name", default="walras-scheduler", help="schedulerName of the pods Walras creates")
    parser.add_argument("--extender-port", type=int, default=8888, help="port of /scheduler/{filter,prioritize,...}")
    parser.add_argument("--extender-tls-cert", help="serve the extender over TLS with this certificate")
    parser.add_argument("--extender-tls-key", help="private key of --extender-tls-cert")
    parser.add_argument("--extender-client-ca",
                        help="require a client certificate of this CA (kube-scheduler: tlsConfig.certFile)")
    parser.add_argument("--extender-host", default=DEFAULT_HOST,
                        help="address the extender listens on (default: loopback only; see docs/security.md)")
    parser.add_argument("--metrics-port", type=int, default=9847, help="port of /metrics")
    parser.add_argument("--health-port", type=int, default=8080, help="port of kopf's liveness probe /healthz")
    parser.add_argument("--peering", default="walras",
                        help="name of the coordination.k8s.io Lease that elects the leader (in the pod's namespace)")
    parser.add_argument("--standalone", action="store_true", help="no peering: this replica always acts")
    parser.add_argument("--plan-period", type=float, default=30.0, help="re-plan at least this often (seconds)")
    parser.add_argument("--debounce", type=float, default=1.0, help="wait this long after a change before planning")
    parser.add_argument("--max-migrations", type=int, default=10, metavar="N",
                        help="running pods of opt-in jobs (spec.migration) one plan may move through the Eviction "
                             "API, all jobs together (0: no rebalancing)")
    parser.add_argument("--node-loss-grace", type=float, default=300.0, metavar="SECONDS",
                        help="how long a node may be NotReady before its pods are force-deleted and re-planned "
                             "elsewhere")
    parser.add_argument("--job-metrics-limit", type=int, default=500,
                        help="export walras_job_* for at most this many jobs (highest cost first)")
    parser.add_argument("--tenants", action=argparse.BooleanOptionalAction, default=True,
                        help="plan Budgets' tenants as a Fisher market (docs/budgets.md; default: on, so that no "
                             "namespace takes the cluster by inflating its numbers; --no-tenants: every job its own "
                             "buyer; the chart's tenants.enabled)")
    parser.add_argument("--default-share", type=float, default=1.0, metavar="SHARE",
                        help="with --tenants: the share of a namespace no Budget selects (default 1)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    return parser


def setup_logging() -> None:
    level = os.environ.get("WALRAS_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=getattr(logging, level, logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if level != "DEBUG":
        logging.getLogger("kopf").setLevel(logging.WARNING)


def metrics_app(metrics: WalrasMetrics, extender: Extender | None = None,
                health: ApiHealth | None = None) -> web.Application:
    """``/metrics`` served by prometheus-client's own aiohttp handler (content negotiation with OpenMetrics,
    ``name[]`` filtering, compression) on the operator's registry, ``/healthz`` and, with ``extender``, its
    ``/readyz`` (200 on the leader only; served here because a kubelet probe cannot present the extender's client
    certificate). With ``health`` (:class:`walras.operator.handlers.ApiHealth`), ``/healthz`` answers 503
    ``degraded: ...`` while the Kubernetes API does not answer (the process keeps running and retrying)."""
    from aiohttp import web
    from prometheus_client.aiohttp import make_aiohttp_handler

    async def healthz(request: web.Request) -> web.Response:
        if health is None:
            return web.Response(text="ok")
        healthy, text = health.report()
        return web.Response(text=text, status=200 if healthy else 503)

    app = web.Application()
    app.router.add_get("/metrics", make_aiohttp_handler(metrics.registry))
    app.router.add_get("/healthz", healthz)
    if extender is not None:
        app.router.add_get("/readyz", extender.readyz)
    return app


@dataclass
class Servers:
    """The HTTP servers beside kopf (extender, metrics), started and stopped together."""

    runners: list[web.AppRunner]

    @classmethod
    async def start(cls, apps: list[tuple[web.Application, str, int, ssl.SSLContext | None]]) -> Servers:
        from aiohttp import web

        servers = cls([])
        for app, host, port, ctx in apps:
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
            await runner.setup()
            servers.runners.append(runner)
            try:
                await web.TCPSite(runner, host, port, ssl_context=ctx).start()
            except OSError as exc:
                await servers.stop()
                raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc} "
                                 "(another process has the port? choose another with the --*-port options)") from exc
        return servers

    async def stop(self) -> None:
        for runner in self.runners:
            await runner.cleanup()


def tenant_options(args: argparse.Namespace) -> TenantOptions | None:
    """``--tenants`` / ``--default-share`` (docs/budgets.md): None with tenants off; a share <= 0 is an error."""
    from walras.planner.cluster import TenantOptions

    if not getattr(args, "tenants", True):
        return None
    share = float(getattr(args, "default_share", 1.0))
    if not share > 0 or share == float("inf"):
        raise ValueError(f"--default-share must be a finite number > 0, got {share}")
    return TenantOptions(default_share=share)


def operator_options(args: argparse.Namespace) -> OperatorOptions:
    """The operator's settings from ``args``; :class:`UsageError` for a value out of range."""
    from walras.operator import OperatorOptions

    try:
        return OperatorOptions(mode=args.mode, namespaces=tuple(args.namespace), scheduler_name=args.scheduler_name,
                               plan_period=args.plan_period, debounce=args.debounce,
                               max_migrations=args.max_migrations, node_loss_grace=args.node_loss_grace,
                               identity=f"walras@{os.uname().nodename}/{os.getpid()}",
                               tenants=tenant_options(args))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def pool_selector(args: argparse.Namespace) -> LabelSelector | None:
    """``--pool-selector`` parsed (:func:`walras.kube.decode.label_selector_text`); None when empty;
    :class:`UsageError` naming the bad part."""
    from walras.kube.decode import label_selector_text

    text = str(getattr(args, "pool_selector", "") or "").strip()
    if not text:
        return None
    try:
        return label_selector_text(text)
    except ValueError as exc:
        raise UsageError(f"--pool-selector: {exc}") from exc


def pool_scope(args: argparse.Namespace, kube: KubeConfig) -> PoolScope:
    """The release's pools (:class:`walras.operator.ownership.PoolScope`): its ``--pool-selector``, and its
    identity ``NAMESPACE/LEASE`` (the Lease that elects its leader, shared by the release's replicas), which it writes
    on the pools it claims."""
    from walras.operator.handlers import lease_namespace
    from walras.operator.ownership import PoolScope

    return PoolScope(release=f"{lease_namespace(kube)}/{args.peering}", selector=pool_selector(args))


def build(args: argparse.Namespace, kube: KubeConfig) -> tuple[Controller, IndexSource, Extender, WalrasMetrics]:
    """The controller, its index source, the extender and the metrics for ``args``."""
    from walras.extender import Extender
    from walras.kube.client import KubeClient
    from walras.metrics import WalrasMetrics
    from walras.operator import Controller, IndexSource
    from walras.planner import build_plan

    metrics = WalrasMetrics(job_metrics_limit=args.job_metrics_limit)
    options = operator_options(args)
    source = IndexSource(options.namespaces)
    controller = Controller(KubeClient(kube), source, build_plan, options, metrics)
    controller.pool_scope = pool_scope(args, kube)
    extender = Extender(lambda: controller.plan, binder=controller.bind, metrics=metrics,
                        foreign_binder=controller.bind_foreign)  # the binder of every pod sent (docs/refusals.md)
    return controller, source, extender, metrics


def extender_tls(cert: str | None, key: str | None, client_ca: str | None = None) -> ssl.SSLContext | None:
    """The server-side TLS context of the extender for ``--extender-tls-cert``/``--extender-tls-key`` (PEM files),
    requiring client certificates of ``--extender-client-ca`` when given, or ``None`` (plain HTTP) when neither
    certificate nor key is given."""
    if not (cert or key):
        if client_ca:
            raise ValueError("--extender-client-ca needs --extender-tls-cert and --extender-tls-key")
        return None
    if not (cert and key):
        raise ValueError("--extender-tls-cert and --extender-tls-key go together")
    from walras.extender import server_tls

    return server_tls(cert, key, client_ca)


def check_port_free(host: str, port: int, option: str) -> None:
    """:class:`UsageError` when ``host:port`` cannot be bound (checked before kopf starts its health server, whose
    bind error kopf would log with a traceback before the operator stops)."""
    if not port:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port} ({option}): {exc.strerror or exc}") from exc


def load_kube_config(kubeconfig: str | None) -> KubeConfig:
    """The cluster connection as kubectl finds it; :class:`UsageError` when there is none."""
    from walras.kube.client import KubeConfig
    from walras.kube.errors import ConfigError

    try:
        return KubeConfig.load(kubeconfig)
    except (ConfigError, OSError) as exc:
        raise UsageError(f"no Kubernetes cluster configured ({_one_line(exc)}): pass --kubeconfig, set $KUBECONFIG "
                         "or ~/.kube/config, or run inside a cluster") from exc


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


async def check_reachable(kube: KubeConfig, timeout: float = 10.0) -> None:
    """GET ``/version`` once (:func:`walras.kube.client.probe`); :class:`UsageError` naming the server when it cannot
    be reached. Any HTTP answer (even 401/403) counts as reachable: authorization errors surface in the operator's own
    requests."""
    from walras.kube.client import probe
    from walras.kube.errors import ServiceUnavailable

    try:
        await probe(kube, timeout)
    except ServiceUnavailable as exc:
        raise UsageError(f"cannot reach the Kubernetes API at {kube.server}: {exc.message}") from exc


async def serve(args: argparse.Namespace) -> int:
    from walras.extender import start_site
    from walras.operator import run_operator
    from walras.operator.handlers import ApiHealth

    try:
        tls = extender_tls(args.extender_tls_cert, args.extender_tls_key, args.extender_client_ca)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    operator_options(args)  # options out of range: one line before anything starts
    pool_selector(args)
    check_port_free("0.0.0.0", args.health_port, "--health-port")
    kube = load_kube_config(args.kubeconfig)
    await check_reachable(kube)
    controller, source, extender, metrics = build(args, kube)
    try:
        extender_runner, _ = await start_site(extender.app(), args.extender_host, args.extender_port, tls)
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.extender_host}:{args.extender_port}: {exc.strerror or exc} "
                         "(another process has the port? choose another with --extender-port)") from exc
    health = ApiHealth()
    servers = await Servers.start([(metrics_app(metrics, extender, health), "0.0.0.0", args.metrics_port, None)])
    servers.runners.append(extender_runner)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    logging.getLogger("walras").info(
        "walras run: mode=%s extender=%s:%d metrics=:%d leader Lease=%s", args.mode, args.extender_host,
        args.extender_port, args.metrics_port, "none (standalone)" if args.standalone else args.peering)
    try:
        await run_operator(controller, source, kube, peering=None if args.standalone else args.peering,
                           health_port=args.health_port or None, stop_flag=stop, extender=extender, health=health)
    finally:
        await servers.stop()
        await controller.stop()
        await controller.client.close()
    return 0


def settle_gc() -> None:
    """Move every object alive after start-up (the imported modules: torch, numpy, kopf, ~10^6 objects) out of the
    cyclic collector's reach (``gc.freeze``), once, at process start. Otherwise each full collection triggered by a
    plan's allocations walks them all: measured 4.7 s -> 2.2 s for one plan of 500 nodes / 600 jobs on a loaded
    2-core machine. Done here, by the process owner, never inside a plan (the planner changes no process state)."""
    import gc

    gc.collect()
    gc.freeze()


def run(args: argparse.Namespace) -> int:
    setup_logging()
    try:
        from walras.manifests.preload import preload

        # what a first plan loads on first use (the LP solver, the compiled kernels of price discovery and of the
        # placement policies), once at start-up and before the freeze, not in the first plan
        preload()
        settle_gc()
        return asyncio.run(serve(args))
    except KeyboardInterrupt:
        return 0
