"""Measure a plan's peak memory in the child process: on a CPU the process as users run it
(the model built and the plan run once, the kernel's resident high-water mark above what the
process held before), or after a warm-up of the plan itself (`measure_cpu`: module runs); on
CUDA the caching allocator's peak plus the CUDA context; and the tensors held at rest, by kind.
See `memory_run`'s docstring for the method and why."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from gpuwise.measure.hardware.nvml import shared_nvml
from gpuwise.measure.runs.rss import RssSampler, hwm_bytes, malloc_stats, reset_hwm, rss_bytes

# What a process runs (a built model's plan) and what it then holds at rest, by kind.
Prepared = tuple[Callable[[], None], Callable[[], dict[str, int]]]
# The tiny warm-up's plan: a few tokens, one step (the model: model_build.TINY).
TINY_PLAN = {"batch": 1, "prompt_tokens": 8, "new_tokens": 2, "seq": 8, "steps": 1}


def tensors_at_rest(model: Any, optimizer: Any | None) -> dict[str, int]:
    """Bytes held between steps, by kind; a storage shared by several tensors counts once."""
    import torch

    seen: set[tuple[str, int]] = set()

    def size(tensors: Iterator[Any]) -> int:
        total = 0
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key = (str(t.device), storage.data_ptr())
            if storage.data_ptr() == 0 or key in seen:
                continue
            seen.add(key)
            total += storage.nbytes()
        return total

    params = list(model.parameters())
    state = optimizer.state.values() if optimizer is not None else []
    return {
        "params": size(iter(params)),
        "buffers": size(model.buffers()),
        "grads": size(p.grad for p in params if p.grad is not None),
        "optimizer": size(v for s in state for v in _state_tensors(s)),
    }


def _state_tensors(state: object) -> Iterator[Any]:
    if isinstance(state, dict):
        for value in state.values():
            yield from _state_tensors(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from _state_tensors(value)
    else:
        yield state


def measure_cpu(run: Callable[[], None], at_rest: Callable[[], dict[str, int]]) -> dict:
    run()  # warm-up
    gc.collect()
    tensors = at_rest()
    baseline = rss_bytes() - sum(tensors.values())
    if reset_hwm():
        start = time.perf_counter()
        run()
        seconds = time.perf_counter() - start
        peak = hwm_bytes()
        method = "VmHWM reset through /proc/self/clear_refs"
    else:
        with RssSampler() as sampler:
            start = time.perf_counter()
            run()
            seconds = time.perf_counter() - start
        peak = sampler.peak
        method = "resident set sampled every 1 ms (clear_refs unavailable)"
    return {
        "peak_bytes": peak,
        "baseline_bytes": baseline,
        "model_bytes": peak - baseline,
        "device": "cpu",
        "tensors_at_rest": tensors,
        "seconds": seconds,
        "method": method,
    }


def _warm_up_runtime(job: dict, prepare: Callable[[dict], Prepared]) -> str:
    """Run the plan once on a tiny model of the family (`model_build.TINY`): the runtime's
    code, kernel caches and thread pools are then in place (glibc's mmap threshold is where the
    imports left it: `mmap_threshold_at_build`). Returns what was warmed up."""
    try:
        prepare({**job, **TINY_PLAN, "tiny": True})[0]()
    except Exception as exc:  # noqa: BLE001 - a family the shrinking does not fit: no warm-up
        return f"no warm-up ({type(exc).__name__}: {str(exc)[:120]})"
    gc.collect()
    return "after a warm-up on a tiny model of the family"


def measure_cpu_process(job: dict, prepare: Callable[[dict], Prepared]) -> dict:
    """The process as users run it: the model built and the plan run once, after a tiny
    warm-up; the peak is the resident high-water mark over the run, above the resident set
    just before the build (the baseline). The build's own transients are left out: building
    from a config, transformers makes a tied head's weight and frees it when it ties it, which
    loading a checkpoint does not."""
    warmed = _warm_up_runtime(job, prepare)
    gc.collect()
    baseline = rss_bytes()
    run, at_rest = prepare(job)
    sampler = None if reset_hwm() else RssSampler().__enter__()
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    if sampler is None:
        peak, how = hwm_bytes(), "VmHWM reset through /proc/self/clear_refs"
    else:
        sampler.__exit__()
        peak, how = sampler.peak, "resident set sampled every 1 ms (clear_refs unavailable)"
    return {
        "peak_bytes": peak, "baseline_bytes": baseline, "model_bytes": peak - baseline,
        "device": "cpu", "tensors_at_rest": at_rest(), "seconds": seconds,
        "method": f"{how} after the build, {warmed}", "malloc": malloc_stats(),
    }


def _cuda_context_bytes(device: Any) -> tuple[int, str]:
    """Device memory this process holds beyond torch's reserved pool (the CUDA context)."""
    import torch

    reserved = torch.cuda.memory_reserved(device)
    nvml = shared_nvml()
    handle = nvml.handle_by_uuid(str(torch.cuda.get_device_properties(device).uuid))
    if handle.value is not None:
        used = nvml.process_memory_bytes(handle.value, os.getpid()).value
        if used is not None:
            return used - reserved, "NVML process memory"
    free, total = torch.cuda.mem_get_info(device)
    return total - free - reserved, "cudaMemGetInfo (counts other processes on the device too)"


def measure_cuda(
    run: Callable[[], None], at_rest: Callable[[], dict[str, int]], device_name: str
) -> dict:
    import torch

    device = torch.device(device_name)
    run()  # warm-up
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    tensors = at_rest()
    context, source = _cuda_context_bytes(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    run()
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    reserved_peak = torch.cuda.max_memory_reserved(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return {
        "peak_bytes": reserved_peak + context,
        "baseline_bytes": context,
        "model_bytes": reserved_peak,
        "device": f"cuda:{index} ({torch.cuda.get_device_name(index)})",
        "tensors_at_rest": tensors,
        "seconds": seconds,
        "method": f"torch.cuda.max_memory_reserved + context from {source}",
    }
