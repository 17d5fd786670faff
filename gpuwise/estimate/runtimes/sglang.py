"""SGLang: mem_fraction_static of the device, computed from its memory and tensor-parallel
size where not given, holds the weights and a token-granular KV pool; its scheduler's chunked
prefill by the device's memory and its running requests by the pool (docs/memory.md, "vLLM
and SGLang"; docs/serve.md). It steps as vLLM does (one roofline step)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.schedulers import SchedulerDefaults
from gpuwise.estimate.memory.breakdown import MemoryEstimate
from gpuwise.estimate.memory.sglang_memory import (
    estimate_sglang,
    sglang_cache_tokens,
    sglang_scheduler,
)
from gpuwise.estimate.runtimes.vllm import LOADS, READS, PagedPool
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan


@dataclass(frozen=True)
class Sglang(PagedPool):
    def memory(self, arch: Architecture, plan: InferencePlan, hw: Hardware, *,
               held_slack: float | None = None, without_slack: bool = False) -> MemoryEstimate:
        return estimate_sglang(arch, plan, hw)

    def scheduler_for(self, arch: Architecture, plan: InferencePlan,
                      hw: Hardware) -> SchedulerDefaults:
        return sglang_scheduler(arch, plan, hw, plan.tp)

    def kv_positions(self, arch: Architecture, plan: InferencePlan, hw: Hardware, tp: int,
                     slots: int) -> int:
        """max_total_num_tokens: the pool the static budget leaves after the weights."""
        return sglang_cache_tokens(arch, plan, hw, tp)


UNITS = (Sglang("sglang", reads=READS, loads=LOADS, own_memory_rules=True, shards_memory=True,
                pipelines=True),)
