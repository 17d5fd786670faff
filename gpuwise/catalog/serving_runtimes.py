"""Settings of the serving runtimes with their own memory rules (data/runtimes.toml)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any


@dataclass(frozen=True)
class LlamaCppRuntime:
    name: str
    ctx_pad: int
    n_ubatch: int
    kv_type: str
    flash_attention: bool
    kv_type_bytes: dict[str, float] = field(repr=False)
    baseline_bytes_cuda: int
    baseline_bytes_cpu: int
    baseline_source: str
    source: str


@dataclass(frozen=True)
class VllmRuntime:
    name: str
    gpu_memory_utilization: float
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    cuda_graph_bytes: int
    cuda_graph_source: str
    non_torch_bytes: int
    cuda_context_bytes: int
    source: str


@cache
def _sections() -> dict[str, Any]:
    text = resources.files("gpuwise.catalog").joinpath("data/runtimes.toml").read_text()
    return tomllib.loads(text)


@cache
def llama_cpp_runtime() -> LlamaCppRuntime:
    return LlamaCppRuntime(**_sections()["llama-cpp"])


@cache
def vllm_runtime() -> VllmRuntime:
    return VllmRuntime(**_sections()["vllm"])
