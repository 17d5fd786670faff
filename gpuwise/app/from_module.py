"""`gpuwise.from_module`: trace a torch.nn.Module on meta and estimate its memory and time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuwise.catalog.hardware import Hardware
from gpuwise.estimate.memory.breakdown import MemoryEstimate
from gpuwise.estimate.traced_module import (
    ModuleTime,
    estimate_module_memory,
    estimate_module_time,
)
from gpuwise.measure.module.trace import trace_module
from gpuwise.measure.probe.rates_source import rates_for
from gpuwise.workload.traced import TracedModule


@dataclass(frozen=True)
class ModuleEstimate:
    """What from_module returns: the trace, the memory estimate and (where rates are known)
    the time estimate, for `hardware`."""

    traced: TracedModule
    hardware: Hardware
    memory: MemoryEstimate
    time: ModuleTime | None
    time_rates: str  # how the rates were chosen, or why there is no time estimate
    optimizer: str

    @property
    def seconds(self) -> float | None:
        """Forward latency (inference) or training step time, estimated."""
        return self.time.seconds if self.time else None


def hardware_for(on: str | Hardware) -> Hardware:
    """A Hardware record, a catalogue name, or 'local' (this machine's best device)."""
    if isinstance(on, Hardware):
        return on
    if on.strip().lower() in ("local", "here", "this"):
        from gpuwise.measure.hardware.detect import detect_local

        return detect_local().best_device()
    from gpuwise.catalog.hardware import find_hardware

    return find_hardware(on)


def from_module(model: Any, example_inputs: Any, *, training: bool = False,
                dtype: str | None = None, optimizer: str = "adamw",
                loss_fn: Callable[[Any], Any] | None = None, on: str | Hardware = "local",
                name: str | None = None) -> ModuleEstimate:  # fmt: skip
    """Estimate any torch.nn.Module's memory and time without running it for real.

    The module is traced on the meta device (no memory allocated, its weights untouched and
    not needed): `example_inputs` is a tensor, a shape tuple, or a tuple/dict of them (their
    values are never read). `training` traces forward + backward of `loss_fn(output)` (default:
    the sum of the floating outputs) and adds the optimizer (`adamw`, `sgd`, `adafactor`).
    `dtype` ("fp32", "bf16", "fp16") casts the floating parameters and inputs; default: as
    they are. `on` is a catalogue device or "local".
    """
    hw = hardware_for(on)
    traced = trace_module(model, example_inputs, training=training, dtype=dtype,
                          loss_fn=loss_fn, optimizer=optimizer, name=name,
                          device_kind=hw.kind)  # fmt: skip
    memory = estimate_module_memory(traced, hw, optimizer)
    rates, how = rates_for(hw)
    timing = estimate_module_time(traced, rates, optimizer) if rates is not None else None
    return ModuleEstimate(traced, hw, memory, timing, how, optimizer)
