"""``walras check [-f FILES_OR_DIRS | --kubeconfig FILE]``: the scheduler's invariants on a cluster.

Reads the cluster (manifests with ``-f``, Pods included; else the live cluster of the kubeconfig, through the
kubernetes client) and runs :func:`walras.planner.invariants.check_cluster`: per-node over-commit on any resource,
pods bound to nodes that do not exist, pods of deleted jobs, pools over capacity, statuses that disagree with the
pods (a replica count, or a phase the pods contradict: ``Running`` with no pod Running, ``Pending`` with one).
Prints one line per violation (or ``-o json``); exit status 0 when there is none, 1 when there is any, 2 for a
usage error (unreadable manifests, no reachable cluster).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from walras.cli.errors import UsageError

GROUP, VERSION = "walras.dev", "v1alpha1"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``walras check`` and its options."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "check", help="check the scheduler's invariants on a cluster (live, or from manifests)",
        description="Report over-committed nodes, pods on missing nodes, orphaned pods, pools over capacity and "
                    "statuses that disagree with the pods; exit 1 on any violation.")
    parser.add_argument("-f", "--filename", dest="files", action="append", default=None, metavar="FILES_OR_DIRS",
                        help="YAML manifests (nodes, pods and the Walras kinds) instead of a live cluster")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig of the live cluster (default: the usual)")
    parser.add_argument("--context", default=None, help="kubeconfig context")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    return parser


def live_snapshot(kubeconfig: str | None, context: str | None) -> Any:
    """Nodes, pods, pools, jobs and profiles of the live cluster, as raw objects
    (:func:`walras.kube.client.read_cluster`)."""
    from walras.kube.client import read_cluster
    from walras.kube.errors import ConfigError
    from walras.kube.snapshot import snapshot_from

    try:
        nodes, pods, lists = read_cluster(kubeconfig, context, GROUP, VERSION)
    except ConfigError as exc:
        raise UsageError(f"cannot load a kubeconfig: {exc}") from None
    except Exception as exc:  # an ApiError, or urllib3's: report what failed in one line
        raise UsageError(f"cannot read the cluster: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None
    return snapshot_from(nodes, pods, lists[0], lists[1], lists[2])


def run(args: argparse.Namespace) -> int:
    """Check the cluster; print violations; 0 when none, 1 otherwise."""
    import json

    from walras.kube.decode import cluster_from
    from walras.manifests.loader import load_manifests
    from walras.planner.invariants import check_cluster

    if args.files:
        try:
            snapshot = load_manifests(args.files, validate=False)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    else:
        snapshot = live_snapshot(args.kubeconfig, args.context)
    violations = check_cluster(cluster_from(snapshot))
    if args.output == "json":
        json.dump([{"kind": v.kind, "object": v.object, "message": v.message} for v in violations], sys.stdout)
        sys.stdout.write("\n")
    else:
        for v in violations:
            print(v)
        print(f"{len(violations)} violation(s) in {len(snapshot.nodes)} node(s), {len(snapshot.pods)} pod(s), "
              f"{len(snapshot.jobs)} job(s)", file=sys.stderr)
    return 1 if violations else 0
