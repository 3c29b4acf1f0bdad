"""Offline tooling around the planner: manifests read from files, checked against the CRDs, the packaged example
cluster and the start-up preload. The planner never imports this package (an import-linter contract): it plans a
:class:`~walras.planner.model.Snapshot` however it was obtained, and this package is one way to obtain one.

=====================================  ==========================================================================
module                                 computes
=====================================  ==========================================================================
:mod:`walras.manifests.reader`         YAML streams decoded as ``yaml.SafeLoader`` does, faster (``load_yaml``)
:mod:`walras.manifests.loader`         files and directories of manifests -> a ``Snapshot`` (``load_manifests``),
                                       and the pieces ``walras plan`` reads ahead in a child process
:mod:`walras.manifests.schema`         a Walras object's errors against its CRD (structural schema, CEL rules)
:mod:`walras.manifests.examples`       the example cluster packaged with ``walras`` (``walras demo``, tests)
:mod:`walras.manifests.preload`        a process's one-time costs of planning paid before its first plan
=====================================  ==========================================================================

Nothing here imports the planner's phases (numpy, the market, the compiled kernels) at import time, so ``walras
plan``'s read-ahead child reads manifests without them (:class:`walras.cli.plan.ReadAhead`); ``preload`` imports
them when called.
"""

from walras.manifests.loader import load_manifests

__all__ = ["load_manifests"]
