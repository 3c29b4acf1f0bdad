"""walras.manifests.schema's fast paths agree with the reference checks they stand in front of.

* :func:`schema.compile_check` is one-sided: where it says valid, ``jsonschema`` (draft 2020-12, the reference that
  names the errors) must find no error; it must say valid for every example manifest (else the fast path is never
  taken); checked on every case of ``tests/test_schema.py`` and on random mutations of the examples.
* :func:`schema.defaulted` gives what :func:`schema.apply_defaults` gives on a deep copy, without modifying its
  argument.
* the translated CRD schemas are valid draft 2020-12 schemas (``crds()`` no longer checks this on every start).
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from walras.manifests import schema

from tests.test_schema import _DELETE, CEL, STRUCTURAL, TYPOS, VALID_VARIANTS, example_documents, with_value

WALRAS = [d for d in example_documents() if d.get("apiVersion", "").startswith("walras.dev/")]


def _crd(obj: dict[str, Any]) -> schema.CRD:
    return schema.crds()[(obj["apiVersion"], obj["kind"])]


def _reference_valid(obj: dict[str, Any]) -> bool:
    crd = _crd(obj)
    body = schema.apply_defaults(crd.schema, {k: copy.deepcopy(v) for k, v in obj.items() if k != "status"})
    return not any(jsonschema.Draft202012Validator(crd.json_schema).iter_errors(body))


def _fast_valid(obj: dict[str, Any]) -> bool:
    crd = _crd(obj)
    body = schema.defaulted(crd.schema, {k: v for k, v in obj.items() if k != "status"})
    return schema.compile_check(crd.json_schema)(body)


def test_translated_schemas_are_valid_json_schemas() -> None:
    assert schema.crds()
    for crd in schema.crds().values():
        jsonschema.Draft202012Validator.check_schema(crd.json_schema)


@pytest.mark.parametrize("doc", WALRAS, ids=lambda d: f"{d['kind']}-{d['metadata']['name']}")
def test_every_example_takes_the_fast_path(doc: dict[str, Any]) -> None:
    assert _fast_valid(doc) and _reference_valid(doc)


CASES = [(c[0], c[1], c[2], c[3]) for c in STRUCTURAL + TYPOS + CEL] + list(VALID_VARIANTS)


@pytest.mark.parametrize("kind,name,path,value", CASES, ids=[f"{c[0]}-{c[2]}-{k}" for k, c in enumerate(CASES)])
def test_fast_check_never_passes_what_jsonschema_refuses(kind: str, name: str, path: str, value: Any) -> None:
    obj = with_value(kind, name, path, value)
    reference = _reference_valid(obj)
    assert not _fast_valid(obj) or reference
    if (kind, name, path, value) in [(c[0], c[1], c[2], c[3]) for c in STRUCTURAL + TYPOS]:
        assert not reference  # the structural cases are refused by the reference itself


def test_fast_check_on_values_of_every_type() -> None:
    """Types the structural schema sets apart: a bool is no number, 2.0 is an integer, an int no string."""
    spec = {"type": "object", "properties": {
        "n": {"type": "number", "minimum": 0}, "i": {"type": "integer", "exclusiveMinimum": 1},
        "s": {"type": "string", "enum": ["a", "b"]}, "l": {"type": "array", "items": {"type": "string"},
                                                           "maxItems": 2},
        "m": {"type": "object", "additionalProperties": {"type": "string"}, "minProperties": 1},
        "u": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}, "required": ["n"],
        "additionalProperties": False}
    check = schema.compile_check(spec)
    reference = jsonschema.Draft202012Validator(spec)
    samples: list[Any] = [
        {"n": 0}, {"n": True}, {"n": -1}, {"n": 1.5, "i": 2.0}, {"n": 1, "i": 1}, {"n": 1, "i": True},
        {"n": 1, "s": "a"}, {"n": 1, "s": "c"}, {"n": 1, "s": 1}, {"n": 1, "l": ["x", "y"]}, {"n": 1, "l": ["x", 1]},
        {"n": 1, "l": ["x", "y", "z"]}, {"n": 1, "m": {}}, {"n": 1, "m": {"k": "v"}}, {"n": 1, "m": {"k": 1}},
        {"n": 1, "u": 3}, {"n": 1, "u": "x"}, {"n": 1, "u": 1.5}, {"n": 1, "x": 1}, {}, [], "text", None,
        {"n": float("nan")}, {1: 1, "n": 1},
    ]
    verdicts = [(sample, check(sample), reference.is_valid(sample)) for sample in samples]
    assert all(ref for _, fast, ref in verdicts if fast), [v for v in verdicts if v[1] and not v[2]]
    # and it is not trivially False: it passes the plainly valid ones
    assert [s for s, fast, _ in verdicts if fast] == [
        {"n": 0}, {"n": 1.5, "i": 2.0}, {"n": 1, "s": "a"}, {"n": 1, "l": ["x", "y"]}, {"n": 1, "m": {"k": "v"}},
        {"n": 1, "u": 3}, {"n": 1, "u": "x"}]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2, allow_nan=False) | st.sampled_from(
        ["", "log", "linear", "a", "cpu", "x" * 300, "Web", "nvidia.com/gpu", "1.5Gi"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["type", "count", "min", "max", "points", "amount", "value", "x", "a", "exponent"]),
        inner, max_size=3),
    max_leaves=8)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(value, list):
        for k, v in enumerate(value):
            out.extend(_paths(v, (*prefix, k)))
    return out


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(WALRAS), st.data(), _JSON, st.booleans())
def test_random_mutations_agree(doc: dict[str, Any], data: st.DataObject, value: Any, delete: bool) -> None:
    obj = copy.deepcopy(doc)
    paths = [p for p in _paths(obj) if p and p[0] not in ("apiVersion", "kind", "metadata", "status")]
    path = data.draw(st.sampled_from(paths))
    node: Any = obj
    for key in path[:-1]:
        node = node[key]
    if delete and isinstance(node, dict):
        del node[path[-1]]
    else:
        node[path[-1]] = value
    before = copy.deepcopy(obj)
    assert not _fast_valid(obj) or _reference_valid(obj)
    assert obj == before  # the fast path modifies nothing


@pytest.mark.parametrize("kind,name,path", [("FungibleJob", "resnet50", "spec.demand"),
                                            ("FungibleJob", "resnet50", "spec.replicas"),
                                            ("ColocationProfile", "web-batch", "spec.cost")])
def test_defaulted_equals_apply_defaults_and_modifies_nothing(kind: str, name: str, path: str) -> None:
    obj = with_value(kind, name, path, _DELETE)
    crd = _crd(obj)
    before = copy.deepcopy(obj)
    got = schema.defaulted(crd.schema, obj)
    assert obj == before
    assert got == schema.apply_defaults(crd.schema, copy.deepcopy(obj))
    assert list(got) == list(schema.apply_defaults(crd.schema, copy.deepcopy(obj)))  # key order too


def test_defaulted_shares_a_complete_object() -> None:
    doc = next(d for d in WALRAS if d["kind"] == "FungibleJob")
    crd = _crd(doc)
    full = schema.apply_defaults(crd.schema, copy.deepcopy(doc))
    assert schema.defaulted(crd.schema, full) is full
