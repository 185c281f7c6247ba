"""Parsing of human-written quantities ("80GB", "141GiB", "1.5e9")."""

from __future__ import annotations

import re

from autoparallel.errors import UserError

_BYTE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
GIB = 2**30


def parse_bytes(value: str | int | float, what: str = "memory size") -> int:
    """'80GB' -> 80e9 bytes, '141GiB' -> 141*2**30; a bare number is bytes."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value <= 0:
            raise UserError(f"{what}: {value!r} must be positive (e.g. 80GB)")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _BYTE_UNITS:
        raise UserError(f"{what}: cannot read {value!r}; write a number with a unit such as 80GB or 141GiB")
    n = float(m.group(1)) * _BYTE_UNITS[unit]
    if n <= 0:
        raise UserError(f"{what}: {value!r} must be positive")
    return int(n)
