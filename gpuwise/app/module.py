"""`gpuwise module` and `gpuwise.from_module`: trace a torch.nn.Module on meta and estimate its memory and time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuwise.app.lookup import hardware_named
from gpuwise.app.module_inputs import examples
from gpuwise.catalog.hardware import Hardware
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.memory.breakdown import MemoryEstimate
from gpuwise.estimate.traced_module import (
    ModuleTime,
    estimate_module_memory,
    estimate_module_time,
    heap_faults,
)
from gpuwise.measure.module.trace import load_factory, trace_module
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

    @property
    def page_fault_bytes(self) -> int:
        """Bytes the host allocator faults in per pass (steady state), all phases."""
        return sum(heap_faults(self.traced, self.optimizer).values())

    @property
    def page_fault_s(self) -> float:
        """Seconds of the estimated time that are those page faults (0 without a time)."""
        if self.time is None:
            return 0.0
        phases = (self.time.forward, self.time.backward, self.time.optimizer)
        return sum(t.seconds for p in phases if p for t in p.ops if t.op.kind == "faults")


def from_module(model: Any, example_inputs: Any, *, training: bool = False,
                dtype: str | None = None, optimizer: str = "adamw",
                loss_fn: Callable[[Any], Any] | None = None, on: str | Hardware = "local",
                name: str | None = None) -> ModuleEstimate:
    """Estimate any torch.nn.Module's memory and time without running it for real.

    The module is traced on the meta device (no memory allocated, its weights untouched and
    not needed): `example_inputs` is a tensor, a shape tuple, or a tuple/dict of them (their
    values are never read). `training` traces forward + backward of `loss_fn(output)` (default:
    the sum of the floating outputs) and adds the optimizer (`adamw`, `sgd`, `adafactor`).
    `dtype` ("fp32", "bf16", "fp16") casts the floating parameters and inputs; default: as
    they are. `on` is a catalogue device or "local".
    """
    hw = on if isinstance(on, Hardware) else hardware_named(on)
    traced = trace_module(model, example_inputs, training=training, dtype=dtype,
                          loss_fn=loss_fn, optimizer=optimizer, name=name,
                          device_kind=hw.kind)
    memory = estimate_module_memory(traced, hw, optimizer)
    rates, how = rates_for(hw)
    timing = estimate_module_time(traced, rates, optimizer) if rates is not None else None
    return ModuleEstimate(traced, hw, memory, timing, how, optimizer)


def module_from_factory(factory: str, inputs: list[str], batch: int | None, *, training: bool,
                        dtype: str | None, optimizer: str,
                        on: str) -> tuple[ModuleEstimate, list[str]]:
    """`gpuwise module`: build the module from `package.module:function`, trace it on the
    inputs given (or its own), estimate; the estimate and the inputs' labels."""
    build = load_factory(factory)
    try:
        made = build()
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's factory failed: one line
        raise GpuwiseError(f"{factory}() failed: {type(exc).__name__}: {str(exc)[:200]}",
                           "the factory must build the module without arguments") from None
    model, example, labels = examples(made, inputs, batch)
    est = from_module(model, example, training=training, dtype=dtype, optimizer=optimizer, on=on,
                      name=factory.partition(":")[2])
    return est, labels
