"""Kubernetes resource quantities (``"500m"``, ``"16Gi"``, ``"2"``) to floats and back."""

from __future__ import annotations

import math
import re
from functools import lru_cache

_SUFFIX = {
    "": 1.0,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}
_PATTERN = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$")


@lru_cache(maxsize=4096)
def _parse_text(text: str) -> float:
    match = _PATTERN.match(text.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    return float(match.group(1)) * _SUFFIX[match.group(2) or ""]


def parse_quantity(value: object, field: str = "quantity") -> float:
    """Return the numeric value of a quantity given as a number or a string such as ``"250m"`` or ``"4Gi"``.

    Raises ``ValueError`` naming ``field`` for anything else (booleans, malformed strings, NaN, negatives).
    """
    if isinstance(value, bool):
        raise ValueError(f"{field}: expected a quantity, got {value!r}")
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = _parse_text(value)
        except ValueError as exc:
            raise ValueError(f"{field}: {exc}") from None
    else:
        raise ValueError(f"{field}: expected a quantity, got {value!r}")
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{field}: quantity must be finite and non-negative, got {value!r}")
    return number


def format_quantity(value: float) -> str:
    """Format a non-negative amount as a quantity: an integer when it is one, else milli-units (``"1500m"``).

    Whole multiples of ``Mi``, ``Gi`` or ``Ti`` (amounts of at least 1 Mi: bytes of memory or storage, never a count of
    cores or devices) keep the binary suffix a manifest would use: ``2147483648`` -> ``"2Gi"``.
    """
    if value < 0 or not math.isfinite(value):
        raise ValueError(f"quantity must be finite and non-negative, got {value!r}")
    rounded = round(value)
    if abs(value - rounded) < 1e-9:
        whole = int(rounded)
        for suffix, unit in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20)):
            if whole >= unit and whole % unit == 0:
                return f"{whole // unit}{suffix}"
        return str(whole)
    milli = round(value * 1000)
    if milli % 1000 == 0:
        return str(milli // 1000)
    return f"{milli}m"
