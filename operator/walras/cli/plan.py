"""``walras plan -f FILES_OR_DIRS [--json]``: plan offline from YAML manifests, no cluster needed."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from walras.planner import Plan, build_plan, load_manifests


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``walras plan`` and its options."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="plan offline from YAML manifests (nodes, pods, ResourcePools, FungibleJobs, ColocationProfiles)",
        description="Run the planner on YAML manifests and print prices, allocations and pod placements.",
    )
    parser.add_argument(
        "-f",
        "--filename",
        dest="files",
        action="append",
        required=True,
        metavar="FILES_OR_DIRS",
        help="a YAML file or a directory searched recursively (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="print the whole plan as JSON")
    return parser


def render(plan: Plan) -> str:
    """A human-readable summary: pools with prices, jobs with allocations, pods with nodes, warnings."""
    lines = ["POOL        RESOURCE          POLICY      NODES  CAPACITY      USED     PRICE  UTIL"]
    for name, p in plan.pools.items():
        lines.append(
            f"{name:<11} {p.resource:<17} {p.policy:<11} {p.node_count:>5} {p.capacity:>9.4g} {p.used:>9.4g} "
            f"{p.price:>9.4g} {p.utilisation:>5.0%}"
        )
    lines.append("")
    lines.append("JOB                          PHASE          THROUGHPUT      COST  REPLICAS")
    for job in plan.jobs.values():
        replicas = ",".join(f"{k}={v}" for k, v in job.replicas.items()) or "-"
        lines.append(
            f"{job.namespace + '/' + job.name:<28} {job.phase:<14} {job.throughput:>10.4g} {job.cost:>9.4g}  {replicas}"
        )
    lines.append("")
    lines.append("POD                                      ACTION  POOL        NODE             REQUESTS")
    for pod in plan.pods:
        requests = ",".join(f"{k}={v}" for k, v in pod.requests.items())
        lines.append(
            f"{pod.namespace + '/' + pod.name:<40} {pod.action:<7} {pod.pool:<11} {pod.node or '-':<16} {requests}"
        )
    warnings = [e for e in plan.events if e.type == "Warning"]
    if warnings:
        lines.append("")
        lines.append("WARNINGS")
        for e in warnings:
            target = f"{e.kind}/{e.namespace + '/' if e.namespace else ''}{e.name}"
            lines.append(f"{target}: {e.reason}: {e.message}")
    s = plan.solver
    lines.append("")
    lines.append(
        f"solver: {s.iterations} evaluations, gap {s.gap:.3g}, converged {s.converged}, {s.seconds:.3f} s; "
        f"plan {plan.seconds:.3f} s"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Load the manifests, build the plan, print it; exit 1 with a message for unreadable input."""
    try:
        snapshot = load_manifests(args.files)
    except ValueError as exc:
        print(f"walras plan: {exc}", file=sys.stderr)
        return 1
    plan = build_plan(snapshot)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2, sort_keys=False))
    else:
        print(render(plan))
    return 0
