"""NVIDIA GPUs through NVML (nvidia-ml-py): the one module that imports and initialises it.

pynvml is imported on first use and initialised once per process; nothing shuts it down
(NVML counts its initialisations, and the process's exit releases it). Each reading is a
`Reading`: the value, or None with the reason it could not be read (no library, no driver,
a GPU that does not report it, no permission). Nothing here raises.

Tests hand `Nvml.open` a stand-in for the pynvml module (tests/fakes.py): the seam is the
handful of pynvml functions called here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

NOT_INSTALLED = "nvidia-ml-py not installed (pip install 'gpuwise[nvidia]')"


def error_text(exc: BaseException) -> str:
    """A failed call's reason: its message, or its type where it has none."""
    return str(exc) or type(exc).__name__


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Reading(Generic[T]):
    """A value read through NVML, or None and the reason it could not be read."""

    value: T | None
    reason: str | None = None


@dataclass(frozen=True)
class GpuMemory:
    total_bytes: int
    used_bytes: int


class Nvml:
    """NVML ready to read, or its absence: `reason` says why when `available` is False and
    `installed` whether nvidia-ml-py could be imported at all."""

    def __init__(self, lib: Any | None, reason: str | None = None, installed: bool = True):
        self.lib = lib
        self.reason = reason
        self.installed = installed

    @classmethod
    def open(cls, lib: Any | None = None) -> Nvml:
        """NVML through `lib` (pynvml, or a stand-in with its functions), initialised now;
        without `lib`, pynvml imported here."""
        if lib is None:
            try:
                import pynvml
            except Exception:
                return cls(None, NOT_INSTALLED, installed=False)
            lib = pynvml
        try:
            lib.nvmlInit()
        except Exception as exc:  # no driver, or one too old for this library
            return cls(None, error_text(exc))
        return cls(lib)

    @property
    def available(self) -> bool:
        return self.lib is not None

    def _read(self, call: Callable[[Any], T | None]) -> Reading[T]:
        if self.lib is None:
            return Reading(None, self.reason)
        try:
            return Reading(call(self.lib))
        except Exception as exc:  # not supported on this GPU, or no permission
            return Reading(None, error_text(exc))

    # --- the machine ---------------------------------------------------------------------------

    def driver_version(self) -> Reading[str]:
        return self._read(lambda nv: _text(nv.nvmlSystemGetDriverVersion()))

    def device_count(self) -> Reading[int]:
        return self._read(lambda nv: int(nv.nvmlDeviceGetCount()))

    def handle(self, index: int) -> Reading[Any]:
        return self._read(lambda nv: nv.nvmlDeviceGetHandleByIndex(index))

    def handle_by_uuid(self, uuid: str) -> Reading[Any]:
        """The GPU with this UUID ("GPU-..." added where torch leaves it out)."""
        full = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        return self._read(lambda nv: nv.nvmlDeviceGetHandleByUUID(full))

    # --- one GPU -------------------------------------------------------------------------------

    def name(self, handle: Any) -> Reading[str]:
        return self._read(lambda nv: _text(nv.nvmlDeviceGetName(handle)))

    def compute_capability(self, handle: Any) -> Reading[float]:
        """CUDA compute capability, major.minor (what runtimes and kernels check)."""
        def read(nv: Any) -> float:
            major, minor = nv.nvmlDeviceGetCudaComputeCapability(handle)
            return float(f"{int(major)}.{int(minor)}")

        return self._read(read)

    def memory(self, handle: Any) -> Reading[GpuMemory]:
        def read(nv: Any) -> GpuMemory:
            info = nv.nvmlDeviceGetMemoryInfo(handle)
            return GpuMemory(int(info.total), int(info.used))

        return self._read(read)

    def utilization_percent(self, handle: Any) -> Reading[int]:
        """Share of the last sample period in which a kernel ran (not how much of the GPU)."""
        return self._read(lambda nv: nv.nvmlDeviceGetUtilizationRates(handle).gpu)

    def power_w(self, handle: Any) -> Reading[float]:
        return self._read(lambda nv: nv.nvmlDeviceGetPowerUsage(handle) / 1000.0)

    def energy_j(self, handle: Any) -> Reading[float]:
        """Energy since the driver loaded (Volta and later)."""
        return self._read(lambda nv: nv.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0)

    def process_memory_bytes(self, handle: Any, pid: int) -> Reading[int]:
        """Device memory process `pid` holds on this GPU (None: not listed, or not reported)."""

        def read(nv: Any) -> int | None:
            for proc in nv.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid and proc.usedGpuMemory:
                    return int(proc.usedGpuMemory)
            return None

        return self._read(read)

    # --- SM activity from GPM metrics (Hopper and later) ---------------------------------------

    def gpm_supported(self, handle: Any) -> Reading[bool]:
        return self._read(lambda nv: bool(nv.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice))

    def gpm_sample(self, handle: Any, into: Any = None) -> Reading[Any]:
        """A GPM sample of the GPU now, written into `into` (a sample this returned before)
        or into a new one."""
        return self._read(lambda nv: nv.nvmlGpmSampleGet(handle, into or nv.nvmlGpmSampleAlloc()))

    def gpm_sm_active_percent(self, previous: Any, current: Any) -> Reading[float]:
        """Share of SMs busy between two GPM samples. None without a reason: not ready yet
        (the samples too close together)."""

        def read(nv: Any) -> float | None:
            query = nv.c_nvmlGpmMetricsGet_t()
            query.version = nv.NVML_GPM_METRICS_GET_VERSION
            query.numMetrics = 1
            query.sample1, query.sample2 = previous, current
            query.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
            nv.nvmlGpmMetricsGet(query)
            if query.metrics[0].nvmlReturn != 0:
                return None
            return float(query.metrics[0].value)

        return self._read(read)


_shared: Nvml | None = None
_lock = threading.Lock()


def shared_nvml() -> Nvml:
    """This process's NVML: imported and initialised on the first call, then kept."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = Nvml.open()
        return _shared
