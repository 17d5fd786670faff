"""Bottom layer: byte units, how sizes, counts and token numbers are written, and shares read."""

from __future__ import annotations

import math

from gpuwise.errors import GpuwiseError

KIB = 1024
MIB = 1024**2
GIB = 1024**3
HOURS_PER_MONTH = 8760 / 12  # 730: a year's hours over its months
DAYS_PER_MONTH = 365 / 12


def format_bytes(n: float | None) -> str:
    if n is None:
        return "NA"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("TiB", 1024**4), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            return f"{sign}{n / size:.2f} {unit}"
    return f"{sign}{n:.0f} B"


def format_count(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n:.0f}"


def format_tokens(n: int) -> str:
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}K"
    if n >= 1000:
        return f"{n / 1000:.1f}K".replace(".0K", "K")
    return str(n)


def parse_fraction(text: str | float, name: str, allow_zero: bool = False) -> float:
    """A share such as a utilisation: '0.3' or '30%'. A bare number above 1 is refused rather
    than guessed at (is 30 meant as 30% or as an error?)."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise GpuwiseError(f"{name} {raw!r} is not a number", "write a fraction such as 0.3, "
                           "or a percentage such as 30%") from None
    if not math.isfinite(value) or value < 0 or value > 1 or (value == 0 and not allow_zero):
        hint = "write 0.3 or 30%" if 1 < value <= 100 and not raw.endswith("%") else (
            "a utilisation is between 0 and 100%")
        low = "0" if allow_zero else "above 0"
        raise GpuwiseError(f"{name} must be {low} and at most 1 (100%), got {raw}", hint)
    return value
