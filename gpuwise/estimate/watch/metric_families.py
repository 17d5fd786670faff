"""The metric families `gpuwise watch --prometheus` serves (names, types, help, labels), and
a family being filled with samples. Pure; the values come from `metrics.LiveWindow`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PREFIX = "gpuwise_watch_"
BOUNDS = ("input-bound", "host-bound", "compute-bound", "no-steps")  # Verdict.bound's values
EXTRA_FINDINGS = ("memory-creep", "stragglers")
QUANTILES = (0.5, 0.9)


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
)
SPECS = {spec.name: spec for spec in METRICS}

Sample = tuple[str, dict[str, str], float]  # (sample name, labels, value)


@dataclass
class Family:
    spec: MetricSpec
    samples: list[Sample] = field(default_factory=list)

    def add(self, value: float | None, suffix: str = "", **labels: Any) -> None:
        if value is not None:
            self.samples.append((self.spec.name + suffix, {k: str(v) for k, v in labels.items()},
                                 float(value)))


def label_value(kind: str) -> str:
    """A finding's kind as a label value: `input-bound` -> `input_bound`."""
    return kind.replace("-", "_")


def metric_names() -> set[str]:
    """Every sample name that can be served (a summary's `_count`/`_sum` included)."""
    names = set()
    for spec in METRICS:
        names.add(spec.name)
        if spec.kind == "summary":
            names |= {spec.name + "_count", spec.name + "_sum"}
    return names
