"""Readings for `gpuwise watch`: CPU and memory (psutil), NVIDIA GPUs (nvidia-ml-py), CPU
package energy (RAPL). A reading that is not available is None, and `unavailable` says why;
nothing here raises once constructed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil

RAPL_ROOT = Path("/sys/class/powercap")
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
        total = 0
        for proc in self._tree:
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                continue  # a worker that just exited
        return total


class GpuSensor:
    """Utilisation, SM activity (GPM metrics, Hopper and later), memory, power and energy of
    the GPUs the job can see (CUDA_VISIBLE_DEVICES when it lists indices, else all)."""

    def __init__(self, nvml: Any = None) -> None:
        self.unavailable: dict[str, str] = {}
        self.names: list[str] = []
        self._handles: list[tuple[int, Any]] = []
        self._gpm: dict[int, Any] = {}
        try:
            self.nvml = nvml or _import_nvml()
            self.nvml.nvmlInit()
            count = self.nvml.nvmlDeviceGetCount()
        except Exception as exc:
            self.unavailable["gpu"] = _reason(exc)
            return
        for index in _visible(count):
            try:
                handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
                self.names.append(_text(self.nvml.nvmlDeviceGetName(handle)))
            except Exception as exc:  # a GPU lost, or one we may not query
                self.unavailable[f"gpu{index}"] = _reason(exc)
                continue
            self._handles.append((index, handle))
            self._start_gpm(index, handle)
        if not self._handles:
            self.unavailable["gpu"] = "no NVIDIA GPU visible"

    def read(self) -> list[dict[str, Any]]:
        return [self._read_one(index, handle) for index, handle in self._handles]

    def _read_one(self, index: int, handle: Any) -> dict[str, Any]:
        nv = self.nvml
        util = self._try("util", lambda: nv.nvmlDeviceGetUtilizationRates(handle).gpu)
        mem = self._try("memory", lambda: nv.nvmlDeviceGetMemoryInfo(handle).used)
        power = self._try("power", lambda: nv.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        energy = self._try("energy",
                           lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0)  # fmt: skip
        return {"index": index, "util_percent": util, "sm_percent": self._sm_active(index, handle),
                "mem_used_bytes": mem, "power_w": power, "energy_j": energy}  # fmt: skip

    def _try(self, what: str, read: Any) -> Any:
        if what in self.unavailable:
            return None
        try:
            return read()
        except Exception as exc:  # not supported on this GPU, or no permission
            self.unavailable[what] = _reason(exc)
            return None

    def _start_gpm(self, index: int, handle: Any) -> None:
        try:
            if not self.nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                self.unavailable["sm_active"] = "GPM metrics need a Hopper or later GPU"
                return
            sample = self.nvml.nvmlGpmSampleAlloc()
            self._gpm[index] = (self.nvml.nvmlGpmSampleGet(handle, sample),
                                self.nvml.nvmlGpmSampleAlloc())  # fmt: skip
        except Exception as exc:
            self.unavailable["sm_active"] = _reason(exc)

    def _sm_active(self, index: int, handle: Any) -> float | None:
        """Share of SMs busy between the previous reading and this one (NVML GPM)."""
        if index not in self._gpm:
            return None
        nv = self.nvml
        previous, spare = self._gpm[index]
        try:
            current = nv.nvmlGpmSampleGet(handle, spare)
            query = nv.c_nvmlGpmMetricsGet_t()
            query.version = nv.NVML_GPM_METRICS_GET_VERSION
            query.numMetrics = 1
            query.sample1, query.sample2 = previous, current
            query.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
            nv.nvmlGpmMetricsGet(query)
            self._gpm[index] = (current, previous)
            if query.metrics[0].nvmlReturn != 0:
                return None  # not ready yet (samples too close together)
            return float(query.metrics[0].value)
        except Exception as exc:
            self.unavailable["sm_active"] = _reason(exc)
            del self._gpm[index]
            return None


class RaplSensor:
    """Cumulative CPU package energy in joules from /sys/class/powercap (Intel and AMD RAPL)."""

    def __init__(self, root: Path = RAPL_ROOT) -> None:
        self.unavailable: dict[str, str] = {}
        self._zones: list[tuple[Path, int]] = []
        self._last: dict[Path, int] = {}
        self._wraps: dict[Path, int] = {}
        if not root.exists():
            self.unavailable["cpu_energy"] = f"no RAPL here ({root} absent)"
            return
        for zone in sorted(root.glob("*-rapl:*")):
            if zone.name.count(":") != 1:
                continue  # sub-zones (core, uncore, dram) are inside the package reading
            try:
                int((zone / "energy_uj").read_text())
                limit = int((zone / "max_energy_range_uj").read_text())
            except PermissionError:
                self.unavailable["cpu_energy"] = (
                    f"no permission to read {zone}/energy_uj (root only since 2020)"
                )
                continue
            except (OSError, ValueError) as exc:
                self.unavailable["cpu_energy"] = _reason(exc)
                continue
            self._zones.append((zone / "energy_uj", limit))
        if not self._zones:
            self.unavailable.setdefault("cpu_energy", "no readable RAPL package zone")
        else:
            self.unavailable.pop("cpu_energy", None)

    def read(self) -> float | None:
        """A cumulative count in joules (wrap-arounds added back): differences between two
        readings are the energy used in between."""
        if not self._zones:
            return None
        total = 0
        try:
            for path, limit in self._zones:
                value = int(path.read_text())
                if value < self._last.get(path, value):
                    self._wraps[path] = self._wraps.get(path, 0) + limit
                self._last[path] = value
                total += value + self._wraps.get(path, 0)
        except (OSError, ValueError):
            return None
        return total / 1e6


def _import_nvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise RuntimeError("nvidia-ml-py not installed (pip install 'gpuwise[nvidia]')") from exc
    return pynvml


def _visible(count: int) -> list[int]:
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return list(range(count))
    indices = [s.strip() for s in listed.split(",") if s.strip()]
    if all(s.isdigit() for s in indices):
        return [int(s) for s in indices if int(s) < count]
    return list(range(count))  # UUIDs or MIG names: watch every GPU


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if (
        "Driver Not Loaded" in text
        or "NVML Shared Library Not Found" in text
        or "libnvidia-ml" in text
    ):
        return f"no NVIDIA driver ({text})"
    return text
