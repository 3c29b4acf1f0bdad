"""Validation of Walras manifests against the CRDs in ``crds/``, as the API server applies them.

:func:`validate` checks a ResourcePool, FungibleJob or ColocationProfile (any other kind passes unchecked) in the
order the API server does on create (``k8s.io/apiextensions-apiserver``, structural schemas):

1. the ``apiVersion``/``kind`` must be a served version of a Walras CRD;
2. **defaults** of the schema are applied (``default:``), so rules see the object the server would store;
3. the **structural schema** (OpenAPI v3, translated to JSON Schema draft 2020-12; a compiled check,
   :func:`compile_check`, passes a valid object, and the ``jsonschema`` library, imported only then, names the
   errors of any other): types, enums, bounds, patterns, required fields; every object schema that declares
   ``properties`` without ``additionalProperties`` or ``x-kubernetes-preserve-unknown-fields`` rejects other fields, as
   ``kubectl apply --validate=strict`` (server-side field validation ``Strict``) does - the API server would
   otherwise prune them silently;
4. the **CEL rules** (``x-kubernetes-validations``), compiled and evaluated by the ``cel-python`` library with
   ``self`` bound to the value at the rule's node, typed from the schema (``number`` -> double, ``integer`` -> int,
   as the API server's CEL type provider does). Rules are evaluated only where the schema check passed for that
   node's subtree, like the server, which skips CEL on an invalid object.

``status`` is not validated: with the status sub-resource enabled the API server ignores ``status`` on create and
update of the main resource. ``metadata`` is the API server's ObjectMeta and is not described by the CRDs.

Each error is one string ``<field path>: <what is wrong>``, with the path written as ``spec.replicas.min`` or
``spec.utilityCurve.points[0].amount``; the result is sorted and empty for a valid object.

The CRDs are read from ``walras/crds`` (a link to ``crds/`` in the checkout; the files themselves in the wheel).
Pure: no Kubernetes client, no I/O besides reading the CRDs once.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from walras.manifests.reader import load_yaml

if TYPE_CHECKING:
    import jsonschema

__all__ = ["CRD", "crds", "validate"]


@dataclass(frozen=True)
class CRD:
    """One served version of a Walras CRD: its group, version, kind, OpenAPI schema and the translated JSON Schema."""

    group: str
    version: str
    kind: str
    schema: Mapping[str, Any]
    json_schema: Mapping[str, Any]

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


@functools.cache
def crds() -> dict[tuple[str, str], CRD]:
    """Every served version of the CRDs in ``walras/crds``, keyed by ``(apiVersion, kind)``."""
    out: dict[tuple[str, str], CRD] = {}
    folder = resources.files("walras").joinpath("crds")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".yaml"):
            continue
        docs = load_yaml(entry.read_bytes())
        doc = docs[0] if docs else None
        if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
            continue
        spec = doc["spec"]
        for version in spec["versions"]:
            if not version.get("served", False):
                continue
            schema = version["schema"]["openAPIV3Schema"]
            translated = to_json_schema(schema, root=True)
            crd = CRD(spec["group"], version["name"], spec["names"]["kind"], schema, translated)
            out[(crd.api_version, crd.kind)] = crd
    if not out:
        raise FileNotFoundError("no CustomResourceDefinition found in walras/crds")
    return out


def walras_kinds() -> set[str]:
    return {kind for _, kind in crds()}


# ------------------------------------------------------------------------------------------- structural schema


def to_json_schema(node: Any, root: bool = False) -> Any:
    """OpenAPI v3 (the Kubernetes structural subset) -> JSON Schema draft 2020-12.

    ``exclusiveMinimum: true`` with ``minimum`` becomes a numeric ``exclusiveMinimum``; ``nullable`` adds ``null``
    to the type; an object schema with ``properties`` and neither ``additionalProperties`` nor
    ``x-kubernetes-preserve-unknown-fields`` gets ``additionalProperties: false`` (strict field validation);
    ``x-kubernetes-int-or-string`` is already written as ``anyOf``; ``format`` and the other extensions are left
    to the API server (``date-time`` appears only in status). At the root, ``metadata`` (ObjectMeta) and ``status``
    (ignored on create) accept anything.
    """
    if isinstance(node, list):
        return [to_json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("description", "default", "format", "nullable"):
            continue
        if key == "properties":
            out[key] = {k: ({} if root and k in ("metadata", "status") else to_json_schema(v))
                        for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = to_json_schema(value) if isinstance(value, dict) else value
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [to_json_schema(v) for v in value]
        else:
            out[key] = value
    if out.get("exclusiveMinimum") is True:
        out["exclusiveMinimum"] = out.pop("minimum")
    elif out.get("exclusiveMinimum") is False:
        del out["exclusiveMinimum"]
    if out.get("exclusiveMaximum") is True:
        out["exclusiveMaximum"] = out.pop("maximum")
    elif out.get("exclusiveMaximum") is False:
        del out["exclusiveMaximum"]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if ("properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def field_path(parts: Iterator[Any] | Any) -> str:
    """``['spec', 'points', 0, 'amount']`` -> ``spec.points[0].amount``."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "<root>"


@functools.cache
def _validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    import jsonschema

    return jsonschema.Draft202012Validator(crds()[(api_version, kind)].json_schema)


#: A compiled check of one schema node: ``True`` when the value is certainly valid (see :func:`compile_check`).
Check = Callable[[Any], bool]

#: The keywords :func:`compile_check` decides on; a node with any other keyword is left to ``jsonschema``.
_COMPILED_KEYWORDS = frozenset({
    "type", "properties", "additionalProperties", "required", "enum", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "pattern", "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
    "items", "anyOf"})

_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
    "string": lambda v: type(v) is str,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
    "number": lambda v: type(v) is int or type(v) is float,
    "integer": lambda v: type(v) is int or (type(v) is float and v.is_integer()),
}


def _never(_: Any) -> bool:
    return False


def compile_check(schema: Any) -> Check:
    """A function telling whether a value is valid against ``schema`` (JSON Schema draft 2020-12, as
    :func:`to_json_schema` writes the CRDs), several times faster than ``jsonschema`` on a valid object.

    One-sided: ``True`` only where ``jsonschema`` accepts the value too; ``False`` where it may not, and then
    :func:`_schema_errors` asks ``jsonschema`` for the errors (which may be none). A schema node with a keyword
    outside :data:`_COMPILED_KEYWORDS`, and values of types it does not know (a YAML timestamp), answer ``False``;
    ``enum`` is decided for strings only. ``tests/test_schema_compiled.py`` checks the two agree on every case of
    ``tests/test_schema.py`` and on random mutations of the examples."""
    if schema is True or schema == {}:
        return lambda v: True
    if not isinstance(schema, dict) or set(schema) - _COMPILED_KEYWORDS:
        return _never
    checks: list[Check] = []
    kinds = schema.get("type")
    if kinds is not None:
        found = [_TYPES.get(k) for k in ([kinds] if isinstance(kinds, str) else kinds)]
        tests = [t for t in found if t is not None]
        if len(tests) != len(found):
            return _never
        checks.append(lambda v: any(t(v) for t in tests))
    if "enum" in schema:
        allowed = schema["enum"]
        if not all(type(e) is str for e in allowed):
            return _never
        strings = frozenset(allowed)
        checks.append(lambda v: type(v) is str and v in strings)
    bounds = [(schema[k], op) for k, op in (("minimum", "ge"), ("maximum", "le"), ("exclusiveMinimum", "gt"),
                                            ("exclusiveMaximum", "lt")) if k in schema]
    if bounds:
        if not all(type(b) in (int, float) for b, _ in bounds):
            return _never
        compare = {"ge": lambda v, b: v >= b, "le": lambda v, b: v <= b, "gt": lambda v, b: v > b,
                   "lt": lambda v, b: v < b}
        pairs = [(b, compare[op]) for b, op in bounds]
        checks.append(lambda v: (type(v) is not int and type(v) is not float) or all(c(v, b) for b, c in pairs))
    if "pattern" in schema:
        search = re.compile(schema["pattern"]).search
        checks.append(lambda v: type(v) is not str or search(v) is not None)
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    if lo is not None or hi is not None:
        lo_, hi_ = lo or 0, hi if hi is not None else float("inf")
        checks.append(lambda v: type(v) is not str or lo_ <= len(v) <= hi_)
    lo, hi = schema.get("minItems"), schema.get("maxItems")
    if lo is not None or hi is not None:
        lo_items, hi_items = lo or 0, hi if hi is not None else float("inf")
        checks.append(lambda v: type(v) is not list or lo_items <= len(v) <= hi_items)
    if "items" in schema:
        item = compile_check(schema["items"])
        checks.append(lambda v: type(v) is not list or all(item(x) for x in v))
    if "anyOf" in schema:
        options = [compile_check(sub) for sub in schema["anyOf"]]
        checks.append(lambda v: any(o(v) for o in options))
    if "minProperties" in schema:
        least = schema["minProperties"]
        checks.append(lambda v: type(v) is not dict or len(v) >= least)
    if "maxProperties" in schema:
        most = schema["maxProperties"]
        checks.append(lambda v: type(v) is not dict or len(v) <= most)
    if "required" in schema:
        required = tuple(schema["required"])
        checks.append(lambda v: type(v) is not dict or all(k in v for k in required))
    if "properties" in schema or "additionalProperties" in schema:
        props = {k: compile_check(sub) for k, sub in (schema.get("properties") or {}).items()}
        extra = schema.get("additionalProperties", True)
        other: Check | None = None if extra is False else compile_check(extra)

        def check_object(v: Any) -> bool:
            if type(v) is not dict:
                return True
            for key, sub in v.items():
                test = props.get(key) if type(key) is str else None
                if test is None:
                    if other is None or not other(sub):
                        return False
                elif not test(sub):
                    return False
            return True

        checks.append(check_object)
    if not checks:
        return lambda v: True
    if len(checks) == 1:
        return checks[0]
    return lambda v: all(c(v) for c in checks)


@functools.cache
def _compiled(api_version: str, kind: str) -> Check:
    return compile_check(crds()[(api_version, kind)].json_schema)


def _schema_errors(crd: CRD, obj: Mapping[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    if _compiled(crd.api_version, crd.kind)(obj):
        return []
    validator = _validator(crd.api_version, crd.kind)
    found: list[tuple[tuple[Any, ...], str]] = []
    for error in validator.iter_errors(obj):
        where = tuple(error.absolute_path)
        if error.validator == "additionalProperties" and error.validator_value is False:
            allowed = set(error.schema.get("properties", {}))
            for key in sorted(set(error.instance) - allowed):
                found.append(((*where, key), f'unknown field "{key}"'))
        elif error.validator == "required":
            match = re.match(r"'(.+)' is a required property", error.message)
            name = match.group(1) if match else error.message
            found.append(((*where, name), "Required value"))
        else:
            found.append((where, f"Invalid value: {_short(error.instance)}: {_reason(error)}"))
    return found


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, (dict, list)) else ("object" if isinstance(value, dict) else "array")
    return text if len(text) <= 60 else text[:57] + "..."


def _reason(error: jsonschema.ValidationError) -> str:
    v, expected = error.validator, error.validator_value
    reasons = {
        "enum": lambda: "supported values: " + ", ".join(f'"{x}"' for x in expected),
        "minimum": lambda: f"must be greater than or equal to {expected}",
        "exclusiveMinimum": lambda: f"must be greater than {expected}",
        "maximum": lambda: f"must be less than or equal to {expected}",
        "exclusiveMaximum": lambda: f"must be less than {expected}",
        "type": lambda: f"must be of type {expected if isinstance(expected, str) else ' or '.join(expected)}",
        "pattern": lambda: f"must match the pattern {expected}",
        "minItems": lambda: f"must have at least {expected} items",
        "maxItems": lambda: f"must have at most {expected} items",
        "minProperties": lambda: f"must have at least {expected} properties",
        "minLength": lambda: f"must be at least {expected} characters long",
        "maxLength": lambda: f"must be at most {expected} characters long",
        "anyOf": lambda: "must be an integer or a string",
    }
    return reasons[v]() if v in reasons else error.message


# ------------------------------------------------------------------------------------------------- defaulting


def apply_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """``value`` with the schema's ``default``s filled in where a field is absent (structural defaulting)."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, sub in props.items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(sub, value[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value:
                if key not in props:
                    value[key] = apply_defaults(extra, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], v) for v in value]
    return value


def defaulted(schema: Mapping[str, Any], value: Any) -> Any:
    """``value`` with the schema's ``default``s filled in where a field is absent, as :func:`apply_defaults` does,
    without modifying ``value``: the mappings and lists on the way to a filled-in default are copied, every other
    part is shared with ``value`` (a valid manifest that sets every defaulted field is returned as is)."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        out: dict[Any, Any] | None = None
        for key, sub in props.items():
            if key in value:
                new = defaulted(sub, value[key])
                if new is value[key]:
                    continue
            elif "default" in sub:
                new = copy.deepcopy(sub["default"])
            else:
                continue
            if out is None:
                out = dict(value)
            out[key] = new
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, sub_value in value.items():
                if key not in props:
                    new = defaulted(extra, sub_value)
                    if new is not sub_value:
                        if out is None:
                            out = dict(value)
                        out[key] = new
        return value if out is None else out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = [defaulted(schema["items"], v) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value


# ------------------------------------------------------------------------------------------------------- CEL


@functools.cache
def _program(rule: str) -> Any:
    import celpy

    env = celpy.Environment()
    return env.program(env.compile(rule))


#: Outcomes of CEL rules already evaluated, keyed by the rule, the schema node it sits on and the value it saw
#: (see :func:`_rule_outcome`); cleared when it reaches :data:`RULE_MEMO_SIZE` entries.
_rule_memo: dict[tuple[str, int, str], tuple[str, Any]] = {}
RULE_MEMO_SIZE = 65_536


def _value_key(value: Any) -> str | None:
    """A canonical text of a manifest value that tells apart everything a rule can see: key order is irrelevant
    (maps), ``1``, ``1.0`` and ``true`` differ (JSON writes them differently), strings are quoted. ``None`` for a
    value JSON cannot write (a YAML timestamp or binary) or with a key that is not a string (JSON would write
    ``1`` and ``"1"`` alike): such a value is not memoised."""
    if not _string_keys(value):
        return None
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError):
        return None


def _string_keys(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _string_keys(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_string_keys(v) for v in value)
    return True


def _rule_outcome(rule: str, schema: Mapping[str, Any], value: Any) -> tuple[str, Any]:
    """``("ok", bool)`` or ``("error", message)`` of ``rule`` at a schema node on ``value``.

    A CEL rule is a pure function of the value at its node (typed by that node's schema), so manifests that repeat a
    value (every job with the same ``utility`` or ``replicas`` block) pay the interpreter once: the outcome is
    memoised on ``(rule, schema node, canonical value)``. The schema nodes are the cached CRDs' own dicts, alive for
    the process, so their ``id`` identifies them."""
    import celpy

    text = _value_key(value)
    key = (rule, id(schema), text) if text is not None else None
    if key is not None:
        hit = _rule_memo.get(key)
        if hit is not None:
            return hit
    try:
        result = _program(rule).evaluate({"self": to_cel(schema, value)})
    except celpy.CELEvalError as exc:
        outcome: tuple[str, Any] = ("error", exc.args[0])
    else:
        outcome = ("error", result.args[0]) if isinstance(result, celpy.CELEvalError) else ("ok", bool(result))
    if key is not None:
        if len(_rule_memo) >= RULE_MEMO_SIZE:
            _rule_memo.clear()
        _rule_memo[key] = outcome
    return outcome


def to_cel(schema: Mapping[str, Any], value: Any) -> Any:
    """``value`` as a CEL value typed by its schema (``number`` -> double even when written as ``1``)."""
    import celpy
    from celpy import celtypes

    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        return celpy.json_to_cel(value)
    kind = schema.get("type")
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra: dict[str, Any] = schema["additionalProperties"] if isinstance(
            schema.get("additionalProperties"), dict) else {}
        return celtypes.MapType({celtypes.StringType(k): to_cel(props.get(k) or extra, v) for k, v in value.items()})
    if isinstance(value, list):
        items: dict[str, Any] = schema["items"] if isinstance(schema.get("items"), dict) else {}
        return celtypes.ListType([to_cel(items, v) for v in value])
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if kind == "number" and isinstance(value, (int, float)):
        return celtypes.DoubleType(float(value))
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    return celpy.json_to_cel(value)


def _cel_errors(schema: Mapping[str, Any], value: Any, path: tuple[Any, ...],
                invalid: set[tuple[Any, ...]]) -> list[tuple[tuple[Any, ...], str]]:
    found: list[tuple[tuple[Any, ...], str]] = []
    if any(bad[: len(path)] == path for bad in invalid):
        skip_self = True  # the schema check failed inside this subtree: the server would not run its rules
    else:
        skip_self = False
    if not skip_self:
        for rule in schema.get("x-kubernetes-validations") or []:
            if "oldSelf" in rule["rule"]:
                continue  # a transition rule: only evaluated on update, against the stored object
            status, result = _rule_outcome(rule["rule"], schema, value)
            if status == "error":
                found.append((path, f"rule {rule['rule']!r} could not be evaluated: {result}"))
            elif not result:
                message = rule.get("message") or f"failed rule: {rule['rule']}"
                found.append((path, f"Invalid value: {_short(value)}: {message}"))
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else None
        for key, sub in value.items():
            child = props.get(key, extra)
            if child is not None:
                found.extend(_cel_errors(child, sub, (*path, key), invalid))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, sub in enumerate(value):
            found.extend(_cel_errors(schema["items"], sub, (*path, i), invalid))
    return found


# ----------------------------------------------------------------------------------------------------- entry


def validate(obj: Mapping[str, Any]) -> list[str]:
    """Errors of ``obj`` against its CRD (structural schema, strict fields, CEL rules), each ``path: message``;
    empty when valid and for kinds that are not Walras CRDs."""
    kind, api_version = obj.get("kind"), obj.get("apiVersion")
    known = crds()
    if kind not in walras_kinds():
        return []
    crd = known.get((str(api_version), str(kind)))
    if crd is None:
        served = sorted(v for v, k in known if k == kind)
        return [f'apiVersion: no matches for kind "{kind}" in version "{api_version}" (served: {", ".join(served)})']
    body = defaulted(crd.schema, {k: v for k, v in obj.items() if k != "status"})
    structural = _schema_errors(crd, body)
    invalid = {path for path, _ in structural}
    spec_schema = {k: v for k, v in crd.schema.items() if k != "properties"}
    spec_schema["properties"] = {k: v for k, v in (crd.schema.get("properties") or {}).items()
                                 if k not in ("metadata", "status")}
    rules = _cel_errors(spec_schema, body, (), invalid)
    return sorted({f"{field_path(path)}: {message}" for path, message in structural + rules})
