"""Cost assumptions (data/costs.toml): electricity, PUE, depreciation, hosting, power, CO2.

Every assumption carries its source and date; a user override replaces the value and the
source becomes "your --flag".
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Any

from gpuwise.catalog.toml_cache import parsed_toml
from gpuwise.errors import GpuwiseError

SCALARS = ("electricity_usd_per_kwh", "pue", "depreciation_years", "hosting_usd_per_kw_month",
           "ops_usd_per_device_year", "idle_power_fraction", "busy_power_fraction",
           "memory_power_fraction", "grid_gco2_per_kwh", "reserved_discount")
# (low, high) accepted for each override; fractions are 0-1.
LIMITS = {
    "electricity_usd_per_kwh": (0.0, 10.0), "pue": (1.0, 5.0), "depreciation_years": (0.1, 30.0),
    "hosting_usd_per_kw_month": (0.0, 1e5), "ops_usd_per_device_year": (0.0, 1e7),
    "idle_power_fraction": (0.0, 1.0), "busy_power_fraction": (0.0, 1.5),
    "memory_power_fraction": (0.0, 1.5),
    "grid_gco2_per_kwh": (0.0, 2000.0), "reserved_discount": (0.0, 0.99),
    "host_power_fraction": (0.0, 10.0), "host_price_fraction": (0.0, 10.0),
}


@dataclass(frozen=True)
class Assumption:
    """One assumption as used: its value, where it came from and when."""

    name: str
    value: float
    source: str
    date: str
    flag: str


@dataclass(frozen=True)
class CostAssumptions:
    """The numbers a cost estimate rests on. Host fractions are keyed by device kind."""

    electricity_usd_per_kwh: float
    pue: float
    depreciation_years: float
    hosting_usd_per_kw_month: float
    ops_usd_per_device_year: float
    idle_power_fraction: float
    busy_power_fraction: float
    memory_power_fraction: float
    grid_gco2_per_kwh: float
    reserved_discount: float
    host_power_fraction: dict[str, float] = field(default_factory=dict)
    host_price_fraction: dict[str, float] = field(default_factory=dict)
    sources: dict[str, Assumption] = field(default_factory=dict)
    site: str | None = None  # where owned devices run (--site); None: each device's own

    def host_power(self, kind: str) -> float:
        return self.host_power_fraction.get(kind, self.host_power_fraction.get("gpu", 0.0))

    def host_price(self, kind: str) -> float:
        return self.host_price_fraction.get(kind, self.host_price_fraction.get("gpu", 0.0))

    def listed(self) -> list[Assumption]:
        """Every assumption with its source, in a stable order (for the output)."""
        return list(self.sources.values())


@cache
def _data() -> dict[str, Any]:
    text = resources.files("gpuwise.catalog").joinpath("data/costs.toml").read_text()
    return parsed_toml(text, "costs")


def load_costs() -> CostAssumptions:
    """The catalogue's default assumptions."""
    data = _data()
    values: dict[str, Any] = {k: float(data[k]["value"]) for k in SCALARS}
    sources = {k: Assumption(k, values[k], data[k]["source"], data[k]["date"], data[k]["flag"])
               for k in SCALARS}
    host = data["host"]
    for key, flag in (("power_fraction", "--host-power-fraction"),
                      ("price_fraction", "--host-price-fraction")):
        for kind, rec in host.items():
            name = f"host_{key}[{kind}]"
            sources[name] = Assumption(name, float(rec[key]), rec["source"], rec["date"], flag)
    return CostAssumptions(
        **values,
        host_power_fraction={k: float(v["power_fraction"]) for k, v in host.items()},
        host_price_fraction={k: float(v["price_fraction"]) for k, v in host.items()},
        sources=sources,
    )


def _checked(name: str, value: float, flag: str) -> float:
    low, high = LIMITS[name]
    if not low <= value <= high:  # NaN too
        raise GpuwiseError(f"{name.replace('_', ' ')} must be between {low:g} and {high:g}, "
                           f"got {value:g} ({flag})", f"check the value given to {flag}")
    return value


def with_overrides(base: CostAssumptions, **overrides: float | None) -> CostAssumptions:
    """`base` with the user's values (None: keep the default), each range-checked."""
    changes: dict[str, Any] = {}
    sources = dict(base.sources)
    for name, value in overrides.items():
        if value is None:
            continue
        if name in ("host_power_fraction", "host_price_fraction"):
            value = _checked(name, float(value), "--" + name.replace("_", "-"))
            kinds = getattr(base, name)
            changes[name] = {kind: value for kind in kinds}
            for kind in kinds:
                old = sources[f"{name}[{kind}]"]
                sources[old.name] = replace(old, value=value, source=f"your {old.flag}", date="")
            continue
        old = sources[name]
        changes[name] = value = _checked(name, float(value), old.flag)
        sources[name] = replace(old, value=value, source=f"your {old.flag}", date="")
    return replace(base, **changes, sources=sources)


SITES = ("home", "datacentre")
SITE_FIELDS = ("pue", "hosting_usd_per_kw_month", "electricity_usd_per_kwh")


def at_site(a: CostAssumptions, site: str) -> CostAssumptions:
    """`a` for an owned device at `site`: a data centre's are `a` itself; a home's replace the
    PUE, hosting and electricity price (costs.toml [site.home]) where no flag gave them."""
    if site != "home":
        return a
    rec = _data()["site"]["home"]
    changes: dict[str, Any] = {}
    sources = dict(a.sources)
    for name in SITE_FIELDS:
        old = sources[name]
        if old.source.startswith("your "):
            continue  # the user's value wins
        changes[name] = float(rec[name])
        sources[name] = replace(old, value=float(rec[name]), source=f"home: {rec['source']}",
                                date=rec["date"])
    return replace(a, **changes, sources=sources)
