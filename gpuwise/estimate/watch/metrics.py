"""The metrics `gpuwise watch --prometheus` serves, computed from the log's records. Pure.

A `LiveWindow` is fed the log's records as they arrive and keeps three things: running
totals since the job started (steps, step and phase seconds, samples, joules: Prometheus
counters, which `rate()` turns into any window), the records of a recent window (`window_s`
seconds, at most `max_steps` steps per rank), and the memory readings of the whole run,
thinned to at most `MEMORY_POINTS` evenly spaced ones per rank (creep is slow: a window of
minutes would miss what the report sees). `families()` summarises the window with the very
functions the report uses (`summarize`, `verdict`), its memory trends drawn from the whole
run as the report's are, so the verdict served is the report's verdict over the last
minutes, not a second one.

Series are bounded: labels are job and host on every metric, plus rank (the ranks of the
job), device (its GPUs), phase, verdict, finding/measure (fixed sets: metric_families.py), source and
memory. Nothing is labelled by step, time or free text.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwise.estimate.watch.energy import cumulative_series
from gpuwise.estimate.watch.log_records import SampleRecord, StepRecord, WatchLog, parse_records
from gpuwise.estimate.watch.metric_evidence import evidence
from gpuwise.estimate.watch.metric_families import (
    BOUNDS,
    EXTRA_FINDINGS,
    METRICS,
    PREFIX,
    QUANTILES,
    Family,
    label_value,
)
from gpuwise.estimate.watch.summary import (
    ALL_PHASES,
    MemoryTrend,
    WatchSummary,
    memory_trends,
    sample_trends,
    summarize,
    timed_steps,
)
from gpuwise.estimate.watch.verdict import (
    verdict,
)

# The recent window the gauges describe, and its cap per rank (a 1 ms loop makes 120,000
# steps in 2 minutes; summarising 500 per rank takes a few ms).
WINDOW_S = 120.0
MAX_STEPS = 500
MAX_SAMPLES = 2000
MEMORY_POINTS = 1024  # whole-run memory readings kept per rank (and of the samples)



class Thinned(list[Any]):
    """Every `stride`-th item added, at most `cap` of them: when full, every other one is
    dropped and the stride doubles, so the kept items stay evenly spread over all added."""

    def __init__(self, cap: int = MEMORY_POINTS) -> None:
        super().__init__()
        self.cap, self.stride, self.added = cap, 1, 0

    def add(self, item: Any) -> None:
        if self.added % self.stride == 0:
            self.append(item)
            if len(self) > self.cap:
                del self[1::2]
                self.stride *= 2
        self.added += 1


@dataclass
class RankTotals:
    steps: int = 0
    step_s: float = 0.0
    samples: int = 0
    phase_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ALL_PHASES, 0.0))


class LiveWindow:
    """The state the metrics are drawn from; `feed` it the log's records in order."""

    def __init__(self, window_s: float = WINDOW_S, max_steps: int = MAX_STEPS,
                 rank: int | None = None) -> None:
        self.window_s = window_s
        self.max_steps = max_steps
        self.rank = rank  # only this rank's steps (gpuwise.watch() in one rank), or all
        self.header: dict[str, Any] = {}
        self.steps: dict[int, deque[StepRecord]] = {}
        self.samples: deque[SampleRecord] = deque(maxlen=MAX_SAMPLES)
        self.latest_sample: dict[str, Any] | None = None
        self.totals: dict[int, RankTotals] = {}
        self.energy_j: dict[str, float] = {}
        self.memory_steps: dict[int, Thinned] = {}  # the whole run's steps with memory
        self.memory_samples = Thinned()
        self.start_t: float | None = None
        self.now = 0.0  # the latest time in the log (Unix s): the window ends here
        self._last: SampleRecord | None = None

    def feed(self, records: Iterable[dict[str, Any]]) -> None:
        records = [r for r in records if isinstance(r, dict)]
        for rec in records:
            if rec.get("kind") == "sample" and isinstance(rec.get("t"), int | float):
                self.latest_sample = rec
        log = parse_records(records)
        if log.header and not self.header:
            self.header = log.header
        self.start_t = self.start_t or log.header.get("t")
        for step in log.steps:  # by rank, then index: each rank's in time order
            if self.rank is not None and step.rank != self.rank:
                continue
            self._add_step(step)
        if log.samples:
            self._add_energy(log.samples)
            self.samples.extend(log.samples)
            for sample in log.samples:
                if sample.rss_bytes is not None or sample.gpu_mem_bytes is not None:
                    self.memory_samples.add(sample)
            self.now = max(self.now, log.samples[-1].t)
        self._trim()

    def _add_step(self, step: StepRecord) -> None:
        if step.rank not in self.totals:
            self.steps[step.rank] = deque(maxlen=self.max_steps)
            self.totals[step.rank] = RankTotals()
            self.memory_steps[step.rank] = Thinned()
        self.steps[step.rank].append(step)
        total = self.totals[step.rank]
        total.steps += 1
        total.step_s += step.step_s
        total.samples += step.samples or 0
        # the phases read once (a scrape may bring thousands of steps); other_s as defined
        # in log_records.StepRecord, without its six lookups by name
        data, h2d, forward = step.data_s, step.h2d_s, step.forward_s
        backward, optimizer = step.backward_s, step.optimizer_s
        seconds = total.phase_s
        seconds["data"] += data
        seconds["h2d"] += h2d
        seconds["forward"] += forward
        seconds["backward"] += backward
        seconds["optimizer"] += optimizer
        seconds["other"] += max(step.step_s - (data + h2d + forward + backward + optimizer), 0.0)
        if step.rss_bytes is not None or step.device_mem_bytes is not None:
            self.memory_steps[step.rank].add(step)
        self.now = max(self.now, step.t_end)
        self.start_t = self.start_t or step.t_start

    def _add_energy(self, new: tuple[SampleRecord, ...]) -> None:
        """Joules between the last sample seen and the newest, per source (energy.py's series:
        counters where the log has them, else power integrated)."""
        points = ([self._last] if self._last is not None else []) + list(new)
        self._last = new[-1]
        for source in ("gpu", "cpu"):
            series = cumulative_series(points, source)
            if series is not None:
                used = max(series[1][-1] - series[1][0], 0.0)
                self.energy_j[source] = self.energy_j.get(source, 0.0) + used

    def _trim(self) -> None:
        start = self.now - self.window_s
        for steps in self.steps.values():
            while steps and steps[0].t_end < start:
                steps.popleft()
        while self.samples and self.samples[0].t < start:
            self.samples.popleft()

    # -- what is served -------------------------------------------------------------------
    def log(self, rank: int | None = None) -> WatchLog:
        """The recent window as a log (one rank's steps, or every rank's)."""
        ranks = [rank] if rank is not None else sorted(self.steps)
        steps = sorted((s for r in ranks for s in self.steps.get(r, ())),
                       key=lambda s: (s.rank, s.pid, s.index))
        return WatchLog(self.header, tuple(steps), tuple(self.samples))

    def memory_trends(self) -> tuple[MemoryTrend, ...]:
        """The report's memory trends (summary.py), over the whole run's thinned readings."""
        steepest: dict[str, MemoryTrend] = {}  # per reading, as memory_trends picks it
        for kept in self.memory_steps.values():  # one rank at a time: it scans per process
            for trend in memory_trends(kept):
                best = steepest.get(trend.what)
                if best is None or trend.growth_bytes > best.growth_bytes:
                    steepest[trend.what] = trend
        trends = tuple(steepest[w] for w in ("rss", "device") if w in steepest)
        return trends or sample_trends(WatchLog(self.header, (), tuple(self.memory_samples)))

    def families(self, job: str, host: str, host_memory_bytes: int | None = None,
                 version: str = "", exporter_cpu_s: float = 0.0) -> list[Family]:
        """Every metric family with its samples, labelled job and host."""
        summary = replace(summarize(self.log()), memory=self.memory_trends())
        judged = verdict(summary)
        out = {spec.name: Family(spec) for spec in METRICS}

        def add(metric: str, value: float | None, suffix: str = "", **labels: Any) -> None:
            out[PREFIX + metric].add(value, suffix, **labels)

        add("job_info", 1, gpus=",".join(self.header.get("gpus") or []), version=version)
        add("start_time_seconds", self.start_t)
        add("window_seconds", self.window_s)
        for bound in BOUNDS:
            add("verdict", float(judged.bound == bound), verdict=label_value(bound))
        kinds = {f.kind for f in judged.findings}
        for kind in EXTRA_FINDINGS:
            add("finding", float(kind in kinds), finding=label_value(kind))
        for finding, measure, value, threshold in evidence(summary, judged):
            add("evidence", value, finding=finding, measure=measure)
            add("evidence_threshold", threshold, finding=finding, measure=measure)
        for rank in sorted(self.totals):
            self._rank_metrics(add, rank)
        self._spread_metrics(add, summary)
        self._memory_metrics(add, summary)
        self._sensor_metrics(add, host_memory_bytes)
        for source, joules in self.energy_j.items():
            add("energy_joules_total", joules, source=source)
        for source in ("gpu", "cpu"):
            add("power_watts", self._mean_power(source), source=source)
        add("step_energy_joules", summary.energy.per_step_j)
        add("exporter_cpu_seconds_total", exporter_cpu_s)
        for family in out.values():
            for sample in family.samples:
                sample[1].update(job=job, host=host)
        return list(out.values())

    def _rank_metrics(self, add: Any, rank: int) -> None:
        """One rank's series: totals since the start; over the window's timed steps, the
        quantities summary.py computes for the whole job (shares of the summed step time,
        samples per second of it), for this rank alone."""
        total = self.totals[rank]
        add("steps_total", total.steps, rank=rank)
        add("step_seconds", total.steps, "_count", rank=rank)
        add("step_seconds", total.step_s, "_sum", rank=rank)
        add("samples_total", total.samples, rank=rank)
        for phase in ALL_PHASES:
            add("phase_seconds_total", total.phase_s[phase], rank=rank, phase=phase)
        steps = self.steps[rank]
        if steps:
            rss = next((t.rss_bytes for t in reversed(steps) if t.rss_bytes), None)
            add("process_rss_bytes", rss, rank=rank)
            add("device_memory_allocated_bytes", steps[-1].device_mem_bytes, rank=rank)
        timed = timed_steps(list(steps))  # as the report: no first step, no counted ones
        seconds = sum(t.step_s for t in timed)
        if not timed or seconds <= 0:
            return
        times = sorted(t.step_s for t in timed)
        for q in QUANTILES:
            add("step_seconds", times[int(q * (len(times) - 1))], rank=rank, quantile=q)
        for phase in ALL_PHASES:
            spent = sum(t.phase_s(phase) for t in timed)
            add("phase_share_ratio", spent / seconds, rank=rank, phase=phase)
            add("phase_step_seconds", spent / len(timed), rank=rank, phase=phase)
        counted = [t.samples for t in timed if t.samples is not None]
        add("samples_per_second", sum(counted) / seconds if counted else None, rank=rank)
        add("before_sync_seconds", statistics.median(  # as ranks.py's RankStats
            t.step_s - t.backward_s - t.optimizer_s for t in timed), rank=rank)

    def _spread_metrics(self, add: Any, s: WatchSummary) -> None:
        spread = s.ranks
        if spread is None:
            return
        for r in spread.ranks:
            add("straggler", float(r.rank in spread.stragglers), rank=r.rank)
        add("rank_spread_ratio", spread.step_spread)
        add("straggler_wait_seconds", spread.wait_s_per_step or 0.0)

    def _memory_metrics(self, add: Any, s: WatchSummary) -> None:
        for trend in s.memory:
            per_s = trend.slope_bytes
            if trend.per == "step":
                if not s.step_s_median:
                    continue
                per_s = trend.slope_bytes / s.step_s_median
            add("memory_growth_bytes_per_second", per_s, memory=trend.what)

    def _sensor_metrics(self, add: Any, host_memory_bytes: int | None) -> None:
        add("host_memory_total_bytes", host_memory_bytes)
        sample = self.latest_sample
        if sample is None:
            return
        add("rss_bytes", sample.get("rss_bytes"))
        add("host_cpu_utilization_ratio", _ratio(sample.get("cpu_percent")))
        add("host_iowait_ratio", _ratio(sample.get("iowait_percent")))
        names = list(self.header.get("gpus") or [])
        for i, gpu in enumerate(g for g in sample.get("gpus") or [] if isinstance(g, dict)):
            device = gpu.get("index", i)
            add("gpu_info", 1, device=device, name=names[i] if i < len(names) else "")
            add("gpu_utilization_ratio", _ratio(gpu.get("util_percent")), device=device)
            add("gpu_sm_active_ratio", _ratio(gpu.get("sm_percent")), device=device)
            add("gpu_memory_used_bytes", gpu.get("mem_used_bytes"), device=device)
            add("gpu_memory_total_bytes", gpu.get("mem_total_bytes"), device=device)
            add("gpu_power_watts", gpu.get("power_w"), device=device)

    def _mean_power(self, source: str) -> float | None:
        series = cumulative_series(self.samples, source)
        if series is None or series[0][-1] <= series[0][0]:
            return None
        return (series[1][-1] - series[1][0]) / (series[0][-1] - series[0][0])


def _ratio(percent: Any) -> float | None:
    return None if percent is None else float(percent) / 100.0
