"""The `gpuwise module` view: a traced module's memory and time, as JSON and for the terminal."""

from __future__ import annotations

from typing import Any

from rich.console import Group

from gpuwise.report import terminal
from gpuwise.report.records import hardware_record, memory_record, ops_record
from gpuwise.report.terminal import View
from gpuwise.units import format_count


def _module_record(est: Any) -> dict[str, Any]:
    t = est.traced
    phases = ("forward", "backward") if t.training else ("forward",)
    return {
        "name": t.name, "training": t.training, "dtype": t.dtype, "params": t.param_count,
        "param_bytes": t.param_bytes, "buffer_bytes": t.buffer_bytes,
        "input_bytes": t.input_bytes, "trainable_params": t.trainable_count,
        "saved_for_backward_bytes": t.saved_bytes, "output_bytes": t.output_bytes,
        "flops": {p: t.flops(p) for p in phases},
        "aten_ops": {p: len(t.phase_ops(p)) for p in phases},
        "optimizer_aten_ops": t.optimizer_ops, "source": "measured on the meta device (trace)",
    }


def _time_record(est: Any) -> dict[str, Any]:
    t = est.time
    if t is None:
        return {"unavailable": est.time_rates}
    rec: dict[str, Any] = {"seconds": t.seconds, "forward_s": t.forward.seconds,
                           "bound": {"forward": t.forward.bound}}
    for phase in (t.backward, t.optimizer):
        if phase is not None:
            rec[f"{phase.name}_s"] = phase.seconds
            rec["bound"][phase.name] = phase.bound
    rec["what"] = "training step" if t.backward else "forward (no-grad) latency"
    rec.update(source=t.source, rates=est.time_rates, runtime=t.runtime,
               source_kind="estimated")
    return rec


def _time_line(rec: dict[str, Any]) -> str:
    if "unavailable" in rec:
        return f"not estimated: {rec['unavailable']}"
    parts = [f"{k.removesuffix('_s')} {terminal.format_seconds(v)}" for k, v in rec.items()
             if k.endswith("_s")]
    return (f"{rec['what']} {terminal.format_seconds(rec['seconds'])} ({', '.join(parts)}; "
            f"estimated from {rec['source']} rates: {rec['rates']})")


def module_view(est: Any, inputs: list[str], show_ops: bool = False) -> View:
    """(JSON record, rich renderable) of a ModuleEstimate."""
    t = est.traced
    time_rec = _time_record(est)
    obj: dict[str, Any] = {
        "module": _module_record(est), "hardware": hardware_record(est.hardware),
        "plan": {"training": t.training, "dtype": t.dtype, "inputs": inputs,
                 "optimizer": est.optimizer if t.training else None},
        "memory": memory_record(est.memory), "time": time_rec,
    }
    phases = [p for p in (est.time.forward, est.time.backward) if p] if est.time else []
    if show_ops:
        obj["ops"] = {p.name: ops_record(p) for p in phases}
    what = f"training ({est.optimizer})" if t.training else "inference (no-grad forward)"
    title = (f"{t.name}: {what}, {t.dtype}, inputs {' '.join(inputs)}; "
             f"{format_count(t.param_count)} parameters")
    extra = {
        "traced": f"{format_count(t.flops())}FLOP in {len(t.ops)} aten ops on meta"
                  + (f"; saved for backward {t.saved_bytes / 2**20:,.1f} MiB" if t.training
                     else ""),
        "time": _time_line(time_rec),
    }
    view: Any = terminal.format_memory(title, est.memory, est.hardware, extra)
    if show_ops:
        view = Group(view, *(terminal.format_ops(f"{p.name} operations", _by_time(p))
                             for p in phases))
    return obj, view


def _by_time(phase: Any) -> Any:
    """The phase with its operations slowest first (a traced module has many)."""
    from dataclasses import replace

    return replace(phase, ops=tuple(sorted(phase.ops, key=lambda o: -o.seconds)))
