"""`gpuwise models` and `gpuwise hardware`: the catalogues, with what each model comes to."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwise.catalog.hardware import Hardware, load_hardware
from gpuwise.catalog.models import ModelEntry, load_models
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


def hardware() -> tuple[Hardware, ...]:
    """Every catalogue device, spec values with their sources."""
    return load_hardware()
