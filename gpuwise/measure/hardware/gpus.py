"""Read this machine's NVIDIA GPUs: through NVML (fast), or through torch.cuda (imports torch,
over a second). Each reader returns the GPUs it found, or none with the reason; none raises.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from typing import Any

from gpuwise.measure.hardware.nvml import Nvml, error_text

NVIDIA_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidia0")
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as this machine reports it."""

    index: int
    name: str
    memory_total_bytes: int
    memory_used_bytes: int | None
    driver: str | None
    via: str  # "nvidia-ml-py" or "torch.cuda"
    reading_errors: tuple[str, ...] = ()  # readings that failed, with the reason
    compute_capability: float = 0.0  # CUDA major.minor; 0: not read


def nvidia_driver_present() -> bool:
    """Whether an NVIDIA kernel driver is loaded (its files exist)."""
    return any(os.path.exists(p) for p in NVIDIA_DRIVER_PATHS)


def torch_installed() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except Exception:
        return False


# --- NVML ---------------------------------------------------------------------------------------


def _nvml_device(nvml: Nvml, index: int, driver: str | None) -> GpuInfo:
    handle = nvml.handle(index)
    if handle.value is None:
        return GpuInfo(index, "unknown NVIDIA GPU", 0, None, driver, "nvidia-ml-py",
                       (f"handle: {handle.reason}",))
    errors: list[str] = []
    name = nvml.name(handle.value)
    if name.value is None:
        errors.append(f"name: {name.reason}")
    memory = nvml.memory(handle.value)
    if memory.value is None:
        errors.append(f"memory: {memory.reason}")
    total, used = (memory.value.total_bytes, memory.value.used_bytes) if memory.value else (0, None)
    cc = nvml.compute_capability(handle.value).value or 0.0
    return GpuInfo(index, name.value or "unknown NVIDIA GPU", total, used, driver, "nvidia-ml-py",
                   tuple(errors), cc)


def nvml_gpus(nvml: Nvml) -> tuple[list[GpuInfo], str | None]:
    """GPUs through NVML, or none with the reason."""
    if not nvml.available:
        return [], nvml.reason if not nvml.installed else f"nvidia-ml-py: {nvml.reason}"
    driver = nvml.driver_version().value
    count = nvml.device_count()
    if count.value is None:
        return [], f"nvidia-ml-py: {count.reason}"
    gpus = [_nvml_device(nvml, i, driver) for i in range(count.value)]
    return gpus, None if gpus else f"nvidia-ml-py: no GPUs found (driver {driver or 'NA'})"


# --- torch.cuda ---------------------------------------------------------------------------------


def _driver_from_proc() -> str | None:
    try:
        with open(DRIVER_VERSION_FILE) as f:
            found = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", f.read())
    except OSError:
        return None
    return found.group(1) if found else None


def _torch_device(torch: Any, index: int, driver: str | None) -> GpuInfo:
    errors: list[str] = []
    name, total, used, cc = "unknown CUDA GPU", 0, None, 0.0
    try:
        props = torch.cuda.get_device_properties(index)
        name, total = str(props.name), int(props.total_memory)
        cc = float(f"{int(props.major)}.{int(props.minor)}")
    except Exception as exc:
        errors.append(f"properties: {error_text(exc)}")
    try:
        free, total_now = torch.cuda.mem_get_info(index)
        used = int(total_now) - int(free)
    except Exception as exc:
        errors.append(f"memory used: {error_text(exc)}")
    return GpuInfo(index, name, total, used, driver, "torch.cuda", tuple(errors), cc)


def torch_gpus() -> tuple[list[GpuInfo], str | None]:
    """GPUs through torch.cuda (imports torch: slow), or none with the reason."""
    if not torch_installed():
        return [], "torch.cuda: torch not installed"
    try:
        import torch

        if not torch.cuda.is_available():
            return [], f"torch.cuda: no CUDA device (torch {torch.__version__})"
        driver = _driver_from_proc()
        return [_torch_device(torch, i, driver) for i in range(torch.cuda.device_count())], None
    except Exception as exc:
        return [], f"torch.cuda: {error_text(exc)}"
