"""The `fp32` line of `gpuwise train` and `gpuwise infer`: where a CPU's probed kernels make
fp32 the faster precision, the time and memory it takes instead (docs/speed.md)."""

from __future__ import annotations

from gpuwise.estimate.speed.inference_time import InferenceTime
from gpuwise.estimate.speed.training_time import TrainingTime
from gpuwise.report.terminal import format_seconds
from gpuwise.units import format_bytes
from gpuwise.workload.plans import InferencePlan, TrainingPlan

WHY = ("this CPU's probed {dtype} kernels are slower than its fp32 ones: without {dtype} "
       "matrix instructions torch converts every element")


def training_fp32(plan: TrainingPlan, own: TrainingTime, fp32: TrainingTime,
                  memory_bytes: int) -> dict[str, str]:
    half = plan.dtype.removeprefix("mixed-")
    return {"fp32": f"faster here: step {format_seconds(fp32.step_s)} against "
                    f"{format_seconds(own.step_s)} in {plan.dtype}, for "
                    f"{format_bytes(memory_bytes)} of memory ({WHY.format(dtype=half)})"}


def inference_fp32(plan: InferencePlan, own: InferenceTime, fp32: InferenceTime,
                   memory_bytes: int) -> dict[str, str]:
    return {"fp32": f"weights in fp32: prefill {format_seconds(fp32.prefill_s)} against "
                    f"{format_seconds(own.prefill_s)}, decode "
                    f"{format_seconds(fp32.decode_s_per_token)}/token against "
                    f"{format_seconds(own.decode_s_per_token)}, for {format_bytes(memory_bytes)} of "
                    f"memory ({WHY.format(dtype=plan.weights)})"}
