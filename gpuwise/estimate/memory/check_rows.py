"""The can-I-run-it views: one model across precisions, or a catalogue on one device."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuwise.catalog.hardware import Hardware
from gpuwise.estimate.memory.fits import max_context
from gpuwise.estimate.runtimes import estimate_inference
from gpuwise.workload import Architecture, count_params
from gpuwise.workload.plans import InferencePlan

CHECK_PRECISIONS = ("fp32", "bf16", "fp8", "int8", "int4", "nf4")


def precision_row(arch: Architecture, plan: InferencePlan, hw: Hardware) -> dict[str, Any]:
    est = estimate_inference(arch, plan, hw)
    return {
        "weights": plan.weights, "weight_bytes": est.breakdown["weights"],
        "total_bytes": est.total_bytes, "fits": est.fits, "verdict": est.verdict,
        "margin_bytes": est.margin_bytes, "capacity_bytes": est.capacity_bytes,
        "headroom_bytes": est.headroom_bytes,
        "max_context": max_context(arch, plan, hw), "model_max_context": arch.max_position,
        "breakdown": est.breakdown,
    }


def check_rows(arch: Architecture, plan: InferencePlan, hw: Hardware,
               precisions: tuple[str, ...] = CHECK_PRECISIONS) -> list[dict[str, Any]]:
    return [precision_row(arch, replace(plan, weights=p), hw) for p in precisions]


def catalogue_rows(models: list[tuple[str, Architecture]], plan: InferencePlan, hw: Hardware,
                   precisions: tuple[str, ...]) -> list[dict[str, Any]]:
    rows = []
    for name, arch in models:
        fitted = _within_model_limit(arch, plan)
        for p in precisions:
            row = precision_row(arch, replace(fitted, weights=p), hw)
            row.update(model=name, params=count_params(arch).total)
            rows.append(row)
    return rows


def _within_model_limit(arch: Architecture, plan: InferencePlan) -> InferencePlan:
    """Shorten the prompt so prompt + new tokens stay inside the model's context window."""
    limit = arch.max_position
    if not limit or plan.context_tokens <= limit:
        return plan
    new = min(plan.new_tokens, limit // 4)
    return replace(plan, prompt_tokens=max(1, limit - new), new_tokens=new)
