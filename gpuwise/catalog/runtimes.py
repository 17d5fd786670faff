"""Runtime overheads (data/runtimes.toml) and the activation profiles of each family."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any


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
    rec = tomllib.loads(text)[key]
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
}  # fmt: skip


def activation_profile(model_type: str, mode: str, attention: str, checkpointing: bool,
                       dropout: bool) -> tuple[dict[str, Any], str]:  # fmt: skip
    """The saved-tensor profile for a family, and the attention it actually uses."""
    family = PROFILE_FAMILY.get(model_type, "llama")
    mode = {"fp16": "bf16", "mixed-fp16": "mixed-bf16"}.get(mode, mode)
    if attention == "flash":
        attention = "sdpa"  # flash keeps no score matrix either; sdpa's profile stands in
    profiles = _profiles()["profiles"]

    def key(att: str) -> str:
        return (f"{family}/{mode}/{att}/{'ckpt' if checkpointing else 'full'}/"
                f"{'dropout' if dropout else 'nodropout'}")  # fmt: skip

    prof = profiles[key(attention)]
    if "unsupported" in prof:
        attention = "eager"
        prof = profiles[key(attention)]
    return prof, attention


def profile_runtime() -> str:
    return str(_profiles().get("runtime", ""))


@cache
def _op_counts() -> dict[str, Any]:
    path = resources.files("gpuwise.catalog").joinpath("data/op_counts.json")
    return json.loads(path.read_text())["counts"]


def op_counts(model_type: str, mode: str, attention: str) -> dict[str, dict[str, int]]:
    """Aten ops per layer and per model that transformers dispatches, by phase."""
    family = PROFILE_FAMILY.get(model_type, "llama")
    mode = {"fp16": "bf16", "mixed-fp16": "mixed-bf16"}.get(mode, mode)
    if attention == "flash":
        attention = "sdpa"
    counts = _op_counts()
    entry = counts.get(f"{family}/{mode}/{attention}", {})
    if "unsupported" in entry or not entry:
        entry = counts[f"{family}/{mode}/eager"]
    return entry
