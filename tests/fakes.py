"""A fake NVML for tests without a GPU: a stand-in for the pynvml module (nvidia-ml-py) that
`gpuwise.measure.hardware.nvml.Nvml.open` accepts. Its GPUs are `FakeGpu`s; any function can
be made to fail with a message, as a GPU that does not support a reading or a missing driver
does.

    nvml = fake_nvml(FakeGpu("NVIDIA H100 80GB HBM3"), fail={"nvmlDeviceGetPowerUsage": "Not Supported"})
    detect_gpus(nvml=nvml); GpuSensor(nvml); EnergyMeter(tmp_path, nvml)
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from gpuwise.measure.hardware.nvml import Nvml

GIB = 2**30


@dataclass
class FakeGpu:
    """One GPU as NVML reports it (an A100 without GPM metrics unless told otherwise)."""

    name: str | bytes = b"NVIDIA A100-SXM4-80GB"
    memory_total_bytes: int = 80 * GIB
    memory_used_bytes: int = 40 * GIB
    util_percent: int = 87
    power_mw: int = 312_000
    energy_mj: int = 5_000_000  # since the driver loaded
    gpm: bool = False  # SM activity through GPM metrics (Hopper and later)
    sm_active_percent: float = 64.0  # what GPM reports between two samples
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    processes: tuple[tuple[int, int], ...] = ()  # (pid, device memory bytes)
    compute_capability: tuple[int, int] = (8, 0)


class FakeNvmlError(Exception):
    """What pynvml raises (its NVMLError subclasses carry the driver's message)."""


class FakeNvml:
    """Enough of pynvml for gpuwise. `fail` maps a pynvml function name (or "*": every one) to
    the message it raises; `calls` lists the functions called, in order. A GPU's readings can be changed
    between calls (`gpus[0].energy_mj += 2500`)."""

    def __init__(self, *gpus: FakeGpu, driver: str | bytes = "550.54.15",
                 fail: dict[str, str] | None = None) -> None:
        self.gpus = list(gpus) if gpus else [FakeGpu()]
        self.driver = driver
        self.fail = dict(fail or {})
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        message = self.fail.get(name, self.fail.get("*"))
        if message is not None:
            raise FakeNvmlError(message)

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self._call("nvmlInit")

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._call("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str | bytes:  # noqa: N802
        self._call("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:  # noqa: N802
        self._call("nvmlDeviceGetHandleByIndex")
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:  # noqa: N802
        self._call("nvmlDeviceGetHandleByUUID")
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise FakeNvmlError("Not Found")

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> str | bytes:  # noqa: N802
        self._call("nvmlDeviceGetName")
        return gpu.name

    def nvmlDeviceGetCudaComputeCapability(self, gpu: FakeGpu) -> tuple[int, int]:  # noqa: N802
        self._call("nvmlDeviceGetCudaComputeCapability")
        return gpu.compute_capability

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu) -> Any:  # noqa: N802
        self._call("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=gpu.memory_total_bytes, used=gpu.memory_used_bytes,
                               free=gpu.memory_total_bytes - gpu.memory_used_bytes)

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> Any:  # noqa: N802
        self._call("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=gpu.util_percent, memory=0)

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:  # noqa: N802
        self._call("nvmlDeviceGetPowerUsage")
        return gpu.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, gpu: FakeGpu) -> int:  # noqa: N802
        self._call("nvmlDeviceGetTotalEnergyConsumption")
        return gpu.energy_mj

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeGpu) -> list[Any]:  # noqa: N802
        self._call("nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes]

    def nvmlGpmQueryDeviceSupport(self, gpu: FakeGpu) -> Any:  # noqa: N802
        self._call("nvmlGpmQueryDeviceSupport")
        return SimpleNamespace(isSupportedDevice=int(gpu.gpm))

    # GPM: a sample records its GPU; a metrics query of two samples of one GPU gives its SM
    # activity ("not ready" for one sample twice, as for samples too close together).
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = 2

    def nvmlGpmSampleAlloc(self) -> Any:  # noqa: N802
        self._call("nvmlGpmSampleAlloc")
        return SimpleNamespace(gpu=None)

    def nvmlGpmSampleGet(self, gpu: FakeGpu, sample: Any) -> Any:  # noqa: N802
        self._call("nvmlGpmSampleGet")
        sample.gpu = gpu
        return sample

    def c_nvmlGpmMetricsGet_t(self) -> Any:  # noqa: N802
        return SimpleNamespace(metrics=[SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0)])

    def nvmlGpmMetricsGet(self, query: Any) -> None:  # noqa: N802
        self._call("nvmlGpmMetricsGet")
        metric = query.metrics[0]
        if query.sample1 is query.sample2:
            metric.nvmlReturn = 1
        else:
            metric.value = query.sample2.gpu.sm_active_percent


def fake_nvml(*gpus: FakeGpu, driver: str | bytes = "550.54.15",
              fail: dict[str, str] | None = None) -> Nvml:
    """NVML opened on a FakeNvml (`nvml.lib` is the fake, to change its readings)."""
    return Nvml.open(FakeNvml(*gpus, driver=driver, fail=fail))
