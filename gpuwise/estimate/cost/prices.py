"""What a deployment costs: owned, rented on demand, reserved, or a hosted API. Pure formulas.

Conventions (docs/cost.md states them with the formulas):
- a month is 730 hours (8760 / 12);
- utilisation u is the share of a month's hours a device is busy; a busy device draws
  TDP x busy fraction, an idle one TDP x idle fraction, and the server around it adds the
  host power fraction; PUE scales IT power to power at the wall;
- owned hardware is paid for every hour (depreciation, hosting, ops) and powered every hour;
  on-demand rental is paid for the hours it is held; reserved for every hour at a discount.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuwise.catalog.costs import CostAssumptions
from gpuwise.catalog.hardware import Hardware
from gpuwise.units import HOURS_PER_MONTH

MODES = ("owned", "on-demand", "reserved")


@dataclass(frozen=True)
class Usage:
    """How a workload uses one option's devices in a month."""

    devices: int
    busy_hours: float  # per device, per month
    held_hours: float  # per device, per month, that a rental is held (paid)
    tokens: float  # per month (prompt + generated for inference; trained for training)
    requests: float = 0.0  # per month (0 for training)

    @property
    def utilisation(self) -> float:
        """Busy share of the month's hours, per device."""
        return self.busy_hours / HOURS_PER_MONTH


@dataclass(frozen=True)
class OptionCost:
    """One option's monthly cost, power and energy. None: not known (e.g. no TDP)."""

    mode: str  # owned | on-demand | reserved | api
    usd_per_month: float
    breakdown_usd: dict[str, float]
    wall_kw: float | None  # provisioned: every device busy, with the host and PUE
    kwh_per_month: float | None  # at the wall
    co2_kg_per_month: float | None
    tokens_per_month: float
    requests_per_month: float
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def usd_per_million_tokens(self) -> float:
        return cost_per_million(self.usd_per_month, self.tokens_per_month)

    @property
    def usd_per_1000_requests(self) -> float | None:
        return (
            self.usd_per_month / self.requests_per_month * 1000 if self.requests_per_month else None
        )

    @property
    def kwh_per_1000_requests(self) -> float | None:
        if self.kwh_per_month is None or not self.requests_per_month:
            return None
        return self.kwh_per_month / self.requests_per_month * 1000


def cost_per_million(usd_per_month: float, tokens_per_month: float) -> float:
    return usd_per_month / tokens_per_month * 1e6 if tokens_per_month > 0 else math.inf


def server_watts(hw: Hardware, a: CostAssumptions) -> tuple[float, float]:
    """(busy, idle) IT power of one device and its share of the server, in watts."""
    base = hw.tdp_w * (1 + a.host_power(hw.kind))
    return base * a.busy_power_fraction, base * a.idle_power_fraction


def wall_kw(hw: Hardware, devices: int, a: CostAssumptions) -> float | None:
    """Power to provision at the wall: every device busy, host included, times PUE."""
    if not hw.tdp_w:
        return None
    return devices * server_watts(hw, a)[0] * a.pue / 1000


def energy_kwh(hw: Hardware, usage: Usage, powered_hours: float,
               a: CostAssumptions) -> float | None:
    """Energy at the wall in a month: busy hours at busy power, the rest of the powered hours
    at idle power."""
    if not hw.tdp_w:
        return None
    busy_w, idle_w = server_watts(hw, a)
    busy = min(usage.busy_hours, powered_hours)
    per_device_wh = busy * busy_w + (powered_hours - busy) * idle_w
    return usage.devices * per_device_wh * a.pue / 1000


def owned_fixed_usd_per_month(hw: Hardware, a: CostAssumptions, price_usd: float | None = None
                              ) -> dict[str, float]:
    """What one owned device costs per month whether it works or not."""
    price = hw.list_price_usd if price_usd is None else price_usd
    capex = price * (1 + a.host_price(hw.kind)) / (a.depreciation_years * 12)
    it_kw = hw.tdp_w * (1 + a.host_power(hw.kind)) * a.busy_power_fraction / 1000
    return {"depreciation": capex, "hosting": a.hosting_usd_per_kw_month * it_kw,
            "ops": a.ops_usd_per_device_year / 12}


def owned_cost(hw: Hardware, usage: Usage, a: CostAssumptions,
               price_usd: float | None = None) -> OptionCost:
    """Owned: fixed costs per device plus electricity, powered all month."""
    parts = {k: v * usage.devices for k, v in owned_fixed_usd_per_month(hw, a, price_usd).items()}
    kwh = energy_kwh(hw, usage, HOURS_PER_MONTH, a)
    parts["electricity"] = (kwh or 0.0) * a.electricity_usd_per_kwh
    notes = () if kwh is not None else (f"{hw.name}: power not known, electricity not counted",)
    return _option("owned", parts, hw, usage, kwh, a, notes)


def rent_cost(hw: Hardware, usage: Usage, a: CostAssumptions, reserved: bool = False,
              rate_usd_per_hour: float | None = None) -> OptionCost:
    """Cloud rental: on demand for the held hours, or reserved for every hour at a discount.
    The provider's electricity is in the price; the energy figure is still reported."""
    rate = hw.cloud_usd_per_hour if rate_usd_per_hour is None else rate_usd_per_hour
    if reserved:
        hours, rate = HOURS_PER_MONTH, rate * (1 - a.reserved_discount)
    else:
        hours = usage.held_hours
    kwh = energy_kwh(hw, usage, hours, a)
    parts = {"rental": rate * hours * usage.devices}
    return _option("reserved" if reserved else "on-demand", parts, hw, usage, kwh, a, ())


def api_cost(input_tokens: float, output_tokens: float, usd_per_mtok_in: float,
             usd_per_mtok_out: float, requests: float) -> OptionCost:
    """A hosted API billed per million input and output tokens (prices given by the user)."""
    parts = {"api input": input_tokens / 1e6 * usd_per_mtok_in,
             "api output": output_tokens / 1e6 * usd_per_mtok_out}
    return OptionCost("api", sum(parts.values()), parts, None, None, None,
                      input_tokens + output_tokens, requests,
                      ("the vendor's latency, power and energy are not known",))


def _option(mode: str, parts: dict[str, float], hw: Hardware, usage: Usage, kwh: float | None,
            a: CostAssumptions, notes: tuple[str, ...]) -> OptionCost:
    co2 = kwh * a.grid_gco2_per_kwh / 1000 if kwh is not None else None
    return OptionCost(mode, sum(parts.values()), parts, wall_kw(hw, usage.devices, a), kwh, co2,
                      usage.tokens, usage.requests, notes)


def break_even_utilisation(hw: Hardware, a: CostAssumptions, price_usd: float | None = None,
                           rate_usd_per_hour: float | None = None) -> float | None:
    """The share h of a month's hours above which owning one device costs less than renting it
    on demand for those hours:

        owned(h) = F + e_idle + (e_busy - e_idle) h      rent(h) = r H h
        h* = (F + e_idle) / (r H - (e_busy - e_idle))

    F: fixed cost per month (depreciation, hosting, ops); e_busy, e_idle: electricity per month
    if busy, or idle, every hour; r: on-demand $/h; H: hours per month. Above 1 (or inf):
    renting is cheaper even when busy every hour. None: no purchase or rental price.
    """
    price = hw.list_price_usd if price_usd is None else price_usd
    rate = hw.cloud_usd_per_hour if rate_usd_per_hour is None else rate_usd_per_hour
    if price <= 0 or rate <= 0:
        return None
    fixed = sum(owned_fixed_usd_per_month(hw, a, price).values())
    busy_w, idle_w = server_watts(hw, a)
    per_w = a.pue * HOURS_PER_MONTH / 1000 * a.electricity_usd_per_kwh
    e_busy, e_idle = busy_w * per_w, idle_w * per_w
    denominator = rate * HOURS_PER_MONTH - (e_busy - e_idle)
    if denominator <= 0:
        return math.inf
    return (fixed + e_idle) / denominator
