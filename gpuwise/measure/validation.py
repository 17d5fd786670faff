"""`gpuwise validate`: run a plan for real on this machine and compare with the estimate."""

from __future__ import annotations

from typing import Any

from gpuwise.estimate.inference import estimate_inference
from gpuwise.estimate.plans import InferencePlan, TrainingPlan
from gpuwise.measure.device import detect_local
from gpuwise.workload import Architecture


def validate(config: dict[str, Any], arch: Architecture, plan: InferencePlan | TrainingPlan,
             quiet: bool = False) -> dict[str, Any]:  # fmt: skip
    """Measure the plan in a fresh process (torch needed) and return both sides and the error."""
    from gpuwise.estimate.training import estimate_training
    from gpuwise.measure import realrun

    hw = detect_local(use_torch=True).best_device()
    device = "cuda" if hw.kind == "gpu" else "cpu"
    if isinstance(plan, InferencePlan):
        est = estimate_inference(arch, plan, hw)
        measured = realrun.measure_inference(
            config, batch=plan.batch, prompt_tokens=plan.prompt_tokens,
            new_tokens=plan.new_tokens, dtype=plan.weights, attention=plan.attention,
            kv_dtype=plan.kv_dtype, device=device)  # fmt: skip
    else:
        est = estimate_training(arch, plan, hw)
        measured = realrun.measure_training(
            config, batch=plan.batch, seq=plan.seq, dtype=plan.dtype, optimizer=plan.optimizer,
            checkpointing=plan.checkpointing, attention=plan.attention, finetune=plan.finetune,
            lora_rank=plan.lora_rank, lora_targets=plan.lora_targets, device=device)  # fmt: skip
    model_est = est.model_bytes
    error = (model_est - measured.model_bytes) / measured.model_bytes
    return {
        "device": measured.device, "runtime": est.runtime,
        "estimated_total_bytes": est.total_bytes, "estimated_model_bytes": model_est,
        "estimated_overhead_bytes": est.breakdown.get("overhead", 0),
        "estimated_breakdown": est.breakdown, "estimated_peak_phase": est.peak_phase,
        "measured_peak_bytes": measured.peak_bytes,
        "measured_baseline_bytes": measured.baseline_bytes,
        "measured_model_bytes": measured.model_bytes,
        "measured_tensors_at_rest": measured.tensors_at_rest,
        "measured_seconds": measured.seconds, "error": error,
        "versions": {"torch": measured.torch_version,
                     "transformers": measured.transformers_version},
    }  # fmt: skip
