"""Quantities with units as written in hardware profiles ("312 TFLOPS", "2.039 TB/s", "200 Gb/s", "3 us").

Every parser returns SI base units: FLOP/s, bytes, bytes/s, seconds. Decimal prefixes (k, M, G, T, P)
are powers of 1000, binary prefixes (KiB, MiB, GiB, TiB) powers of 1024, as in vendor datasheets and
IEC 80000-13. Bandwidth case matters: an upper-case ``B`` is bytes, a lower-case ``b`` is bits, so
``200 Gb/s`` (an HDR InfiniBand port) is 25 GB/s. The parsers raise ``UnitError`` (a ValueError carrying
the expected form); the loader turns it into a UserError that names the file and the field.
"""

from __future__ import annotations

import re
from collections.abc import Callable
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


def _parse(value: object, units: dict[str, Decimal], expected: str) -> Decimal:
    """Split '<number> <unit>' and scale by the unit, exactly; the result must be > 0."""
    if isinstance(value, bool) or not isinstance(value, str):
        raise UnitError(value, expected, "needs a unit, got")
    m = _QUANTITY.fullmatch(value)
    if not m:
        raise UnitError(value, expected)
    number, unit = Decimal(m.group(1)), m.group(2)
    if number and abs(number.adjusted()) > 300:  # beyond float range either way (and Decimal's Emax)
        raise UnitError(value, expected, "out of range:")
    if unit not in units:
        hint = ""
        lowered = {u.lower(): u for u in units}
        if unit.lower() in lowered:
            hint = f" (did you mean {lowered[unit.lower()]!r}? case matters: B = bytes, b = bits)"
        raise UnitError(value, expected + hint, f"unknown unit {unit!r} in" if unit else "no unit in")
    result = number * units[unit]
    if not result > 0:
        raise UnitError(value, expected, "must be positive, got")
    return result


def _to_float(value: object, exact: Decimal, expected: str) -> float:
    """Round once to the nearest float; reject values beyond float range."""
    result = float(exact)
    if result == float("inf"):
        raise UnitError(value, expected, "too large:")
    return result


def _to_int(value: object, exact: Decimal, expected: str) -> int:
    result = int(exact.to_integral_value())
    if result < 1:
        raise UnitError(value, expected, "less than one byte:")
    return result


def parse_flops(value: object) -> float:
    """'312 TFLOPS' -> 3.12e14 FLOP/s."""
    return _to_float(value, _parse(value, FLOPS_UNITS, FLOPS_FORM), FLOPS_FORM)


def parse_bytes(value: object) -> int:
    """'80 GB' -> 80_000_000_000 bytes; '81920 MiB' -> 85_899_345_920 bytes."""
    return _to_int(value, _parse(value, BYTE_UNITS, BYTES_FORM), BYTES_FORM)


def parse_bandwidth(value: object) -> float:
    """'2.039 TB/s' -> 2.039e12 bytes/s (the same float as the literal); '200 Gb/s' -> 2.5e10 bytes/s."""
    return _to_float(value, _parse(value, BANDWIDTH_UNITS, BANDWIDTH_FORM), BANDWIDTH_FORM)


def parse_time(value: object) -> float:
    """'3 us' -> 3e-6 s."""
    return _to_float(value, _parse(value, TIME_UNITS, TIME_FORM), TIME_FORM)


def _format(value: float | int, units: list[tuple[str, Decimal]], parse: Callable[[str], float | int]) -> str:
    """Write value in a unit whose text `parse` reads back to exactly `value`.

    ``units`` is ordered largest first. The shortest rendering wins: a 6-digit text in the largest
    unit that gives one, then 12, 17 and 40 digits; 17 significant digits identify any float and 40
    any int below 1e40, and the smallest unit is always tried, so the loop returns.
    """
    exact = Decimal(value)
    for digits in (6, 12, 17, 40):
        for unit, scale in units:
            if exact >= scale or unit == units[-1][0]:
                text = f"{exact / scale:.{digits}g}"
                if "e" in text or "E" in text:
                    text = f"{Decimal(text):f}"
                if "." in text:
                    text = text.rstrip("0").rstrip(".")
                if parse(f"{text} {unit}") == value:
                    return f"{text} {unit}"
    raise ValueError(f"cannot format {value!r}")


def format_flops(value: float) -> str:
    return _format(value, [(u, FLOPS_UNITS[u]) for u in ("TFLOPS", "GFLOPS", "FLOPS")], parse_flops)


def format_bytes(value: int) -> str:
    return _format(value, [(u, BYTE_UNITS[u]) for u in ("TB", "GiB", "GB", "MiB", "MB", "B")], parse_bytes)


def format_bandwidth(value: float) -> str:
    return _format(value, [(u, BANDWIDTH_UNITS[u]) for u in ("TB/s", "GB/s", "MB/s", "B/s")], parse_bandwidth)


def format_time(value: float) -> str:
    return _format(value, [(u, TIME_UNITS[u]) for u in ("s", "ms", "us", "ns")], parse_time)
