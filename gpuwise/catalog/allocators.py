"""The host allocator as PyTorch's CPU tensors meet it (data/allocators.toml): glibc malloc's
defaults on 64-bit Linux and PyTorch's tensor alignment, and the allocators a CPU plan may name
(`--allocator`: glibc as a process starts, glibc pinned, jemalloc, tcmalloc), every value with
its source."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cache

from gpuwise.catalog.sourced import data_file, sourced_record, sourced_section

FILE = "allocators.toml"


@dataclass(frozen=True)
class HostAllocator:
    """glibc malloc's rules that decide which tensors fault their pages in afresh."""

    page_bytes: int
    chunk_header_bytes: int  # SIZE_SZ
    malloc_alignment: int  # chunk sizes are multiples of it
    min_chunk_bytes: int  # MINSIZE
    mmap_threshold_min: int  # the initial mmap threshold
    mmap_threshold_max: int  # the most a freed mapped chunk raises it to
    mmap_threshold_at_build: int  # reached by a torch + transformers process's imports
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


PREFIX = "choice-"


@dataclass(frozen=True)
class AllocatorChoice:
    """An allocator a CPU plan may name (`--allocator`): what a process under it sets, and
    the rules that decide what it keeps resident (see data/allocators.toml)."""

    name: str
    label: str
    env: str  # "KEY=VALUE ..." set in the measured process
    preload: str  # the library LD_PRELOAD names ("": none)
    mmap_threshold: int  # 0: glibc's dynamic threshold; else fixed
    trim_threshold: int  # with a fixed mmap threshold: the fixed trim threshold
    returned_from_bytes: int  # freed blocks this large go back at once (0: glibc's rules)
    keeps_freed: bool  # freed blocks below that stay resident and are reused best fit
    size_classes_per_doubling: int  # 0: no size classes
    carved_by_small_bytes: int  # taken from each chunk a training forward frees, for the run
    pinned_small_chunks: int  # how many such pieces stay taken elsewhere (glibc's tcache)
    page_bytes: int
    sources: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def env_vars(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.env.split())


@cache
def allocator_choices() -> dict[str, AllocatorChoice]:
    """Every allocator a plan may name, by name; the first is the default (glibc's)."""
    names = [key.removeprefix(PREFIX) for key in data_file(FILE) if key.startswith(PREFIX)]
    return {name: sourced_record(AllocatorChoice, FILE, PREFIX + name, name=name)
            for name in names}


def allocator_choice(name: str) -> AllocatorChoice:
    return allocator_choices()[name]


@dataclass(frozen=True)
class BlasPacking:
    """What a CPU matrix product leaves each thread that took part (data/allocators.toml,
    [blas_packing]): MKL's sgemm packing buffers for fp32, oneDNN's for bf16."""

    header_bytes: int
    fixed_pages: int
    rows_cap: int  # rows of the left operand a thread packs, at most
    cols_cap: int  # columns of the right operand, at most
    depth_wide: int  # the packed depth (k block) for k above narrow_depth_max
    depth_narrow: int
    narrow_depth_max: int
    no_buffer_rows_max: int  # products this short pack nothing
    one_thread_rows_below: int  # products this short run on one thread
    onednn_bytes: int  # a bf16 product's buffer per thread
    grids: tuple[tuple[int, int, int], ...]  # (threads, row blocks, column blocks) measured
    min_cols_per_block: int  # a column block is at least this wide
    sources: dict[str, str] = field(default_factory=dict, repr=False)

    def grid(self, threads: int) -> tuple[int, int]:
        """(row blocks, column blocks) MKL splits a product into on `threads` threads: the
        measured grid of the most threads up to `threads`; past the last, one as square as
        the last (7 x 9 for 64), scaled by the root of the threads."""
        last, rows, cols = self.grids[-1]
        if threads > last:
            rows = max(1, round(rows * (threads / last) ** 0.5))
            return rows, max(1, threads // rows)
        return next((r, c) for t, r, c in reversed(self.grids) if t <= max(1, threads))


@cache
def blas_packing() -> BlasPacking:
    record = sourced_record(BlasPacking, FILE, "blas_packing")
    grids = tuple(sorted((int(t), int(r), int(c)) for t, r, c in record.grids))
    return replace(record, grids=grids)


@cache
def host_tight_fraction() -> float:
    """A CPU plan with less headroom than this share of its memory beyond the baseline is
    "tight" (data/allocators.toml, [host_fits])."""
    values, _ = sourced_section(FILE, "host_fits")
    return float(values["tight_fraction"])
