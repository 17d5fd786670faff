"""The child process of benchmarks/gpu_memory_check.py (`python -m gpu_memory_child`, the job
as JSON on stdin, gpuwise.measure.runs.child_process's protocol): one plan run on the GPU,
then, before the process exits and while PyTorch's caching allocator still holds its pool,
torch's counters and this process's used memory as nvidia-smi and NVML report it.

- a measured case (`"once": false`): `gpuwise validate`'s own measurement
  (`memory_run.run_job`: a warm-up, `empty_cache`, the peak reset, the measured run);
- a largest-batch try (`"once": true`): the plan run once as a user's process runs it (a
  `generate`, or the job's training steps), no warm-up; a CUDA out-of-memory error reaches
  the parent as the child's error.

Also what the parent reads of the machine without touching CUDA: nvidia-smi, package
versions, whether bitsandbytes imports (torch is imported only inside the child's functions).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from gpuwise.measure.runs.child_process import child_main
from gpuwise.measure.runs.memory_run import run_job
from gpuwise.measure.runs.model_build import build_model
from gpuwise.measure.runs.plans import inference_plan, training_plan

MIB = 1 << 20
SMI_TIMEOUT_S = 20
# `nvidia-smi --help-query-compute-apps` / `--help-query-gpu`: with `nounits` memory is in MiB.
COMPUTE_APPS_QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
GPU_QUERY = ["--query-gpu=name,memory.total,memory.used,driver_version",
             "--format=csv,noheader,nounits"]


@dataclass(frozen=True)
class ProcessMemory:
    """A process's used device memory as nvidia-smi lists it, or None and why not."""

    used_bytes: int | None
    how: str


def _mib(text: str) -> int | None:
    """A memory cell in MiB as bytes; None for "[N/A]", "[Not Supported]" and the like."""
    text = text.strip()
    return int(text) * MIB if text.isdigit() else None


def parse_compute_apps(text: str) -> list[tuple[int, int | None]]:
    """(pid, used bytes) for each row of `nvidia-smi --query-compute-apps=pid,used_memory
    --format=csv,noheader,nounits` ("1234, 5678" with the memory in MiB)."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 2 and cells[0].isdigit():
            rows.append((int(cells[0]), _mib(cells[1])))
    return rows


def process_memory(rows: list[tuple[int, int | None]], pid: int) -> ProcessMemory:
    """The row of `pid`; failing that the only process listed: inside a container nvidia-smi
    lists the host's pids (another pid namespace), and the parent holds no CUDA context."""
    own = [used for p, used in rows if p == pid]
    if own:
        known = [u for u in own if u is not None]
        return ProcessMemory(sum(known) if known else None, "nvidia-smi row of this pid")
    if len(rows) == 1:
        return ProcessMemory(rows[0][1], "the only process nvidia-smi lists (its pid differs)")
    return ProcessMemory(None, f"pid {pid} not among the {len(rows)} processes nvidia-smi lists")


def parse_gpu_query(text: str) -> dict | None:
    """The first GPU of `nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version
    --format=csv,noheader,nounits`; None when there is no such line. The name is split off from
    the right, so a comma in it stays in it."""
    for line in text.splitlines():
        cells = line.rsplit(",", 3)
        if len(cells) == 4 and cells[1].strip().isdigit():
            return {"gpu": cells[0].strip(), "gpu_memory_bytes": _mib(cells[1]),
                    "gpu_used_bytes": _mib(cells[2]), "driver": cells[3].strip()}
    return None


def nvidia_smi(args: list[str]) -> str:
    """nvidia-smi's output, or "" where it is missing or fails."""
    try:
        done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True,
                              timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def _nvml_used_bytes(device: object) -> int | None:
    import torch

    from gpuwise.measure.hardware.nvml import shared_nvml

    nvml = shared_nvml()
    handle = nvml.handle_by_uuid(str(torch.cuda.get_device_properties(device).uuid))
    if handle.value is None:
        return None
    return nvml.process_memory_bytes(handle.value, os.getpid()).value


def readings(device_name: str) -> dict:
    """torch's counters and the process's used device memory, now (the pool still held)."""
    import torch

    device = torch.device(device_name)
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    smi = process_memory(parse_compute_apps(nvidia_smi(COMPUTE_APPS_QUERY)), os.getpid())
    gpu = parse_gpu_query(nvidia_smi(GPU_QUERY)) or {}
    return {"max_memory_reserved_bytes": torch.cuda.max_memory_reserved(device),
            "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(device),
            "memory_reserved_at_end_bytes": torch.cuda.memory_reserved(device),
            "smi_used_bytes": smi.used_bytes, "smi_how": smi.how,
            "smi_device_used_bytes": gpu.get("gpu_used_bytes"),
            "nvml_used_bytes": _nvml_used_bytes(device), "cuda_total_bytes": total,
            "cuda_free_at_end_bytes": free, "pid": os.getpid()}


# ---------------------------------------------------------------- the machine, for the parent

PACKAGES = ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "nvidia-ml-py")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(qlora_problem: str | None) -> dict[str, Any]:
    """The machine without touching CUDA: a CUDA context in this parent would hold device
    memory through every child's run (less room for the largest batch, one more process in
    nvidia-smi), so the GPU comes from nvidia-smi and the versions from package metadata."""
    gpu = parse_gpu_query(nvidia_smi(GPU_QUERY)) or {}
    return {"gpu": gpu.get("gpu"), "gpu_memory_bytes": gpu.get("gpu_memory_bytes"),
            "gpu_used_at_start_bytes": gpu.get("gpu_used_bytes"), "driver": gpu.get("driver"),
            "versions": {p: _version(p) for p in PACKAGES},
            "bitsandbytes_problem": qlora_problem,
            "python": platform.python_version(), "host": platform.node(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def bitsandbytes_problem() -> str | None:
    """Why QLoRA cannot run here (`import bitsandbytes` fails), or None; in a child process."""
    if importlib.util.find_spec("bitsandbytes") is None:
        return "bitsandbytes is not installed"
    try:
        done = subprocess.run([sys.executable, "-c", "import bitsandbytes"], capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "import bitsandbytes took over 120 s"
    lines = done.stderr.strip().splitlines()
    return f"import bitsandbytes failed: {lines[-1] if lines else done.returncode}" if done.returncode else None


# ---------------------------------------------------------------- the child


def _run_once(job: dict) -> dict:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if not torch.cuda.is_available():
        raise RuntimeError(f"device {job['device']!r} asked for, but torch sees no CUDA GPU")
    model = build_model(job)
    run = inference_plan(model, job) if job["kind"] == "inference" else training_plan(model, job)[0]
    start = time.perf_counter()
    run()
    torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - start, "torch_version": torch.__version__,
            "transformers_version": transformers.__version__}


def run_case(job: dict) -> dict:
    result = _run_once(job) if job.get("once") else run_job(job)
    return {**result, **readings(job["device"])}


def _has_readings(**result: object) -> None:
    if not isinstance(result.get("max_memory_reserved_bytes"), int):
        raise RuntimeError("the child's result has no max_memory_reserved_bytes")


if __name__ == "__main__":
    sys.exit(child_main(run_case, check=_has_readings))
