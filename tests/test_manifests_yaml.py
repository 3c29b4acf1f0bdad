"""``walras.planner.manifests.load_yaml`` decodes YAML exactly as ``yaml.load_all(..., Loader=yaml.SafeLoader)``
(PyYAML's pure-Python loader is the reference): YAML 1.1 implicit types, explicit tags, anchors, merge keys, errors;
and random JSON-like documents in every emitter style. Tagged sets and ordered maps are refused (a manifest is
JSON)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from walras.planner.manifests import load_yaml


def reference(text: str) -> tuple[str, Any]:
    try:
        return "ok", list(yaml.load_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as exc:
        return "error", type(exc).__name__


def ours(text: str) -> tuple[str, Any]:
    try:
        return "ok", load_yaml(text)
    except yaml.YAMLError as exc:
        return "error", type(exc).__name__


CASES = [
    "a: =", "=: 1", "a: <<", "<<", "- <<", "",
    "---\n", "a: [1, {b: c}]\n---\n---\n- x\n", "- - - 1", "x:", 'x: ""', "x: |\n  multi\n  line\n",
    "b: &b {x: 1, y: 2}\nc: {<<: *b, y: 3, z: 4}",
    "b: &b {x: 1}\nd: &d {x: 2, w: 0}\nc: {<<: [*b, *d], z: 4}",
    "b: &b {x: 1}\nd: &d {x: 2, w: 0}\nc: {z: 4, <<: *b, <<: *d}",
    "b: &b [1]\nc: {<<: *b}",
    "x: 2024-01-02", "x: 2024-01-02T10:00:00Z", "x: 0o17", "x: 017", "x: 1_000", "x: 1:20", "x: .inf", "x: -.inf",
    "x: .nan", "x: ~", "x: yes", "x: Off", "x: NULL", "x: 1e3", "x: 1.0e+3", "x: -.5", "x: 0x1F", "x: +12",
    'x: "yes"', "x: 'no'", 'x: !!int "12"', "x: !!float 1", "x: !!str 12", "x: !!binary aGVsbG8=",
    "x: !!map {a: 1}", "x: !!seq [1]", "x: !foo 1", "x: *nope", "? [1]\n: 2", "{? {a: 1} : 2}", "{a: 1",
    "x: &a [1, *a]", "a: &x 1\nb: *x\n---\nc: *x", "a: &x {k: v}\nb: *x\n",
    "metadata:\n  labels: {app: web, tier: '1'}\n  annotations:\n    x: >\n      folded\n      text\n",
]


@pytest.mark.parametrize("text", CASES)
def test_same_as_pyyaml_safe_loader(text: str) -> None:
    assert repr(ours(text)) == repr(reference(text))


def test_aliases_share_one_object_like_pyyaml() -> None:
    doc = load_yaml("a: &x {k: v}\nb: *x\n")[0]
    assert doc["a"] is doc["b"]


@pytest.mark.parametrize("text", ["x: !!set {a, b}", "x: !!omap [a: 1]", "x: !!pairs [a: 1]", "x: !local {a: 1}"])
def test_collections_with_other_tags_are_refused(text: str) -> None:
    with pytest.raises(yaml.YAMLError, match="unsupported tag"):
        load_yaml(text)


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.floats(allow_nan=False),
    st.text(max_size=12), st.sampled_from(["yes", "no", "on", "1_0", "0o7", "2024-01-02", "1:2", "~", "<<", "=", ""]),
)
json_like = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=25, deadline=None)
@given(st.lists(json_like, min_size=1, max_size=3), st.sampled_from([None, False, True]))
def test_random_documents_in_every_style(docs: list[Any], flow: bool | None) -> None:
    text = yaml.safe_dump_all(docs, default_flow_style=flow, allow_unicode=True)
    assert repr(ours(text)) == repr(reference(text))
