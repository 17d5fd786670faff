"""The thresholds of gpuwise's verdicts, recommendations and probe readings
(data/thresholds.toml), every value with its source."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from gpuwise.catalog.sourced import sourced_record

FILE = "thresholds.toml"


@dataclass(frozen=True)
class WatchThresholds:
    """Where `gpuwise watch` calls a loop input-bound, host-bound, creeping or straggling."""

    input_bound_share: float  # of the step time waiting for data and copies
    host_bound_us_per_op: float  # average microseconds per operator, at most
    host_bound_dispatch_factor: float  # x this host's measured cost of a tiny operator
    low_gpu_util_percent: float  # busy share below which, without op counts, host-bound
    creep_min_bytes: int  # growth after warm-up, at least
    creep_min_fraction: float  # ... and this share of where it started
    creep_min_r: float  # ... with this correlation of bytes with the step
    straggler_ratio: float  # before-sync time over the other ranks' median, more than
    straggler_min_s: float  # ... and by more than this
    sources: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class AdviseThresholds:
    """Where `gpuwise advise` blames the data pipeline, and what a well-fed job reaches."""

    pipeline_util: float
    target_util: float
    sources: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class PrecisionThresholds:
    """How much faster fp32 must be on a CPU to be named the better precision."""

    fp32_faster_by: float
    sources: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class ProbeThresholds:
    """Where a probe's first touch with memory in use counts as slow."""

    slow_first_touch_share: float  # of the small process's first-touch rate, under
    sources: dict[str, str] = field(default_factory=dict, repr=False)


@cache
def watch_thresholds() -> WatchThresholds:
    return sourced_record(WatchThresholds, FILE, "watch")


@cache
def advise_thresholds() -> AdviseThresholds:
    return sourced_record(AdviseThresholds, FILE, "advise")


@cache
def precision_thresholds() -> PrecisionThresholds:
    return sourced_record(PrecisionThresholds, FILE, "precision")


@cache
def probe_thresholds() -> ProbeThresholds:
    return sourced_record(ProbeThresholds, FILE, "probe")
