"""The roofs of a roofline plot: a device's memory rate and compute peaks, from its datasheet
(`spec`) and, where `--on local` has a trusted probe, as measured here (`measured`) - the
same rates the time estimates use (gpuwise.measure.probe.rates_source)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwise.catalog.hardware import Hardware
from gpuwise.estimate.speed.device_rates import DTYPE_PEAK_KEY
from gpuwise.measure.probe.rates_source import rates_for


@dataclass(frozen=True)
class Roof:
    """One set of roofs: bytes/s from memory and FLOP/s by dtype."""

    source: str  # "spec" or "measured"
    label: str  # what it is, for a legend: "H100 SXM datasheet", "probe of this machine"
    bandwidth_bytes_per_s: float
    peak_flops: dict[str, float] = field(default_factory=dict)


def spec_roof(hw: Hardware) -> Roof | None:
    """The datasheet's roofs (None where the device has no speed figures)."""
    if not hw.memory_bandwidth_gbs or not hw.peak_tflops:
        return None
    return Roof("spec", f"{hw.name} datasheet", hw.memory_bandwidth_gbs * 1e9,
                {k: v * 1e12 for k, v in hw.peak_tflops.items() if v})


def roofs_for(hw: Hardware) -> tuple[Roof, ...]:
    """The datasheet's roofs and, where the estimates use this machine's probe, the measured
    ones (triad bandwidth; the fastest matmul the probe timed of each dtype, median times)."""
    roofs = [r for r in (spec_roof(hw),) if r is not None]
    rates, _ = rates_for(hw)
    if rates is not None and rates.source == "measured":
        peaks = {k: max(r for _, r in v) for k, v in rates.matmul_curves.items() if v}
        roofs.append(Roof("measured", "probe of this machine", rates.bandwidth_bytes_per_s, peaks))
    return tuple(roofs)


def compute_dtype(precision: str) -> str:
    """The dtype whose peak a plan's matmuls run at: int8/int4 weights compute in bf16."""
    name = precision.removeprefix("mixed-")
    return DTYPE_PEAK_KEY.get(name, "bf16")


def catalogue_roof(spec_id: str | None) -> Roof | None:
    """The datasheet roofs of the catalogue entry a probe compared itself with."""
    if not spec_id:
        return None
    from gpuwise.catalog.hardware import find_hardware
    from gpuwise.errors import GpuwiseError

    try:
        return spec_roof(find_hardware(spec_id))
    except GpuwiseError:
        return None
