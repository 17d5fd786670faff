"""The host allocator as PyTorch's CPU tensors meet it (data/allocators.toml): glibc malloc's
defaults on 64-bit Linux and PyTorch's tensor alignment, every value with its source."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from gpuwise.catalog.sourced import sourced_section

FILE = "allocators.toml"


@dataclass(frozen=True)
class HostAllocator:
    """glibc malloc's rules that decide which tensors fault their pages in afresh."""

    page_bytes: int
    chunk_header_bytes: int  # SIZE_SZ
    malloc_alignment: int  # chunk sizes are multiples of it
    mmap_threshold_min: int  # the initial mmap threshold
    mmap_threshold_max: int  # the most a freed mapped chunk raises it to
    trim_threshold: int  # the initial trim threshold
    top_pad: int  # kept beyond the top chunk when the heap grows or is trimmed
    fastbin_consolidation_threshold: int  # a free at least this large may trim
    untracked_below_bytes: int  # smaller tensors are left out of a replayed pass
    tensor_alignment: int  # PyTorch's posix_memalign alignment of a CPU tensor
    sources: dict[str, str] = field(default_factory=dict, repr=False)


@cache
def host_allocator() -> HostAllocator:
    glibc, glibc_sources = sourced_section(FILE, "glibc")
    torch, torch_sources = sourced_section(FILE, "pytorch_cpu")
    return HostAllocator(**glibc, **torch, sources={**glibc_sources, **torch_sources})
