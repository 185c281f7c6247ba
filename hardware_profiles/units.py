"""Quantities with units as written in hardware profiles ("312 TFLOPS", "2.039 TB/s", "200 Gb/s", "3 us").

Every parser returns SI base units: FLOP/s, bytes, bytes/s, seconds. Decimal prefixes (k, M, G, T, P)
are powers of 1000, binary prefixes (KiB, MiB, GiB, TiB) powers of 1024, as in vendor datasheets and
IEC 80000-13. Bandwidth case matters: an upper-case ``B`` is bytes, a lower-case ``b`` is bits, so
``200 Gb/s`` (an HDR InfiniBand port) is 25 GB/s. The parsers raise ``UnitError`` (a ValueError carrying
the expected form); the loader turns it into a UserError that names the file and the field.
"""

from __future__ import annotations

import re
from decimal import Decimal

_NUMBER = r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_QUANTITY = re.compile(rf"\s*({_NUMBER})\s*([A-Za-zµ/]*)\s*")

# Scales are Decimals: '<number> <unit>' is multiplied exactly and rounded once to float, so
# '2.039 TB/s' gives the same float as the literal 2.039e12 (2.039 * 1e12 in floats does not).
_DECIMAL = {"": Decimal(1), "k": Decimal("1e3"), "K": Decimal("1e3"), "M": Decimal("1e6"),
            "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15")}
_BINARY = {"Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40)}

FLOPS_UNITS: dict[str, Decimal] = {
    **{f"{p}FLOPS": _DECIMAL[p] for p in ("", "G", "T", "P")},
    **{f"{p}FLOP/s": _DECIMAL[p] for p in ("", "G", "T", "P")},
}
BYTE_UNITS: dict[str, Decimal] = {
    **{f"{p}B": s for p, s in _DECIMAL.items() if p != "K"},
    **{f"{p}B": s for p, s in _BINARY.items()},
}
BANDWIDTH_UNITS: dict[str, Decimal] = {
    **{f"{u}/s": s for u, s in BYTE_UNITS.items()},
    # bits per second: divide by 8 to get bytes per second
    **{f"{p}b/s": s / 8 for p, s in _DECIMAL.items() if p != "K"},
    **{f"{p}bps": s / 8 for p, s in _DECIMAL.items() if p not in ("", "K")},
    **{f"{p}bit/s": s / 8 for p, s in _DECIMAL.items() if p != "K"},
}
TIME_UNITS: dict[str, Decimal] = {"s": Decimal(1), "ms": Decimal("1e-3"), "us": Decimal("1e-6"),
                                  "µs": Decimal("1e-6"), "ns": Decimal("1e-9")}

FLOPS_FORM = "a number with a unit such as '312 TFLOPS' (GFLOPS, TFLOPS, PFLOPS)"
BYTES_FORM = "a number with a unit such as '80 GB' or '81920 MiB' (MB, GB, TB, MiB, GiB, TiB)"
BANDWIDTH_FORM = ("a number with a unit such as '2.039 TB/s', '300 GB/s' or '200 Gb/s' "
                  "(B = bytes, b = bits: GB/s, TB/s, GiB/s, MB/s, Gb/s)")
TIME_FORM = "a number with a unit such as '3 us' (ns, us, ms, s)"


class UnitError(ValueError):
    """A quantity could not be read; ``expected`` names the accepted form."""

    def __init__(self, value: object, expected: str, why: str = "") -> None:
        self.value = value
        self.expected = expected
        self.why = why
        super().__init__(f"{why or 'cannot read'} {value!r}; expected {expected}")


def _parse(value: object, units: dict[str, Decimal], expected: str) -> float:
    """Split '<number> <unit>' and scale by the unit; the result must be finite and > 0."""
    if isinstance(value, bool) or not isinstance(value, str):
        raise UnitError(value, expected, "needs a unit, got")
    m = _QUANTITY.fullmatch(value)
    if not m:
        raise UnitError(value, expected)
    number, unit = Decimal(m.group(1)), m.group(2)
    if unit not in units:
        hint = ""
        lowered = {u.lower(): u for u in units}
        if unit.lower() in lowered and unit not in units:
            hint = f" (did you mean {lowered[unit.lower()]!r}? case matters: B = bytes, b = bits)"
        raise UnitError(value, expected + hint, f"unknown unit {unit!r} in" if unit else "no unit in")
    result = _scaled(number, units[unit])
    if not result > 0:
        raise UnitError(value, expected, "must be positive, got")
    if result == float("inf"):
        raise UnitError(value, expected, "too large:")
    return result


def parse_flops(value: object) -> float:
    """'312 TFLOPS' -> 3.12e14 FLOP/s."""
    return _parse(value, FLOPS_UNITS, FLOPS_FORM)


def parse_bytes(value: object) -> int:
    """'80 GB' -> 80_000_000_000 bytes; '81920 MiB' -> 85_899_345_920 bytes."""
    return int(round(_parse(value, BYTE_UNITS, BYTES_FORM)))


def parse_bandwidth(value: object) -> float:
    """'2.039 TB/s' -> 2.039e12 bytes/s; '200 Gb/s' -> 2.5e10 bytes/s (bits / 8)."""
    return _parse(value, BANDWIDTH_UNITS, BANDWIDTH_FORM)


def parse_time(value: object) -> float:
    """'3 us' -> 3e-6 s."""
    return _parse(value, TIME_UNITS, TIME_FORM)


def _scaled(number: Decimal, scale: Decimal) -> float:
    """number * scale computed exactly, rounded once to the nearest float."""
    return float(number * scale)


def _format(value: float, units: list[tuple[str, Decimal]]) -> str:
    """Write value in a unit whose text parses back to exactly the same float.

    ``units`` is ordered largest first. The shortest rendering wins: a 6-digit text in the largest
    unit that gives one, then 12 and 17 digits; 17 significant digits always identify a float, and
    the smallest unit is tried last at that precision, so the loop always returns.
    """
    exact = Decimal(value)
    for digits in (6, 12, 17):
        for unit, scale in units:
            if exact >= scale or unit == units[-1][0]:
                text = f"{exact / scale:.{digits}g}"
                if "e" not in text and _scaled(Decimal(text), scale) == value:
                    return f"{text} {unit}"
    raise ValueError(f"cannot format {value!r}")  # unreachable for finite positive values


def format_flops(value: float) -> str:
    return _format(value, [(u, FLOPS_UNITS[u]) for u in ("PFLOPS", "TFLOPS", "GFLOPS", "FLOPS")])


def format_bytes(value: int) -> str:
    return _format(float(value), [(u, BYTE_UNITS[u]) for u in ("TB", "GiB", "GB", "MiB", "MB", "B")])


def format_bandwidth(value: float) -> str:
    return _format(value, [(u, BANDWIDTH_UNITS[u]) for u in ("TB/s", "GB/s", "MB/s", "B/s")])


def format_time(value: float) -> str:
    return _format(value, [(u, TIME_UNITS[u]) for u in ("s", "ms", "us", "ns")])
