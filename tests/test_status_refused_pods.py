"""A job whose pod creations the API server refuses lists in its status only the pods that exist: the status says
what runs, not the pods of a retry that was refused again (e2e/test_e2e_refusals.py shows it live)."""

from __future__ import annotations

from walras.operator.statuses import without_refused_pods
from walras.planner.cluster import Refusal


def test_a_refused_jobs_status_lists_only_existing_pods() -> None:
    status = {"phase": "Pending", "pods": [{"name": "j-a-0", "node": "n0"}, {"name": "j-a-1", "node": "n1"}]}
    existing = {("ns", "j-a-0"): {}}
    refused = Refusal("denied by policy", pods=1, until=1000.0)
    assert without_refused_pods(status, "ns", refused, existing)["pods"] == [{"name": "j-a-0", "node": "n0"}]
    # no refusal, or one without a retry time: the plan's list as it is
    assert without_refused_pods(status, "ns", None, existing) == status
    assert without_refused_pods(status, "ns", Refusal("x", until=None), existing) == status
    # another namespace's pod of the same name does not count
    assert without_refused_pods(status, "other", refused, existing)["pods"] == []
