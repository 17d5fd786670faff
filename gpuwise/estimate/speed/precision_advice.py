"""On a CPU, half precision is not always faster: without bf16 or fp16 matrix instructions
(AVX2-only x86: Zen 2-4 without AVX512-BF16, Intel before Cooper Lake) torch converts every
element and its bf16 x @ W (a linear's input gradient) falls to a generic loop: 0.15-0.6
GFLOP/s against 90 in fp32 on a 2-core Zen 2 guest. Pure: the same estimate in fp32, where
the probed kernels make it the faster one."""

from __future__ import annotations

from dataclasses import replace

from gpuwise.catalog.thresholds import precision_thresholds
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.inference_time import InferenceTime, estimate_inference_time
from gpuwise.estimate.speed.training_time import TrainingTime, estimate_training_time
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan, TrainingPlan

HALF = ("bf16", "fp16")


def _applies(rates: DeviceRates) -> bool:
    return rates.kind == "cpu" and rates.kernels is not None


def fp32_training(arch: Architecture, plan: TrainingPlan, rates: DeviceRates,
                  step_s: float) -> TrainingTime | None:
    """The step in fp32 where a CPU's probed kernels make it `fp32_faster_by` faster than
    `step_s` (the plan's own step, in a half or mixed precision); else None."""
    if not _applies(rates) or plan.dtype == "fp32":
        return None
    fp32 = estimate_training_time(arch, replace(plan, dtype="fp32"), rates)
    return fp32 if fp32.step_s * precision_thresholds().fp32_faster_by <= step_s else None


def fp32_weights(plan: InferencePlan) -> InferencePlan:
    """The plan with fp32 weights (and an fp32 cache, where it followed the weights)."""
    kv = None if plan.kv_dtype in (None, plan.weights) else plan.kv_dtype
    return replace(plan, weights="fp32", kv_dtype=kv)


def fp32_inference(arch: Architecture, plan: InferencePlan, rates: DeviceRates,
                   own: InferenceTime) -> InferenceTime | None:
    """Generation with fp32 weights where a CPU's probed kernels make its prefill or its
    decode `fp32_faster_by` faster than `own` (bf16 or fp16 weights; the threshold:
    catalog/data/thresholds.toml); else None."""
    if not _applies(rates) or plan.weights not in HALF or plan.stored_weights is not None:
        return None
    fp32 = estimate_inference_time(arch, fp32_weights(plan), rates)
    by = precision_thresholds().fp32_faster_by
    faster = (fp32.prefill_s * by <= own.prefill_s
              or fp32.decode_s_per_token * by <= own.decode_s_per_token)
    return fp32 if faster else None
