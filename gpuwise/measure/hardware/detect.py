"""Detect this machine: CPU, RAM and NVIDIA GPUs, and the device a `--on local` estimate uses.

GPUs are read through nvidia-ml-py first. torch.cuda is only a fallback, tried when there is
evidence of an NVIDIA driver, because importing torch takes over a second and `gpuwise check`
must answer quickly on a machine without a GPU. Every probe is wrapped: a reading that is not
available becomes None (or an empty tuple) with a reason, never an exception.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass, replace
from typing import Any

from gpuwise.catalog.hardware import Hardware, load_hardware
from gpuwise.units import GIB

NVIDIA_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidia0")
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
UNKNOWN_CPU = "unknown CPU"

# Words in marketing names that do not tell two devices apart.
_NOISE_WORDS = frozenset(
    {
        "nvidia",
        "geforce",
        "tesla",
        "quadro",
        "tensor",
        "core",
        "gpu",
        "generation",
        "graphics",
        "card",
        "with",
    }
)
_MEMORY_GB = re.compile(r"(\d+)\s*gb\b")
_FORM_HINTS = ((re.compile(r"sxm\d*"), "sxm"), (re.compile(r"pci-?e"), "pcie"))
_MEMORY_KIND = re.compile(r"g?hbm\d*e?|gddr\d*x?")
# Relative difference in memory size still read as "the same size" (GB vs GiB, reserved memory).
_SAME_MEMORY = 0.12


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


# --- Matching a reported GPU name to the catalogue ----------------------------------------------


@dataclass(frozen=True)
class _NameFacts:
    tokens: tuple[str, ...]  # the model, e.g. ("h", "100") or ("rtx", "4090")
    form: str | None  # "sxm", "pcie" or None
    memory_gb: int | None  # a size written in the name, e.g. 80 for "A100-SXM4-80GB"


def _name_facts(name: str) -> _NameFacts:
    text = name.lower().replace("_", " ")
    sizes = _MEMORY_GB.findall(text)
    text = _MEMORY_GB.sub(" ", text)
    form = None
    for pattern, hint in _FORM_HINTS:
        if pattern.search(text):
            form = form or hint
            text = pattern.sub(" ", text)
    text = _MEMORY_KIND.sub(" ", text)
    # Letters and digits split apart so "rtx4090" and "RTX 4090" read the same.
    tokens = tuple(t for t in re.findall(r"[a-z]+|\d+", text) if t not in _NOISE_WORDS)
    return _NameFacts(tokens, form, int(sizes[0]) if sizes else None)


def _entry_names(hw: Hardware) -> list[_NameFacts]:
    return [_name_facts(n) for n in (hw.id, hw.name, *hw.aliases)]


def _entry_form(hw: Hardware) -> str | None:
    for facts in _entry_names(hw):
        if facts.form:
            return facts.form
    return None


def _contains(outer: tuple[str, ...], inner: tuple[str, ...]) -> bool:
    """Whether `inner` is a run of `outer` that names a model number (has a digit token)."""
    if not inner or not any(t.isdigit() for t in inner):
        return False
    n = len(inner)
    return any(outer[i : i + n] == inner for i in range(len(outer) - n + 1))


def _candidates(gpu: _NameFacts, devices: tuple[Hardware, ...]) -> list[Hardware]:
    """Entries naming the same model; failing that, those whose model is part of the name."""
    exact = [hw for hw in devices if any(f.tokens == gpu.tokens for f in _entry_names(hw))]
    if exact:
        return exact
    best: list[Hardware] = []
    longest = 0
    for hw in devices:
        size = max(
            (len(f.tokens) for f in _entry_names(hw) if _contains(gpu.tokens, f.tokens)), default=0
        )
        if size > longest:
            best, longest = [hw], size
        elif size and size == longest:
            best.append(hw)
    return best


def _memory_mismatch(hw: Hardware, target_bytes: int) -> float:
    if target_bytes <= 0:
        return 0.0
    rel = abs(hw.memory_bytes - target_bytes) / target_bytes
    return 0.0 if rel <= _SAME_MEMORY else rel


def match_catalogue(gpu_name: str, memory_bytes: int) -> Hardware | None:
    """The catalogue entry for a GPU name as the driver reports it, or None if there is none.

    Memory size picks between variants first (A100 40GB vs 80GB), then the form factor: a
    name without "PCIe" is read as SXM, as NVML names SXM parts ("NVIDIA H100 80GB HBM3").
    """
    try:
        devices = tuple(hw for hw in load_hardware() if hw.kind == "gpu")
    except Exception:  # no catalogue yet, or unreadable: nothing to borrow from
        return None
    gpu = _name_facts(gpu_name)
    if not gpu.tokens:
        return None
    candidates = _candidates(gpu, devices)
    if not candidates:
        return None
    target = memory_bytes if memory_bytes > 0 else (gpu.memory_gb or 0) * GIB
    form = gpu.form or "sxm"

    def rank(hw: Hardware) -> tuple[float, int]:
        entry_form = _entry_form(hw)
        return _memory_mismatch(hw, target), int(entry_form is not None and entry_form != form)

    return min(candidates, key=rank)  # min is stable: ties keep catalogue order


# --- Probes: each small, each never raises ------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _error_text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _nvml_device(pynvml: Any, index: int, driver: str | None) -> GpuInfo:
    errors: list[str] = []
    name, total, used = "unknown NVIDIA GPU", 0, None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:
        return GpuInfo(
            index, name, total, used, driver, "nvidia-ml-py", (f"handle: {_error_text(exc)}",)
        )
    try:
        name = _text(pynvml.nvmlDeviceGetName(handle))
    except Exception as exc:
        errors.append(f"name: {_error_text(exc)}")
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        total, used = int(info.total), int(info.used)
    except Exception as exc:
        errors.append(f"memory: {_error_text(exc)}")
    return GpuInfo(index, name, total, used, driver, "nvidia-ml-py", tuple(errors))


def _nvml_gpus() -> tuple[list[GpuInfo], str | None]:
    """GPUs through nvidia-ml-py, or none with the reason."""
    try:
        import pynvml
    except Exception as exc:
        return [], f"nvidia-ml-py not installed ({_error_text(exc)})"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return [], f"nvidia-ml-py: {_error_text(exc)}"
    try:
        try:
            driver: str | None = _text(pynvml.nvmlSystemGetDriverVersion())
        except Exception:
            driver = None
        count = int(pynvml.nvmlDeviceGetCount())
        gpus = [_nvml_device(pynvml, i, driver) for i in range(count)]
        return gpus, None if gpus else f"nvidia-ml-py: no GPUs found (driver {driver or 'NA'})"
    except Exception as exc:
        return [], f"nvidia-ml-py: {_error_text(exc)}"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _driver_from_proc() -> str | None:
    try:
        with open(DRIVER_VERSION_FILE) as f:
            found = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", f.read())
    except OSError:
        return None
    return found.group(1) if found else None


def _torch_device(torch: Any, index: int, driver: str | None) -> GpuInfo:
    errors: list[str] = []
    name, total, used = "unknown CUDA GPU", 0, None
    try:
        props = torch.cuda.get_device_properties(index)
        name, total = str(props.name), int(props.total_memory)
    except Exception as exc:
        errors.append(f"properties: {_error_text(exc)}")
    try:
        free, total_now = torch.cuda.mem_get_info(index)
        used = int(total_now) - int(free)
    except Exception as exc:
        errors.append(f"memory used: {_error_text(exc)}")
    return GpuInfo(index, name, total, used, driver, "torch.cuda", tuple(errors))


def _torch_gpus() -> tuple[list[GpuInfo], str | None]:
    """GPUs through torch.cuda (imports torch: slow), or none with the reason."""
    if not _torch_installed():
        return [], "torch.cuda: torch not installed"
    try:
        import torch

        if not torch.cuda.is_available():
            return [], f"torch.cuda: no CUDA device (torch {torch.__version__})"
        driver = _driver_from_proc()
        return [_torch_device(torch, i, driver) for i in range(torch.cuda.device_count())], None
    except Exception as exc:
        return [], f"torch.cuda: {_error_text(exc)}"


def _torch_installed() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except Exception:
        return False


def _nvidia_driver_present() -> bool:
    return any(os.path.exists(p) for p in NVIDIA_DRIVER_PATHS)


def detect_gpus(use_torch: bool | None = None) -> tuple[tuple[GpuInfo, ...], str | None]:
    """NVIDIA GPUs on this machine and, when there are none, why.

    use_torch: None tries torch.cuda only if nvidia-ml-py found nothing, an NVIDIA driver is
    present and torch is installed; False never imports torch; True always tries it.
    """
    gpus, nvml_reason = _nvml_gpus()
    if gpus:
        return tuple(gpus), None
    driver = _nvidia_driver_present()
    if use_torch is False or (use_torch is None and not (driver and _torch_installed())):
        return (), nvml_reason if driver else f"no NVIDIA driver ({nvml_reason})"
    torch_gpus, torch_reason = _torch_gpus()
    if torch_gpus:
        return tuple(torch_gpus), None
    reasons = f"{nvml_reason}; {torch_reason}"
    return (), reasons if driver else f"no NVIDIA driver ({reasons})"


def _cpu_model() -> str:
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                text=True,
                capture_output=True,
                timeout=2,
                check=False,
            ).stdout.strip()
            if out:
                return out
        except Exception:
            pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    try:
        return platform.processor() or UNKNOWN_CPU
    except Exception:
        return UNKNOWN_CPU


def _core_counts() -> tuple[int | None, int]:
    try:
        import psutil

        physical: int | None = psutil.cpu_count(logical=False)
        logical = psutil.cpu_count(logical=True)
    except Exception:
        physical, logical = None, None
    return physical, logical or os.cpu_count() or 1


def _ram() -> tuple[int, int]:
    """(total, available) bytes of RAM; (0, 0) if neither psutil nor sysconf can tell."""
    try:
        import psutil

        mem = psutil.virtual_memory()
        return int(mem.total), int(mem.available)
    except Exception:
        pass
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0, 0


def detect_local(use_torch: bool | None = None) -> LocalMachine:
    """Detect this machine. Never raises; see `detect_gpus` for what `use_torch` does."""
    physical, logical = _core_counts()
    total, available = _ram()
    gpus, reason = detect_gpus(use_torch)
    return LocalMachine(
        cpu_model=_cpu_model(),
        physical_cores=physical,
        logical_cores=logical,
        ram_total_bytes=total,
        ram_available_bytes=available,
        gpus=gpus,
        gpu_unavailable_reason=reason,
    )
