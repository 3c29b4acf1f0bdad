"""The Walras operator: kopf handlers and indexes, the reconcile loop, and the Kubernetes API writes."""

from walras.operator.controller import Controller, OperatorOptions, fingerprint
from walras.operator.handlers import IndexSource, build_registry, ensure_peering, run_operator
from walras.operator.kube import KubeClient, KubeConfig, KubeError, RetryPolicy
from walras.operator.translate import event_body, pod_manifest, resize_containers, snapshot_from, status_patch

__all__ = [
    "Controller",
    "IndexSource",
    "KubeClient",
    "KubeConfig",
    "KubeError",
    "OperatorOptions",
    "RetryPolicy",
    "build_registry",
    "ensure_peering",
    "event_body",
    "fingerprint",
    "pod_manifest",
    "resize_containers",
    "run_operator",
    "snapshot_from",
    "status_patch",
]
