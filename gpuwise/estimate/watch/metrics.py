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
job), device (its GPUs), phase, verdict, finding/measure (fixed sets below), source and
memory. Nothing is labelled by step, time or free text.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwise.catalog.thresholds import watch_thresholds
from gpuwise.estimate.watch.energy import cumulative_series
from gpuwise.estimate.watch.log_records import SampleRecord, StepRecord, WatchLog, parse_records
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
    Verdict,
    creep_finding,
    host_bound_threshold_us,
    input_share,
    verdict,
)

PREFIX = "gpuwise_watch_"
BOUNDS = ("input-bound", "host-bound", "compute-bound", "no-steps")  # Verdict.bound's values
EXTRA_FINDINGS = ("memory-creep", "stragglers")
QUANTILES = (0.5, 0.9)
# The recent window the gauges describe, and its cap per rank (a 1 ms loop makes 120,000
# steps in 2 minutes; summarising 500 per rank takes a few ms).
WINDOW_S = 120.0
MAX_STEPS = 500
MAX_SAMPLES = 2000
MEMORY_POINTS = 1024  # whole-run memory readings kept per rank (and of the samples)


@dataclass(frozen=True)
class MetricSpec:
    """One metric family: its full name (counters end in `_total`), type, help and the
    labels it has besides job and host."""

    name: str
    kind: str  # gauge, counter or summary
    help: str
    labels: tuple[str, ...] = ()


def _m(name: str, kind: str, help: str, *labels: str) -> MetricSpec:
    return MetricSpec(PREFIX + name, kind, help, labels)


# Every family served (docs/watch.md lists them; the dashboard and alert rules use only these).
METRICS = (
    _m("job_info", "gauge", "1, labelled with the watched job's GPUs and gpuwise's version",
       "gpus", "version"),
    _m("start_time_seconds", "gauge", "when the watched job started (Unix time)"),
    _m("window_seconds", "gauge", "the recent window the verdict and the other gauges cover"),
    _m("verdict", "gauge", "1 for what limits the loop over the recent window, 0 for the "
       "others (input_bound, host_bound, compute_bound, no_steps)", "verdict"),
    _m("finding", "gauge", "1 when the job shows the finding, else 0: memory_creep (over the "
       "whole run), stragglers (recent window)", "finding"),
    _m("evidence", "gauge", "the measured numbers behind each current finding", "finding",
       "measure"),
    _m("evidence_threshold", "gauge", "the threshold each evidence number was judged against",
       "finding", "measure"),
    _m("steps_total", "counter", "training steps completed", "rank"),
    _m("step_seconds", "summary", "step time: quantiles over the recent window, count and sum "
       "since the start", "rank"),
    _m("phase_seconds_total", "counter", "seconds spent in each phase of the steps (data, h2d, "
       "forward, backward, optimizer, other)", "rank", "phase"),
    _m("phase_share_ratio", "gauge", "share of step time in each phase, recent window", "rank",
       "phase"),
    _m("phase_step_seconds", "gauge", "mean seconds per step in each phase, recent window",
       "rank", "phase"),
    _m("samples_total", "counter", "training samples processed (first dimension of a batch)",
       "rank"),
    _m("samples_per_second", "gauge", "training samples per second, recent window", "rank"),
    _m("process_rss_bytes", "gauge", "resident memory of the rank's process, last step", "rank"),
    _m("device_memory_allocated_bytes", "gauge", "CUDA memory allocated by the rank's tensors, "
       "last step", "rank"),
    _m("before_sync_seconds", "gauge", "median work per step before the gradient all-reduce "
       "(step - backward - optimizer), recent window: a straggler's is longer", "rank"),
    _m("straggler", "gauge", "1 for a rank that holds the others back, else 0; with more than "
       "one rank", "rank"),
    _m("rank_spread_ratio", "gauge", "(slowest - fastest) / fastest median step time across "
       "ranks, recent window"),
    _m("straggler_wait_seconds", "gauge", "how long the other ranks wait for the stragglers "
       "per step, recent window"),
    _m("memory_growth_bytes_per_second", "gauge", "least-squares growth of memory after "
       "warm-up over the whole run (rss: the steepest process, device: CUDA memory)",
       "memory"),
    _m("rss_bytes", "gauge", "resident memory of the job's process tree"),
    _m("host_memory_total_bytes", "gauge", "the host's physical memory"),
    _m("host_cpu_utilization_ratio", "gauge", "busy share of the host's CPUs"),
    _m("host_iowait_ratio", "gauge", "share of CPU time waiting for I/O"),
    _m("gpu_info", "gauge", "1 per watched GPU, with its name", "device", "name"),
    _m("gpu_utilization_ratio", "gauge", "share of time a kernel ran on the GPU (NVML)",
       "device"),
    _m("gpu_sm_active_ratio", "gauge", "share of SMs busy (NVML GPM, Hopper and later)",
       "device"),
    _m("gpu_memory_used_bytes", "gauge", "GPU memory used (NVML)", "device"),
    _m("gpu_memory_total_bytes", "gauge", "GPU memory capacity (NVML)", "device"),
    _m("gpu_power_watts", "gauge", "GPU power draw (NVML)", "device"),
    _m("energy_joules_total", "counter", "energy used since the job started (gpu: NVML, "
       "cpu: RAPL package)", "source"),
    _m("power_watts", "gauge", "mean power over the recent window", "source"),
    _m("step_energy_joules", "gauge", "energy per step, recent window (estimated)"),
    _m("exporter_cpu_seconds_total", "counter", "CPU time the exporter spent computing these "
       "metrics"),
)  # fmt: skip
SPECS = {spec.name: spec for spec in METRICS}

Sample = tuple[str, dict[str, str], float]  # (sample name, labels, value)


@dataclass
class Family:
    spec: MetricSpec
    samples: list[Sample] = field(default_factory=list)

    def add(self, value: float | None, suffix: str = "", **labels: Any) -> None:
        if value is not None:
            self.samples.append((self.spec.name + suffix, {k: str(v) for k, v in labels.items()},
                                 float(value)))  # fmt: skip


def label_value(kind: str) -> str:
    """A finding's kind as a label value: `input-bound` -> `input_bound`."""
    return kind.replace("-", "_")


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
                 rank: int | None = None) -> None:  # fmt: skip
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
                       key=lambda s: (s.rank, s.pid, s.index))  # fmt: skip
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
                 version: str = "", exporter_cpu_s: float = 0.0) -> list[Family]:  # fmt: skip
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
            t.step_s - t.backward_s - t.optimizer_s for t in timed), rank=rank)  # fmt: skip

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


def evidence(s: WatchSummary, v: Verdict) -> list[tuple[str, str, float, float | None]]:
    """(finding, measure, value, threshold or None) for each current finding: the numbers of
    the summary its rule read (verdict.py), each measure named with its unit."""
    t = watch_thresholds()
    out: list[tuple[str, str, float, float | None]] = []
    ops = s.us_per_op is not None and bool(s.ops_per_step)
    for finding in v.findings:
        kind = label_value(finding.kind)
        if finding.kind == "input-bound":
            out += [(kind, "input_share_ratio", input_share(s), t.input_bound_share),
                    (kind, "data_share_ratio", s.phase_share.get("data", 0.0), None),
                    (kind, "h2d_share_ratio", s.phase_share.get("h2d", 0.0), None)]  # fmt: skip
        elif finding.kind in ("host-bound", "compute-bound"):
            if finding.kind == "compute-bound":
                out.append((kind, "compute_share_ratio", 1.0 - input_share(s), None))
            if ops:
                out += [(kind, "operator_seconds", (s.us_per_op or 0.0) / 1e6,
                         host_bound_threshold_us(s) / 1e6),
                        (kind, "operators_per_step", s.ops_per_step or 0.0, None)]  # fmt: skip
            elif s.gpu_util_percent is not None:
                out.append((kind, "gpu_utilization_ratio", s.gpu_util_percent / 100,
                            t.low_gpu_util_percent / 100))  # fmt: skip
    for trend in s.memory:
        if creep_finding(trend) is not None:
            least = max(t.creep_min_bytes, t.creep_min_fraction * trend.first_bytes)
            out += [("memory_creep", f"{trend.what}_growth_bytes", trend.growth_bytes, least),
                    ("memory_creep", f"{trend.what}_growth_correlation", trend.r,
                     t.creep_min_r)]  # fmt: skip
    spread = s.ranks
    if spread is not None and spread.stragglers:
        slow = max((r for r in spread.ranks if r.rank in spread.stragglers),
                   key=lambda r: r.before_sync_s_median)  # fmt: skip
        typical = statistics.median(r.before_sync_s_median for r in spread.ranks
                                    if r.rank != slow.rank)  # fmt: skip
        limit = max(t.straggler_ratio * typical, typical + t.straggler_min_s)
        out += [("stragglers", "before_sync_seconds", slow.before_sync_s_median, limit),
                ("stragglers", "others_before_sync_seconds", typical, None),
                ("stragglers", "wait_seconds_per_step", spread.wait_s_per_step or 0.0, None)]  # fmt: skip
    return out


def metric_names() -> set[str]:
    """Every sample name that can be served (a summary's `_count`/`_sum` included)."""
    names = set()
    for spec in METRICS:
        names.add(spec.name)
        if spec.kind == "summary":
            names |= {spec.name + "_count", spec.name + "_sum"}
    return names
