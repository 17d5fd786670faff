"""The optimizers gpuwise models (data/optimizers.toml): states per parameter, passes of a
step over parameter-sized tensors, and the step's temporaries, every value with its source."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from gpuwise.catalog.sourced import data_file, sourced_record

FILE = "optimizers.toml"


@dataclass(frozen=True)
class OptimizerSpec:
    """One optimizer as its library runs it. Passes are by probed kernel ("binary", "sqrt",
    "div"): full read-or-write sweeps over a parameter-sized tensor of the state dtype."""

    name: str
    states_per_param: int  # full states, in units of the state dtype's size
    passes_fused: dict[str, float]  # fused or foreach kernels (an accelerator)
    passes_loop: dict[str, float]  # the single-tensor loop (a CPU)
    step_temporaries_foreach: int  # parameter-sized temporaries of every tensor at once
    step_temporaries_loop: int  # ... of the largest tensor, one tensor at a time
    factored: bool = False  # a factored second moment (rows + columns), no full state
    quantised_states: int = 0  # 8-bit states, each with an fp32 absmax per block
    quantised_state_bytes: int = 0
    quantisation_block: int = 0
    paged: bool = False  # states in unified memory outside PyTorch's pool (bitsandbytes paged)
    sources: dict[str, str] = field(default_factory=dict, repr=False)

    def passes(self, device_kind: str) -> dict[str, float]:
        """The step's passes on this kind of device: a CPU runs the single-tensor loop."""
        return self.passes_loop if device_kind == "cpu" else self.passes_fused


@cache
def optimizers() -> dict[str, OptimizerSpec]:
    """Every optimizer in the catalogue, by name."""
    return {name: sourced_record(OptimizerSpec, FILE, name, name=name) for name in data_file(FILE)}


def optimizer_spec(name: str) -> OptimizerSpec:
    return optimizers()[name]
