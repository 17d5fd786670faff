"""Runtime overheads (data/runtimes.toml) and the activation profiles of each family."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from gpuwise.catalog.sourced import sourced_section
from gpuwise.catalog.stacks import stack_value
from gpuwise.catalog.toml_cache import parsed_toml


@dataclass(frozen=True)
class Runtime:
    id: str
    name: str
    baseline_bytes: int
    baseline_source: str
    allocator_fraction: float
    optimizer_foreach: bool


@cache
def runtime(device_kind: str) -> Runtime:
    """The transformers runtime on a CPU ("cpu") or an accelerator (anything else)."""
    key = "transformers-cpu" if device_kind == "cpu" else "transformers-cuda"
    text = resources.files("gpuwise.catalog").joinpath("data/runtimes.toml").read_text()
    rec = parsed_toml(text, "runtimes")[key]
    return Runtime(id=key, **rec)


@cache
def _profiles() -> dict[str, Any]:
    path = resources.files("gpuwise.catalog").joinpath("data/activation_profiles.json")
    return json.loads(path.read_text())


# Families whose layer is laid out like another profiled family.
PROFILE_FAMILY = {
    "llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "gemma": "gemma2",
    "gemma2": "gemma2", "phi": "phi", "phi3": "phi3", "gpt_neox": "gpt_neox", "gpt2": "gpt2",
    "gpt_bigcode": "gpt_bigcode", "falcon": "falcon", "mixtral": "mistral",
    "qwen2_moe": "qwen2", "deepseek_v2": "llama", "deepseek_v3": "llama",
    # families without a measured profile of their own: the measured family whose decoder
    # layer saves the same tensors (activation_profiles.json), said in the answer's note
    "qwen3": "qwen2", "qwen3_moe": "qwen2", "gemma3_text": "gemma2", "phimoe": "phi3",
}


def profile_family(model_type: str) -> str:
    """The measured family whose saved-tensor profile a family's training memory uses."""
    return PROFILE_FAMILY.get(model_type, "llama")


def activation_profile(model_type: str, mode: str, attention: str, checkpointing: bool,
                       dropout: bool) -> tuple[dict[str, Any], str]:
    """The saved-tensor profile for a family, and the attention it actually uses."""
    family = profile_family(model_type)
    mode = {"fp16": "bf16", "mixed-fp16": "mixed-bf16"}.get(mode, mode)
    if attention == "flash":
        attention = "sdpa"  # flash keeps no score matrix either; sdpa's profile stands in
    profiles = _profiles()["profiles"]

    def key(att: str) -> str:
        return (f"{family}/{mode}/{att}/{'ckpt' if checkpointing else 'full'}/"
                f"{'dropout' if dropout else 'nodropout'}")

    prof = profiles[key(attention)]
    if "unsupported" in prof:
        attention = "eager"
        prof = profiles[key(attention)]
    return prof, attention


def compiled_layer_profile(model_type: str, mode: str, attention: str,
                           dropout: bool) -> dict[str, float] | None:
    """Bytes per unit of each term that one decoder layer saves under torch.compile
    (AOTAutograd's min-cut partitioner, data/stacks.toml [compiled_layer]), for the families
    and settings the rules cover; None elsewhere (the eager profile stands in). Weight copies
    under autocast are the eager profile's: the partitioner saves each cast weight once, as
    autograd does."""
    family = profile_family(model_type)
    mode = {"fp16": "bf16", "mixed-fp16": "mixed-bf16"}.get(mode, mode)
    if family not in stack_value("compiled_layer", "families") or dropout:
        return None
    if attention not in ("sdpa", "flash"):  # eager's b x h x s x s path is not covered
        return None
    compute = 4.0 if mode == "fp32" else 2.0
    stream = 2.0 if mode == "bf16" else 4.0  # autocast keeps the residual stream in fp32
    width = {"stream": stream, "compute": compute, "fp32": 4.0}
    prof: dict[str, float] = {}
    for key, count in sourced_section("stacks.toml", "compiled_layer")[0].items():
        if key != "families":
            kind, term = key.split("_", 1)
            prof[term] = prof.get(term, 0.0) + count * width[kind]
    eager, _ = activation_profile(model_type, mode, attention, False, dropout)
    if "weight_cast" in eager["per_layer"]:
        prof["weight_cast"] = eager["per_layer"]["weight_cast"]
    return prof


@cache
def _op_counts() -> dict[str, Any]:
    path = resources.files("gpuwise.catalog").joinpath("data/op_counts.json")
    return json.loads(path.read_text())["counts"]


def op_counts(model_type: str, mode: str, attention: str) -> dict[str, dict[str, int]]:
    """Aten ops per layer and per model that transformers dispatches, by phase."""
    family = profile_family(model_type)
    mode = {"fp16": "bf16", "mixed-fp16": "mixed-bf16"}.get(mode, mode)
    if attention == "flash":
        attention = "sdpa"
    counts = _op_counts()
    entry = counts.get(f"{family}/{mode}/{attention}", {})
    if "unsupported" in entry or not entry:
        entry = counts[f"{family}/{mode}/eager"]
    return entry
