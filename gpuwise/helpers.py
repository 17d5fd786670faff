"""Bottom layer: units, formatting and name matching. Imports nothing from gpuwise."""

from __future__ import annotations

import difflib
import statistics
import time
from collections.abc import Callable, Iterable

KIB = 1024
MIB = 1024**2
GIB = 1024**3


class GpuwiseError(Exception):
    """A problem with the user's input: shown as one line with a hint, exit code 2."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def did_you_mean(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The closest names to `name` among `choices`, best first."""
    pool = list(choices)
    lowered = {c.lower(): c for c in pool}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)
    if not close:
        close = [c.lower() for c in pool if name.lower() in c.lower()][:n]
    return [lowered[c] for c in close]


def unknown_name_error(kind: str, name: str, choices: Iterable[str], list_cmd: str) -> GpuwiseError:
    suggestions = did_you_mean(name, choices)
    if suggestions:
        hint = f"did you mean {', '.join(repr(s) for s in suggestions)}? (`{list_cmd}` lists them)"
    else:
        hint = f"`{list_cmd}` lists the known names"
    return GpuwiseError(f"unknown {kind} {name!r}", hint)


def normalise_name(name: str) -> str:
    """Lowercase, with spaces and underscores read as dashes."""
    return name.strip().lower().replace("_", "-").replace(" ", "-")


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


def median_call_s(fn: Callable[[], object], repeats: int,
                  after: Callable[[], object] | None = None) -> float:  # fmt: skip
    """Median seconds of one call of `fn` over `repeats` calls, after one warm-up call;
    `after` runs inside each timing (a device synchronisation)."""
    fn()
    if after is not None:
        after()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if after is not None:
            after()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
