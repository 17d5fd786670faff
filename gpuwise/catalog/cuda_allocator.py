"""PyTorch's CUDA caching allocator, the libraries' workspaces and the device memory outside
PyTorch's pool (data/cuda_allocator.toml), every value with its source."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from gpuwise.catalog.sourced import sourced_section

FILE = "cuda_allocator.toml"


@dataclass(frozen=True)
class CudaAllocatorRules:
    """c10/cuda/CUDACachingAllocator.cpp's constants, and what a CUDA process holds besides."""

    min_block_bytes: int  # every request rounded up to a multiple of it
    small_size_bytes: int  # largest small-pool request; large-pool split threshold
    small_buffer_bytes: int  # small-pool segment (and expandable page)
    large_buffer_bytes: int  # segment of a 1-10 MiB request (and expandable page)
    min_large_alloc_bytes: int  # from here a request gets its own segment
    round_large_bytes: int  # ... rounded up to this
    cublas_workspace_hopper_bytes: int
    cublas_workspace_other_bytes: int
    rocm_workspace_bytes: int
    hopper_device_prefixes: tuple[str, ...]
    rocm_device_prefixes: tuple[str, ...]
    cuda_context_bytes: int
    nccl_communicator_bytes: int
    tight_fraction: float  # a fit with less headroom than this share of the pool is "tight"
    sources: dict[str, str] = field(default_factory=dict, repr=False)


@cache
def cuda_allocator() -> CudaAllocatorRules:
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for section in ("caching_allocator", "workspaces", "outside_torch", "fits"):
        v, s = sourced_section(FILE, section)
        values.update({k: tuple(x) if isinstance(x, list) else x for k, x in v.items()})
        sources.update(s)
    return CudaAllocatorRules(**values, sources=sources)  # type: ignore[arg-type]


def cublas_workspace_bytes(device_id: str) -> int:
    """The BLAS workspace PyTorch takes from its pool on the first matmul on `device_id`."""
    rules = cuda_allocator()
    if device_id.startswith(rules.rocm_device_prefixes):
        return rules.rocm_workspace_bytes
    if device_id.startswith(rules.hopper_device_prefixes):
        return rules.cublas_workspace_hopper_bytes
    return rules.cublas_workspace_other_bytes
