"""How far to trust a time (data/time_intervals.toml, written by tools/write_time_intervals.py
from the validations' residuals; docs/speed.md, "How far to trust a time")."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from gpuwise.catalog.sourced import data_file

FILE = "time_intervals.toml"


@dataclass(frozen=True)
class TimeInterval:
    """Measured / estimated time at the 10th and 90th percentile of the validation entries
    of one runtime, phase and rates source: the time lies in (t x low, t x high) of an
    estimate t with 80% confidence, as far as those entries tell. The band contains ratio 1,
    so that every interval contains its own estimate (where the residuals are one-sided the
    writer widens it to 1)."""

    low: float
    high: float
    entries: int
    runtime: str  # "any": pooled over runtimes
    phase: str  # "any": pooled over phases
    source: str  # "spec" or "measured"

    def __post_init__(self) -> None:
        if not 0 < self.low <= 1 <= self.high:
            raise ValueError(f"{FILE}: the interval of {self.runtime} {self.phase} "
                             f"({self.source}), {self.low}-{self.high}, does not contain its "
                             "estimate (ratio 1): run tools/write_time_intervals.py")

    def around(self, seconds: float) -> tuple[float, float]:
        return seconds * self.low, seconds * self.high

    @property
    def basis(self) -> str:
        what = "all runtimes" if self.runtime == "any" else self.runtime
        phase = "" if self.phase == "any" else f" {self.phase}"
        return f"{self.entries} validation entries of {what}{phase} ({self.source})"


@cache
def _intervals() -> dict[tuple[str, str, str], TimeInterval]:
    out = {}
    for rec in data_file(FILE).get("interval", []):
        iv = TimeInterval(rec["low"], rec["high"], rec["entries"], rec["runtime"], rec["phase"],
                          rec["source"])
        out[(iv.runtime, iv.phase, iv.source)] = iv
    return out


def time_interval(runtime: str, phase: str, source: str) -> TimeInterval | None:
    """The narrowest group that has entries: this runtime and phase, the runtime's phases
    pooled, then every runtime of the same rates source."""
    found = _intervals()
    for key in ((runtime, phase, source), (runtime, "any", source), ("any", "any", source)):
        if key in found:
            return found[key]
    return None
