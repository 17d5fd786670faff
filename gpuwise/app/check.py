"""`gpuwise check`: can I run it? Memory across weight precisions on one device."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gpuwise.app.infer import ignored_options
from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.models import ResolvedModel
from gpuwise.estimate.memory.check_rows import check_rows, precision_row
from gpuwise.estimate.memory.fits import precision_that_fits
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan


@dataclass(frozen=True)
class CheckAnswer:
    model: ResolvedModel
    arch: Architecture
    hardware: Hardware
    plan: InferencePlan
    rows: list[dict[str, Any]]
    precision_that_fits: str | None
    notes: tuple[str, ...] = ()  # options the runtime ignores


def check(model: ResolvedModel, arch: Architecture, hw: Hardware,
          plan: InferencePlan) -> CheckAnswer:  # fmt: skip
    """One row per weight precision; a checkpoint's exact stored bytes first."""
    rows = check_rows(arch, replace(plan, stored_weights=None), hw)
    if plan.stored_weights:
        rows.insert(0, {**precision_row(arch, plan, hw),
                        "weights": f"{plan.stored_weights.label}, exact"})  # fmt: skip
    return CheckAnswer(model, arch, hw, plan, rows, precision_that_fits(arch, plan, hw),
                       ignored_options(plan))  # fmt: skip
