"""Each command's view: run the estimate, then return (JSON record, terminal renderable)."""

from __future__ import annotations

import platform
from dataclasses import asdict, replace
from typing import Any

from rich.console import Group
from rich.text import Text

from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.models import ResolvedModel, load_models
from gpuwise.estimate.memory import fits as answers
from gpuwise.estimate.memory.check_rows import catalogue_rows, check_rows, precision_row
from gpuwise.estimate.memory.inference import estimate_inference
from gpuwise.estimate.memory.training import estimate_training
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.model_time import (
    estimate_inference_time,
    estimate_training_time,
    slow_faults_step_s,
    step_fault_s,
)
from gpuwise.helpers import format_bytes, format_tokens
from gpuwise.measure.probe.profile import STEADY, describe_ratios, largest_move
from gpuwise.measure.probe.rates_source import rates_for
from gpuwise.measure.runs.module_run import NO_FAULTS_ENV
from gpuwise.report import terminal
from gpuwise.report.checkpoint_records import checkpoint_record
from gpuwise.report.precision_lines import inference_fp32, training_fp32
from gpuwise.report.records import (
    hardware_record,
    inference_time_record,
    memory_record,
    model_record,
    ops_record,
    training_time_record,
)
from gpuwise.workload import Architecture, count_params, from_config
from gpuwise.workload.plans import InferencePlan, TrainingPlan

View = tuple[Any, Any]  # (JSON-able record, rich renderable)
LOCAL_PRECISIONS = ("bf16", "int8", "int4")


def _context_label(plan: InferencePlan) -> str:
    return (f"batch {plan.batch}, prompt {format_tokens(plan.prompt_tokens)} + "
            f"{plan.new_tokens} new tokens")  # fmt: skip


def local_view() -> View:
    from gpuwise.measure.hardware.detect import detect_local

    machine = detect_local()
    hw = machine.best_device()
    plan = InferencePlan(prompt_tokens=2048, new_tokens=256)
    entries = load_models()
    models = [(e.id, from_config(e.load_config(), e.id)) for e in entries]
    rows = catalogue_rows(models, plan, hw, LOCAL_PRECISIONS)
    gpus = ", ".join(f"{g.name} ({format_bytes(g.memory_total_bytes)}, via {g.via})"
                     for g in machine.gpus) or f"none ({machine.gpu_unavailable_reason})"  # fmt: skip
    lines = [
        f"CPU:  {machine.cpu_model}, {machine.physical_cores or '?'} cores / "
        f"{machine.logical_cores} threads ({platform.machine()})",
        f"RAM:  {format_bytes(machine.ram_total_bytes)} "
        f"({format_bytes(machine.ram_available_bytes)} available)",
        f"GPU:  {gpus}",
        f"Estimates for: {terminal.format_hardware_line(hw)}",
    ]
    obj = {"machine": asdict(machine), "hardware": hardware_record(hw),
           "plan": asdict(plan), "models": rows}  # fmt: skip
    return obj, terminal.format_local(lines, rows, _context_label(plan))


def check_view(model: ResolvedModel, arch: Architecture, hw: Hardware, batch: int, prompt: int,
               new_tokens: int, plan: InferencePlan | None = None) -> View:  # fmt: skip
    plan = plan or InferencePlan(batch=batch, prompt_tokens=prompt, new_tokens=new_tokens)
    rows = check_rows(arch, replace(plan, stored_weights=None), hw)
    if plan.stored_weights:  # the checkpoint as stored, exact bytes, first
        rows.insert(0, {**precision_row(arch, plan, hw),
                        "weights": f"{plan.stored_weights.label}, exact"})  # fmt: skip
    obj = {"model": model_record(model, arch), "hardware": hardware_record(hw),
           "plan": asdict(plan), "precisions": rows, "runtime": plan.runtime,
           "params": count_params(arch).total,
           "precision_that_fits": answers.precision_that_fits(arch, plan, hw)}  # fmt: skip
    if model.checkpoint is not None:
        obj["checkpoint"] = checkpoint_record(model.checkpoint)
    label = f"{_context_label(plan)}, runtime {plan.runtime}"
    return obj, terminal.format_check(model.name, hw, rows, label)


def _throughput_curve(arch: Architecture, plan: InferencePlan, hw: Hardware,
                      rates: DeviceRates) -> list[dict[str, float]]:  # fmt: skip
    """Decode tokens/s as the batch doubles, until memory runs out."""
    curve = []
    batch = 1
    while batch <= 4096:
        p = replace(plan, batch=batch)
        if not estimate_inference(arch, p, hw).fits:
            break
        t = estimate_inference_time(arch, p, rates)
        curve.append({"batch": batch, "tokens_per_s": t.tokens_per_s,
                      "decode_s_per_token": t.decode_s_per_token})  # fmt: skip
        batch *= 2
    return curve


def _inference_time(arch: Architecture, plan: InferencePlan, hw: Hardware,
                    ) -> tuple[Any, Any, DeviceRates | None]:  # fmt: skip
    rates, how = rates_for(hw)
    if rates is None:
        return None, {"unavailable": how}, None
    t = estimate_inference_time(arch, plan, rates)
    return t, inference_time_record(t, how, _throughput_curve(arch, plan, hw, rates)), rates


def _time_lines(rec: dict[str, Any]) -> dict[str, str]:
    if "unavailable" in rec:
        return {"time": f"not estimated: {rec['unavailable']}"}
    if "step_s" in rec:
        return {"time": f"step {terminal.format_seconds(rec['step_s'])}, "
                        f"{rec['tokens_per_s']:,.0f} tokens/s, MFU {100 * rec['mfu']:.0f}% "
                        f"(backward {rec['bound']['backward']}-bound; {rec['source']}: "
                        f"{rec['rates']})" + _time_to_train(rec)}  # fmt: skip
    return {"time": f"prefill {terminal.format_seconds(rec['prefill_s'])} "
                    f"({rec['bound']['prefill']}-bound), decode "
                    f"{terminal.format_seconds(rec['decode_s_per_token'])}/token "
                    f"({rec['bound']['decode']}-bound), {rec['tokens_per_s']:,.1f} tokens/s "
                    f"({rec['source']}: {rec['rates']})"}  # fmt: skip


def _time_to_train(rec: dict[str, Any]) -> str:
    if not rec.get("train_tokens"):
        return ""
    hours = rec["time_to_train_s"] / 3600
    return f"; {rec['train_tokens']:,.0f} tokens in {hours:,.1f} h ({hours / 24:,.1f} days)"


def infer_view(model: ResolvedModel, arch: Architecture, hw: Hardware, plan: InferencePlan,
               show_ops: bool = False, weights_source: str = "") -> View:  # fmt: skip
    est = estimate_inference(arch, plan, hw)
    weights_source = weights_source or f"estimated ({plan.weights})"
    timing, time_rec, rates = _inference_time(arch, plan, hw)
    found: dict[str, Any] = {
        "max_batch": answers.max_inference_batch(arch, plan, hw),
        "max_context_batch1": answers.max_context(arch, plan, hw),
        "precision_that_fits": answers.precision_that_fits(arch, plan, hw),
        "devices_needed": answers.devices_for_inference(arch, plan, hw),
    }
    obj = {"model": model_record(model, arch), "hardware": hardware_record(hw),
           "plan": asdict(plan), "memory": memory_record(est),
           "params": count_params(arch).total, "answers": found, "time": time_rec,
           "runtime": plan.runtime, "weights_source": weights_source}  # fmt: skip
    if model.checkpoint is not None:
        obj["checkpoint"] = checkpoint_record(model.checkpoint)
    if show_ops and timing is not None:
        obj["ops"] = {"prefill": ops_record(timing.prefill), "decode": ops_record(timing.decode)}
    ctx = found["max_context_batch1"]
    extra = {
        "weights source": weights_source,
        "answers": f"largest batch {found['max_batch']} at this context; largest context at "
                   f"batch 1: {format_tokens(ctx) if ctx else 'none'}"
                   + (f" (model limit {format_tokens(arch.max_position)})"
                      if arch.max_position and ctx > arch.max_position else ""),
        "precision": f"highest weight precision that fits: {found['precision_that_fits'] or 'none'}"
                     f"; devices needed (tensor parallel): {found['devices_needed'] or 'too many'}",
    }  # fmt: skip
    extra.update(_time_lines(time_rec))
    if rates is not None and timing is not None:
        extra.update(inference_fp32(arch, plan, hw, rates, timing, time_rec))
    if plan.runtime != "transformers" and "time" in extra:  # memory follows the runtime; time not
        extra["time"] += f" [time model of transformers, not {plan.runtime}]"
    stored = plan.stored_weights.label if plan.stored_weights else plan.weights
    title = f"{model.name} inference ({plan.runtime}): {_context_label(plan)}, weights {stored}"
    view = terminal.format_memory(title, est, hw, extra)
    if show_ops and timing is not None:
        view = Group(view, terminal.format_ops("prefill operations", timing.prefill),
                     terminal.format_ops("decode operations (one step)", timing.decode))  # fmt: skip
    return obj, view


# The share of a step in page faults from which `gpuwise train` says how to avoid them.
FAULTS_WORTH_A_TIP = 0.05


def _faults_tip(fault_s: float, step_s: float, slow_step_s: float | None,
                slow_rate: float) -> str:  # fmt: skip
    """glibc gives back memory and maps it again every step; told not to, it faults nothing
    in after the first steps (run AD: training steps 11-49% faster; GPT-2's and Qwen2.5's
    peak 7% and 10% higher, docs/speed.md). Where the probe saw first touch slow down with
    memory in use, the step at that rate too: such a host's steps run in between."""
    env = " ".join(f"{k}={v}" for k, v in NO_FAULTS_ENV.items())
    slow = ""
    if slow_step_s and slow_rate:
        slow = (f"; at the {slow_rate / 1e9:.2f} GB/s the probe also "
                f"saw with memory in use, the step takes up to {slow_step_s:.2f} s")  # fmt: skip
    return (f"{fault_s:.2f} s of the step ({fault_s / step_s:.0%}) at the probed first-touch "
            f"rate, for memory glibc gives back and maps again every step{slow}; `{env}` "
            "keeps it mapped, for a peak about 10% higher")  # fmt: skip


def train_view(model: ResolvedModel, arch: Architecture, hw: Hardware,
               plan: TrainingPlan, show_ops: bool = False, train_tokens: float = 0) -> View:  # fmt: skip
    est = estimate_training(arch, plan, hw)
    rates, how = rates_for(hw)
    timing = estimate_training_time(arch, plan, rates) if rates else None
    faults = step_fault_s(arch, plan, rates, timing) if rates and timing else 0.0
    slow = slow_faults_step_s(arch, plan, rates) if rates and faults else None
    time_rec = (training_time_record(timing, how, train_tokens, faults, slow) if timing
                else {"unavailable": how})  # fmt: skip
    found = {
        "max_batch": answers.max_training_batch(arch, plan, hw),
        "devices_needed_zero3": answers.devices_for_training(arch, plan, hw),
        "with_checkpointing_bytes": estimate_training(
            arch, replace(plan, checkpointing=True), hw).total_bytes,
    }  # fmt: skip
    obj = {"model": model_record(model, arch), "hardware": hardware_record(hw),
           "plan": asdict(plan), "memory": memory_record(est),
           "params": count_params(arch).total, "answers": found, "time": time_rec}  # fmt: skip
    if show_ops and timing is not None:
        obj["ops"] = {"forward": ops_record(timing.forward)}
    extra = {
        "answers": f"largest batch at seq {plan.seq}: {found['max_batch']}; devices needed with "
        f"ZeRO-3: {found['devices_needed_zero3'] or 'more than 1024'}",
    }
    if not plan.checkpointing:
        extra["tip"] = (f"with --checkpointing: "
                        f"{format_bytes(found['with_checkpointing_bytes'])}")  # fmt: skip
    extra.update(_time_lines(time_rec))
    if rates is not None and timing is not None:
        extra.update(training_fp32(arch, plan, hw, rates, timing, time_rec))
    if timing and faults >= FAULTS_WORTH_A_TIP * timing.step_s:
        slow_rate = rates.kernels.slow_fresh_bytes_per_s if rates and rates.kernels else 0.0
        extra["page faults"] = _faults_tip(faults, timing.step_s, slow, slow_rate)
    title = (f"{model.name} training: batch {plan.batch} x seq {plan.seq}, {plan.dtype}, "
             f"{plan.optimizer}, {plan.finetune}")  # fmt: skip
    view = terminal.format_memory(title, est, hw, extra)
    if show_ops and timing is not None:
        view = Group(view, terminal.format_ops("forward operations (backward ~2x)",
                                               timing.forward))  # fmt: skip
    return obj, view


def models_view() -> View:
    entries = []
    for e in load_models():
        arch = from_config(e.load_config(), e.id)
        counts = count_params(arch)
        entries.append((e, counts.total, counts.active, arch.attention_kind))
    obj = [{**asdict(e), "params": t, "active_params": a, "attention": k}
           for e, t, a, k in entries]  # fmt: skip
    return obj, terminal.format_models_table(entries)


def validate_view(model: ResolvedModel, arch: Architecture, plan: InferencePlan | TrainingPlan,
                  quiet: bool, memory: bool = True, timing: bool = True) -> View:  # fmt: skip
    from gpuwise.app.validate import validate

    result = validate(model.config, arch, plan, quiet=quiet, memory=memory, timing=timing)
    rows = []
    if memory:
        rows += [
            {"quantity": "model memory", "estimated": result["estimated_model_bytes"],
             "measured": result["measured_model_bytes"], "error": result["error"],
             "unit": "bytes"},
            {"quantity": "runtime baseline (overhead)",
             "estimated": result["estimated_overhead_bytes"],
             "measured": result["measured_baseline_bytes"], "error": None, "unit": "bytes"},
            {"quantity": "peak total", "estimated": result["estimated_total_bytes"],
             "measured": result["measured_peak_bytes"], "error": None, "unit": "bytes"},
        ]  # fmt: skip
    for key, row in result.get("time", {}).items():
        rows.append({"quantity": key.replace("_", " "), "unit": "seconds", **row})
        if row.get("estimated_slow_faults"):  # the range's top, where first touch slows
            rows.append({"quantity": key.replace("_", " ") + ", faults at the probe's slow "
                         "first touch", "unit": "seconds", "measured": row["measured"],
                         "estimated": row["estimated_slow_faults"],
                         "error": row["estimated_slow_faults"] / row["measured"] - 1
                         if row["measured"] else None})  # fmt: skip
    obj = {"model": model_record(model, arch), "plan": asdict(plan), **result}
    note = (f"time estimates: {result['time_source'] or 'none'} ({result['time_rates']})"
            if timing else "")  # fmt: skip
    note += _drift_note(result.get("time_machine_vs_probe") or {})
    return obj, Group(terminal.format_validation(rows), Text(note))


def _drift_note(drift: dict[str, float]) -> str:
    """How fast the machine ran just before the real run, against its probe."""
    if not drift:
        return ""
    line = f"\nthis machine just before the run, against its probe: {describe_ratios(drift)}"
    if largest_move(drift) > STEADY:
        line += (f"\nit had moved by more than {STEADY:.0%} since it was probed: the "
                 "estimates follow the probe; run `gpuwise probe` again just before a time "
                 "check")  # fmt: skip
    return line
