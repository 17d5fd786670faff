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

RAPL_ROOT = Path("/sys/class/powercap")


def _rapl_domains(root: Path) -> list[Path]:
    """Top-level package domains (intel-rapl:0, intel-rapl:1, ...), not their subdomains."""
    return sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())


def _rapl_joules(domain: Path) -> float:
    return _read_int(domain / "energy_uj") / 1e6


def _pynvml() -> Any:
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def _nvml_joules(lib: Any, handle: Any) -> float:
    return float(lib.nvmlDeviceGetTotalEnergyConsumption(handle)) / 1e3  # millijoules


class EnergyMeter:
    """Reads joules since an arbitrary origin; `delta` handles counter wrap-around."""

    def __init__(self, rapl_root: Path = RAPL_ROOT, nvml: Any = None) -> None:
        self.sources: list[tuple[str, Callable[[], float], float | None]] = []
        self.missing: list[str] = []
        self._add_rapl(rapl_root)
        self._add_nvml(nvml)

    def _add_rapl(self, root: Path) -> None:
        domains = _rapl_domains(root)
        if not domains:
            self.missing.append(f"CPU: no RAPL counters under {root}")
        for d in domains:
            try:
                _read_int(d / "energy_uj")
                wrap = _read_int(d / "max_energy_range_uj") / 1e6
            except (OSError, ValueError) as exc:
                self.missing.append(
                    f"CPU: {d / 'energy_uj'} not readable ({exc.__class__.__name__})"
                )
                continue
            self.sources.append((d.name, partial(_rapl_joules, d), wrap))

    def _add_nvml(self, nvml: Any) -> None:
        try:
            lib = nvml if nvml is not None else _pynvml()
            for i in range(lib.nvmlDeviceGetCount()):
                handle = lib.nvmlDeviceGetHandleByIndex(i)
                read = partial(_nvml_joules, lib, handle)
                read()  # raises where the GPU has no energy counter
                self.sources.append((f"gpu{i}", read, None))
        except Exception as exc:  # no library, no driver, or a GPU without the counter
            self.missing.append(f"GPU: {exc.__class__.__name__}: {exc}".strip())

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
