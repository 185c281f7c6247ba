"""Parsing of human-written quantities ("80GB", "141GiB", "1.5e9")."""

from __future__ import annotations

import math
import re

from autoparallel.errors import UserError
from autoparallel.limits import MAX_DEVICE_BYTES, MIN_DEVICE_BYTES

_BYTE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
GIB = 2**30


def parse_bytes(value: str | int | float, what: str = "memory size") -> int:
    """'80GB' -> 80e9 bytes, '141GiB' -> 141*2**30; a bare number is bytes.

    A device memory size lies in [1 MiB, 1 PiB]: a smaller bare number is a forgotten unit ('80' would be
    80 bytes), a larger one a typo, and neither may fall through to "the whole device"."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        n, unit = float(value), ""
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
        unit = m.group(2).lower() if m else None
        if not m or unit not in _BYTE_UNITS:
            raise UserError(f"{what}: cannot read {value!r}; write a number with a unit such as 80GB or 141GiB")
        n = float(m.group(1)) * _BYTE_UNITS[unit]
    if math.isnan(n):
        raise UserError(f"{what}: {value!r} is not a size; write one with a unit such as 80GB")
    if n > MAX_DEVICE_BYTES:
        raise UserError(f"{what}: {value!r} is more than 1 PiB per device; write the size with a unit such as 80GB")
    if n < MIN_DEVICE_BYTES and unit in ("", "b"):
        raise UserError(f"{what}: {value!r} means {n:g} bytes, less than 1 MiB; add a unit, e.g. {value}GB")
    if n < MIN_DEVICE_BYTES:  # refused with a unit too: its bytes, handed on, would read as a forgotten unit
        raise UserError(f"{what}: {value!r} is less than 1 MiB, no device's memory; write a size such as 80GB")
    if int(n) < 1:
        raise UserError(f"{what}: {value!r} is less than one byte; write a positive size such as 80GB")
    return int(n)


def format_bytes(n: float) -> str:
    """A memory size for a message: GiB with one decimal, MiB below a tenth of a GiB (a tiny model's needs
    had read "0.0 GiB")."""
    return f"{n / 2**30:.1f} GiB" if n >= 0.1 * 2**30 else f"{n / 2**20:.1f} MiB"
