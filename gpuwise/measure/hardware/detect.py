"""Detect this machine: CPU, RAM and NVIDIA GPUs, and the device a `--on local` estimate uses.

GPUs are read through nvidia-ml-py first. torch.cuda is only a fallback, tried when there is
evidence of an NVIDIA driver, because importing torch takes over a second and `gpuwise check`
must answer quickly on a machine without a GPU. Every probe is wrapped: a reading that is not
available becomes None (or an empty tuple) with a reason, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuwise.catalog.hardware import Hardware
from gpuwise.measure.hardware import gpus as gpu_readers
from gpuwise.measure.hardware.catalogue_match import match_catalogue
from gpuwise.measure.hardware.gpus import GpuInfo
from gpuwise.measure.hardware.host import core_counts, cpu_model, ram_bytes
from gpuwise.measure.hardware.nvml import Nvml, shared_nvml


@dataclass(frozen=True)
class LocalMachine:
    """What this machine has: CPU, RAM and GPUs (empty, with a reason, when there are none)."""

    cpu_model: str
    physical_cores: int | None
    logical_cores: int
    ram_total_bytes: int
    ram_available_bytes: int
    gpus: tuple[GpuInfo, ...]
    gpu_unavailable_reason: str | None

    def best_device(self) -> Hardware:
        """The device a local estimate should use: the first GPU if any, else the CPU."""
        if self.gpus:
            return gpu_hardware(self.gpus[0], gpu_count=len(self.gpus))
        return cpu_hardware(self)


# --- Turning readings into Hardware records ---------------------------------------------------


def gpu_hardware(gpu: GpuInfo, gpu_count: int = 1) -> Hardware:
    """A detected GPU as Hardware: measured memory, other specs borrowed from the catalogue."""
    entry = match_catalogue(gpu.name, gpu.memory_total_bytes)
    where = f"detected on this machine via {gpu.via} (GPU {gpu.index} of {gpu_count})"
    if entry is None:
        return Hardware(
            id=f"local-gpu{gpu.index}",
            name=gpu.name,
            kind="gpu",
            vendor="nvidia",
            memory_bytes=gpu.memory_total_bytes,
            memory_bandwidth_gbs=0.0,
            source="detected",
            notes=f"{where}; not in the catalogue, so bandwidth and peaks are unknown",
            compute_capability=gpu.compute_capability,
        )
    memory = gpu.memory_total_bytes
    memory_note = "memory total as measured"
    if memory <= 0:
        memory, memory_note = entry.memory_bytes, "memory total from the catalogue (not readable)"
    return replace(
        entry,
        id=f"local-gpu{gpu.index}",
        name=gpu.name,
        memory_bytes=memory,
        aliases=(entry.id,),
        source="detected",
        notes=f"{where}; specs from catalogue entry '{entry.id}'; {memory_note}",
    )


def cpu_hardware(machine: LocalMachine) -> Hardware:
    """This machine's CPU as Hardware; memory bandwidth is unknown until probed (0.0)."""
    return Hardware(
        id="local-cpu",
        name=machine.cpu_model,
        kind="cpu",
        vendor=_cpu_vendor(machine.cpu_model),
        memory_bytes=machine.ram_total_bytes,
        memory_bandwidth_gbs=0.0,
        compute_units=machine.logical_cores,
        compute_unit_name="logical cores",
        source="detected",
        notes="detected on this machine; memory is total RAM, bandwidth not measured",
    )


def _cpu_vendor(cpu_model: str) -> str:
    lowered = cpu_model.lower()
    return next((v for v in ("amd", "intel", "apple", "arm") if v in lowered), "unknown")


def detect_gpus(use_torch: bool | None = None,
                nvml: Nvml | None = None) -> tuple[tuple[GpuInfo, ...], str | None]:
    """NVIDIA GPUs on this machine and, when there are none, why.

    use_torch: None tries torch.cuda only if nvidia-ml-py found nothing, an NVIDIA driver is
    present and torch is installed; False never imports torch; True always tries it.
    nvml: NVML to read through (this process's by default).
    """
    gpus, nvml_reason = gpu_readers.nvml_gpus(nvml or shared_nvml())
    if gpus:
        return tuple(gpus), None
    driver = gpu_readers.nvidia_driver_present()
    if use_torch is False or (use_torch is None and not (driver and gpu_readers.torch_installed())):
        return (), nvml_reason if driver else f"no NVIDIA driver ({nvml_reason})"
    torch_gpus, torch_reason = gpu_readers.torch_gpus()
    if torch_gpus:
        return tuple(torch_gpus), None
    reasons = f"{nvml_reason}; {torch_reason}"
    return (), reasons if driver else f"no NVIDIA driver ({reasons})"


def detect_local(use_torch: bool | None = None, nvml: Nvml | None = None) -> LocalMachine:
    """Detect this machine. Never raises; see `detect_gpus` for `use_torch` and `nvml`."""
    physical, logical = core_counts()
    total, available = ram_bytes()
    gpus, reason = detect_gpus(use_torch, nvml)
    return LocalMachine(
        cpu_model=cpu_model(),
        physical_cores=physical,
        logical_cores=logical,
        ram_total_bytes=total,
        ram_available_bytes=available,
        gpus=gpus,
        gpu_unavailable_reason=reason,
    )
