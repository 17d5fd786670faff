"""This machine's memory read bandwidth, measured as the quick probe measures it (STREAM's read
over arrays 4x the last-level cache, best of 5 passes, or 256 MiB on a GPU), on the device the
torch experiments use; and the rates the time model uses here,
from this machine's probe profile (a quick probe is run and saved, as `gpuwise probe --quick`
would, where there is none)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuwise.app.claims.context import Context
from gpuwise.app.lookup import hardware_named
from gpuwise.app.probe import probe
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.measure.probe.backends import auto_backend
from gpuwise.measure.probe.measurements import Steps, attempt, measure_stream
from gpuwise.measure.probe.profile import DEFAULT_CACHE_BYTES, ProbePlan
from gpuwise.measure.probe.rates_source import rates_for
from gpuwise.measure.probe.trusted import local_profile


@dataclass(frozen=True)
class Bandwidth:
    read_gbs: float
    triad_gbs: float | None
    device: str  # what the probe's backend measured
    array_bytes: int


def measure_bandwidth() -> Bandwidth:
    """The read bandwidth of the device the experiments run on, now (about a second)."""
    backend = auto_backend()
    try:
        cache = attempt({}, "cache", backend.cache_bytes) or DEFAULT_CACHE_BYTES
        plan = ProbePlan.for_mode(True, cache, on_gpu=backend.name == "torch-cuda")
        missing: dict[str, str] = {}
        readings = {r.kind: r for r in measure_stream(backend, plan, None, missing, Steps(None, 1))}
        device = attempt({}, "device", backend.describe) or backend.name
    finally:
        attempt({}, "close", backend.close)
    read = readings.get("read")
    if read is None or not read.gbs:
        raise GpuwiseError("the memory bandwidth could not be measured: "
                           + (missing.get("bandwidth.read") or "no reading"),
                           "gpuwise probe says more")
    triad = readings.get("triad")
    return Bandwidth(read.gbs, triad.gbs if triad else None, device, read.array_bytes)


@dataclass(frozen=True)
class LocalRates:
    rates: DeviceRates
    how: str  # where they came from (rates_for's words)
    probed_now: bool  # a quick probe was run by this command
    probed_on: str = ""  # the probe profile's date (YYYY-MM-DD); "" for datasheet rates
    quick: bool = False  # the profile is a quick probe's


def local_rates(ctx: Context) -> LocalRates:
    """The rates of this machine's best device (measured once per run)."""
    return ctx.once("rates", _local_rates)  # type: ignore[no-any-return]


def _local_rates() -> LocalRates:
    hw = hardware_named("local")
    rates, how = rates_for(hw)
    if rates is not None and rates.source == "measured":
        return _with_profile(LocalRates(rates, how, False))
    probe(quick=True)
    rates, how = rates_for(hw)
    if rates is None:
        raise GpuwiseError(f"no rates for this machine ({how})", "run `gpuwise probe`")
    return _with_profile(LocalRates(rates, how, True))


def _with_profile(local: LocalRates) -> LocalRates:
    """The rates with the date of the probe they came from and whether it was a quick one."""
    if local.rates.source != "measured":
        return local
    profile = local_profile().profile
    if profile is None:
        return local
    return replace(local, probed_on=profile.created_at[:10], quick=profile.quick)
