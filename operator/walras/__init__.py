"""Walras: the Kubernetes side (planner, kopf operator, scheduler extender, metrics, CLI).

Layers (checked by import-linter in ``make lint``)::

    walras.cli  ->  walras.operator | walras.extender  ->  walras.metrics  ->  walras.planner  ->  allocator

The planner is a pure function from a cluster snapshot to a plan; kopf and HTTP handlers only translate.
"""

__version__ = "0.1.0"
