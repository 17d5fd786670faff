"""Renders the estimate commands' answers (check, infer, train, the main job, the catalogues)
as (JSON record, terminal renderable). Computes nothing: the numbers come from app/."""

from __future__ import annotations

import platform
from collections import Counter
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.text import Text

from gpuwise.estimate.runtimes import runtime_unit
from gpuwise.report import terminal
from gpuwise.report.checkpoint_records import checkpoint_record
from gpuwise.report.precision_lines import inference_fp32, training_fp32
from gpuwise.report.records import (
    device_rates_record,
    hardware_record,
    inference_time_record,
    memory_record,
    model_record,
    ops_record,
    training_time_record,
)
from gpuwise.report.terminal import View
from gpuwise.report.time_lines import faults_tip, time_lines
from gpuwise.units import format_bytes, format_tokens
from gpuwise.workload import count_params
from gpuwise.workload.plans import InferencePlan, TrainingPlan

if TYPE_CHECKING:  # the answers' types: each command imports its own app module
    from gpuwise.app.catalogue import ModelRow
    from gpuwise.app.check import CheckAnswer
    from gpuwise.app.config_files import ConfigUse
    from gpuwise.app.infer import InferAnswer
    from gpuwise.app.local import LocalAnswer
    from gpuwise.app.train import TrainAnswer
    from gpuwise.catalog.hardware import Hardware
    from gpuwise.estimate.memory.breakdown import MemoryEstimate
    from gpuwise.estimate.training_search import FitSearch


def _context_label(plan: InferencePlan) -> str:
    return (f"batch {plan.batch}, prompt {format_tokens(plan.prompt_tokens)} + "
            f"{plan.new_tokens} new tokens")


def local_view(a: LocalAnswer) -> View:
    m = a.machine
    kinds = Counter((g.name, g.memory_total_bytes, g.via) for g in m.gpus)
    gpus = "\n      ".join(  # a line a kind: each name whole at 80 columns
        f"{f'{n} x ' if n > 1 else ''}{name} ({format_bytes(size)}{' each' if n > 1 else ''}, "
        f"via {via})" for (name, size, via), n in kinds.items()) or (
        f"none ({m.gpu_unavailable_reason})")
    lines = [
        f"CPU:  {m.cpu_model}, {m.physical_cores or '?'} cores / "
        f"{m.logical_cores} threads ({platform.machine()})",
        f"RAM:  {format_bytes(m.ram_total_bytes)} ({format_bytes(m.ram_available_bytes)} available)",
        f"GPU:  {gpus}",
        f"Estimates for: {terminal.format_hardware_line(a.hardware)}",
    ]
    obj = {"machine": asdict(m), "hardware": hardware_record(a.hardware),
           "plan": asdict(a.plan), "models": [r.record() for r in a.rows]}
    return obj, terminal.format_local(lines, a.rows, _context_label(a.plan), a.plan.runtime)


def check_view(a: CheckAnswer) -> View:
    obj = {"model": model_record(a.model, a.arch), "hardware": hardware_record(a.hardware),
           "plan": asdict(a.plan), "precisions": [r.record() for r in a.rows],
           "runtime": a.plan.runtime,
           "params": count_params(a.arch).total,
           "precision_that_fits": a.precision_that_fits, "notes": list(a.notes)}
    if a.model.checkpoint is not None:
        obj["checkpoint"] = checkpoint_record(a.model.checkpoint)
    label = f"{_context_label(a.plan)}, runtime {a.plan.runtime}"
    table = terminal.format_check(a.model.name, a.hardware, a.rows, label)
    obj["decode_rates"] = a.rates_source
    notes = [f"decode: seconds a token, batch {a.plan.batch}, under {a.plan.runtime} "
             f"({a.rates_source}); `gpuwise infer` gives its interval and the prefill", *a.notes]
    decodes = [r.decode for r in a.rows if r.decode is not None]
    notes += [f"decode -: {why}" for why in sorted({d.unavailable for d in decodes
                                                      if d.unavailable})]
    notes += sorted({f"decode without: {why}" for d in decodes for why in d.missing_parts})
    return obj, Group(table, Text("\n".join(f"note: {n}" for n in notes)))


def _infer_time_record(a: InferAnswer) -> dict[str, Any]:
    if a.time is None:
        return {"unavailable": a.rates_source}
    rec = inference_time_record(a.time, a.rates_source, [asdict(p) for p in a.throughput])
    rec["fp32_prefill_s"] = a.fp32.time.prefill_s if a.fp32 else None
    rec["fp32_decode_s_per_token"] = a.fp32.time.decode_s_per_token if a.fp32 else None
    rec["tp"] = a.tp
    rec["page_faults_s"] = a.page_faults_s
    if a.rates is not None:
        rec["device_rates"] = device_rates_record(a.rates)
    return rec


def infer_view(a: InferAnswer, show_ops: bool = False) -> View:
    plan, arch, found = a.plan, a.arch, a.fits
    time_rec = _infer_time_record(a)
    obj = {"model": model_record(a.model, arch), "hardware": hardware_record(a.hardware),
           "plan": asdict(plan), "memory": memory_record(a.memory),
           "params": count_params(arch).total, "answers": asdict(found), "time": time_rec,
           "runtime": plan.runtime, "weights_source": a.weights_source}
    if a.model.checkpoint is not None:
        obj["checkpoint"] = checkpoint_record(a.model.checkpoint)
    if show_ops and a.time is not None:
        obj["ops"] = {"prefill": ops_record(a.time.prefill), "decode": ops_record(a.time.decode)}
    ctx = found.max_context_batch1
    extra = {
        "weights source": a.weights_source,
        "answers": f"largest batch {found.max_batch} at this context; largest context at "
                   f"batch 1: {format_tokens(ctx) if ctx else 'none'}"
                   + (" (the model's limit)" if arch.max_position and ctx >= arch.max_position
                      else ""),
        "precision": f"highest weight precision that fits"
                     f"{f' at --ctx {found.context}' if found.context else ''}: "
                     f"{found.precision_that_fits or 'none'}"
                     + ("" if a.hardware.kind == "cpu" else  # a CPU host splits no layers
                        f"; devices needed (tensor parallel): {found.devices_needed or 'too many'}"),
    }
    extra.update(time_lines(time_rec))
    if a.time is not None and a.fp32 is not None:
        extra.update(inference_fp32(plan, a.time, a.fp32.time, a.fp32.memory_bytes))
    stored = plan.stored_weights.label if plan.stored_weights else plan.weights
    title = f"{a.model.name} inference ({plan.runtime}): {_context_label(plan)}, weights {stored}"
    view = terminal.format_memory(title, a.memory, a.hardware, extra)
    if show_ops and a.time is not None:
        view = Group(view, terminal.format_ops("prefill operations", a.time.prefill),
                     terminal.format_ops("decode operations (one step)", a.time.decode))
    return obj, view


def _train_time_record(a: TrainAnswer) -> dict[str, Any]:
    if a.time is None:
        return {"unavailable": a.rates_source}
    rec = training_time_record(a.time, a.rates_source, a.train_tokens, a.faults.step_fault_s,
                               a.faults.slow_step_s)
    rec["fp32_step_s"] = a.fp32.time.step_s if a.fp32 else None
    return rec


def train_view(a: TrainAnswer, show_ops: bool = False) -> View:
    plan, found = a.plan, a.fits
    time_rec = _train_time_record(a)
    memory = _as_stack(a.memory, a.stack, plan)
    if a.stack and "runtime" in time_rec:  # the stack the --config file runs, timed so
        time_rec["runtime"] = _stack_step(a.stack, plan)
    obj = {"model": model_record(a.model, a.arch), "hardware": hardware_record(a.hardware),
           "plan": asdict(plan), "memory": memory_record(memory),
           "params": count_params(a.arch).total, "answers": asdict(found), "time": time_rec}
    if show_ops and a.time is not None:
        obj["ops"] = {"forward": ops_record(a.time.forward)}
    extra = {
        "answers": f"largest batch at seq {plan.seq}: {found.max_batch}; devices needed with "
        f"ZeRO-3: {found.devices_needed_zero3 or 'none up to 1,024 (what each keeps whole does not fit)'}",
    }
    if a.fit_search is not None:
        obj["fit_search"] = _fit_search_record(a.fit_search)
        extra.update(_fit_lines(a.fit_search))
    elif not plan.checkpointing:
        extra["tip"] = f"with --checkpointing: {format_bytes(found.with_checkpointing_bytes)}"
    extra.update(time_lines(time_rec))
    if a.time is not None and a.fp32 is not None:
        extra.update(training_fp32(plan, a.time, a.fp32.time, a.fp32.memory_bytes))
    tip = faults_tip(a.faults, a.time.step_s) if a.time else None
    if tip:
        extra["page faults"] = tip
    title = (f"{a.model.name} training: batch {plan.batch} x seq {plan.seq}, {plan.dtype}, "
             f"{plan.optimizer}, {plan.finetune}")
    view = terminal.format_memory(title, memory, a.hardware, extra)
    if show_ops and a.time is not None:
        view = Group(view, terminal.format_ops("forward operations (backward ~2x)",
                                               a.time.forward))
    return obj, view


def _as_stack(memory: MemoryEstimate, stack: str, plan: TrainingPlan) -> MemoryEstimate:
    """The estimate named for the stack a --config file ran (a torchtune recipe, not
    transformers): its step as gpuwise times it, and the stack features that applied."""
    if not stack:
        return memory
    features = memory.runtime.partition(" + ")[2]
    return replace(memory, runtime=_stack_step(stack, plan) + (f" + {features}" if features
                                                               else ""))


def _stack_step(stack: str, plan: TrainingPlan) -> str:
    step = "torch.compile" if runtime_unit(plan.runtime).torch_compile else "PyTorch eager"
    return f"{stack}: {step} step"


def with_config(view: View, use: ConfigUse | None) -> View:
    """A command's view with what it read of its --config file: a `config` object in the JSON
    and its lines under the terminal's answer (docs/configs.md)."""
    if use is None:
        return view
    obj, renderable = view
    return {**obj, "config": config_record(use)}, Group(renderable, Text(config_lines(use)))


def config_record(use: ConfigUse) -> dict[str, Any]:
    r = use.read
    return {
        "format": r.format, "stack": r.stack, "file": use.file, "options": dict(use.used),
        "flags": list(use.flags),
        "applied": [{"key": s.key, "value": s.value, "flags": list(s.flags)} for s in r.applied],
        "overridden": [{"flag": o.flag, "setting": o.setting} for o in use.overridden],
        "not_used": [{"key": s.key, "value": s.value, "flags": list(s.flags), "why": s.why}
                     for s in use.not_used],
        "not_modelled": [{"key": s.key, "value": s.value, "why": s.why}
                         for s in r.not_modelled],
        "no_effect": [{"key": s.key, "value": s.value} for s in r.no_effect],
    }


def config_lines(use: ConfigUse) -> str:
    r = use.read
    lines = [f"config:    {r.stack}, read from {use.file}",
             f"  as:      {' '.join(use.flags) or '(nothing gpuwise takes)'}"]
    lines += [f"  typed:   {o.flag} over the file's {o.setting}" for o in use.overridden]
    lines += [f"  unused:  {s.key}: {s.value} ({s.why})" for s in use.not_used]
    if r.not_modelled:
        lines.append("  not modelled (what each changes is left out of the estimate):")
        lines += [f"    {s.key}: {s.value} ({s.why})" for s in r.not_modelled]
    if r.no_effect:
        groups: dict[str, list[str]] = {}
        for s in r.no_effect:
            groups.setdefault(s.key.split(".")[0], []).append(s.key)
        named = ", ".join(keys[0] if len(keys) == 1 else f"{head}.* ({len(keys)})"
                          for head, keys in groups.items())
        lines.append(f"  no bearing on memory or time: {named} (values in --json)")
    return "\n".join(lines)


def _fit_search_record(f: FitSearch) -> dict[str, Any]:
    return {"tried": f.tried, "checkpointed_batch": f.checkpointed_batch,
            "options": [{"flags": list(o.flags), "total_bytes": o.total_bytes,
                         "capacity_bytes": o.capacity_bytes, "step_s": o.step_s,
                         "trains": o.trains, "plan": asdict(o.plan)} for o in f.options]}


def _fit_lines(f: FitSearch) -> dict[str, str]:
    """The fastest plans that fit, a line each (`fits with`, `or`, ...)."""
    if not f.options:
        line = f"none of {f.tried} combinations of gpuwise's memory features at this batch"
        if f.checkpointed_batch:
            line += (f"; with --checkpointing a batch of {f.checkpointed_batch} fits (accumulate "
                     "gradients to reach this one)")
        return {"fits with": line}
    lines = {}
    for i, o in enumerate(f.options):
        step = f", {terminal.format_seconds(o.step_s)} a step" if o.step_s is not None else ""
        trains = "" if o.trains == "the model" else f", trains {o.trains}"
        lines["fits with" if i == 0 else f"or ({i + 1})"] = (
            f"{' '.join(o.flags) or 'as asked'}: {format_bytes(o.total_bytes)} of "
            f"{format_bytes(o.capacity_bytes)}{step}{trains}")
    return lines


def models_view(rows: list[ModelRow], wide: bool = False) -> View:
    obj = [{**asdict(r.entry), "params": r.params, "active_params": r.active_params,
            "attention": r.attention} for r in rows]
    entries = [(r.entry, r.params, r.active_params, r.attention) for r in rows]
    return obj, terminal.format_models_table(entries, wide)


def hardware_view(devices: tuple[Hardware, ...], wide: bool = False) -> View:
    return [hardware_record(h) for h in devices], terminal.format_hardware_table(devices, wide)
