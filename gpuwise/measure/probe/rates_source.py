"""Which rates a time estimate uses: this machine's probe (`measured`) when the estimate is
for the local machine and a trusted probe profile exists (gpuwise.measure.probe.trusted), else
the catalogue's datasheet (`spec`), saying why the profile was not used."""

from __future__ import annotations

from typing import Any

from gpuwise.catalog.hardware import Hardware
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.speed.device_rates import (
    DeviceRates,
    rates_from_measurements,
    rates_from_spec,
)
from gpuwise.measure.probe.kernels import slow_first_touch
from gpuwise.measure.probe.profile import STEADY, largest_move
from gpuwise.measure.probe.run import BUSY_NOTE
from gpuwise.measure.probe.trusted import local_profile


def rates_for(hw: Hardware) -> tuple[DeviceRates | None, str]:
    """(rates, how they were chosen); rates is None with the reason when none are known.
    A saved profile that was not used (unreadable, malformed, implausible readings) and a newer
    probe set aside are said in `how`, whichever rates are used."""
    remarks: tuple[str, ...] = ()
    if hw.source == "detected":
        local = local_profile()
        remarks = local.remarks
        if local.profile is not None:
            try:
                measured = profile_rates(local.profile, hw)
            except ValueError as exc:  # a record the schema let through but the reader refused
                measured, remarks = None, (f"the saved probe profile was not used: {exc}", *remarks)
            if measured is not None:
                return measured, "; ".join((_measured_how(local.profile), *remarks))
    try:
        rates = rates_from_spec(hw)
    except GpuwiseError as exc:
        return None, "; ".join((*remarks, f"{exc.message}: {exc.hint}"))
    how = "datasheet values with default efficiencies"
    return rates, how + (f" ({'; '.join(remarks)})" if remarks else "")


def _measured_how(profile: Any) -> str:
    """'measured by `gpuwise probe` on this machine', with what the profile warns of: the
    machine changing speed while it was probed, slow first touch, other processes busy."""
    said = "measured by `gpuwise probe` on this machine"
    moved = largest_move(getattr(profile, "steadiness", None) or {})
    if moved > STEADY:
        said += f", which changed speed by {moved:.0%} while it was probed"
    slow_touch = slow_first_touch((getattr(profile, "kernels", None) or {}).get("fresh") or {})
    if slow_touch:  # what the charged page faults may miss
        said += f"; {slow_touch}: page faults are charged at the faster rate"
    busy = [n.split(";")[0] for n in profile.notes if n.startswith(BUSY_NOTE)]
    return "; ".join((said, *busy[:1]))


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
        getattr(profile, "runtime", None), getattr(profile, "kernels", None),
        (getattr(profile, "llama_cpp", None) or {}).get("rates"))
