"""``walras.manifests.reader.load_yaml`` decodes YAML exactly as ``yaml.load_all(..., Loader=yaml.SafeLoader)``
(PyYAML's pure-Python loader is the reference): YAML 1.1 implicit types, explicit tags, anchors, merge keys, errors;
and random JSON-like documents in every emitter style. Tagged sets and ordered maps are refused (a manifest is
JSON)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from walras.manifests.reader import load_yaml


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


# ------------------------------------------------------------------------------- the block-style fast path

#: Block-style texts: each decoded by ``_load_block_yaml`` (or left by it to libyaml) as PyYAML's SafeLoader does.
BLOCK_CASES = [
    "a: 1\nb:\n  c: x\n  d:\n  - 1\n  - 2\ne: end\n",  # an indentless sequence, then a key after it
    "a:\n  - x\n  - y\nb: 2\n", "items:\n- name: c\n  image: x\n- name: d\n", "- - a\n  - b\n- c\n",
    "-\n  a: 1\n-\n- x\n", "a:\nb: 1\n", "a:\n", "-\n", "a: {}\nb: []\n- x\n", "a: {}\nb: []\n",
    "a: 1\n---\n", "---\n", "---\n---\na: 1\n", "# c\n---\na: 1\n", "a: 1\n\n\n# c\n  # d\nb: 2\n",
    "a:\n\n  b: 1\n", "a:\n# c\n  b: 1\n", "a: 'it''s'\nb: ''\nc: 'x: y'\nd: \"q\"\ne: \"a\\nb\"\n",
    "yes: 1\n1: a\n~: b\nnull: c\n1.5: d\n", "a: 1\na: 2\nb: 3\n", "a:  spaced  \n", "a : b\n",
    "a: value # comment\n", "a: multi\n  line\n", "a: 1\n  b: 2\n", "a:\n    b: 1\n  c: 2\n",
    "a:\n  - x\n  b: 1\n", "x: - a\n", "x: -1\ny: -x\n-z: 1\n", "? a\n: b\n", "\ufeffa: 1\n",
    "a: 1\r\nb: 2\r\n", "a: x\x85y\n", "a: 'x' \n", "a: 'unterminated\n  rest'\n", "hello\n", "---\nhello\n",
    "--- a\n", "a: 1\n...\n", "%YAML 1.1\n---\na: 1\n", "a: &x 1\nb: *x\n", "a: !!str 1\n", "a: |\n  text\n",
    "<<: {a: 1}\n", "a: <<\n", "a: =\n", "a:b: c\n", "url: http://x:80/y\n", "a: 2024-01-02\nb: 0o17\nc: .nan\n",
    "- a: 1\n  b:\n  - x\n- c: 2\n", "-   a: 1\n    b: 2\n", "a:\n  b:\n    c:\n      d: 1\ne: 2\n",
    "a:\n- b: 1\n  c:\n  - d\n  - e\n- f\n", "a: b\n- c\n", "- a\nb: c\n", "a: 1\n b: 2\n", "  a: 1\n  b: 2\n",
    "  a: 1\nb: 2\n", "a: \"x\\\"y\"\n", "'on': 'yes'\n\"1\": x\n'a''b': 1\n'a': b: c\n", "'a' : 1\n", "'a\n",
    "\"a\\\"\": 1\n", "'': 1\n", "- 'a: b'\n- \"c: d\"\n", "- - - 1\n", "-x\n", "a:\n  -\n  - 1\n",
]


def _fast(text: str) -> tuple[str, Any]:
    from walras.manifests.reader import _load_block_yaml

    return "ok", _load_block_yaml(text)


@pytest.mark.parametrize("text", BLOCK_CASES)
def test_block_style_same_as_pyyaml_safe_loader(text: str) -> None:
    assert repr(ours(text)) == repr(reference(text))
    taken = _fast(text)[1]
    assert taken is None or repr(("ok", taken)) == repr(reference(text))


def test_tabs_are_left_to_libyaml() -> None:
    """(libyaml, unlike PyYAML's pure-Python scanner, reads a tab after ``:`` as a separator.)"""
    assert _fast("a:\tb\n")[1] is None and _fast("a:\n\t- b\n")[1] is None


def test_the_fast_path_takes_dumped_manifests() -> None:
    """Manifests as ``yaml.dump`` and ``kubectl get -o yaml`` write them are decoded without libyaml's events."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p-0", "namespace": "team-0", "labels": {"walras.dev/job": "j", "on": "yes"},
                        "annotations": {"note": "it's: quoted", "empty": ""}},
           "spec": {"nodeName": "node-1", "nodeSelector": {}, "tolerations": [],
                    "containers": [{"name": "c", "image": "reg.io/x:1.0", "args": ["--a", "-b", "1"],
                                    "resources": {"requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": 1}}}]},
           "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}], "started": 1.5}}
    docs = [pod, {**pod, "metadata": {**pod["metadata"], "name": "p-1"}}]
    text = yaml.safe_dump_all(docs, default_flow_style=False, sort_keys=False)
    taken = _fast(text)[1]
    assert taken is not None
    assert repr(taken) == repr(list(yaml.load_all(text, Loader=yaml.SafeLoader)))
    # with an indented sequence (kubectl's style) and a comment and blank lines
    kubectl = ("apiVersion: v1\nkind: List\nitems:\n  - apiVersion: v1\n    kind: Node\n    metadata:\n"
               "      name: n1\n\n    # status\n    status:\n      allocatable:\n        cpu: \"32\"\n")
    taken = _fast(kubectl)[1]
    assert taken is not None and taken == list(yaml.load_all(kubectl, Loader=yaml.SafeLoader))


block_keys = st.text(alphabet="abcxyz0123456789-_./", min_size=1, max_size=6).filter(
    lambda k: k[0] not in "-")
block_like = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(block_keys, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(block_like, min_size=1, max_size=3), st.booleans())
def test_random_block_documents(docs: list[Any], explicit_start: bool) -> None:
    text = yaml.safe_dump_all(docs, default_flow_style=False, explicit_start=explicit_start, allow_unicode=True)
    taken = _fast(text)[1]
    assert taken is None or repr(("ok", taken)) == repr(reference(text))
    assert repr(ours(text)) == repr(reference(text))


def test_mutated_block_text_is_never_misread() -> None:
    """Random one-to-three character edits of block-style manifests (seeded): where the fast path decodes the text,
    SafeLoader decodes it to the same objects; a text SafeLoader refuses is never accepted by it."""
    import random

    job = {"apiVersion": "walras.dev/v1alpha1", "kind": "FungibleJob",
           "metadata": {"name": "job-0", "namespace": "team-0", "resourceVersion": "100"},
           "spec": {"throughput": {"p2": 3.3, "p6": 32}, "utility": {"type": "linear"}, "replicas": {"count": 2},
                    "resources": {"cpu": "2", "memory": "8Gi"}, "colocation": {"type": "a", "size": 1},
                    "template": {"spec": {"containers": [{"name": "c", "image": "x", "args": ["-a", "1"]}]}}}}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n-0", "labels": {"pool": "p0"}},
            "spec": {}, "status": {"allocatable": {"cpu": "32"}, "conditions": [{"type": "Ready", "status": "True"}]}}
    base = (yaml.safe_dump_all([job, node], default_flow_style=False, sort_keys=False)
            + "---\nx:\n- - a\n  - b: 1\n    c:\n    - 'q''s'\n  -\n    k: v\nz: {}\n'o': \"d\"\n"
            + "# c\n\n---\n---\n- a\n-\n")
    rnd = random.Random(20)
    alphabet = " -:#'\"\n{}[]ab1.?&*!|>%@`,~"
    taken = 0
    for _ in range(300):
        chars = list(base)
        for _ in range(rnd.randint(1, 3)):
            op, at = rnd.random(), rnd.randrange(len(chars))
            if op < 0.4:
                chars.insert(at, rnd.choice(alphabet))
            elif op < 0.8:
                del chars[at]
            else:
                chars[at] = rnd.choice(alphabet)
        text = "".join(chars)
        fast = _fast(text)[1]
        if fast is not None:
            taken += 1
            assert repr(("ok", fast)) == repr(reference(text)), text
    assert taken > 50  # the edits that keep the text in the subset do take the fast path
