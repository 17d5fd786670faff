"""Hugging Face transformers' generate() in eager PyTorch, and the same model through
torch.compile (docs/memory.md, docs/speed.md, "Runtimes")."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.runtimes import runtime
from gpuwise.estimate.memory.breakdown import MemoryEstimate
from gpuwise.estimate.memory.inference import transformers_memory
from gpuwise.estimate.memory.weights import weight_bytes
from gpuwise.estimate.runtimes.unit import RuntimeUnit
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.step import RooflineStep
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan


@dataclass(frozen=True)
class Transformers(RuntimeUnit):
    def memory(self, arch: Architecture, plan: InferencePlan, hw: Hardware, *,
               held_slack: float | None = None, without_slack: bool = False) -> MemoryEstimate:
        return transformers_memory(arch, plan, hw, held_slack=held_slack,
                                   without_slack=without_slack)

    def step(self, arch: Architecture, plan: InferencePlan, rates: DeviceRates, tp: int = 1,
             host: DeviceRates | None = None) -> RooflineStep:
        return RooflineStep(arch, plan, rates, tp, self.id)

    def kv_positions(self, arch: Architecture, plan: InferencePlan, hw: Hardware, tp: int,
                     slots: int) -> int:
        """What the weights and the runtime's baseline leave of the devices' memory."""
        fmt = plan.weight_format
        weights = plan.stored_weights.total_bytes if plan.stored_weights else weight_bytes(arch, fmt)
        left = hw.memory_bytes * tp - weights - runtime(hw.kind).baseline_bytes * tp
        return max(0, int(left // plan.kv_bytes_per_position(arch)))


UNITS = (
    Transformers("transformers", dequantises=frozenset({"gguf"}), probe_part=""),
    # torch.compile keeps the same tensors as eager (its static KV cache of the whole
    # context is not modelled); it times as the catalogue's compiled runtime
    Transformers("compiled", torch_compile=True, dequantises=frozenset({"gguf"}),
                 serves_as="transformers",
                 memory_note="memory as transformers': torch.compile keeps the same tensors "
                             "(its static KV cache of the whole context is not modelled)"),
)
