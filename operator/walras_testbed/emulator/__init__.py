"""An emulated Kubernetes API on loopback, for ``walras demo`` and the tests. It is NOT a real cluster.

It stores objects in memory and serves discovery, CRUD, list/watch, patches, the status / binding / resize /
eviction sub-resources (evictions honour PodDisruptionBudgets), finalizers, owner-reference garbage collection,
Events and kopf's peering resources, so that the real
``kubectl`` (1.35, ``--validate=false``) and the real Walras operator (kopf) can run against it. There is no
scheduler, admission, authentication or kubelet beyond marking a bound pod Running. Nothing in the product imports it
except ``walras demo``; it imports nothing from ``walras`` or ``allocator`` (an import-linter contract).

Run it standalone with ``python -m walras_testbed.emulator --port 0 --kubeconfig KUBECONFIG``.
"""

from walras_testbed.emulator.selectors import FieldSelector, LabelSelector, SelectorError
from walras_testbed.emulator.server import Emulator, EmulatorApp, EmulatorThread, write_kubeconfig
from walras_testbed.emulator.store import ApiError, Fault, ResourceType, Store, json_patch, merge_patch

__all__ = [
    "ApiError",
    "Emulator",
    "EmulatorApp",
    "EmulatorThread",
    "Fault",
    "FieldSelector",
    "LabelSelector",
    "ResourceType",
    "SelectorError",
    "Store",
    "json_patch",
    "merge_patch",
    "write_kubeconfig",
]
