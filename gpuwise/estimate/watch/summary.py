"""Summarise a watch log: step times, phase shares, operators, utilisation, memory trend,
energy and the spread across ranks. Pure: no I/O, no torch."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwise.estimate.watch.energy import EnergyReport, energy_report
from gpuwise.estimate.watch.log_records import PHASES, StepRecord, WatchLog
from gpuwise.estimate.watch.ranks import RankSpread, rank_spread

ALL_PHASES = (*PHASES, "other")
# Memory is judged after the first steps (allocator and caches warm up) ...
WARMUP_FRACTION = 0.2
# ... and needs this many steps to call a trend.
MIN_TREND_STEPS = 8


@dataclass(frozen=True)
class MemoryTrend:
    """Least-squares line of a memory reading after warm-up: over steps (per process), or,
    when the job logged no step memory (--no-inject, not PyTorch), over the samples' time
    (the whole process tree's RSS; memory used on the GPUs)."""

    what: str  # "rss" or "device"
    per: str  # "step" or "second"
    first_bytes: int
    last_bytes: int
    growth_bytes: float  # slope times the span
    slope_bytes: float  # per step or per second
    r: float  # correlation of bytes with the step index or time
    points: int


@dataclass(frozen=True)
class WatchSummary:
    """The numbers a verdict is drawn from (seconds, shares in 0..1, bytes, joules)."""

    steps_total: int
    steps_timed: int  # without each process's first step and the counted steps
    processes: int
    step_s_median: float | None
    step_s_p90: float | None
    phase_s: dict[str, float]  # summed over the timed steps of every process
    phase_share: dict[str, float]
    samples_per_s: float | None
    ops_per_step: float | None
    us_per_op: float | None  # non-input time of a median step per operator
    dispatch_us: float | None  # median measured cost of one tiny operator on the host
    gpu_util_percent: float | None
    gpu_sm_percent: float | None
    cpu_percent: float | None
    iowait_percent: float | None
    memory: tuple[MemoryTrend, ...]
    energy: EnergyReport
    ranks: RankSpread | None
    wall_s: float | None
    source: str  # "inject" (forward not timed apart) or "api"


def timed_steps(steps: Sequence[StepRecord]) -> list[StepRecord]:
    """Steps that represent the loop: not a process's first (warm-up), not counted (nor,
    on other ranks, a step counted somewhere: the ranks wait for each other)."""
    firsts: dict[tuple[int, int], int] = {}
    for s in steps:
        key = (s.rank, s.pid)
        firsts[key] = min(firsts.get(key, s.index), s.index)
    counted = {s.index for s in steps if s.counted}
    timed = [s for s in steps if s.index != firsts[(s.rank, s.pid)] and s.index not in counted]
    return timed or [s for s in steps if not s.counted] or list(steps)


def summarize(log: WatchLog) -> WatchSummary:
    """Everything the verdict and the report need, from the log's records."""
    timed = timed_steps(log.steps)
    total = sum(s.step_s for s in timed)
    phase_s = {p: sum(s.phase_s(p) for s in timed) for p in ALL_PHASES}
    share = {p: v / total for p, v in phase_s.items()} if total > 0 else {}
    times = sorted(s.step_s for s in timed)
    processes = len({(s.rank, s.pid) for s in log.steps})
    samples_done = [s.samples for s in timed if s.samples is not None]
    window = _steps_window(log.steps)
    all_samples = sum(s.samples or 0 for s in log.steps) or None
    steps_per_rank = len(log.steps) / processes if processes else 0.0
    return WatchSummary(
        steps_total=len(log.steps), steps_timed=len(timed), processes=processes,
        step_s_median=statistics.median(times) if times else None,
        step_s_p90=times[int(0.9 * (len(times) - 1))] if times else None,
        phase_s=phase_s, phase_share=share,
        samples_per_s=sum(samples_done) / total * processes if samples_done and total else None,
        ops_per_step=_ops_per_step(log.steps), us_per_op=_us_per_op(log.steps, timed),
        dispatch_us=_median_of([s.dispatch_us for s in log.steps]),
        gpu_util_percent=_mean_in(log, "gpu_util_percent", window),
        gpu_sm_percent=_mean_in(log, "gpu_sm_percent", window),
        cpu_percent=_mean_in(log, "cpu_percent", window),
        iowait_percent=_mean_in(log, "iowait_percent", window),
        memory=memory_trends(log.steps) or sample_trends(log), ranks=rank_spread(timed),
        energy=energy_report(log.samples, log.unavailable, window, share, steps_per_rank,
                             all_samples),
        wall_s=log.samples[-1].t - log.samples[0].t if len(log.samples) > 1 else None,
        source="inject" if any(s.source == "inject" for s in log.steps) else "api",
    )


def _steps_window(steps: Sequence[StepRecord]) -> tuple[float, float] | None:
    if not steps:
        return None
    return min(s.t_start for s in steps), max(s.t_end for s in steps)


def _ops_per_step(steps: Sequence[StepRecord]) -> float | None:
    return _median_of([s.ops for s in steps if s.ops])


def _median_of(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return float(statistics.median(got)) if got else None


def _us_per_op(steps: Sequence[StepRecord], timed: Sequence[StepRecord]) -> float | None:
    """Wall time per operator of the steps' non-input work (all but data and H2D)."""
    ops = _ops_per_step(steps)
    if not ops or not timed:
        return None
    work = statistics.median(s.step_s - s.data_s - s.h2d_s for s in timed)
    return 1e6 * work / ops


def _mean_in(log: WatchLog, field: str, window: tuple[float, float] | None) -> float | None:
    """Mean of a sample field over the steps (over the whole run if there are none)."""
    values = [getattr(s, field) for s in log.samples
              if window is None or window[0] <= s.t <= window[1]]
    got = [v for v in values if v is not None]
    return statistics.fmean(got) if got else None


def memory_trends(steps: Sequence[StepRecord]) -> tuple[MemoryTrend, ...]:
    """The steepest RSS and device-memory trends over any one process's steps."""
    trends: list[MemoryTrend] = []
    for what, field in (("rss", "rss_bytes"), ("device", "device_mem_bytes")):
        per_process: list[MemoryTrend] = []
        for key in sorted({(s.rank, s.pid) for s in steps}):
            mine = [s for s in steps if (s.rank, s.pid) == key and getattr(s, field) is not None]
            trend = _trend(what, "step", [(s.index, getattr(s, field)) for s in mine])
            if trend is not None:
                per_process.append(trend)
        if per_process:
            trends.append(max(per_process, key=lambda t: t.growth_bytes))
    return tuple(trends)


def sample_trends(log: WatchLog) -> tuple[MemoryTrend, ...]:
    """Memory trends over the sampled time, for jobs without per-step memory."""
    if not log.samples:
        return ()
    t0 = log.samples[0].t
    trends = []
    for what, field in (("rss", "rss_bytes"), ("device", "gpu_mem_bytes")):
        points = [(s.t - t0, getattr(s, field)) for s in log.samples]
        trend = _trend(what, "second", [(t, v) for t, v in points if v is not None])
        if trend is not None:
            trends.append(trend)
    return tuple(trends)


def _trend(what: str, per: str, points: list[tuple[float, int]]) -> MemoryTrend | None:
    skip = max(2, int(WARMUP_FRACTION * len(points)))
    kept = points[skip:]
    if len(kept) < MIN_TREND_STEPS:
        return None
    xs = [float(x) for x, _ in kept]
    ys = [float(y) for _, y in kept]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx if sxx else 0.0
    r = sxy / (sxx * syy) ** 0.5 if sxx and syy else 0.0
    return MemoryTrend(what, per, int(ys[0]), int(ys[-1]), slope * (xs[-1] - xs[0]), slope, r,
                       len(kept))
