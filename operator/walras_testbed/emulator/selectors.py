"""Label and field selectors as the Kubernetes API parses them (``labelSelector=``, ``fieldSelector=``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class SelectorError(ValueError):
    """A selector string the API server would reject (HTTP 400)."""


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside ``( ... )``."""
    terms: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if current:
        terms.append("".join(current).strip())
    return [t for t in terms if t]


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        raise SelectorError(f"unknown operator {self.op!r}")


@dataclass(frozen=True)
class LabelSelector:
    """A parsed label selector: all requirements must hold."""

    requirements: tuple[Requirement, ...]

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        reqs = []
        for term in _split_terms(text):
            lowered = f" {term} "
            if " notin " in lowered or " in " in lowered:
                op = "notin" if " notin " in lowered else "in"
                key, _, rest = term.partition(f" {op} ")
                rest = rest.strip()
                if not (rest.startswith("(") and rest.endswith(")")):
                    raise SelectorError(f"label selector term {term!r}: values must be in parentheses")
                values = tuple(v.strip() for v in rest[1:-1].split(",") if v.strip())
                reqs.append(Requirement(key.strip(), op, values))
            elif "!=" in term:
                key, _, value = term.partition("!=")
                reqs.append(Requirement(key.strip(), "!=", (value.strip(),)))
            elif "==" in term or "=" in term:
                key, _, value = term.partition("==") if "==" in term else term.partition("=")
                reqs.append(Requirement(key.strip(), "=", (value.strip(),)))
            elif term.startswith("!"):
                reqs.append(Requirement(term[1:].strip(), "!exists"))
            else:
                if any(c in term for c in " ()<>"):
                    raise SelectorError(f"unable to parse label selector term {term!r}")
                reqs.append(Requirement(term, "exists"))
        return cls(tuple(reqs))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(r.matches(labels) for r in self.requirements)


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The value at a dotted path (``spec.nodeName``) as a string; missing fields read as the empty string."""
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return ""
        value = value[part]
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


@dataclass(frozen=True)
class FieldSelector:
    """A parsed field selector: ``path=value``, ``path==value`` or ``path!=value`` terms, all of which must hold."""

    terms: tuple[tuple[str, str, str], ...]

    @classmethod
    def parse(cls, text: str) -> FieldSelector:
        terms = []
        for term in _split_terms(text):
            if "!=" in term:
                path, _, value = term.partition("!=")
                terms.append((path.strip(), "!=", value.strip()))
            elif "=" in term:
                path, _, value = term.partition("==") if "==" in term else term.partition("=")
                terms.append((path.strip(), "=", value.strip()))
            else:
                raise SelectorError(f"field selector term {term!r} needs '=', '==' or '!='")
        return cls(tuple(terms))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        for path, op, value in self.terms:
            actual = field_value(obj, path)
            if (actual == value) != (op == "="):
                return False
        return True
