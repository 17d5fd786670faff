"""llama.cpp (llama-cli, llama-server, llama-cpp-python): GGUF weights, one context of n_ctx
cells the slots share, its own step model (docs/memory.md, "llama.cpp"; docs/speed.md,
"Runtimes")."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwise.catalog.hardware import Hardware
from gpuwise.estimate.memory.breakdown import MemoryEstimate
from gpuwise.estimate.memory.serving_runtimes import estimate_llama_cpp
from gpuwise.estimate.runtimes.unit import RuntimeUnit
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.ggml_step import GgmlStep
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan


@dataclass(frozen=True)
class LlamaCpp(RuntimeUnit):
    def memory(self, arch: Architecture, plan: InferencePlan, hw: Hardware, *,
               held_slack: float | None = None, without_slack: bool = False) -> MemoryEstimate:
        return estimate_llama_cpp(arch, plan, hw)

    def step(self, arch: Architecture, plan: InferencePlan, rates: DeviceRates, tp: int = 1,
             host: DeviceRates | None = None) -> GgmlStep:
        return GgmlStep(arch, plan, rates, tp, host)

    def kv_positions(self, arch: Architecture, plan: InferencePlan, hw: Hardware, tp: int,
                     slots: int) -> int:
        """One context of n_ctx cells, shared by the slots (llama-server's -c)."""
        return plan.context_alloc or max(4096, slots * plan.context_tokens)


UNITS = (LlamaCpp("llama.cpp", reads=frozenset({"ctx", "gpu_layers", "threads"}),
                  loads=frozenset({"gguf"}), own_memory_rules=True, probe_part="llama_cpp",
                  convert_hint="convert with llama.cpp's convert_hf_to_gguf.py, or pick "
                               "--runtime transformers or vllm"),)
