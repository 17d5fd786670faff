"""The `fp32` line of `gpuwise train` and `gpuwise infer`: where a CPU's probed kernels make
fp32 the faster precision, the time and memory it takes instead (and `time.fp32_*` in JSON)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuwise.catalog.hardware import Hardware
from gpuwise.estimate.memory.inference import estimate_inference
from gpuwise.estimate.memory.training import estimate_training
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.model_time import InferenceTime, TrainingTime
from gpuwise.estimate.speed.precision_advice import fp32_inference, fp32_training, fp32_weights
from gpuwise.helpers import format_bytes
from gpuwise.report.terminal import format_seconds
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan, TrainingPlan

WHY = ("this CPU's probed {dtype} kernels are slower than its fp32 ones: without {dtype} "
       "matrix instructions torch converts every element")  # fmt: skip


def training_fp32(arch: Architecture, plan: TrainingPlan, hw: Hardware, rates: DeviceRates,
                  own: TrainingTime, time_rec: dict[str, Any]) -> dict[str, str]:  # fmt: skip
    """Sets `time_rec["fp32_step_s"]`; the line where fp32 is the faster (else nothing)."""
    fp32 = fp32_training(arch, plan, rates, own.step_s)
    time_rec["fp32_step_s"] = fp32.step_s if fp32 else None
    if fp32 is None:
        return {}
    memory = estimate_training(arch, replace(plan, dtype="fp32"), hw).total_bytes
    half = plan.dtype.removeprefix("mixed-")
    return {"fp32": f"faster here: step {format_seconds(fp32.step_s)} against "
                    f"{format_seconds(own.step_s)} in {plan.dtype}, for "
                    f"{format_bytes(memory)} of memory ({WHY.format(dtype=half)})"}  # fmt: skip


def inference_fp32(arch: Architecture, plan: InferencePlan, hw: Hardware, rates: DeviceRates,
                   own: InferenceTime, time_rec: dict[str, Any]) -> dict[str, str]:  # fmt: skip
    """Sets `time_rec["fp32_prefill_s"]` and `["fp32_decode_s_per_token"]`; the line where
    fp32 weights are the faster (else nothing)."""
    fp32 = fp32_inference(arch, plan, rates, own)
    time_rec["fp32_prefill_s"] = fp32.prefill_s if fp32 else None
    time_rec["fp32_decode_s_per_token"] = fp32.decode_s_per_token if fp32 else None
    if fp32 is None:
        return {}
    memory = estimate_inference(arch, fp32_weights(plan), hw).total_bytes
    return {"fp32": f"weights in fp32: prefill {format_seconds(fp32.prefill_s)} against "
                    f"{format_seconds(own.prefill_s)}, decode "
                    f"{format_seconds(fp32.decode_s_per_token)}/token against "
                    f"{format_seconds(own.decode_s_per_token)}, for {format_bytes(memory)} of "
                    f"memory ({WHY.format(dtype=plan.weights)})"}  # fmt: skip
