"""The Walras operator: kopf handlers and indexes, and the reconcile loop composed of a watcher, an actuator and a
status writer. Every API object it reads or writes goes through :mod:`walras.kube`."""

from walras.operator.actuator import Actuator
from walras.operator.controller import Controller, OperatorOptions
from walras.operator.handlers import IndexSource, build_registry, ensure_peering, run_operator
from walras.operator.statuses import StatusWriter
from walras.operator.watch import SnapshotIndex, Watcher

__all__ = [
    "Actuator",
    "Controller",
    "IndexSource",
    "OperatorOptions",
    "SnapshotIndex",
    "StatusWriter",
    "Watcher",
    "build_registry",
    "ensure_peering",
    "run_operator",
]
