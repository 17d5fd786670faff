"""The one step model of a plan (docs/speed.md, "One step"): the runtime's own, llama.cpp's
(estimate/speed/ggml_step.py) or the roofline's (estimate/speed/step.py). Every command that
times a step (infer, check, serve, advise) asks here."""

from __future__ import annotations

from gpuwise.catalog.runtime_speed import runtime_speed
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.ggml_step import GgmlStep
from gpuwise.estimate.speed.step import RooflineStep
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan

StepModel = GgmlStep | RooflineStep


def step_model(arch: Architecture, plan: InferencePlan, rates: DeviceRates, tp: int = 1,
               host: DeviceRates | None = None, runtime: str = "") -> StepModel:  # fmt: skip
    """Steps of `plan` (under `runtime`, else its own) on one replica of `tp` devices with
    `rates`; llama.cpp's layers past `plan.gpu_layers` on `host`."""
    rt = runtime_speed(runtime or plan.runtime)
    if rt.model == "ggml":
        return GgmlStep(arch, plan, rates, tp, host)
    return RooflineStep(arch, plan, rates, tp, rt.id)
