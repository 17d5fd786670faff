"""What one claim's experiment returns: its measurements (each saying where it came from), the
verdict with the rule it was decided by, and the data its figures are drawn from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Where a number came from (README: "Every number says where it came from").
SOURCES = ("measured", "detected", "estimated", "spec")


@dataclass(frozen=True)
class Measurement:
    """One number of an experiment: `source` is measured, detected, estimated or spec."""

    name: str
    value: float | int | str | None
    unit: str
    source: str
    note: str = ""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"source {self.source!r} is not one of {', '.join(SOURCES)}")


@dataclass(frozen=True)
class Verdict:
    """`holds` True or False, or None where the experiment could not run here; `reason` gives
    the numbers it rests on, `rule` the stated threshold and where it comes from."""

    holds: bool | None
    reason: str
    rule: str

    @property
    def text(self) -> str:
        if self.holds is None:
            return f"not measured here, because {self.reason}"
        return "holds here" if self.holds else f"does not hold here, because {self.reason}"


@dataclass(frozen=True)
class ClaimResult:
    """One claim of the explainer, tested on this machine."""

    id: str
    title: str
    claim: str  # the explainer's claim, in one sentence
    experiment: str  # what was run here, in one or two sentences
    verdict: Verdict
    summary: str  # the measurement in one line (the terminal table's cell)
    measurements: tuple[Measurement, ...] = ()
    series: dict[str, Any] = field(default_factory=dict)  # what the figures are drawn from
    table: tuple[tuple[str, ...], ...] = ()  # rows, the first the header
    notes: tuple[str, ...] = ()
    seconds: float = 0.0


def not_measured(claim_id: str, title: str, claim: str, reason: str, rule: str = "",
                 seconds: float = 0.0) -> ClaimResult:
    """The result of an experiment that could not run here, saying why."""
    return ClaimResult(claim_id, title, claim, "the experiment did not run",
                       Verdict(None, reason, rule), f"not measured: {reason}", seconds=seconds)


@dataclass(frozen=True)
class ClaimsAnswer:
    """Every claim tested, in the explainer's order, and the machine it ran on."""

    machine: dict[str, Any]
    quick: bool
    results: tuple[ClaimResult, ...]
    wall_s: float
    command: str = ""
