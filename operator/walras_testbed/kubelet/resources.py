"""Exact Kubernetes quantities and the kubelet's view of a pod's resource requests.

Quantities are parsed into :class:`fractions.Fraction` (no rounding: ``"100m" * 3 == "300m"`` exactly), because
admission compares sums against allocatable and a float sum could wrongly admit or reject at the boundary.
:func:`pod_requests` is what the kubelet's resource fit uses (``k8s.io/component-helpers/resource``
``PodRequests``): per resource, the larger of the sum over app containers and the largest init container (restartable
"sidecar" init containers count towards the sum instead), plus ``spec.overhead``. A container with limits but no
requests has had its requests defaulted to the limits by the API server already.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

_SUFFIX: dict[str, Fraction] = {
    "": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}
_PATTERN = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:[eE]([+-]?\d+))?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$")

Resources = dict[str, Fraction]


def quantity(value: object) -> Fraction:
    """The exact value of a Kubernetes quantity (``"250m"``, ``"4Gi"``, ``"1e3"``, ``2``)."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    if not isinstance(value, str):
        raise ValueError(f"not a quantity: {value!r}")
    match = _PATTERN.match(value.strip())
    if match is None:
        raise ValueError(f"not a quantity: {value!r}")
    number = Fraction(match.group(1))
    if match.group(2):
        number *= Fraction(10) ** int(match.group(2))
    return number * _SUFFIX[match.group(3) or ""]


def resources(mapping: Mapping[str, Any] | None) -> Resources:
    """``{name: quantity}`` of a ``requests``/``limits``/``allocatable`` mapping."""
    return {name: quantity(v) for name, v in (mapping or {}).items()}


def add(a: Mapping[str, Fraction], b: Mapping[str, Fraction]) -> Resources:
    out = dict(a)
    for name, v in b.items():
        out[name] = out.get(name, Fraction(0)) + v
    return out


def pod_requests(pod: Mapping[str, Any]) -> Resources:
    """The pod's effective requests as the kubelet's admission counts them (see the module docstring)."""
    spec = pod.get("spec") or {}
    app: Resources = {}
    for c in spec.get("containers") or []:
        app = add(app, resources((c.get("resources") or {}).get("requests")))
    sidecars: Resources = {}
    init_max: Resources = {}
    for c in spec.get("initContainers") or []:
        req = resources((c.get("resources") or {}).get("requests"))
        if c.get("restartPolicy") == "Always":
            sidecars = add(sidecars, req)
            continue
        # a regular init container runs alongside the sidecars started before it
        for name, v in add(req, sidecars).items():
            init_max[name] = max(init_max.get(name, Fraction(0)), v)
    total = add(app, sidecars)
    for name, v in init_max.items():
        total[name] = max(total.get(name, Fraction(0)), v)
    return add(total, resources(spec.get("overhead")))


def milli(name: str, value: Fraction) -> int:
    """The integer the kubelet prints in its rejection message: milli-cores for cpu, plain units otherwise."""
    return int(value * 1000) if name == "cpu" else int(value)
