"""vLLM's V1 engine: a fixed share of the device taken up front for a paged KV pool
(docs/memory.md, "vLLM and SGLang"; docs/serve.md)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwise.catalog.hardware import Hardware
from gpuwise.estimate.memory.breakdown import MemoryEstimate
from gpuwise.estimate.memory.serving_runtimes import (
    estimate_vllm,
    vllm_kv_bytes_per_token,
    vllm_pool,
)
from gpuwise.estimate.runtimes.unit import RuntimeUnit
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.step import RooflineStep
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan


@dataclass(frozen=True)
class PagedPool(RuntimeUnit):
    def memory(self, arch: Architecture, plan: InferencePlan, hw: Hardware, *,
               held_slack: float | None = None, without_slack: bool = False) -> MemoryEstimate:
        return estimate_vllm(arch, plan, hw)

    def step(self, arch: Architecture, plan: InferencePlan, rates: DeviceRates, tp: int = 1,
             host: DeviceRates | None = None) -> RooflineStep:
        return RooflineStep(arch, plan, rates, tp, self.id)

    def kv_positions(self, arch: Architecture, plan: InferencePlan, hw: Hardware, tp: int,
                     slots: int) -> int:
        """The pool: what the utilisation share leaves after weights and activations."""
        pool = vllm_pool(arch, plan, hw, tp)[3]
        return int(pool * tp // vllm_kv_bytes_per_token(arch, plan))


# the options a paged-pool server reads: --ctx (max_model_len, SGLang's --context-length) and
# --gpu-memory-utilization (SGLang's --mem-fraction-static), and --expert-parallel (vLLM's
# --enable-expert-parallel, SGLang's --ep-size)
READS = frozenset({"ctx", "gpu_memory_utilization", "expert_parallel"})
LOADS = frozenset({"safetensors", "gguf"})  # vLLM and SGLang load a GGUF file (--load-format gguf)
UNITS = (PagedPool("vllm", reads=READS, loads=LOADS, own_memory_rules=True, shards_memory=True,
                   pipelines=True),)
