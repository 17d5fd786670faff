"""What kernels, attention implementations and compute dtypes need of a device
(data/capabilities.toml), read once. The device's side is in hardware.toml; the check of a plan
against both is estimate/capability.py."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

from gpuwise.catalog.toml_cache import parsed_toml


@dataclass(frozen=True)
class Needs:
    """What one kernel, attention or dtype needs, and what runs in its place elsewhere."""

    kind: str  # "dtype", "kernel", "attention" or "ggml" (a GGUF block type)
    id: str
    vendors: tuple[str, ...] = ()  # empty: any
    kinds: tuple[str, ...] = ()  # empty: any
    min_cc: float = 0.0  # NVIDIA compute capability
    max_cc: float = 0.0  # the highest it runs on (0: no limit)
    matmul: str = ""  # the matrix-unit dtype it computes in
    instead: str = ""
    source: str = ""


@cache
def _needs() -> dict[tuple[str, str], Needs]:
    text = resources.files("gpuwise.catalog").joinpath("data/capabilities.toml").read_text()
    out = {}
    for kind, table in parsed_toml(text, "capabilities").items():
        for name, rec in table.items():
            sources = rec.get("sources", {})
            out[(kind, name)] = Needs(kind, name, tuple(rec.get("vendors", ())),
                                      tuple(rec.get("kinds", ())), float(rec.get("min_cc", 0.0)),
                                      float(rec.get("max_cc", 0.0)), rec.get("matmul", ""),
                                      rec.get("instead", ""), sources.get("*", ""))
    return out


def needs(kind: str, name: str) -> Needs | None:
    """What `name` (a "dtype", "kernel", "attention" or "ggml" type) needs; None: nothing beyond
    its runtime."""
    return _needs().get((kind, name))
