"""Which rates a time estimate uses: this machine's probe (`measured`) when the estimate is
for the local machine and a probe profile exists, else the catalogue's datasheet (`spec`)."""

from __future__ import annotations

from typing import Any

from gpuwise.catalog.hardware import Hardware
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.speed.device_rates import (
    DeviceRates,
    rates_from_measurements,
    rates_from_spec,
)
from gpuwise.measure.probe import store
from gpuwise.measure.probe.kernels import slow_first_touch
from gpuwise.measure.probe.profile import STEADY, largest_move


def rates_for(hw: Hardware) -> tuple[DeviceRates | None, str]:
    """(rates, how they were chosen); rates is None with the reason when none are known."""
    if hw.source == "detected":
        measured, moved, slow_touch = _measured(hw)
        if measured is not None:
            said = "measured by `gpuwise probe` on this machine"
            if moved > STEADY:
                said += f", which changed speed by {moved:.0%} while it was probed"
            if slow_touch:  # what the charged page faults may miss
                said += f"; {slow_touch}: page faults are charged at the faster rate"
            return measured, said
    try:
        return rates_from_spec(hw), "datasheet values with default efficiencies"
    except GpuwiseError as exc:
        return None, f"{exc.message}: {exc.hint}"


def _measured(hw: Hardware) -> tuple[DeviceRates | None, float, str]:
    """The profile's rates, how far its headline rates moved while it was probed, and
    whether first touch slowed with memory in use."""
    profile = store.load_profile()
    if profile is None:
        return None, 0.0, ""
    fresh = (getattr(profile, "kernels", None) or {}).get("fresh") or {}
    return (profile_rates(profile, hw), largest_move(getattr(profile, "steadiness", None) or {}),
            slow_first_touch(fresh))  # fmt: skip


def profile_rates(profile: Any, hw: Hardware) -> DeviceRates | None:
    """Turn a probe profile into rates (None when it lacks bandwidth or matmul readings).

    Matmul curves use each point's median time (what a run sees), not its best; the per-op
    cost is the tiny `add`'s time, and a view (no kernel) is taken as a third of it.
    """
    triad = profile.bandwidth_gbs("triad")
    overhead = profile.overhead_s.get("add")
    square: dict[str, list[tuple[float, float]]] = {}
    rows: dict[str, list[tuple[float, float]]] = {}
    for p in profile.matmul_points:
        flops = 2.0 * p.m * p.n * p.k
        rate = flops / p.median_s
        if p.m == p.n == p.k:  # size curve: small matrices waste the machine
            square.setdefault(p.dtype, []).append((flops, rate))
        elif p.n == p.k == 4096:  # rows curve: a big weight against few rows is skinny
            rows.setdefault(p.dtype, []).append((float(p.m), rate))
    if not triad or not square or overhead is None:
        return None
    return rates_from_measurements(
        hw, triad * 1e9, {k: tuple(sorted(v)) for k, v in square.items()}, overhead,
        overhead / 3, {k: tuple(sorted(v)) for k, v in rows.items()},
        getattr(profile, "runtime", None), getattr(profile, "kernels", None))  # fmt: skip
