"""Where the joules went: per phase, per step, idle, per 1000 samples. Pure.

Energy between two instants comes from cumulative counters (NVML total energy, RAPL),
interpolated linearly between samples, or, where a GPU has no energy counter, from its
power readings integrated with the trapezoid rule. Phases are shorter than the sampling
interval, so a step's energy is split over its phases by their share of the step time
(`estimated`): a phase that draws less power than average (waiting for data) gets a little
more than its due, so the idle figure is an upper bound.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuwise.estimate.watch.log_records import SampleRecord

Series = tuple[tuple[float, ...], tuple[float, ...]]  # times, cumulative joules


@dataclass(frozen=True)
class EnergyReport:
    """Joules by source (`gpu`, `cpu`) and in total; None where no source could be read."""

    sources: tuple[str, ...]
    missing: dict[str, str]
    job_j: float | None  # the whole watched run
    in_steps_j: float | None
    outside_steps_j: float | None  # start-up, evaluation, saving
    per_phase_j: dict[str, float]
    idle_j: float | None  # spent while the loop waited for data
    per_step_j: float | None
    per_1000_samples_j: float | None
    mean_power_w: float | None


def cumulative_series(samples: Sequence[SampleRecord], source: str) -> Series | None:
    """Cumulative joules over time for 'gpu' or 'cpu', or None if not measured."""
    if source == "cpu":
        return _counter(samples, lambda s: s.cpu_energy_j)
    counted = _counter(samples, lambda s: s.gpu_energy_j)
    if counted is not None:
        return counted
    points = [(s.t, s.gpu_power_w) for s in samples if s.gpu_power_w is not None]
    if len(points) < 2:
        return None
    times, total = [points[0][0]], [0.0]
    for (t0, p0), (t1, p1) in zip(points, points[1:], strict=False):
        times.append(t1)
        total.append(total[-1] + (p0 + p1) / 2 * (t1 - t0))
    return tuple(times), tuple(total)


def _counter(samples: Sequence[SampleRecord],
             read: Callable[[SampleRecord], float | None]) -> Series | None:
    points = [(s.t, read(s)) for s in samples]
    kept = [(t, v) for t, v in points if v is not None]
    if len(kept) < 2:
        return None
    return tuple(t for t, _ in kept), tuple(float(v) for _, v in kept if v is not None)


def energy_between(series: Series, start: float, end: float) -> float:
    """Joules used between two instants (clamped to the sampled span)."""
    return max(_at(series, end) - _at(series, start), 0.0)


def _at(series: Series, t: float) -> float:
    times, values = series
    if t <= times[0]:
        return values[0]
    if t >= times[-1]:
        return values[-1]
    i = bisect.bisect_right(times, t)
    t0, t1, v0, v1 = times[i - 1], times[i], values[i - 1], values[i]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1


def energy_report(samples: Sequence[SampleRecord], missing: dict[str, str],
                  window: tuple[float, float] | None, phase_share: dict[str, float],
                  steps_per_rank: float, samples_total: int | None) -> EnergyReport:
    """Energy of the run: `window` is (first step start, last step end) on the Unix clock."""
    series = {src: cumulative_series(samples, src) for src in ("gpu", "cpu")}
    got = {src: s for src, s in series.items() if s is not None}
    absent = {src: _why(src, missing) for src in series if src not in got}
    if not got or not samples:
        return EnergyReport((), absent, None, None, None, {}, None, None, None, None)
    start, end = samples[0].t, samples[-1].t
    job = sum(energy_between(s, start, end) for s in got.values())
    in_steps = None
    if window is not None:
        in_steps = sum(energy_between(s, *window) for s in got.values())
    per_phase = {p: in_steps * share for p, share in phase_share.items()} if in_steps else {}
    return EnergyReport(
        sources=tuple(got), missing=absent, job_j=job, in_steps_j=in_steps,
        outside_steps_j=None if in_steps is None else max(job - in_steps, 0.0),
        per_phase_j=per_phase, idle_j=per_phase.get("data"),
        per_step_j=in_steps / steps_per_rank if in_steps and steps_per_rank else None,
        per_1000_samples_j=1000 * in_steps / samples_total if in_steps and samples_total else None,
        mean_power_w=job / (end - start) if end > start else None,
    )


def _why(source: str, missing: dict[str, str]) -> str:
    key = "cpu_energy" if source == "cpu" else "gpu"
    reason = missing.get(key) or (missing.get("energy") if source == "gpu" else None)
    return reason or "no readings"
