"""``walras.simulate``: a discrete-event simulator that drives the planner (:func:`walras.planner.build_plan`) and
baseline scheduling policies over a trace of jobs on a virtual GPU cluster (issue 21; see ``docs/simulate.md``).

Pure: no Kubernetes client, kopf or HTTP. Modules: :mod:`.trace` (Gavel-style traces, CSV), :mod:`.cluster` (the
virtual cluster), :mod:`.state` (what a policy sees and answers), :mod:`.policies`, :mod:`.engine` (the event loop),
:mod:`.report` (metrics, table, plots), :mod:`.gavel` (Gavel's LP and rounds).
"""
