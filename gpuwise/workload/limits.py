"""A numeric option checked where a command reads it: a number (not NaN, not infinite), of the
right sign, inside the range real machines and workloads have; refused in one line that names
the option and its limits."""

from __future__ import annotations

import math

from gpuwise.errors import GpuwiseError

# Training tokens: the largest published runs train on 15-36 trillion tokens (Llama 3, Qwen3).
MAX_TRAIN_TOKENS = 1e15


def number_text(value: float) -> str:
    """1,048,576 for whole numbers below 1e9, else %g (1e+12, 0.05, nan)."""
    if isinstance(value, int | float) and math.isfinite(value) and value == int(value) and (
            abs(value) < 1e9):
        return f"{int(value):,}"
    text = f"{value:g}" if isinstance(value, int | float) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_number(value: float | None, option: str, high: float, low: float = 0.0,
                 zero_ok: bool = False, what: str = "", hint: str = "") -> None:
    """`value` (None: not given) must be finite and in (low, high], or [low, high] where
    `zero_ok` (low 0 then means 0 is allowed). `what` puts the quantity in words before the
    option: 'requests per day must be above 0 ..., got -5 (--requests-per-day)'."""
    if value is None:
        return
    closed = zero_ok or low > 0
    inside = math.isfinite(value) and (value >= low if closed else value > low) and value <= high
    if inside:
        return
    if low == 0 and not zero_ok:
        bounds = f"above 0 and at most {number_text(high)}"
    else:
        bounds = f"between {number_text(low)} and {number_text(high)}"
    got = f"got {number_text(value)}"
    message = (f"{what} must be {bounds}, {got} ({option})" if what
               else f"{option} must be {bounds}, {got}")
    raise GpuwiseError(message, hint or f"pass a sensible {option.split(' ')[0]}")


def check_count(value: int, option: str, high: int, low: int = 1, hint: str = "") -> None:
    """`value` must be an integer from `low` to `high`."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise GpuwiseError(f"{option} must be an integer from {low:,} to {high:,}, got "
                           f"{number_text(value)}", hint or f"pass a sensible {option}")
