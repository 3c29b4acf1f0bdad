"""Decode YAML streams as ``yaml.SafeLoader`` does, faster: :func:`load_yaml`.

Block-style text as ``yaml.dump`` and ``kubectl get -o yaml`` write it is read by one loop over its lines
(:func:`_load_block_yaml`), anything else by one loop over the events of libyaml's parser (PyYAML's ``CParser``),
instead of PyYAML's node graph and recursive Python constructor, which cost 3.7 times the parse itself on 18,680
generated Pods (see :func:`load_yaml`). Both the manifest loader (:mod:`walras.manifests.loader`) and the CRD
reader of :mod:`walras.manifests.schema` decode through it; it imports neither.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import (
    AliasEvent,
    DocumentEndEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
    StreamStartEvent,
)
from yaml.nodes import ScalarNode
from yaml.resolver import Resolver

#: libyaml's parser; PyYAML built without libyaml offers the pure-Python one with the same event interface
_Parser: Any = getattr(getattr(yaml, "cyaml", None), "CParser", None) or yaml.SafeLoader

_TAG = "tag:yaml.org,2002:"
_STR, _MAP, _SEQ, _MERGE_TAG, _VALUE_TAG = (_TAG + k for k in ("str", "map", "seq", "merge", "value"))
_IMPLICIT = Resolver.yaml_implicit_resolvers
_CONSTRUCTORS = SafeConstructor.yaml_constructors
_NO_KEY = object()


class _Merge:
    """The plain key ``<<`` (YAML merge key)."""


class _Value:
    """The plain scalar ``=`` (YAML value key): a string as a key, an error elsewhere (as ``SafeLoader``)."""


def _plain_tag(value: str) -> str:
    """The tag ``yaml.SafeLoader`` resolves a plain (unquoted, untagged) scalar to (``Resolver.resolve``)."""
    for tag, regexp in _IMPLICIT.get(value[0] if value else "", []) + _IMPLICIT.get(None, []):
        if regexp.match(value):
            return str(tag)
    return _STR


def _scalar(tag: str, value: str, style: str | None, constructor: SafeConstructor, mark: Any) -> Any:
    """A scalar of ``tag`` as ``yaml.SafeLoader`` constructs it (int, float, bool, null, timestamp, binary, str)."""
    if tag == _STR:
        return value
    if tag == _MERGE_TAG:
        return _Merge
    if tag == _VALUE_TAG:
        return _Value
    build = _CONSTRUCTORS.get(tag)
    if build is None:
        raise ConstructorError(None, None, f"could not determine a constructor for the tag {tag!r}", mark)
    return build(constructor, ScalarNode(tag, value, style=style))


def _not_a_key(value: Any, mark: Any) -> Any:
    """``value``, unless it is ``<<`` or ``=`` outside a key, which ``SafeLoader`` cannot construct either."""
    if value is _Merge or value is _Value:
        tag = _MERGE_TAG if value is _Merge else _VALUE_TAG
        raise ConstructorError(None, None, f"could not determine a constructor for the tag {tag!r}", mark)
    return value


def _merge(target: dict[Any, Any], merges: list[Any], mark: Any) -> None:
    """Apply merge keys as ``SafeLoader`` does: merged entries first (of a list of mappings and of several ``<<``
    keys, the earlier wins), then the mapping's own keys over them."""
    merged: dict[Any, Any] = {}
    for value in reversed(merges):
        parts = [value] if isinstance(value, dict) else value
        if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
            raise ConstructorError("while constructing a mapping", None,
                                   "expected a mapping or list of mappings for merging", mark)
        for part in reversed(parts):
            merged.update(part)
    own = dict(target)
    target.clear()
    target.update(merged)
    target.update(own)


class _NotSimple(Exception):
    """The text is outside :func:`_load_block_yaml`'s subset: decode it with libyaml's events instead."""


#: Characters YAML refuses in a stream or reads as line breaks (c-printable, b-break): a text with any of them is
#: left to libyaml (which reports the error or breaks the line as YAML does).
_SPECIAL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff]")
#: First characters of a plain scalar that make it something else (YAML c-indicator), or need a look further.
_INDICATORS = frozenset("[]{}#&*!|>'\"%@`,")
_NEEDS_NEXT = frozenset("-?:")


#: Parsed forms of one line's content (after its indentation), as :func:`_block_line` returns them.
_KEY_VALUE, _KEY_OPEN, _ITEM_VALUE, _ITEM_OPEN, _ITEM_COMPACT = range(5)
#: Stand-ins for the values ``{}`` and ``[]`` in the line cache (each use builds a new, unshared object).
_EMPTY_MAP, _EMPTY_SEQ = object(), object()
#: A ``---`` line; a blank line or a whole-line comment.
_DOCUMENT, _BLANK = object(), object()


def _is_item(content: str) -> bool:
    return content[0] == "-" and (len(content) == 1 or content[1] == " ")


def _block_line(content: str, scalar: Callable[[str], Any], plain: Callable[[str], Any]) -> tuple[Any, ...]:
    """One line of block YAML (content without indentation or trailing spaces), parsed:

    ==============================================  ===============================================================
    form                                            line
    ==============================================  ===============================================================
    ``(_KEY_VALUE, key, value)``                    ``key: value``
    ``(_KEY_OPEN, key)``                            ``key:`` (its value is the block that follows, or null)
    ``(_ITEM_VALUE, value)``                        ``- value``
    ``(_ITEM_OPEN,)``                               ``-`` (its value is the block that follows, or null)
    ``(_ITEM_COMPACT, offset, rest)``               ``- key: ...`` or ``- - ...``: ``rest`` starts a block at
                                                    ``offset`` columns further right
    ==============================================  ===============================================================

    Raises :class:`_NotSimple` for anything else."""
    if _is_item(content):
        rest = content[1:].lstrip(" ")
        if not rest:
            return (_ITEM_OPEN,)
        if _is_item(rest) or ": " in rest or rest[-1] == ":":
            if rest[0] in _INDICATORS:
                raise _NotSimple
            return (_ITEM_COMPACT, len(content) - len(rest), rest)
        return (_ITEM_VALUE, scalar(rest))
    quote = content[0]
    if quote == "'" or quote == '"':  # a quoted key: up to its closing quote ('' is a quote in '...')
        end = 1
        while True:
            end = content.find(quote, end)
            if end < 0:
                raise _NotSimple
            if quote == "'" and content[end + 1:end + 2] == "'":
                end += 2
                continue
            break
        after = content[end + 1:]
        if after != ":" and not after.startswith(": "):
            raise _NotSimple
        key_value = scalar(content[:end + 1])
        rest = after[2:].lstrip(" ")
    else:
        cut = content.find(": ")
        if cut < 0:
            if content[-1] != ":":
                raise _NotSimple
            key, rest = content[:-1], ""
        else:
            key, rest = content[:cut], content[cut + 2:].lstrip(" ")
        if not key or key[-1] == " ":
            raise _NotSimple
        key_value = plain(key)
    if rest:
        return (_KEY_VALUE, key_value, scalar(rest))
    return (_KEY_OPEN, key_value)


def _scalar_readers(constructor: SafeConstructor) -> tuple[Callable[[str], Any], Callable[[str], Any]]:
    """The two scalar readers of :func:`_load_block_yaml`, ``(scalar, plain_scalar)``, sharing one cache of plain
    texts (manifests repeat keys, labels and quantities):

    * ``plain_scalar(raw)``: a plain (unquoted) scalar resolved to its YAML 1.1 type as ``SafeLoader`` resolves it
      (:func:`_plain_tag`, :func:`_scalar`);
    * ``scalar(raw)``: a value as the subset writes it: a one-line single-quoted scalar, a one-line double-quoted
      scalar without escapes, ``{}``/``[]`` (as the stand-ins :data:`_EMPTY_MAP`/:data:`_EMPTY_SEQ`), else a plain
      scalar.

    Both raise :class:`_NotSimple` for a text outside the subset."""
    plain: dict[str, Any] = {}

    def plain_scalar(raw: str) -> Any:
        value = plain.get(raw, _NO_KEY)
        if value is not _NO_KEY:
            return value
        first = raw[0]
        if (first in _INDICATORS or (first in _NEEDS_NEXT and (len(raw) == 1 or raw[1] == " "))
                or ": " in raw or " #" in raw or raw[-1] == ":"):
            raise _NotSimple
        tag = _plain_tag(raw)
        if tag == _MERGE_TAG or tag == _VALUE_TAG:
            raise _NotSimple
        value = _scalar(tag, raw, None, constructor, None)
        plain[raw] = value
        return value

    def scalar(raw: str) -> Any:
        first = raw[0]
        if first == "'":
            inner = raw[1:-1]
            if len(raw) < 2 or raw[-1] != "'" or "'" in inner.replace("''", ""):
                raise _NotSimple
            return inner.replace("''", "'")
        if first == '"':
            inner = raw[1:-1]
            if len(raw) < 2 or raw[-1] != '"' or '"' in inner or "\\" in inner:
                raise _NotSimple
            return inner
        if raw == "{}":
            return _EMPTY_MAP
        if raw == "[]":
            return _EMPTY_SEQ
        return plain_scalar(raw)

    return scalar, plain_scalar


def _line_readers(constructor: SafeConstructor) -> tuple[Callable[[str], Any], Callable[[str], tuple[Any, ...]]]:
    """The line readers of :func:`_load_block_yaml`, ``(read_line, parse_content)``, sharing one cache of parsed
    line contents (each distinct content is parsed once by :func:`_block_line`):

    * ``read_line(line)``: ``(indentation, parsed content, whether an item)``, or :data:`_DOCUMENT` for ``---``, or
      :data:`_BLANK` for a blank line or a whole-line comment;
    * ``parse_content(content)``: the parsed form of a content without indentation (the rest of a compact
      ``- key: ...`` line).

    Both raise :class:`_NotSimple` for a line outside the subset."""
    scalar, plain_scalar = _scalar_readers(constructor)
    parsed: dict[str, tuple[Any, ...]] = {}

    def parse_content(content: str) -> tuple[Any, ...]:
        form = parsed.get(content)
        if form is None:
            form = parsed[content] = _block_line(content, scalar, plain_scalar)
        return form

    def read_line(line: str) -> Any:
        content = line.lstrip(" ")
        if not content or content[0] == "#":
            return _BLANK
        indent = len(line) - len(content)
        content = content.rstrip(" ")
        if indent == 0 and content[0] in "-.%" and (content[:3] in ("---", "...") or content[0] == "%"):
            if content != "---":
                raise _NotSimple
            return _DOCUMENT
        form = parsed.get(content)
        if form is None:
            form = parsed[content] = _block_line(content, scalar, plain_scalar)
        return (indent, form, form[0] >= _ITEM_VALUE)

    return read_line, parse_content


def _load_block_yaml(text: str) -> list[Any] | None:
    """The documents of ``text`` if it is written in the block style that ``yaml.dump`` (``default_flow_style=False``)
    and ``kubectl get -o yaml`` write, else ``None``.

    The subset: documents separated by ``---`` lines; block mappings whose keys are plain scalars; block sequences
    (``- ``, also at the indentation of their key, and compact ``- key: value``); values that are plain scalars
    (resolved to YAML 1.1 types exactly as :func:`load_yaml`), one-line single-quoted scalars, one-line
    double-quoted scalars without escapes, and ``{}``/``[]``; whole-line comments and blank lines. Anything else -
    flow collections, block scalars, multi-line scalars, anchors, aliases, tags, merge keys, complex keys, trailing
    comments, directives, tabs, end markers, characters YAML refuses, bytes that are not UTF-8 - returns ``None``,
    and :func:`load_yaml` decodes the stream with libyaml's events (which also reports malformed YAML).

    One loop over the lines, with a stack of the open collections (column, container, whether a sequence, the key
    or item waiting for its block); each distinct line content is parsed once (:func:`_block_line`: manifests
    repeat most lines), several times faster than building libyaml's Python event objects.
    ``tests/test_manifests_yaml.py`` checks the result is what PyYAML's ``SafeLoader`` gives.
    """
    if "\t" in text or "\r" in text or _SPECIAL.search(text) is not None:
        return None
    read_line, parse_content = _line_readers(SafeConstructor())
    try:
        return _block_documents(text, read_line, parse_content)
    except _NotSimple:
        return None


def _block_documents(text: str, read_line: Callable[[str], Any],
                     parse_content: Callable[[str], tuple[Any, ...]]) -> list[Any]:
    """The documents of ``text`` by one loop over its lines (read by ``read_line`` and ``parse_content``, of
    :func:`_line_readers`), with a stack of the open collections (column, container, whether a sequence, the key or
    item waiting for its block); :class:`_NotSimple` for a text outside :func:`_load_block_yaml`'s subset."""
    documents: list[Any] = []
    # open collections, innermost last: [column, container, is a sequence, key or item waiting for a block value]
    stack: list[list[Any]] = []
    started = False  # a "---" opened the current document
    has_root = False  # the current document has its root node

    def settle(frame: list[Any], value: Any) -> None:
        """Give the key or item ``frame`` holds open the value ``value``."""
        if frame[2]:
            frame[1].append(value)
        else:
            frame[1][frame[3]] = value
        frame[3] = _NO_KEY

    def end_document() -> None:
        nonlocal has_root
        if not has_root:
            documents.append(None)  # an empty document (after a "---"), as SafeLoader reads it
        for frame in stack:
            if frame[3] is not _NO_KEY:
                settle(frame, None)
        stack.clear()
        has_root = False

    seen: dict[str, Any] = {}  # each distinct line (most repeat) read once
    for line in text.split("\n"):
        entry = seen.get(line)
        if entry is None:
            entry = seen[line] = read_line(line)
        if type(entry) is not tuple:
            if entry is _DOCUMENT:
                if started or has_root:
                    end_document()
                started = True
            continue  # a blank line or a whole-line comment
        indent, form, item = entry
        while stack and stack[-1][0] > indent:  # blocks this line closes
            frame = stack.pop()
            if frame[3] is not _NO_KEY:
                settle(frame, None)
        if not stack:
            if has_root:
                raise _NotSimple  # a second node at the root of one document
            container: Any = [] if item else {}
            documents.append(container)
            stack.append([indent, container, item, _NO_KEY])
            has_root = True
        else:
            top = stack[-1]
            if top[3] is not _NO_KEY:  # a key or item waiting for its block
                if indent > top[0] or (indent == top[0] and item and not top[2]):
                    container = [] if item else {}
                    settle(top, container)
                    stack.append([indent, container, item, _NO_KEY])
                else:
                    settle(top, None)
            top = stack[-1]
            if top[2] and not item and top[0] == indent and len(stack) > 1:
                stack.pop()  # a key after an indentless sequence closes it
                top = stack[-1]
            if top[0] != indent:
                raise _NotSimple
        while True:
            top = stack[-1]
            kind = form[0]
            if top[2] != (kind >= _ITEM_VALUE):
                raise _NotSimple
            if kind == _KEY_VALUE:
                value = form[2]
                top[1][form[1]] = {} if value is _EMPTY_MAP else [] if value is _EMPTY_SEQ else value
            elif kind == _KEY_OPEN:
                top[3] = form[1]
            elif kind == _ITEM_VALUE:
                value = form[1]
                top[1].append({} if value is _EMPTY_MAP else [] if value is _EMPTY_SEQ else value)
            elif kind == _ITEM_OPEN:
                top[3] = None
            else:  # a compact block: its first line starts after the "- "
                indent += form[1]
                content = form[2]
                form = parse_content(content)
                container = [] if form[0] >= _ITEM_VALUE else {}
                top[1].append(container)
                stack.append([indent, container, form[0] >= _ITEM_VALUE, _NO_KEY])
                continue
            break
    if started or has_root:
        end_document()
    return documents


def load_yaml(data: bytes | str) -> list[Any]:
    """Every document of a YAML stream, decoded as ``list(yaml.load_all(data, Loader=yaml.SafeLoader))`` does: by
    :func:`_load_block_yaml` where the text is in its block-style subset (UTF-8 without a byte-order mark), else
    in one loop over libyaml's events.

    The same YAML 1.1 implicit types (PyYAML's resolver regular expressions: ``yes`` is ``True``, ``1_000`` is
    1000, ``2024-01-02`` a date), the same explicit scalar tags (``!!str``, ``!!int``, ``!!binary``...), anchors and
    aliases (per document), merge keys ``<<``. Collections tagged other than ``!!map``/``!!seq`` (``!!set``,
    ``!!omap``, ``!!pairs``, local tags) are refused with a ``yaml.YAMLError``: a Kubernetes object is JSON and has
    none. Malformed YAML raises libyaml's ``yaml.YAMLError``. Plain scalars repeat heavily in manifests (keys,
    labels, quantities), so each distinct plain text is resolved once per stream.

    Speed (18,688 generated Pods, 7.7 MB): PyYAML's ``CSafeLoader`` spent 3.7x libyaml's event parse on its node
    graph and Python constructor; the event loop builds the objects from the events directly, but creating libyaml's
    Python event objects alone costs 5x its parse (2.1 s against ``raw_parse``'s 0.4 s for 1,065,218 events);
    the line loop took 0.9-1.0 s of CPU where the event loop took 1.9-2.6 s on the same file at load ~4
    (``bench/cli.py`` measures the whole ``walras plan`` command).
    """
    if isinstance(data, bytes):
        try:
            text = data.decode() if not data.startswith(b"\xef\xbb\xbf") else None
        except UnicodeDecodeError:
            text = None
    else:
        text = data
    fast = _load_block_yaml(text) if text is not None else None
    if fast is not None:
        return fast
    parser = _Parser(data)
    constructor = SafeConstructor()
    plain: dict[str, Any] = {}
    documents: list[Any] = []
    anchors: dict[str, Any] = {}
    # open collections: [container, pending key (mappings), merge values (mappings)]
    stack: list[list[Any]] = []
    get: Callable[[], Any] = parser.get_event
    try:
        while True:
            event = get()
            kind = type(event)
            if kind is ScalarEvent:
                tag = event.tag
                if tag is None or tag == "!":
                    if event.implicit[0]:
                        text = event.value
                        value = plain.get(text, _NO_KEY)
                        if value is _NO_KEY:
                            value = _scalar(_plain_tag(text), text, None, constructor, event.start_mark)
                            plain[text] = value
                    else:
                        value = event.value
                else:
                    value = _scalar(tag, event.value, event.style, constructor, event.start_mark)
                if event.anchor is not None:
                    anchors[event.anchor] = value
            elif kind is MappingStartEvent or kind is SequenceStartEvent:
                tag = event.tag
                is_map = kind is MappingStartEvent
                if tag not in (None, "!", _MAP if is_map else _SEQ):
                    raise ConstructorError(None, None, f"unsupported tag {tag!r} on a "
                                           f"{'mapping' if is_map else 'sequence'} (a manifest is JSON)",
                                           event.start_mark)
                container: Any = {} if is_map else []
                if event.anchor is not None:
                    anchors[event.anchor] = container
                stack.append([container, _NO_KEY, None])
                continue
            elif kind is MappingEndEvent:
                frame = stack.pop()
                value = frame[0]
                if frame[2] is not None:
                    _merge(value, frame[2], event.start_mark)
            elif kind is SequenceEndEvent:
                value = stack.pop()[0]
            elif kind is AliasEvent:
                if event.anchor not in anchors:
                    raise yaml.composer.ComposerError(None, None, f"found undefined alias {event.anchor!r}",
                                                      event.start_mark)
                value = anchors[event.anchor]
            elif kind is DocumentStartEvent:
                anchors = {}
                continue
            elif kind is StreamEndEvent:
                break
            elif kind is DocumentEndEvent or kind is StreamStartEvent:
                continue
            else:  # pragma: no cover - libyaml emits no other event
                raise ConstructorError(None, None, f"unexpected YAML event {kind.__name__}", event.start_mark)
            if not stack:
                documents.append(_not_a_key(value, event.start_mark))
                continue
            frame = stack[-1]
            container = frame[0]
            if type(container) is list:
                container.append(_not_a_key(value, event.start_mark))
            elif frame[1] is _NO_KEY:
                if value is _Value:
                    value = "="
                else:
                    try:
                        hash(value)
                    except TypeError:
                        raise ConstructorError("while constructing a mapping", None, "found unhashable key",
                                               event.start_mark) from None
                frame[1] = value
            else:
                key = frame[1]
                frame[1] = _NO_KEY
                value = _not_a_key(value, event.start_mark)
                if key is _Merge:
                    frame[2] = [*(frame[2] or []), value]
                else:
                    container[key] = value
    finally:
        dispose = getattr(parser, "dispose", None)
        if dispose is not None:
            dispose()
    return documents
