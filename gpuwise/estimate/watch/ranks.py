"""Distributed runs: each rank's step times side by side, the spread, and the stragglers.

Under data parallelism every rank meets the others in the gradient all-reduce during
backward, so step times come out equal and the wait hides inside backward. What tells a
slow rank apart is the work it does before that meeting point: its step time minus
backward and optimizer ("before sync"). A rank is a straggler when its median before-sync
time exceeds the median of the other ranks by `straggler_ratio` and by `straggler_min_s`
(catalog/data/thresholds.toml, `[watch]`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwise.catalog.thresholds import watch_thresholds
from gpuwise.estimate.watch.log_records import StepRecord


@dataclass(frozen=True)
class RankStats:
    rank: int
    steps: int
    step_s_median: float
    before_sync_s_median: float  # data, copy, forward and the rest: all but backward+optimizer
    data_s_median: float
    backward_s_median: float  # includes the wait for slower ranks in the all-reduce


@dataclass(frozen=True)
class RankSpread:
    ranks: tuple[RankStats, ...]
    step_spread: float  # (slowest - fastest) / fastest median step time
    before_sync_spread: float
    stragglers: tuple[int, ...]
    wait_s_per_step: float | None  # how long the others wait for the stragglers, per step


def rank_spread(steps: Sequence[StepRecord]) -> RankSpread | None:
    """Per-rank statistics when more than one rank logged steps, else None."""
    ranks = sorted({s.rank for s in steps})
    if len(ranks) < 2:
        return None
    stats = tuple(_stats(r, [s for s in steps if s.rank == r]) for r in ranks)
    stragglers = tuple(s.rank for s in stats if _is_straggler(s, stats))
    wait = None
    if stragglers:
        slow = [s for s in stats if s.rank in stragglers]
        fast = [s for s in stats if s.rank not in stragglers]
        if fast:
            wait = max(statistics.median(s.backward_s_median for s in fast)
                       - statistics.median(s.backward_s_median for s in slow), 0.0)
    return RankSpread(stats, _spread([s.step_s_median for s in stats]),
                      _spread([s.before_sync_s_median for s in stats]), stragglers, wait)


def _stats(rank: int, steps: list[StepRecord]) -> RankStats:
    return RankStats(
        rank=rank, steps=len(steps),
        step_s_median=statistics.median(s.step_s for s in steps),
        before_sync_s_median=statistics.median(s.step_s - s.backward_s - s.optimizer_s
                                               for s in steps),
        data_s_median=statistics.median(s.data_s for s in steps),
        backward_s_median=statistics.median(s.backward_s for s in steps),
    )


def _is_straggler(me: RankStats, stats: Sequence[RankStats]) -> bool:
    others = [s.before_sync_s_median for s in stats if s.rank != me.rank]
    typical = statistics.median(others)
    t = watch_thresholds()
    return (me.before_sync_s_median > t.straggler_ratio * typical
            and me.before_sync_s_median - typical > t.straggler_min_s)


def _spread(values: list[float]) -> float:
    low = min(values)
    return (max(values) - low) / low if low > 0 else 0.0
