"""llama.cpp (llama-cli, llama-server, llama-cpp-python): GGUF weights, one context of n_ctx
cells the slots share, its own step model (docs/memory.md, "llama.cpp"; docs/speed.md,
"Runtimes")."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.serving_runtimes import llama_cpp_runtime
from gpuwise.estimate.memory.breakdown import MemoryEstimate
from gpuwise.estimate.memory.llama_cpp_fit import Fitted, fit_llama_cpp
from gpuwise.estimate.memory.llama_cpp_memory import estimate_llama_cpp, llama_cpp_kv_cells
from gpuwise.estimate.runtimes.unit import RuntimeUnit
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.ggml_step import GgmlStep
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan


@dataclass(frozen=True)
class LlamaCpp(RuntimeUnit):
    def memory(self, arch: Architecture, plan: InferencePlan, hw: Hardware, *,
               held_slack: float | None = None, without_slack: bool = False) -> MemoryEstimate:
        if plan.context_alloc is not None:  # the user's context: nothing to fit
            return estimate_llama_cpp(arch, plan, hw)
        fitted = _fitted(arch, plan, hw)
        est = fitted.estimate
        return replace(est, notes=(*est.notes[:1], fitted.note, *est.notes[1:]))

    def context_step(self) -> int:
        return llama_cpp_runtime().ctx_pad

    def as_run(self, arch: Architecture, plan: InferencePlan, hw: Hardware) -> InferencePlan:
        return plan if plan.context_alloc is not None else _fitted(arch, plan, hw).plan

    def step(self, arch: Architecture, plan: InferencePlan, rates: DeviceRates, tp: int = 1,
             host: DeviceRates | None = None) -> GgmlStep:
        return GgmlStep(arch, plan, rates, tp, host)

    def kv_positions(self, arch: Architecture, plan: InferencePlan, hw: Hardware, tp: int,
                     slots: int) -> int:
        """One context of n_ctx cells, shared by the slots (llama-server's -c; unset, the
        context its --fit picks)."""
        return llama_cpp_kv_cells(arch, self.as_run(arch, plan, hw))


@lru_cache(maxsize=1024)  # a search and a command's views ask for one plan many times
def _fitted(arch: Architecture, plan: InferencePlan, hw: Hardware) -> Fitted:
    """The fit of a plan without a context: a few estimates, kept."""
    return fit_llama_cpp(arch, plan, hw)


UNITS = (LlamaCpp("llama.cpp", reads=frozenset({"ctx", "gpu_layers", "threads",
                                                   "cpu_moe_layers"}),
                  loads=frozenset({"gguf"}), own_memory_rules=True, probe_part="llama_cpp",
                  precisions=("fp16", "q8_0", "q6_k", "q5_k_m", "q4_k_m"),
                  convert_hint="convert with llama.cpp's convert_hf_to_gguf.py, or pick "
                               "--runtime transformers or vllm"),)
