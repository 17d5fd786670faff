"""Readings for `gpuwise watch`: CPU and memory (psutil), NVIDIA GPUs (nvidia-ml-py), CPU
package energy (RAPL). A reading that is not available is None, and `unavailable` says why;
nothing here raises once constructed."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil

from gpuwise.measure.hardware.nvml import Nvml, Reading, shared_nvml
from gpuwise.measure.hardware.rapl import RAPL_ROOT, RaplCounter

T = TypeVar("T")
TREE_REFRESH = 10  # readings between two listings of the watched process tree


class CpuSensor:
    """CPU use per core, I/O wait, and the resident memory of a process and its children."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.unavailable: dict[str, str] = {}
        psutil.cpu_percent(percpu=True)  # the first call starts the interval
        try:
            psutil.cpu_times_percent()
            self._iowait = hasattr(psutil.cpu_times(), "iowait")
        except Exception as exc:
            self._iowait = False
            self.unavailable["iowait"] = repr(exc)
        if not self._iowait:
            self.unavailable.setdefault("iowait", "not reported on this OS")
        self._tree: list[psutil.Process] = []
        self._reads = 0
        try:
            self._root: psutil.Process | None = psutil.Process(pid)
        except psutil.Error as exc:
            self._root = None
            self.unavailable["rss"] = repr(exc)

    def read(self) -> dict[str, Any]:
        per_core = psutil.cpu_percent(percpu=True)
        out: dict[str, Any] = {
            "cpu_percent": sum(per_core) / len(per_core) if per_core else None,
            "per_core": per_core,
            "iowait_percent": None,
            "rss_bytes": self._tree_rss(),
        }
        if self._iowait:
            out["iowait_percent"] = getattr(psutil.cpu_times_percent(), "iowait", None)
        return out

    def _tree_rss(self) -> int | None:
        """Sum of RSS over the process tree (pages shared by forked workers count in each).
        Listing the tree scans every process (~2 ms), so it is refreshed every
        TREE_REFRESH readings; reading each member's RSS is cheap."""
        if self._root is None:
            return None
        if self._reads % TREE_REFRESH == 0 or not self._tree:
            try:
                self._tree = [self._root, *self._root.children(recursive=True)]
            except psutil.Error:
                return None
        self._reads += 1
        total, read = 0, 0
        for proc in self._tree:
            try:
                total += proc.memory_info().rss
                read += 1
            except psutil.Error:
                continue  # a worker that just exited
        return total if read else None  # the whole tree gone: no reading, not 0 B


class GpuSensor:
    """Utilisation, SM activity (GPM metrics, Hopper and later), memory, power and energy of
    the GPUs the job can see (CUDA_VISIBLE_DEVICES when it lists indices, else all)."""

    def __init__(self, nvml: Nvml | None = None) -> None:
        self.unavailable: dict[str, str] = {}
        self.names: list[str] = []
        self._handles: list[tuple[int, Any]] = []
        self._gpm: dict[int, tuple[Any, Any]] = {}
        self.nvml = nvml or shared_nvml()
        count = self.nvml.device_count()
        if count.value is None:
            self.unavailable["gpu"] = _reason(count.reason)
            return
        for index in _visible(count.value):
            handle = self.nvml.handle(index)
            name = self.nvml.name(handle.value) if handle.value is not None else handle
            if name.value is None:  # a GPU lost, or one we may not query
                self.unavailable[f"gpu{index}"] = _reason(name.reason)
                continue
            self.names.append(name.value)
            self._handles.append((index, handle.value))
            self._start_gpm(index, handle.value)
        if not self._handles:
            self.unavailable["gpu"] = "no NVIDIA GPU visible"

    def read(self) -> list[dict[str, Any]]:
        return [self._read_one(index, handle) for index, handle in self._handles]

    def _read_one(self, index: int, handle: Any) -> dict[str, Any]:
        nv = self.nvml
        memory = self._try("memory", lambda: nv.memory(handle))
        return {"index": index,
                "util_percent": self._try("util", lambda: nv.utilization_percent(handle)),
                "sm_percent": self._sm_active(index, handle),
                "mem_used_bytes": memory.used_bytes if memory is not None else None,
                "mem_total_bytes": memory.total_bytes if memory is not None else None,
                "power_w": self._try("power", lambda: nv.power_w(handle)),
                "energy_j": self._try("energy", lambda: nv.energy_j(handle))}

    def _try(self, what: str, read: Callable[[], Reading[T]]) -> T | None:
        """A reading, None once it has failed (not supported on this GPU, or no permission)."""
        if what in self.unavailable:
            return None
        got = read()
        if got.value is None:
            self.unavailable[what] = _reason(got.reason)
        return got.value

    def _start_gpm(self, index: int, handle: Any) -> None:
        supported = self.nvml.gpm_supported(handle)
        if supported.value is None:
            self.unavailable["sm_active"] = _reason(supported.reason)
            return
        if not supported.value:
            self.unavailable["sm_active"] = "GPM metrics need a Hopper or later GPU"
            return
        first, spare = self.nvml.gpm_sample(handle), self.nvml.gpm_sample(handle)
        if first.value is None or spare.value is None:
            self.unavailable["sm_active"] = _reason(first.reason or spare.reason)
            return
        self._gpm[index] = (first.value, spare.value)

    def _sm_active(self, index: int, handle: Any) -> float | None:
        """Share of SMs busy between the previous reading and this one (NVML GPM)."""
        if index not in self._gpm:
            return None
        previous, spare = self._gpm[index]
        current = self.nvml.gpm_sample(handle, spare)
        active = (self.nvml.gpm_sm_active_percent(previous, current.value)
                  if current.value is not None else Reading(None, current.reason))
        if active.reason is not None:
            self.unavailable["sm_active"] = _reason(active.reason)
            del self._gpm[index]
            return None
        self._gpm[index] = (current.value, previous)
        return active.value  # None: not ready yet (samples too close together)


class RaplSensor:
    """Cumulative CPU package energy in joules (RAPL), wrap-arounds added back."""

    def __init__(self, root: Path = RAPL_ROOT) -> None:
        self.counter = RaplCounter(root)
        reason = self.counter.reason
        self.unavailable: dict[str, str] = {"cpu_energy": reason} if reason else {}

    def read(self) -> float | None:
        """Joules since an arbitrary origin: differences between two readings are the energy
        used in between."""
        return self.counter.read()


def _visible(count: int) -> list[int]:
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return list(range(count))
    indices = [s.strip() for s in listed.split(",") if s.strip()]
    if all(s.isdigit() for s in indices):
        return [int(s) for s in indices if int(s) < count]
    return list(range(count))  # UUIDs or MIG names: watch every GPU


def _reason(text: str | None) -> str:
    """NVML's reason, saying so where it is the driver that is missing."""
    text = text or "not reported"
    if (
        "Driver Not Loaded" in text
        or "NVML Shared Library Not Found" in text
        or "libnvidia-ml" in text
    ):
        return f"no NVIDIA driver ({text})"
    return text
