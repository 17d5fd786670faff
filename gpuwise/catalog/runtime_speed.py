"""How each runtime turns work into time (data/runtime_speed.toml): its dispatch, fusion and
per-step costs, llama.cpp's backends by ggml type, and the weight-only kernels, every value
with its source."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from gpuwise.catalog.sourced import data_file, sourced_record, sourced_section
from gpuwise.errors import GpuwiseError, unknown_name_error

FILE = "runtime_speed.toml"


def _runtime_sections() -> dict[str, str]:
    """The name `--runtime` takes for each runtime's section of the data file (every table
    with a time `model`): its key, or its `option` where a key cannot be it (one takes no
    dot). A new runtime is a section there and a unit in estimate/runtimes/."""
    return {table.get("option", key): key for key, table in data_file(FILE).items()
            if isinstance(table, dict) and "model" in table}


RUNTIME_IDS = _runtime_sections()
# llama.cpp's backend for each kind of device (hardware.toml `kind`).
GGML_BACKENDS = {"cpu": "cpu", "gpu": "cuda", "apple": "metal"}


@dataclass(frozen=True)
class RuntimeSpeed:
    """One runtime's time model settings (see the field notes atop data/runtime_speed.toml)."""

    id: str
    name: str
    model: str  # "roofline" or "ggml"
    dispatch: str  # "eager" or "graphs"
    fused: bool
    devices: list[str]
    training: bool
    step_s: dict[str, float]
    prefill_matmul: float
    attention_memory: float
    kernels: dict[str, str]
    # Mixture of experts: the share of the dense kernel's weight streaming rate the routed
    # experts' grouped kernel reaches, and seconds per sparse layer a step for its routing
    # kernels (top-k, sorting tokens by expert, the weighted sum) beyond their launches.
    expert_memory: float = 1.0
    moe_layer_s: float = 0.0
    option: str = ""  # the `--runtime` name where the section's key cannot be it
    sources: dict[str, str] = field(default_factory=dict, repr=False)

    def check_device(self, kind: str, device: str) -> None:
        """One line where the runtime has no backend for this kind of device."""
        if kind not in self.devices:
            runs = [rid for rid in RUNTIME_IDS if kind in runtime_speed(rid).devices]
            raise GpuwiseError(f"{self.id} does not run on {device} ({kind}): it runs on "
                               f"{', '.join(self.devices)}",
                               f"on a {kind}, --runtime {' or '.join(runs)}")


@dataclass(frozen=True)
class GgmlBackend:
    """llama.cpp on one backend: per ggml type, the share of the datasheet bandwidth token
    generation reaches and the share of the matrix peak prompt processing reaches."""

    backend: str
    memory: dict[str, float]
    matmul: dict[str, float]
    token_s: float
    kernel_s: float
    nodes_per_layer: int
    core_bandwidth_gbs: float
    # Per compute unit per cycle, by ggml type: what the kernels reach where the bandwidth
    # or the peak would allow more ({}: no such limit).
    unit_bytes_per_cycle: dict[str, float]
    unit_flops_per_cycle: dict[str, float]
    # Where decode steps are not measured (a CPU not probed): shares of prompt processing's
    # matmul rate ("batch_matmul": a 4-token decode step's; "decode_attention",
    # "batch_attention", "prompt_attention": of the f16 rate). {}: a batch costs about one
    # token's time and attention runs at the matmul rate (GPUs).
    decode_shares: dict[str, float] = field(default_factory=dict)
    # Share of the type's token-generation rate the routed experts' MUL_MAT_ID streams at.
    expert_memory: float = 1.0
    sources: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class GgmlLike:
    """A ggml type without constants of its own: timed at `like`'s, token generation's rate
    times `memory` and prompt processing's times `matmul` ([ggml.like])."""

    like: str
    memory: float
    matmul: float
    source: str = field(default="", repr=False)


@dataclass(frozen=True)
class WeightKernel:
    """A weight-only (or W8A8) kernel: how fast it streams packed weights in a one-row matmul
    and how much of the matmul rate it reaches with many rows."""

    id: str
    name: str
    decode_memory: float
    prefill_matmul: float
    peak: str  # "compute" or the dtype whose peak a prefill runs at
    sources: dict[str, str] = field(default_factory=dict, repr=False)


def runtime_names() -> list[str]:
    return list(RUNTIME_IDS)


@cache
def runtime_speed(name: str) -> RuntimeSpeed:
    """The settings of a runtime by its `--runtime` name; "did you mean" where unknown."""
    if name not in RUNTIME_IDS:
        raise unknown_name_error("runtime", name, list(RUNTIME_IDS), "gpuwise infer --help")
    return sourced_record(RuntimeSpeed, FILE, RUNTIME_IDS[name], id=name)


@cache
def ggml_backend(kind: str) -> GgmlBackend:
    backend = GGML_BACKENDS.get(kind, "cuda")
    return sourced_record(GgmlBackend, FILE, f"ggml.{backend}", backend=backend)


@cache
def ggml_like() -> dict[str, GgmlLike]:
    """The ggml types timed as another, by type."""
    values, sources = sourced_section(FILE, "ggml.like")
    return {t: GgmlLike(str(v[0]), float(v[1]), float(v[2]), sources[t])
            for t, v in values.items()}


def kernel_names() -> list[str]:
    return list(data_file(FILE)["kernel"])


@cache
def weight_kernel(name: str) -> WeightKernel:
    if name not in data_file(FILE)["kernel"]:
        raise unknown_name_error("quantised kernel", name, kernel_names(), "gpuwise infer --help")
    return sourced_record(WeightKernel, FILE, f"kernel.{name}", id=name)
