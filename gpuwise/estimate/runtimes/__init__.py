"""The runtimes, one unit each (estimate/runtimes/unit.py): `runtime_unit(name)` is what the
rest of gpuwise asks about a runtime."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from gpuwise.catalog.hardware import Hardware
from gpuwise.errors import unknown_name_error
from gpuwise.estimate.memory.breakdown import MemoryEstimate
from gpuwise.estimate.runtimes.unit import PLAN_FIELDS, RUNTIME_OPTIONS, RuntimeUnit, StepModel
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan

__all__ = ["RuntimeUnit", "StepModel", "estimate_inference", "ignored_options", "runtime_unit",
           "runtime_units", "step_model"]


@cache
def runtime_units() -> dict[str, RuntimeUnit]:
    """Every runtime, by the name --runtime takes: the UNITS of each module here."""
    units: dict[str, RuntimeUnit] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for unit in getattr(module, "UNITS", ()):
            units[unit.id] = unit
    return units


def runtime_unit(name: str) -> RuntimeUnit:
    units = runtime_units()
    if name not in units:
        raise unknown_name_error("runtime", name, sorted(units), "gpuwise infer --help")
    return units[name]


def estimate_inference(arch: Architecture, plan: InferencePlan, hw: Hardware, *,
                       held_slack: float | None = None,
                       without_slack: bool = False) -> MemoryEstimate:
    """Peak memory of running `plan` on `hw` under its runtime's own rules (docs/memory.md).
    `held_slack`: the host allocator's slack from an earlier replay, held while a search
    narrows; `without_slack`: the allocators' slack taken as none, a lower bound a search
    uses to rule a plan out before it replays it (estimate/memory/fits.py)."""
    return runtime_unit(plan.runtime).memory(arch, plan, hw, held_slack=held_slack,
                                             without_slack=without_slack)


def step_model(arch: Architecture, plan: InferencePlan, rates: DeviceRates, tp: int = 1,
               host: DeviceRates | None = None, runtime: str = "") -> StepModel:
    """The one step model of `plan` (docs/speed.md, "One step"), under `runtime` or its own,
    on one replica of `tp` devices with `rates`; llama.cpp's layers past `plan.gpu_layers`
    on `host`. infer, check, serve and advise all time their steps with it."""
    return runtime_unit(runtime or plan.runtime).step(arch, plan, rates, tp, host)


def ignored_options(plan: InferencePlan) -> tuple[str, ...]:
    """The options given that the plan's runtime does not read, one line each (and where its
    memory follows another runtime's rules, that): said, not silently dropped."""
    unit = runtime_unit(plan.runtime)
    notes = []
    for name, flag in RUNTIME_OPTIONS.items():
        value = getattr(plan, PLAN_FIELDS.get(name, name))
        if value is None or value is False or name in unit.reads:
            continue
        readers = sorted(u.id for u in runtime_units().values() if name in u.reads)
        listed = ", ".join(readers[:-1]) + " and " + readers[-1] if len(readers) > 1 else readers[0]
        notes.append(f"{flag} applies to {listed}; ignored under {unit.id}")
    return (*notes, unit.memory_note) if unit.memory_note else tuple(notes)
