"""``walras explain NAMESPACE/NAME [-f FILES_OR_DIRS | --kubeconfig FILE] [-o text|json]``: why a FungibleJob has the
replicas it has. Also the kubectl plugin ``kubectl-walras`` (``kubectl walras explain NAMESPACE/NAME``).

Plans the cluster (manifests with ``-f``, as ``walras plan`` reads them; else the live cluster of the kubeconfig, as
``walras check`` reads it) and prints, for the one job, what the plan says (every number is the plan's, computed once
by the status phase, :mod:`walras.planner.status`; nothing is recomputed here):

* what the job asked for (its spec: replicas, the priced amount per replica, throughput per pool, priority weight);
* what it was granted per pool and what it pays: granted and placed replicas, the pool's price, the units its placed
  replicas hold and the spend (``price x units``);
* its bid per pool, the marginal utility of one more unit at the granted allocation (``u_i'(t) a_ij / (N_i d_i)``,
  paper 004 Sec. 2.2), against the pool's price;
* for every replica not granted or not placed, the blocking rule with its numbers (docs/troubleshooting.md);
* its place among the waiting jobs (priority ``spec.weight`` high first, then bid, then age) and, for a waiting job
  with nothing placed, when it would start: the simulator run forward over the plan's jobs and the work they have
  left (:func:`walras.simulate.forecast.estimate_start`; none, with the reason, where its model is not the plan's).

Exit status 0 when the job is found, 2 for a usage error (no such job, unreadable manifests, no cluster).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from typing import Any

from walras.cli.errors import UsageError


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``walras explain`` and its options."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "explain", help="say why a FungibleJob has the replicas it has (grants, prices, bids, what blocks the rest)",
        description="Plan the cluster and explain one FungibleJob: what it asked for, what it was granted per pool "
                    "and what it pays, its bid against each pool's price, the rule that blocks each replica not "
                    "granted, and its place among the waiting jobs.")
    parser.add_argument("job", metavar="NAMESPACE/NAME", help="the FungibleJob (NAME alone means namespace default)")
    parser.add_argument("-f", "--filename", dest="files", action="append", default=None, metavar="FILES_OR_DIRS",
                        help="YAML or JSON manifests (as for walras plan) instead of a live cluster (repeatable)")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig of the live cluster (default: the usual)")
    parser.add_argument("--context", default=None, help="kubeconfig context (default: the current one)")
    parser.add_argument("--tenants", action=argparse.BooleanOptionalAction, default=True,
                        help="plan tenants' budgets as a Fisher market, as `walras run` does (docs/budgets.md; "
                             "default: on, as walras run and walras plan; --no-tenants: every job its own buyer)")
    parser.add_argument("--default-share", type=float, default=1.0,
                        help="with tenants: the share of a namespace no Budget selects (default 1)")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text",
                        help="output format (default: text)")
    return parser


def _key(text: str) -> tuple[str, str]:
    namespace, _, name = text.rpartition("/")
    if not name or "/" in namespace:
        raise UsageError(f"expected NAMESPACE/NAME, got {text!r}")
    return (namespace or "default", name)


def explain_document(plan: Any, job: Any, key: tuple[str, str], estimate: Any = None) -> dict[str, Any]:
    """The JSON view of one job's plan (``-o json``; the text view prints the same). ``job`` is the typed
    :class:`walras.planner.cluster.Job` (its spec is what it asked for); ``estimate`` the
    :class:`walras.simulate.forecast.StartEstimate` of a waiting job (None: not asked for)."""
    from walras.planner.queue import QUEUE_ORDER  # how the waiting jobs are ordered (docs/preemption.md)

    jp = plan.jobs[key]
    spec = job.spec if job is not None else None
    pools: dict[str, Any] = {}
    for name in sorted(set(jp.wanted) | set(jp.replicas) | set(jp.bids)):
        pool = plan.pools.get(name)
        pools[name] = {
            "resource": pool.resource if pool is not None else "",
            "price": pool.price if pool is not None else None,
            "granted": jp.wanted.get(name, 0), "placed": jp.replicas.get(name, 0),
            "units": jp.units.get(name, 0.0), "spend": jp.spend.get(name, 0.0),
            "bid": jp.bids.get(name), "allocation": jp.allocation.get(name, 0.0),
        }
    asked: dict[str, Any] = {}
    if spec is not None:
        asked = {"replicas": spec.replicas, "minReplicas": spec.min_replicas, "elastic": spec.elastic,
                 "demand": spec.demand, "throughput": dict(spec.throughput), "throughputUnit": spec.throughput_unit,
                 "weight": spec.weight, "utility": spec.utility.type,
                 "gang": spec.replicas if spec.gang else None}  # all or none in one pool (docs/gangs.md)
    tenant = None
    held = plan.tenants.get(jp.tenant) if jp.tenant else None
    if held is not None:  # the tenant's budget and what it holds (docs/budgets.md), as the plan reports them
        tenant = {"name": held.name, "budget": held.budget, "share": held.share, "units": dict(held.units),
                  "spendRate": held.spend_rate, "pricedSpend": held.priced_spend, "caps": dict(held.caps)}
    return {
        "job": f"{key[0]}/{key[1]}",
        "phase": jp.phase,
        "asked": asked,
        "tenant": tenant,
        "replicas": {"count": jp.count, "granted": sum(jp.wanted.values()), "placed": sum(jp.replicas.values()),
                     "bound": jp.bound, "running": jp.running},
        "pools": pools,
        "cost": jp.cost,
        "throughput": jp.throughput,
        "blocked": [b.to_dict() for b in jp.blockers],
        "reason": jp.reason or None,
        "queue": ({"position": jp.queue_position, "waiting": jp.waiting, "order": QUEUE_ORDER,
                   "start": estimate.to_dict() if estimate is not None else None}
                  if jp.queue_position is not None else None),
        "conditions": [c.to_dict() for c in jp.conditions],
    }


def _n(value: float | None) -> str:
    return "unbounded" if value is None else f"{value:.4g}"


def _duration(seconds: float) -> str:
    """``2 h 05 min``, ``4 min 10 s``, ``12 s``: a simulated wait for a person (whole seconds)."""
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(widths[c]) for c, cell in enumerate(row)).rstrip() for row in rows]


def render(doc: dict[str, Any]) -> str:
    """The text view of :func:`explain_document`."""
    r = doc["replicas"]
    out = [f"FungibleJob {doc['job']}: {doc['phase']} " + (
        "(not planned: its Valid condition says why)" if doc["phase"] == "Invalid" else
        f"({r['running']} of {r['count']} replica(s) running, {r['placed']} placed, {r['granted']} granted)")]
    asked = doc["asked"]
    if asked:
        each = f"{asked['demand']:g} unit(s) of each pool's priced resource per replica"
        count = (f"{asked['minReplicas']} to {asked['replicas']}" if asked["elastic"] else str(asked["replicas"]))
        if asked.get("gang"):
            count += f" (a gang of {asked['gang']}: all in one pool or none)"
        unit = asked["throughputUnit"]
        unit = unit if unit.startswith("/") else f" {unit}"
        through = ", ".join(f"{p}={v:g}{unit}" for p, v in asked["throughput"].items())
        out.append(f"Asked for: {count} replica(s), {each}; throughput {through}; utility {asked['utility']}, "
                   f"priority weight {asked['weight']:g}")
    tenant = doc.get("tenant")
    if tenant is not None:
        held = ", ".join(f"{p}={u:g}" for p, u in tenant["units"].items()) or "none"
        caps = ", ".join(f"{p}={u:g}" for p, u in tenant["caps"].items()) or "none"
        out.append(f"Tenant {tenant['name']}" + (f" (Budget {tenant['budget']})" if tenant["budget"] else "")
                   + f": share {tenant['share']:g} credits/h; its placed pods hold {held} unit(s), spend rate "
                   f"{tenant['spendRate']:.4g} credits/h (the market's allocation {tenant['pricedSpend']:.4g}); "
                   f"caps {caps}")
    if doc["pools"]:
        out.append("Per pool (granted and placed replicas, what the placed ones pay; bid = marginal utility per "
                   "unit at the granted allocation):")
        rows = [["POOL", "RESOURCE", "GRANTED", "PLACED", "PRICE", "UNITS", "SPEND", "BID", "BID VS PRICE"]]
        for name, p in doc["pools"].items():
            price, bid = p["price"], p["bid"]
            versus = "-" if price is None else ("above" if bid is None or bid > price * (1 + 1e-9) + 1e-12 else
                                                "at or below")
            rows.append([name, p["resource"] or "-", str(p["granted"]), str(p["placed"]), _n(price),
                         f"{p['units']:g}", f"{p['spend']:.4g}", _n(bid), versus])
        out += _table(rows)
        out.append(f"Total: cost {doc['cost']:.4g} at current prices, throughput {doc['throughput']:.4g}")
    if doc["blocked"]:
        out.append("Not granted or not placed:")
        for b in doc["blocked"]:
            out.append(f"  {b['replicas']} replica(s), pool {b['pool']}: {b['reason']}: {b['message']}")
    elif r["placed"] >= r["count"] and doc["phase"] != "Invalid":
        out.append("Nothing blocks this job: every replica it asked for is placed.")
    elif doc["phase"] not in ("Invalid", "Complete", "Failed", "Suspended"):
        out.append(f"Not placed: {r['count'] - r['placed']} replica(s), by no rule of the blocking-rule table; "
                   "the conditions below say why")
    queue = doc["queue"]
    if queue is not None:
        out.append(f"Queue: position {queue['position']} of {queue['waiting']} waiting job(s) (order: "
                   f"{queue['order']})")
        start = queue.get("start")
        if start is not None:
            out.append(f"Estimated start: in {_duration(start['seconds'])} ({start['note']})" if start["seconds"]
                       is not None else f"Estimated start: none ({start['note']})")
    if doc["conditions"]:
        out.append("Conditions:")
        for c in doc["conditions"]:
            out.append(f"  {c['type']}={c['status']} {c['reason']}" + (f": {c['message']}" if c["message"] else ""))
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    """Plan the cluster, print the job's explanation; a job that is not there is a usage error."""
    import time

    from walras.kube.decode import cluster_from
    from walras.planner.cluster import TenantOptions
    from walras.planner.plan import PlanOptions, build_plan

    key = _key(args.job)
    if args.files:
        from walras.manifests import load_manifests

        try:
            snapshot = load_manifests(args.files, validate=False)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        now = None
    else:
        from walras.cli.check import live_snapshot

        snapshot = live_snapshot(args.kubeconfig, args.context)
        now = time.time()
    cluster = cluster_from(snapshot)
    tenants = bool(args.tenants)
    if tenants and not args.default_share > 0:
        raise UsageError(f"--default-share must be > 0, got {args.default_share:g}")
    options = PlanOptions(now=now, tenants=TenantOptions(default_share=args.default_share) if tenants else None)
    plan = build_plan(cluster, options=options)
    if key not in plan.jobs:
        known = [f"{ns}/{name}" for ns, name in sorted(plan.jobs)]
        close = difflib.get_close_matches(f"{key[0]}/{key[1]}", known, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else (
            f"; the jobs are: {', '.join(known[:10])}" if known else "; there is no FungibleJob")
        raise UsageError(f"no FungibleJob {key[0]}/{key[1]}{hint}")
    job = next((j for j in cluster.jobs if j.key == key), None)
    estimate = None
    if plan.jobs[key].queue_position is not None and not plan.jobs[key].replicas:  # waiting, nothing placed
        from walras.simulate.forecast import estimate_start

        estimate = estimate_start(cluster, plan, key, tenants=options.tenants is not None)
    doc = explain_document(plan, job, key, estimate)
    if args.output == "json":
        json.dump(doc, sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(render(doc))
    return 0
