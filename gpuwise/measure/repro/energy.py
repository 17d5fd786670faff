"""Energy of one run from hardware counters: CPU package (RAPL) and NVIDIA GPUs (NVML).

A reading that is not available is None with the reason, never an exception. The counters
cover the whole machine, so a run's energy includes anything else running; with runs in
parallel they cannot be split between runs, and the runner does not read them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from gpuwise.measure.hardware.nvml import Nvml, shared_nvml
from gpuwise.measure.hardware.rapl import RAPL_ROOT, find_zones


def _nvml_joules(nvml: Nvml, handle: Any) -> float:
    joules = nvml.energy_j(handle)
    if joules.value is None:
        raise RuntimeError(f"GPU energy not readable: {joules.reason}")
    return joules.value


class EnergyMeter:
    """Reads joules since an arbitrary origin; `delta` handles counter wrap-around."""

    def __init__(self, rapl_root: Path = RAPL_ROOT, nvml: Nvml | None = None) -> None:
        self.sources: list[tuple[str, Callable[[], float], float | None]] = []
        self.missing: list[str] = []
        self._add_rapl(rapl_root)
        self._add_nvml(nvml or shared_nvml())

    def _add_rapl(self, root: Path) -> None:
        found = find_zones(root)
        self.missing += [f"CPU: {problem}" for problem in found.problems]
        for zone in found.zones:
            self.sources.append((zone.name, zone.read_j, zone.range_j))

    def _add_nvml(self, nvml: Nvml) -> None:
        count = nvml.device_count()
        for i in range(count.value or 0):
            handle = nvml.handle(i)
            # a GPU without an energy counter, and those after it, are left out
            first = nvml.energy_j(handle.value) if handle.value is not None else handle
            if first.value is None:
                self.missing.append(f"GPU: {first.reason}")
                return
            self.sources.append((f"gpu{i}", partial(_nvml_joules, nvml, handle.value), None))
        if count.value is None:  # no library, or no driver
            self.missing.append(f"GPU: {count.reason}")

    @property
    def available(self) -> bool:
        return bool(self.sources)

    def read(self) -> list[float]:
        return [read() for _, read, _ in self.sources]

    def delta(self, before: list[float], after: list[float]) -> float:
        total = 0.0
        for (_, _, wrap), a, b in zip(self.sources, before, after, strict=True):
            diff = b - a
            if diff < 0 and wrap:
                diff += wrap
            total += diff
        return total

    def note(self) -> str:
        names = ", ".join(name for name, _, _ in self.sources)
        return f"measured: {names}" if names else "NA: " + "; ".join(self.missing)
