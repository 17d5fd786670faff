"""`gpuwise models` and `gpuwise hardware`: the catalogues, with what each model comes to."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwise.catalog.hardware import Hardware, load_hardware
from gpuwise.catalog.models import ModelEntry, load_models
from gpuwise.errors import GpuwiseError, did_you_mean
from gpuwise.workload import count_params, from_config


@dataclass(frozen=True)
class ModelRow:
    entry: ModelEntry
    params: int
    active_params: int
    attention: str


def models() -> list[ModelRow]:
    """Every catalogue model with its exact parameter counts and attention kind."""
    rows = []
    for e in load_models():
        arch = from_config(e.load_config(), e.id)
        counts = count_params(arch)
        rows.append(ModelRow(e, counts.total, counts.active, arch.attention_kind))
    return rows


def hardware(vendor: str | None = None, kind: str | None = None,
             min_memory_gib: float | None = None,
             max_price_usd: float | None = None) -> tuple[Hardware, ...]:
    """The catalogue's devices, spec values with their sources, in file order: every one, or
    those of a vendor, of a kind, with at least `min_memory_gib` of memory (as the
    table shows it, to 0.1 GiB: the MI300X's 191.98 is 192.0) and a list price of
    at most `max_price_usd` (a device not sold, list price 0, has none and is left out). A
    vendor or kind the catalogue lacks, a negative memory or a price not above 0 is refused."""
    devices = load_hardware()
    for option, value, field in (("--vendor", vendor, "vendor"), ("--kind", kind, "kind")):
        if value is None:
            continue
        choices = tuple(dict.fromkeys(getattr(hw, field) for hw in devices))
        if value.strip().lower() not in choices:
            close = did_you_mean(value.strip(), choices, 1)
            raise GpuwiseError(f"{option} {value!r}: no such {field} in the catalogue",
                               (f"did you mean {close[0]!r}? " if close else "")
                               + f"choose from {', '.join(choices)}")
    if min_memory_gib is not None and (min_memory_gib < 0 or min_memory_gib != min_memory_gib):
        raise GpuwiseError(f"--min-memory {min_memory_gib:g}: takes GiB, 0 or more",
                           "e.g. --min-memory 24 for devices of 24 GiB and over")
    if max_price_usd is not None and not max_price_usd > 0:
        raise GpuwiseError(f"--max-price {max_price_usd:g}: takes a list price in USD above 0",
                           "e.g. --max-price 2000")
    chosen = tuple(
        hw for hw in devices
        if (vendor is None or hw.vendor == vendor.strip().lower())
        and (kind is None or hw.kind == kind.strip().lower())
        and (min_memory_gib is None or round(hw.memory_gib, 1) >= min_memory_gib)
        and (max_price_usd is None or 0 < hw.list_price_usd <= max_price_usd))
    if not chosen:
        raise GpuwiseError("no catalogue device matches these filters",
                           "loosen one (`gpuwise hardware` lists every device)")
    return chosen
