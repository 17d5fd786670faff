"""`gpuwise validate`: run a plan for real on this machine and compare with the estimates."""

from __future__ import annotations

from typing import Any

from gpuwise.estimate.runtimes import estimate_inference
from gpuwise.estimate.speed.inference_time import estimate_inference_time
from gpuwise.estimate.speed.training_time import estimate_training_time, slow_faults_step_s
from gpuwise.measure.hardware.detect import detect_local
from gpuwise.measure.probe.rates_source import rates_for
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan, TrainingPlan, check_runnable

# A CPU plan's peak memory: the median of this many fresh processes (docs/memory.md).
MEMORY_PASSES = 3
LIVE_ALLOCATOR = "glibc-mmap64k"  # the diagnostic reading: the resident set tracks live tensors


def validate(config: dict[str, Any], arch: Architecture, plan: InferencePlan | TrainingPlan,
             quiet: bool = False, memory: bool = True, timing: bool = True,
             repeats: int = 5, memory_passes: int = MEMORY_PASSES,
             live: bool = True) -> dict[str, Any]:
    """Measure the plan in fresh processes (torch needed); both sides and the errors. On a
    CPU the memory is the median of `memory_passes` processes under the plan's allocator, and
    with `live` one more under glibc pinned (the live tensors: a diagnostic)."""
    check_runnable(plan)
    hw = detect_local(use_torch=True).best_device()
    device = "cuda" if hw.kind == "gpu" else "cpu"
    result: dict[str, Any] = {"device": device}
    if memory:
        passes = memory_passes if device == "cpu" else 1
        result.update(_memory(config, arch, plan, hw, device, passes,
                              live and device == "cpu" and plan.allocator != LIVE_ALLOCATOR))
    if timing:
        result.update(_timing(config, arch, plan, hw, device, repeats))
    return result


def plan_kwargs(plan: InferencePlan | TrainingPlan, device: str) -> dict[str, Any]:
    if isinstance(plan, InferencePlan):
        return dict(batch=plan.batch, prompt_tokens=plan.prompt_tokens,
                    new_tokens=plan.new_tokens, dtype=plan.weights, attention=plan.attention,
                    kv_dtype=plan.kv_dtype, device=device)
    return dict(batch=plan.batch, seq=plan.seq, dtype=plan.dtype, optimizer=plan.optimizer,
                checkpointing=plan.checkpointing, attention=plan.attention,
                finetune=plan.finetune, lora_rank=plan.lora_rank,
                lora_targets=plan.lora_targets, device=device)


def _memory(config: dict[str, Any], arch: Architecture, plan: InferencePlan | TrainingPlan,
            hw: Any, device: str, passes: int, live: bool) -> dict[str, Any]:
    from gpuwise.estimate.memory.training import estimate_training
    from gpuwise.measure.runs import memory_run as realrun

    kwargs = plan_kwargs(plan, device)
    if isinstance(plan, InferencePlan):
        est = estimate_inference(arch, plan, hw)
        measure = realrun.measure_inference
    else:
        est = estimate_training(arch, plan, hw)
        measure = realrun.measure_training
    runs = sorted((measure(config, allocator=plan.allocator, **kwargs) for _ in range(passes)),
                  key=lambda m: m.model_bytes)
    measured = runs[len(runs) // 2]  # the median process
    slack = est.breakdown.get("allocator", 0)
    extra: dict[str, Any] = {"allocator": plan.allocator, "estimated_allocator_bytes": slack,
                             "measured_passes_model_bytes": [m.model_bytes for m in runs],
                             "measured_malloc": measured.malloc}
    if live:
        tensors = measure(config, allocator=LIVE_ALLOCATOR, **kwargs).model_bytes
        extra["live"] = {"allocator": LIVE_ALLOCATOR, "estimated": est.model_bytes - slack,
                         "measured": tensors,
                         "error": (est.model_bytes - slack - tensors) / tensors}
    return extra | {
        "device": measured.device, "runtime": est.runtime,
        "estimated_total_bytes": est.total_bytes, "estimated_model_bytes": est.model_bytes,
        "estimated_overhead_bytes": est.breakdown.get("overhead", 0),
        "estimated_breakdown": est.breakdown, "estimated_peak_phase": est.peak_phase,
        "measured_peak_bytes": measured.peak_bytes,
        "measured_baseline_bytes": measured.baseline_bytes,
        "measured_model_bytes": measured.model_bytes,
        "measured_tensors_at_rest": measured.tensors_at_rest,
        "error": (est.model_bytes - measured.model_bytes) / measured.model_bytes,
        "versions": {"torch": measured.torch_version,
                     "transformers": measured.transformers_version},
    }


def _timing(config: dict[str, Any], arch: Architecture, plan: InferencePlan | TrainingPlan,
            hw: Any, device: str, repeats: int) -> dict[str, Any]:
    from gpuwise.measure.runs import time_run as timerun

    rates, how = rates_for(hw)
    kwargs = plan_kwargs(plan, device)
    drift = machine_vs_probe() if rates is not None and rates.source == "measured" else {}
    if isinstance(plan, InferencePlan):
        measured = timerun.time_inference(config, repeats=repeats, **kwargs)
        pairs = {"prefill_s": measured.prefill_s, "decode_s_per_token": measured.decode_s_per_token}
        if rates is not None:
            t = estimate_inference_time(arch, plan, rates)
            est = {"prefill_s": t.prefill_s, "decode_s_per_token": t.decode_s_per_token}
    else:
        measured = timerun.time_training(config, repeats=repeats, **kwargs)
        pairs = {"step_s": measured.step_s}
        if rates is not None:
            est = {"step_s": estimate_training_time(arch, plan, rates).step_s}
    rows: dict[str, dict[str, Any]] = {}
    for key, value in pairs.items():
        guess = est[key] if rates is not None else None
        why_not = _not_a_reading(value)
        value = None if why_not else value
        error = None if guess is None or not value else guess / value - 1
        rows[key] = {"estimated": guess, "measured": value, "error": error}
        if why_not:
            rows[key]["unmeasured"] = why_not
    slow = (slow_faults_step_s(arch, plan, rates)
            if rates is not None and isinstance(plan, TrainingPlan) else None)
    if slow is not None:  # the top of the range on a VM whose first touch slows
        rows["step_s"]["estimated_slow_faults"] = slow
    return {"time": rows, "time_rates": how, "time_machine_vs_probe": drift,
            "time_source": rates.source if rates is not None else None,
            "time_repeats": measured.repeats, "time_threads": measured.threads}


def _not_a_reading(seconds: float | None) -> str:
    """Why a measured time is no reading: the decode, (full run - one-token run) / tokens, comes
    out at or below zero when the runs' noise outweighs it (few new tokens, a busy machine)."""
    if seconds is None or seconds > 0:
        return ""
    return (f"came out at {seconds * 1e3:.3g} ms: the runs' noise outweighs what is timed; "
            "more --new-tokens, or a quieter machine")


def machine_vs_probe() -> dict[str, float]:
    """This machine's read bandwidth and 1024^3 matmuls just before the real run, as ratios to
    the saved probe's (1.0: as when probed): an estimate follows its probe, not the machine
    now, and a shared host drifts by tens of percent within an hour."""
    from gpuwise.measure.probe.steadiness import machine_vs_profile
    from gpuwise.measure.probe.trusted import local_profile

    profile = local_profile().profile  # the one the estimates used: a trusted probe, or none
    return machine_vs_profile(profile) if profile is not None else {}
