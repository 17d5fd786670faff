"""Default efficiencies of each kind of device and the time model's rules for a training step
(data/efficiency.toml), every value with its source."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from gpuwise.catalog.sourced import data_file, sourced_record

FILE = "efficiency.toml"
RULES = "time_model"


@dataclass(frozen=True)
class DeviceEfficiency:
    """What share of its datasheet a device of one kind reaches, and its fixed costs, where
    this machine was not probed. Fractions are of the datasheet's peak or bandwidth."""

    kind: str
    matmul_max: float  # of the dense peak, for large matmuls
    tile: int  # output tile per compute unit per wave (rows and columns)
    min_rows: int  # rows below which a matmul leaves the matrix units idle
    split_k_min: int  # K a split-K GEMM gives each compute unit at least (0: none)
    memory: float  # of the memory bandwidth
    vector: float  # of the fp32 peak, for elementwise math
    op_overhead_s: float  # eager dispatch and launch per kernel
    view_overhead_s: float  # eager dispatch per view op (no kernel)
    kernel_latency_s: float  # device-side cost per kernel, back to back
    interconnect: float  # of the link's one-way bandwidth
    collective_latency_s: float  # one small all-reduce
    # transformers' own cost per dispatched op and fixed cost per step, by phase
    runtime_op_s: dict[str, float] = field(default_factory=dict)
    runtime_step_s: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class TimeModelRules:
    """How a training step relates to its forward pass, and how views count in dispatch."""

    backward_scale: float  # a backward's work against its forward's
    frozen_base_backward_scale: float  # the same with frozen base weights (LoRA, QLoRA)
    backward_dispatch_per_forward: int  # ops the backward dispatches per forward op
    runtime_views_per_op: int  # views dispatched in the time of one op (measured runtime cost)
    sources: dict[str, str] = field(default_factory=dict, repr=False)


@cache
def device_efficiency(kind: str) -> DeviceEfficiency:
    """The defaults for a kind of device ("gpu", "cpu", "tpu", "apple"); a kind the
    catalogue does not list reads the GPU's."""
    if kind not in data_file(FILE) or kind == RULES:
        kind = "gpu"
    return sourced_record(DeviceEfficiency, FILE, kind, kind=kind)


@cache
def time_model_rules() -> TimeModelRules:
    return sourced_record(TimeModelRules, FILE, RULES)
