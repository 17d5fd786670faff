"""The thresholds of gpuwise's verdicts, recommendations and probe readings
(data/thresholds.toml), every value with its source."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from gpuwise.catalog.sourced import sourced_record, sourced_section

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
    """Where a probe's first touch with memory in use counts as slow, and how far its headline
    rates may move between its start and its end before the probe is not trusted."""

    slow_first_touch_share: float  # of the small process's first-touch rate, under
    steadiness_ratio: list[float]  # [lowest, highest] rate at the end over the probe's reading
    sources: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class ProbeBounds:
    """What a real device of one kind (cpu, gpu) reads in a probe: [lowest, highest] of each
    reading; outside them (or exactly 0, NaN, infinite) a reading is implausible."""

    kind: str
    memory_gbs: list[float]  # read, copy, triad
    overhead_s: list[float]  # a tiny op, and the runtime's cost per op
    elementwise_gbs: list[float]  # the probed elementwise kernels' bytes/s
    matmul_tflops: dict[str, list[float]]  # by dtype: the best of its sizes (and kernel grids)
    link_gbs: list[float] | None = None  # host-device and device-device copies (a GPU)
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


PROBE_KINDS = ("cpu", "gpu")


@cache
def probe_bounds(kind: str) -> ProbeBounds:
    """The plausible range of each probe reading on a device of `kind` (cpu or gpu)."""
    if kind not in PROBE_KINDS:
        raise ValueError(f"no probe bounds for {kind!r}: one of {', '.join(PROBE_KINDS)}")
    matmul, matmul_sources = sourced_section(FILE, f"probe_{kind}_matmul_tflops")
    values, sources = sourced_section(FILE, f"probe_{kind}")
    return ProbeBounds(kind=kind, **values, matmul_tflops=matmul,
                       sources=sources | {f"matmul_tflops.{d}": s for d, s in matmul_sources.items()})
