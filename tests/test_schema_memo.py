"""The memo of CEL rule outcomes in :mod:`walras.manifests.schema`: a repeated value is evaluated once, and the memo
never changes a verdict (each case is checked with an empty memo and again from the memo, against the
expectation written here, not against the code)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from walras.manifests import schema
from walras.manifests.schema import validate

ROOT = Path(__file__).resolve().parents[1]


def resnet50() -> dict[str, Any]:
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "FungibleJob" and doc["metadata"]["name"] == "resnet50":
                return copy.deepcopy(doc)
    raise LookupError("resnet50")


@pytest.mark.parametrize(
    ("utility", "error"),
    [
        ({"type": "power"}, "utility.exponent is required"),
        ({"type": "power", "exponent": 1.5}, "utility.exponent is required"),
        ({"type": "power", "exponent": 0.5}, None),
        ({"type": "alpha-fair"}, "utility.alpha is required"),
        ({"type": "alpha-fair", "alpha": 2}, None),
        ({"type": "log"}, None),
    ],
)
def test_memo_keeps_each_verdict(utility: dict[str, Any], error: str | None) -> None:
    schema._rule_memo.clear()
    job = resnet50()
    job["spec"]["utility"] = utility
    first = validate(job)
    assert schema._rule_memo  # the rules' outcomes were stored
    again = resnet50()
    again["metadata"]["name"] = "another"
    again["spec"]["utility"] = copy.deepcopy(utility)
    second = validate(again)  # same utility block: answered from the memo
    for errors in (first, second):
        if error is None:
            assert errors == []
        else:
            assert len(errors) == 1 and errors[0].startswith("spec.utility: Invalid value") and error in errors[0]


def test_a_repeated_value_is_evaluated_once(monkeypatch: pytest.MonkeyPatch) -> None:
    schema._rule_memo.clear()
    calls: list[str] = []
    real = schema._program

    def counting(rule: str) -> Any:
        calls.append(rule)
        return real(rule)

    monkeypatch.setattr(schema, "_program", counting)
    jobs = []
    for k in range(20):
        job = resnet50()
        job["metadata"]["name"] = f"job-{k}"
        job["spec"]["throughput"] = {"v100": 1.0 + k}  # differs per job; the rules' nodes do not
        jobs.append(job)
    assert all(validate(job) == [] for job in jobs)
    first_job = len(calls)
    assert first_job > 0
    for job in jobs[1:]:
        validate(job)
    assert len(calls) == first_job  # the 19 later jobs evaluated no rule


def test_value_keys_tell_apart_what_a_rule_can_see() -> None:
    keys = [schema._value_key(v) for v in ({"a": 1}, {"a": 1.0}, {"a": True}, {"a": "1"}, {"a": None}, [1], {"b": 1})]
    assert None not in keys and len(set(keys)) == len(keys)
    assert schema._value_key({"a": 1, "b": 2}) == schema._value_key({"b": 2, "a": 1})  # map order is irrelevant
    assert schema._value_key({1: "x"}) is None  # JSON would write the key 1 as "1"
    assert json.loads(schema._value_key({"x": [1, 2.5, "s"]}) or "") == {"x": [1, 2.5, "s"]}
