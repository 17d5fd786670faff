"""Settings of the serving runtimes with their own memory rules (data/runtimes.toml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from gpuwise.catalog.toml_cache import parsed_toml


@dataclass(frozen=True)
class LlamaCppRuntime:
    """llama.cpp's memory settings and rules (data/runtimes.toml [llama-cpp] says where each
    is in llama.cpp's source)."""

    name: str
    ctx_pad: int
    n_ubatch: int
    fit_margin_bytes: int  # llama-server's --fit-target: free memory it leaves on a device
    fit_min_ctx: int  # --fit-ctx: the least context the fit cuts to
    kv_type: str
    flash_attention: bool
    legacy_graph: bool
    cpu_alignment: int
    gpu_alignment: int
    kv_type_bytes: dict[str, float] = field(repr=False)
    ggml_types: dict[str, tuple[int, int]] = field(repr=False)
    ftype_mix: dict[str, tuple[str, ...]] = field(repr=False)
    quant_fallback: dict[str, str] = field(repr=False)
    vec_dot_bytes: dict[str, float] = field(repr=False)
    repack_types: dict[str, dict[str, int]] = field(repr=False)
    amx_types: dict[str, int] = field(repr=False)
    amx_row_multiple: int
    amx_extra: dict[str, int] = field(repr=False)
    cpu_features_by_id: dict[str, tuple[str, ...]] = field(repr=False)
    cpu_features_by_vendor: dict[str, tuple[str, ...]] = field(repr=False)
    vocab_bytes_per_token: int
    graph_meta_bytes_per_node: int
    graph_meta_copies: int
    graph_min_nodes: int
    graph_nodes_per_tensor: int
    python_n_batch: int
    python_bytes_per_token: int
    page_bytes: int
    cpu_fixed_bytes: int
    baseline_bytes_cuda: int
    baseline_bytes_cpu: int
    baseline_source: str
    source: str


@dataclass(frozen=True)
class VllmRuntime:
    name: str
    gpu_memory_utilization: float
    block_size: int
    sampler_bytes_per_logit: float
    cuda_graph_bytes: int
    cuda_graph_source: str
    non_torch_bytes: int
    cuda_context_bytes: int
    windowed_token_share: float
    source: str


@dataclass(frozen=True)
class SglangRuntime:
    """SGLang's default mem_fraction_static (data/runtimes.toml [sglang] says where)."""

    name: str
    reserved_mib: float
    reserved_mib_per_chunk_token: float
    reserved_least_chunk_tokens: int
    reserved_mib_per_graph_batch: float
    reserved_mib_per_8_devices: float
    reserved_floor_above_gib: float
    reserved_floor_mib: float
    fraction_digits: int
    windowed_token_share: float
    source: str


@cache
def _sections() -> dict[str, Any]:
    text = resources.files("gpuwise.catalog").joinpath("data/runtimes.toml").read_text()
    return parsed_toml(text, "serving_runtimes")


@cache
def llama_cpp_runtime() -> LlamaCppRuntime:
    rec = dict(_sections()["llama-cpp"])
    for key in ("ggml_types", "ftype_mix", "cpu_features_by_id", "cpu_features_by_vendor"):
        rec[key] = {k: tuple(v) for k, v in rec[key].items()}
    return LlamaCppRuntime(**rec)


@cache
def vllm_runtime() -> VllmRuntime:
    return VllmRuntime(**_sections()["vllm"])


@cache
def sglang_runtime() -> SglangRuntime:
    return SglangRuntime(**_sections()["sglang"])
