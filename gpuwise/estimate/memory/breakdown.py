"""Result records of the estimators. Sizes in bytes; breakdown parts add up to the total."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak memory on one device, split by component at the moment of the peak."""

    total_bytes: int
    breakdown: dict[str, int]
    capacity_bytes: int
    runtime: str
    peak_phase: str
    phases: dict[str, int] = field(default_factory=dict)  # total at each phase's peak
    notes: tuple[str, ...] = ()
    source: str = "estimated"

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.total_bytes

    @property
    def model_bytes(self) -> int:
        """Everything but the runtime's fixed overhead: what validation compares."""
        return self.total_bytes - self.breakdown.get("overhead", 0)


def make_estimate(parts: dict[str, float], capacity: int, runtime: str, phase: str,
                  phases: dict[str, float] | None = None,
                  notes: tuple[str, ...] = ()) -> MemoryEstimate:  # fmt: skip
    """Round the parts to whole bytes and total them, so the parts always add up."""
    breakdown = {k: int(round(v)) for k, v in parts.items()}
    return MemoryEstimate(
        total_bytes=sum(breakdown.values()), breakdown=breakdown, capacity_bytes=capacity,
        runtime=runtime, peak_phase=phase,
        phases={k: int(round(v)) for k, v in (phases or {}).items()}, notes=notes,
    )  # fmt: skip
