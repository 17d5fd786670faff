"""llama.cpp's context and layers where the user sets neither, as llama-server and llama-cli
set them (common/fit.cpp, `--fit on` by default since late 2025; data/runtimes.toml):

1. the context is the model's trained one (n_ctx 0), if that leaves `--fit-target` (1 GiB)
   free on the device (a CPU-only build: of the host's memory);
2. else it is cut by linear interpolation between `--fit-ctx` (4,096) and the trained context,
   rounded down to 256, so that the memory the two measure meets the target;
3. where even 4,096 does not leave the target free on a GPU, layers move to host memory: the
   most layers that still leave it (`-ngl`, filled back to front).

The memory at each context is gpuwise's own estimate of the run (llama_cpp_memory.py), as
llama.cpp measures its buffers at each step. A context or layer count the user gives is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.serving_runtimes import llama_cpp_runtime
from gpuwise.estimate.memory.breakdown import MemoryEstimate
from gpuwise.estimate.memory.llama_cpp_memory import estimate_llama_cpp
from gpuwise.units import format_bytes
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan

PAD = 256  # the fitted context is rounded down to this (CUDA's alignment, common/fit.cpp)


@dataclass(frozen=True)
class Fitted:
    """The plan as llama-server runs it, its estimate, and what the fit did (a note)."""

    plan: InferencePlan
    estimate: MemoryEstimate
    note: str = ""


def fit_llama_cpp(arch: Architecture, plan: InferencePlan, hw: Hardware) -> Fitted:
    """`plan` with the context (and, on a GPU, the layers) llama-server would pick."""
    if plan.context_alloc is not None:
        return Fitted(plan, estimate_llama_cpp(arch, plan, hw))
    rt = llama_cpp_runtime()
    target = hw.memory_bytes - rt.fit_margin_bytes
    trained = arch.max_position or rt.fit_min_ctx
    full = _at(arch, plan, hw, trained)
    where = "the host's memory" if hw.kind == "cpu" else "the device"
    free = format_bytes(rt.fit_margin_bytes)
    if full.estimate.total_bytes <= target:
        return replace(full, note=f"n_ctx {trained:,}: llama-server's default, the model's "
                                  f"trained context (leaves {free} free on {where}; --ctx sets it)")
    least = full
    if trained > rt.fit_min_ctx:
        least = _at(arch, plan, hw, rt.fit_min_ctx)
        used_min, used_max = least.estimate.total_bytes, full.estimate.total_bytes
        if target > used_min and used_max > used_min:
            n = rt.fit_min_ctx + (trained - rt.fit_min_ctx) * (target - used_min) // (used_max - used_min)
            fitted = _at(arch, plan, hw, max(n - n % PAD, rt.fit_min_ctx))
            return replace(fitted, note=f"n_ctx {fitted.plan.context_alloc:,}: llama-server's "
                                        f"default, the model's {trained:,} cut to leave {free} "
                                        f"free on {where} (--fit on; --ctx sets it)")
    ctx = least.plan.context_alloc or 0
    cut = f"n_ctx {ctx:,}: llama-server's default, at its least (--fit-ctx {rt.fit_min_ctx:,})"
    if hw.kind == "cpu" or plan.gpu_layers is not None:
        return replace(least, note=f"{cut}, and still short of leaving {free} free on {where}")
    layers = _most_layers(arch, least.plan, hw, target)
    moved = replace(least.plan, gpu_layers=layers)
    return Fitted(moved, estimate_llama_cpp(arch, moved, hw),
                  f"{cut}; {layers} of {arch.num_layers} layers on the GPU, the rest in host "
                  f"memory (--fit on moves them to leave {free} free; -ngl sets it)")


def _at(arch: Architecture, plan: InferencePlan, hw: Hardware, ctx: int) -> Fitted:
    sized = replace(plan, context_alloc=ctx)
    return Fitted(sized, estimate_llama_cpp(arch, sized, hw))


def _most_layers(arch: Architecture, plan: InferencePlan, hw: Hardware, target: int) -> int:
    """The most layers on the GPU that leave the target free (0 where none does)."""
    low, high = 0, arch.num_layers
    while low < high:
        mid = (low + high + 1) // 2
        used = estimate_llama_cpp(arch, replace(plan, gpu_layers=mid), hw).total_bytes
        low, high = (mid, high) if used <= target else (low, mid - 1)
    return low

