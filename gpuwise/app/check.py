"""`gpuwise check`: can I run it? Memory across weight precisions on one device."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuwise.app.infer import ignored_options, offload_host
from gpuwise.catalog.formats import shipped_weights
from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.models import ResolvedModel
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.capability import check_attention, kernel_here, precisions_here
from gpuwise.estimate.memory.check_rows import (
    CHECK_PRECISIONS,
    DecodeCell,
    PrecisionRow,
    check_rows,
    precision_row,
)
from gpuwise.estimate.memory.fits import precision_that_fits
from gpuwise.estimate.runtimes import runtime_unit
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.inference_time import estimate_inference_time
from gpuwise.measure.probe.rates_source import rates_for
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan, check_tp_degree


@dataclass(frozen=True)
class CheckAnswer:
    model: ResolvedModel
    arch: Architecture
    hardware: Hardware
    plan: InferencePlan
    rows: list[PrecisionRow]
    precision_that_fits: str | None
    notes: tuple[str, ...] = ()  # options the runtime ignores
    rates_source: str = ""  # where the decode times' rates came from, or why there are none


def check(model: ResolvedModel, arch: Architecture, hw: Hardware,
          plan: InferencePlan) -> CheckAnswer:
    """One row per weight precision; a checkpoint's exact stored bytes first."""
    check_tp_degree(arch, plan.tp)
    check_attention(plan, hw)
    listed = runtime_unit(plan.runtime).precisions or CHECK_PRECISIONS
    shipped = shipped_weights(model.config)  # the format it ships in, where not listed
    if shipped and shipped not in listed and not plan.stored_weights:
        listed = (shipped, *listed)
    precisions, refused = precisions_here(replace(plan, stored_weights=None), hw, listed)
    plans = [kernel_here(replace(plan, stored_weights=None, weights=p), hw) for p in precisions]
    # in turn, in this process: the rows share their allocator replays (fp8 and int8 take
    # the same search), and on two cores forking workers costs more than it saves
    rows = check_rows(arch, replace(plan, stored_weights=None), hw, precisions)
    if plan.stored_weights:
        plans.insert(0, plan)
        rows.insert(0, replace(precision_row(arch, plan, hw),
                               weights=f"{plan.stored_weights.label}, exact"))
    rates, how = rates_for(hw)
    unit = runtime_unit(plan.runtime)
    runs = [unit.as_run(arch, p, hw) for p in plans]  # the context (and layers) it picks
    rows = [replace(row, decode=_decode(arch, p, rates, offload_host(p, hw)) if rates else
                    DecodeCell(unavailable=how)) for row, p in zip(rows, runs, strict=True)]
    fitting = precision_that_fits(arch, unit.as_run(arch, plan, hw), hw)
    return CheckAnswer(model, arch, hw, plan, rows, fitting,
                       (*refused, *ignored_options(plan)), how)


def _decode(arch: Architecture, plan: InferencePlan, rates: DeviceRates,
            host: DeviceRates | None = None) -> DecodeCell:
    """One decode step of the plan under its runtime (the layers past --gpu-layers on
    `host`, as infer runs them), with its 80% interval; or why the runtime cannot run this
    precision."""
    try:
        t = estimate_inference_time(arch, plan, rates, host=host)
    except GpuwiseError as exc:
        return DecodeCell(unavailable=str(exc))
    iv = t.interval("decode")
    low, high = iv.around(t.decode_s_per_token) if iv else (None, None)
    return DecodeCell(t.decode_s_per_token, low, high, t.tokens_per_s, t.kernel, t.source,
                      tuple(t.missing))
