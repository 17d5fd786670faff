"""Renders `gpuwise validate`: each quantity estimated against measured, and how the machine
ran against its probe just before."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.console import Group
from rich.text import Text

from gpuwise.catalog.models import ResolvedModel
from gpuwise.measure.probe.profile import STEADY, describe_ratios, largest_move
from gpuwise.report import terminal
from gpuwise.report.records import model_record
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan, TrainingPlan


def _memory_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The process's memory above its baseline (the median of its passes on a CPU), and the
    live tensors alone under glibc pinned, a diagnostic beside it."""
    passes = len(result.get("measured_passes_model_bytes") or [1])
    median = f", median of {passes} processes" if passes > 1 else ""
    allocator = f" ({result['allocator']} allocator{median})" if result.get("allocator") else ""
    rows = [
        {"quantity": "model memory" + allocator, "estimated": result["estimated_model_bytes"],
         "measured": result["measured_model_bytes"], "error": result["error"], "unit": "bytes"},
        {"quantity": "runtime baseline (overhead)",
         "estimated": result["estimated_overhead_bytes"],
         "measured": result["measured_baseline_bytes"], "error": None, "unit": "bytes"},
        {"quantity": "peak total", "estimated": result["estimated_total_bytes"],
         "measured": result["measured_peak_bytes"], "error": None, "unit": "bytes"},
    ]
    live = result.get("live")
    if live:  # what the allocator keeps is the difference between the two readings
        rows.insert(1, {"quantity": f"live tensors only (diagnostic: {live['allocator']})",
                        "estimated": live["estimated"], "measured": live["measured"],
                        "error": live["error"], "unit": "bytes"})
    return rows


def _time_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key, row in result.get("time", {}).items():
        rows.append({"quantity": key.replace("_", " "), "unit": "seconds", **row})
        if row.get("estimated_slow_faults"):  # the range's top, where first touch slows
            rows.append({"quantity": key.replace("_", " ") + ", faults at the probe's slow "
                         "first touch", "unit": "seconds", "measured": row["measured"],
                         "estimated": row["estimated_slow_faults"],
                         "error": row["estimated_slow_faults"] / row["measured"] - 1
                         if row["measured"] else None})
    return rows


def validate_view(model: ResolvedModel, arch: Architecture, plan: InferencePlan | TrainingPlan,
                  result: dict[str, Any], memory: bool, timing: bool) -> tuple[Any, Any]:
    rows = (_memory_rows(result) if memory else []) + _time_rows(result)
    obj = {"model": model_record(model, arch), "plan": asdict(plan), **result}
    note = (f"time estimates: {result['time_source'] or 'none'} ({result['time_rates']})"
            if timing else "")
    note += _drift_note(result.get("time_machine_vs_probe") or {})
    note += "".join(f"\n{key.replace('_', ' ')}: not measured: {row['unmeasured']}"
                    for key, row in result.get("time", {}).items() if row.get("unmeasured"))
    return obj, Group(terminal.format_validation(rows), Text(note))


def _drift_note(drift: dict[str, float]) -> str:
    """How fast the machine ran just before the real run, against its probe."""
    if not drift:
        return ""
    line = f"\nthis machine just before the run, against its probe: {describe_ratios(drift)}"
    if largest_move(drift) > STEADY:
        line += (f"\nit had moved by more than {STEADY:.0%} since it was probed: the "
                 "estimates follow the probe; run `gpuwise probe` again just before a time "
                 "check")
    return line
