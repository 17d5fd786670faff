"""Which of advise's candidates are sized (docs/cost.md, "Which options are sized"). A sizing
is a few serving simulations; its floor is not: the fewest devices it can have (those its
weights need, times the replicas the load needs at the rate no replica exceeds) and what
they cost at the least, powered but idle. Candidates are sized cheapest floor first, a wave
at a time (side by side within a wave), and one is left unsized once no option of it can
change the answer:

- its floor costs more than the last of the `rows` cheapest options that meet the targets
  (the table shows those; options that miss come after every one that meets);
- it cannot be a smaller deployment that meets them (its floor has more devices than the
  smallest found, or as many and costs more);
- on a CPU, it cannot be a cheaper CPU that meets them (advise says whether a CPU would do).

Each number is a bound, never an estimate, so the options shown, the recommendation and its
reasons are those of sizing every candidate; `rows=None` sizes every one (`advise --all`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

J = TypeVar("J")
S = TypeVar("S")
WAVE = 8  # candidates a wave: side by side, enough to find `rows` that meet in a wave or two


@dataclass(frozen=True)
class Floor:
    """The least a candidate's options can be: devices, and $/month at that count, idle."""

    devices: int
    usd_per_month: float
    cpu: bool = False


@dataclass(frozen=True)
class Priced:
    """What the search reads of an option once sized."""

    meets: bool
    devices: int
    usd_per_month: float
    cpu: bool = False


@dataclass(frozen=True)
class Unsized(Generic[J]):
    job: J
    floor: Floor


class _Bar:
    """The answer so far: what a floor must beat to matter."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.costs: list[float] = []  # of the options that meet, ascending
        self.smallest: tuple[int, float] | None = None
        self.cpu = math.inf

    def add(self, options: Sequence[Priced]) -> None:
        for o in options:
            if not o.meets:
                continue
            self.costs.append(o.usd_per_month)
            size = (o.devices, o.usd_per_month)
            self.smallest = size if self.smallest is None else min(self.smallest, size)
            if o.cpu:
                self.cpu = min(self.cpu, o.usd_per_month)
        self.costs.sort()

    def matters(self, f: Floor) -> bool:
        if len(self.costs) < self.rows or f.usd_per_month <= self.costs[self.rows - 1]:
            return True
        if self.smallest is None or (f.devices, f.usd_per_month) < self.smallest:
            return True
        return f.cpu and f.usd_per_month < self.cpu


def sized_in_waves(jobs: list[J], floors: list[Floor | None], rows: int | None,
                   size_wave: Callable[[list[J]], list[S]],
                   priced: Callable[[S], Sequence[Priced]],
                   wave: int = WAVE) -> tuple[dict[int, S], list[Unsized[J]]]:
    """Each job's sizing by its index, and the jobs left unsized with their floors. A job
    without a floor (None: no sizing can come of it, or its floor is not known) is sized in
    the first wave. `size_wave` sizes a list of jobs (side by side); `priced` reads a
    sizing's options."""
    order = sorted(range(len(jobs)), key=lambda i: _key(floors[i]))
    if rows is None:
        return dict(zip(order, size_wave([jobs[i] for i in order]), strict=True)), []
    bar, done, left = _Bar(rows), {}, order
    while left:
        keep = [i for i in left if floors[i] is None or bar.matters(floors[i])]  # type: ignore[arg-type]
        unsized = [i for i in left if i not in set(keep)]
        if not keep:
            left = unsized
            break
        now, left = keep[:wave], keep[wave:] + unsized
        left.sort(key=lambda i: _key(floors[i]))
        for i, s in zip(now, size_wave([jobs[i] for i in now]), strict=True):
            done[i] = s
            bar.add(priced(s))
    return done, [Unsized(jobs[i], floors[i]) for i in left]  # type: ignore[arg-type]


def _key(f: Floor | None) -> float:
    return -1.0 if f is None else f.usd_per_month
