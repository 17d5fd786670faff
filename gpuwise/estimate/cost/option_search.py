"""Which of advise's candidates are sized (docs/cost.md, "Which options are sized"). A sizing
is a few serving simulations; its floor is not: the fewest devices it can have (those its
weights need, times the replicas the load needs at the rate no replica exceeds) and what
they cost at the least, powered but idle. Candidates are sized cheapest floor first (the
first CPU before them: it is always sized, and slow), each as a worker comes free, and one is
left unsized once no option of it can change the answer:

- its floor costs more than the last of the `rows` cheapest options that meet the targets
  (the table shows those; options that miss come after every one that meets);
- it cannot be a smaller deployment that meets them (its floor has more devices than the
  smallest found, or as many and costs more);
- on a CPU, it cannot be a cheaper CPU that meets them (advise says whether a CPU would do).

Each number is a bound, never an estimate, so the options shown, the recommendation and its
reasons are those of sizing every candidate; `rows=None` sizes every one (`advise --all`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

from gpuwise.estimate.in_turn import Stream, one_by_one

J = TypeVar("J")
S = TypeVar("S")


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
        # at most (not below): the candidate that set the bar still matters once it is set
        if self.smallest is None or (f.devices, f.usd_per_month) <= self.smallest:
            return True
        return f.cpu and f.usd_per_month <= self.cpu


def sized_cheapest_first(jobs: list[J], floors: list[Floor | None], rows: int | None,
                         size: Callable[[J], S], priced: Callable[[S], Sequence[Priced]],
                         stream: Stream[tuple[int, J], S] = one_by_one,
                         ) -> tuple[dict[int, S], list[Unsized[J]]]:
    """Each job's sizing by its index, and the jobs left unsized with their floors. A job
    without a floor (None: no sizing can come of it, or its floor is not known) is always
    sized. `stream` sizes the jobs it is handed, each chosen once those before it are in
    (side by side, a few are in flight at once); `priced` reads a sizing's options. What is
    kept is what matters once every result is in, so the answer does not depend on how many
    ran at once."""
    order = sorted(range(len(jobs)), key=lambda i: _key(floors[i]))
    cpus = [i for i in order if (f := floors[i]) is not None and f.cpu]
    if cpus:  # the first CPU is always sized and is slow: started first, not left for last
        order.remove(cpus[0])
        order.insert(0, cpus[0])
    run = partial(_second, size)
    if rows is None:
        return {i: s for (i, _), s in stream(run, ((i, jobs[i]) for i in order))}, []
    bar, done = _Bar(rows), {}

    def wanted() -> Iterator[tuple[int, J]]:
        for i in order:
            if floors[i] is None or bar.matters(floors[i]):  # type: ignore[arg-type]
                yield i, jobs[i]

    for (i, _), s in stream(run, wanted()):
        done[i] = s
        bar.add(priced(s))
    kept = {i: s for i, s in done.items() if floors[i] is None or bar.matters(floors[i])}  # type: ignore[arg-type]
    return kept, [Unsized(jobs[i], f) for i in order
                  if i not in kept and (f := floors[i]) is not None]


def _second(fn: Callable[[J], S], pair: tuple[int, J]) -> S:
    return fn(pair[1])


def _key(f: Floor | None) -> float:
    return -1.0 if f is None else f.usd_per_month
