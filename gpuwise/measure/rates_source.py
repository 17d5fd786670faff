"""Which rates a time estimate uses: this machine's probe (`measured`) when the estimate is
for the local machine and a probe profile exists, else the catalogue's datasheet (`spec`)."""

from __future__ import annotations

from gpuwise.catalog.hardware import Hardware
from gpuwise.estimate.rates import DeviceRates, rates_from_spec
from gpuwise.helpers import GpuwiseError


def rates_for(hw: Hardware) -> tuple[DeviceRates | None, str]:
    """(rates, how they were chosen); rates is None with the reason when none are known."""
    if hw.source == "detected":
        measured = _measured(hw)
        if measured is not None:
            return measured, "measured by `gpuwise probe` on this machine"
    try:
        return rates_from_spec(hw), "datasheet values with default efficiencies"
    except GpuwiseError as exc:
        return None, f"{exc.message}: {exc.hint}"


def _measured(hw: Hardware) -> DeviceRates | None:
    try:
        from gpuwise.measure.profile_store import load_profile
    except ImportError:
        return None
    profile = load_profile()
    if profile is None:
        return None
    return profile_rates(profile, hw)


def profile_rates(profile: object, hw: Hardware) -> DeviceRates | None:
    """Turn a probe profile into rates (None when it lacks bandwidth or matmul readings)."""
    from gpuwise.estimate.rates import rates_from_measurements

    bandwidth = getattr(profile, "triad_bytes_per_s", None)
    curves = getattr(profile, "matmul_curves", None)
    overhead = getattr(profile, "op_overhead_s", None)
    if not bandwidth or not curves or overhead is None:
        return None
    return rates_from_measurements(hw, bandwidth, curves(), overhead, overhead / 3)
