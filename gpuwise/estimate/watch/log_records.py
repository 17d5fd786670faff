"""The records of a `gpuwise watch` log, parsed from its JSON lines. Pure: no I/O.

Times are seconds, memory bytes, energy joules; `t`/`t_start` are Unix times so that the
sampler (another process) and every rank share one clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

PHASES = ("data", "h2d", "forward", "backward", "optimizer")


@dataclass(frozen=True)
class StepRecord:
    """One training step of one process, split into phases; `other_s` is the rest."""

    rank: int
    pid: int
    index: int
    t_start: float
    step_s: float
    data_s: float = 0.0
    h2d_s: float = 0.0
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float = 0.0
    samples: int | None = None
    ops: int | None = None
    counted: bool = False  # operators were counted in this step, which slowed it
    dispatch_us: float | None = None  # this host's cost of one tiny operator (counted steps)
    rss_bytes: int | None = None
    device_mem_bytes: int | None = None
    source: str = "api"

    @property
    def t_end(self) -> float:
        return self.t_start + self.step_s

    @property
    def other_s(self) -> float:
        """Step time outside the timed phases (forward too, when it was not timed)."""
        return max(self.step_s - sum(self.phase_s(p) for p in PHASES), 0.0)

    def phase_s(self, phase: str) -> float:
        return self.other_s if phase == "other" else float(getattr(self, f"{phase}_s"))


@dataclass(frozen=True)
class GpuReading:
    """One GPU's readings in a sample (the HTML report's timeline draws each GPU)."""

    index: int
    util_percent: float | None = None
    sm_percent: float | None = None
    mem_used_bytes: int | None = None
    power_w: float | None = None


@dataclass(frozen=True)
class SampleRecord:
    """One sensor reading; GPU fields are summed (memory, power, energy) or averaged
    (utilisation) over the watched GPUs."""

    t: float
    cpu_percent: float | None = None
    per_core: tuple[float, ...] = ()
    iowait_percent: float | None = None
    rss_bytes: int | None = None
    gpu_util_percent: float | None = None
    gpu_sm_percent: float | None = None
    gpu_mem_bytes: int | None = None
    gpu_power_w: float | None = None
    gpu_energy_j: float | None = None
    cpu_energy_j: float | None = None
    gpus: tuple[GpuReading, ...] = ()


@dataclass(frozen=True)
class WatchLog:
    """Everything a log holds: its header, the steps of every process, the samples."""

    header: dict[str, Any]
    steps: tuple[StepRecord, ...]
    samples: tuple[SampleRecord, ...]
    end: dict[str, Any] | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def unavailable(self) -> dict[str, str]:
        return dict(self.header.get("unavailable") or {})


def parse_records(records: Iterable[dict[str, Any]]) -> WatchLog:
    """Build a WatchLog from decoded JSON lines (unknown kinds are skipped)."""
    header: dict[str, Any] = {}
    steps: list[StepRecord] = []
    samples: list[SampleRecord] = []
    notes: list[str] = []
    end = None
    for rec in records:
        kind = rec.get("kind")
        if kind == "header":
            header = _merge_headers(header, rec)
        elif kind == "step":
            steps.append(_step(rec))
        elif kind == "sample":
            samples.append(_sample(rec))
        elif kind == "end":
            end = rec
        elif kind == "note":
            notes.append(str(rec.get("text", "")))
    steps.sort(key=lambda s: (s.rank, s.pid, s.index))
    samples.sort(key=lambda s: s.t)
    return WatchLog(header, tuple(steps), tuple(samples), end, tuple(notes))


def _merge_headers(first: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Several logs (one per rank) read together: keep the first, pool what is missing."""
    if not first:
        return dict(new)
    merged = dict(first)
    merged["unavailable"] = {**(new.get("unavailable") or {}), **(first.get("unavailable") or {})}
    return merged


def _step(rec: dict[str, Any]) -> StepRecord:
    return StepRecord(
        rank=int(rec.get("rank", 0)), pid=int(rec.get("pid", 0)), index=int(rec.get("step", 0)),
        t_start=float(rec.get("t_start", 0.0)), step_s=float(rec.get("step_s", 0.0)),
        **{f"{p}_s": float(rec.get(f"{p}_s") or 0.0) for p in PHASES},
        samples=rec.get("samples"), ops=rec.get("ops"), counted=bool(rec.get("counted")),
        dispatch_us=rec.get("dispatch_us"),
        rss_bytes=rec.get("rss_bytes"), device_mem_bytes=rec.get("device_mem_bytes"),
        source=str(rec.get("source", "api")),
    )


def _sample(rec: dict[str, Any]) -> SampleRecord:
    gpus = [g for g in rec.get("gpus") or [] if isinstance(g, dict)]
    return SampleRecord(
        t=float(rec["t"]), cpu_percent=rec.get("cpu_percent"),
        per_core=tuple(rec.get("per_core") or ()), iowait_percent=rec.get("iowait_percent"),
        rss_bytes=rec.get("rss_bytes"), gpu_util_percent=_mean(g.get("util_percent") for g in gpus),
        gpu_sm_percent=_mean(g.get("sm_percent") for g in gpus),
        gpu_mem_bytes=_total(g.get("mem_used_bytes") for g in gpus),
        gpu_power_w=_total(g.get("power_w") for g in gpus),
        gpu_energy_j=_total(g.get("energy_j") for g in gpus),
        cpu_energy_j=rec.get("cpu_energy_j"),
        gpus=tuple(GpuReading(_index(g.get("index"), i), g.get("util_percent"), g.get("sm_percent"),
                              g.get("mem_used_bytes"), g.get("power_w"))
                   for i, g in enumerate(gpus)),
    )


def _index(value: Any, position: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else position


def _mean(values: Iterable[Any]) -> float | None:
    got = list(values)
    if not got or any(v is None for v in got):
        return None
    return sum(got) / len(got)


def _total(values: Iterable[Any]) -> Any:
    got = list(values)
    if not got or any(v is None for v in got):
        return None
    return sum(got)
