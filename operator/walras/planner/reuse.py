"""Reuse of earlier work as an explicit cache owned by the caller (the incremental snapshot; the reuse table of
docs/planner.md).

A phase may take its result from an earlier plan only where every input it reads is unchanged. The planner's inputs
are values, but comparing them by value would cost as much as recomputing; instead the translation cache
(:class:`walras.kube.decode.TranslationCache`) gives an object whose uid and resourceVersion did not change the
*same* Python object, so "the same objects in the same order" means "the same content" and is a C-level pass of
identity tests (:class:`Same`, :func:`same_items`). Arrays are compared by their bytes (:func:`array_key`).

Each phase records a typed, frozen entry (a dataclass with an ``inputs`` field and its result) under its entry type
and, for per-group entries, a group key. :func:`matches` is the one comparison of recorded inputs with the present
ones, and :meth:`Reuse.lookup` the one place that decides hit or miss. A :class:`PlanCache` holds what the last plan
built with it recorded; one plan reads it through a :class:`Reuse` and replaces it at the end (:meth:`Reuse.commit`),
so an entry a plan did not record is dropped, and nothing a plan reads is written to: recorded arrays are read-only
(:func:`frozen`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from operator import is_
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

import numpy as np


def same_items(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether ``a`` and ``b`` hold the same objects (identity) in the same order."""
    return a is b or (len(a) == len(b) and all(map(is_, a, b)))


def array_key(array: np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
    """An array's dtype, shape and bytes: equal keys mean equal arrays (element by element, NaN bit patterns aside)."""
    return (array.dtype.str, array.shape, array.tobytes())


def frozen(array: np.ndarray) -> np.ndarray:
    """``array`` marked read-only (it is shared with the next plan)."""
    array.setflags(write=False)
    return array


@dataclass(frozen=True, slots=True)
class Same:
    """An input compared by identity: ``items``, a sequence, matches another :class:`Same` holding the same objects
    in the same order (:func:`same_items`)."""

    items: Sequence[Any]


#: A phase's inputs: a tuple of parts, each a :class:`Same` (compared by identity) or a value (compared by ``==``).
Inputs = tuple[Any, ...]


def matches(recorded: Inputs, present: Inputs) -> bool:
    """Whether recorded inputs equal the present ones, part by part: :class:`Same` parts by identity, the others by
    value."""
    if recorded is present:
        return True
    if len(recorded) != len(present):
        return False
    for was, now in zip(recorded, present, strict=True):
        if was is now:
            continue
        if type(was) is Same:
            if type(now) is not Same or not same_items(was.items, now.items):
                return False
        elif type(now) is Same or not was == now:
            return False
    return True


class Entry(Protocol):
    """What a phase records: its inputs and (in the fields of the concrete type) its result."""

    @property
    def inputs(self) -> Inputs: ...


E = TypeVar("E", bound=Entry)

#: An entry's place in a cache: its type, and a group key for per-group entries (None for a whole phase).
Key = tuple[type, Hashable]


class PlanCache:
    """The planner's reuse state between plans, owned by the caller (the operator, the simulator, the CLI): the
    entries the last plan built with this cache recorded. Pass the same cache to each ``build_plan`` of one cluster;
    :meth:`fork` gives a second cache that starts from the same entries (they are frozen: sharing them is safe)."""

    __slots__ = ("_entries",)

    def __init__(self, entries: Mapping[Key, Entry] | None = None) -> None:
        self._entries: Mapping[Key, Entry] = MappingProxyType(dict(entries or {}))

    @property
    def entries(self) -> Mapping[Key, Entry]:
        """The recorded entries (read-only)."""
        return self._entries

    def get(self, kind: type[E], group: Hashable = None) -> E | None:
        """The recorded entry of ``kind`` (and ``group``), whatever its inputs (for inspection and tests)."""
        entry = self._entries.get((kind, group))
        return entry if isinstance(entry, kind) else None

    def fork(self) -> PlanCache:
        """A new cache holding the same entries."""
        return PlanCache(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


class Reuse:
    """One plan's access to a :class:`PlanCache`: lookups read what this plan recorded before (so a later round sees
    an earlier one's) and then the cache's entries; stores go to this plan's own record, which :meth:`commit` makes
    the cache's. With ``read=False`` (``PlanOptions.reuse=False``) nothing is taken from the cache, and the cache
    still receives this plan's record. :meth:`off` (no cache) reads no cache and commits nothing, but a plan records
    all the same: within the plan a lookup finds what the plan itself recorded (placement, from one round to the
    next), and a plan with a cache and one without do the same work and share the same arrays read-only (the
    compiled kernels see the same array types either way)."""

    __slots__ = ("_after", "_before", "_cache")

    def __init__(self, cache: PlanCache | None, *, read: bool = True) -> None:
        self._cache = cache
        self._before: Mapping[Key, Entry] = cache.entries if cache is not None and read else {}
        self._after: dict[Key, Entry] = {}

    @classmethod
    def off(cls) -> Reuse:
        return cls(None)

    def lookup(self, kind: type[E], inputs: Inputs, group: Hashable = None) -> E | None:
        """The entry of ``kind`` (and ``group``) recorded with inputs that :func:`matches` ``inputs`` (this plan's
        own record first, then the cache's), or None: the one decision of hit or miss."""
        key = (kind, group)
        entry = self._after.get(key)
        if entry is None:
            entry = self._before.get(key)
        if entry is None or type(entry) is not kind or not matches(entry.inputs, inputs):
            return None
        return entry

    def recorded(self, kind: type[E], group: Hashable = None) -> E | None:
        """The entry of ``kind`` (and ``group``) the cache holds, whatever its inputs: for a phase whose entry has
        parts with their own inputs, each part then decided by :func:`matches`."""
        entry = self._before.get((kind, group)) if self._before else None
        return entry if entry is not None and type(entry) is kind else None

    def store(self, entry: Entry, group: Hashable = None) -> None:
        """Record ``entry`` (for a later lookup of this plan and, once committed, for the next plan)."""
        self._after[(type(entry), group)] = entry

    def drop(self, kind: type, group: Hashable = None) -> None:
        """Forget what this plan recorded of ``kind`` (and ``group``): the next plan finds no entry for it."""
        self._after.pop((kind, group), None)

    def commit(self) -> None:
        """Make this plan's record the cache's entries (the end of a plan that completed)."""
        if self._cache is not None:
            self._cache._entries = MappingProxyType(self._after)
