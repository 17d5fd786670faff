"""Page faults of a pass replayed through glibc's allocator. Pure: no I/O, no torch.

PyTorch's CPU tensors come from glibc malloc, and a page the kernel hands out is faulted in
when first written. A pass faults wherever glibc gives back memory it must take again:

- a request that neither a free chunk nor the heap's top can hold, and that is at least the
  mmap threshold, is mapped afresh (and unmapped when freed);
- freeing a mapped chunk raises the threshold to its size (up to 32 MiB on 64-bit) and the
  trim threshold to twice that: later requests of that size come from the heap;
- a free that leaves the top chunk at least the trim threshold (a freed chunk of 64 KiB or
  more, coalesced) shrinks the heap back to the top pad: the next growth faults again.

`replay` runs the same pass several times (the allocator's thresholds settle over the
first ones) and counts the bytes faulted in the last, by phase. Free chunks are reused best
fit, as glibc's large bins do; the fast bins and tcache of small requests are left out.
glibc's thresholds and sizes are its defaults on 64-bit Linux (catalog/data/allocators.toml).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuwise.catalog.allocators import HostAllocator, host_allocator
from gpuwise.workload.traced import HeapEvent

WARMUP_PASSES = 3


@dataclass
class GlibcHeap:
    """The main arena: a heap [0, end) whose top chunk starts at `top`, free chunks below
    it, and mapped chunks beside it. `touched` is the end of the pages written since the
    heap last shrank; `faulted` counts the bytes faulted in. The thresholds start at
    glibc's defaults (`rules`)."""

    rules: HostAllocator = field(default_factory=host_allocator, repr=False)
    mmap_threshold: int = 0
    trim_threshold: int = 0
    top: int = 0
    end: int = 0
    touched: int = 0
    faulted: int = 0
    free_chunks: list[tuple[int, int]] = field(default_factory=list)  # (start, size), sorted
    chunks: dict[int, tuple[int, int, bool]] = field(default_factory=dict)  # key: start, size, mapped

    def __post_init__(self) -> None:
        self.mmap_threshold = self.mmap_threshold or self.rules.mmap_threshold_min
        self.trim_threshold = self.trim_threshold or self.rules.trim_threshold

    def _chunk(self, nbytes: int) -> int:
        """glibc's chunk for a request aligned as PyTorch's posix_memalign aligns a tensor:
        header and alignment slack, rounded to glibc's alignment."""
        r = self.rules
        align = r.malloc_alignment
        return (nbytes + r.chunk_header_bytes + r.tensor_alignment + align - 1) // align * align

    def _pages(self, nbytes: int) -> int:
        page = self.rules.page_bytes
        return (nbytes + page - 1) // page * page

    def malloc(self, key: int, nbytes: int) -> None:
        size = self._chunk(nbytes)
        start = self._best_fit(size)
        if start is None:  # the top chunk, else the system: a mapping, or a larger heap
            if self.top + size > self.end:
                if size >= self.mmap_threshold:
                    mapped = self._pages(size + self.rules.chunk_header_bytes)
                    self.faulted += mapped
                    self.chunks[key] = (-1, mapped, True)
                    return
                self.end = self._pages(self.top + size + self.rules.top_pad)
            start = self.top
            self.top += size
        self._touch(start + size)
        self.chunks[key] = (start, size, False)

    def free(self, key: int) -> None:
        entry = self.chunks.pop(key, None)
        if entry is None:
            return
        start, size, mapped = entry
        if mapped:
            if self.mmap_threshold < size <= self.rules.mmap_threshold_max:
                self.mmap_threshold, self.trim_threshold = size, 2 * size
            return
        start, size = self._coalesce(start, size)
        if start + size >= self.top:
            self.top = start
        else:
            bisect.insort(self.free_chunks, (start, size))
        trims = size >= self.rules.fastbin_consolidation_threshold
        if trims and self.end - self.top >= self.trim_threshold:
            self.end = self._pages(self.top + self.rules.top_pad)
            self.touched = min(self.touched, self.end)

    def _touch(self, upto: int) -> None:
        if upto > self.touched:
            self.faulted += self._pages(upto) - self._pages(self.touched)
            self.touched = upto

    def _best_fit(self, size: int) -> int | None:
        best = None
        for i, (_, free) in enumerate(self.free_chunks):
            if free >= size and (best is None or free < self.free_chunks[best][1]):
                best = i
        if best is None:
            return None
        start, free = self.free_chunks.pop(best)
        if free > size:
            bisect.insort(self.free_chunks, (start + size, free - size))
        return start

    def _coalesce(self, start: int, size: int) -> tuple[int, int]:
        i = bisect.bisect_left(self.free_chunks, (start, 0))
        if i < len(self.free_chunks) and self.free_chunks[i][0] == start + size:
            size += self.free_chunks.pop(i)[1]
        if i > 0 and sum(self.free_chunks[i - 1]) == start:
            before, _ = self.free_chunks.pop(i - 1)
            size += start - before
            start = before
        return start, size


def replay(events: Sequence[HeapEvent], passes: int = WARMUP_PASSES + 1,
           freed_before: Sequence[int] = ()) -> dict[str, int]:  # fmt: skip
    """Bytes faulted in the last of `passes` runs of the pass, by phase. What the pass
    leaves allocated is given back at its end (outputs, gradients set to None).
    `freed_before`: sizes of tensors the process took and gave back before the first pass
    (a module's parameters replaced by a cast), which set the thresholds."""
    heap = GlibcHeap()
    for i, nbytes in enumerate(freed_before):
        heap.malloc(-1 - i, nbytes)
        heap.free(-1 - i)
    faulted: dict[str, int] = {}
    kept = {e.key for e in events if e.kept}
    for n in range(passes):
        faulted = {}
        for e in events:
            if e.kept and n:
                continue
            before = heap.faulted
            if e.nbytes:
                heap.malloc(e.key, e.nbytes)
            else:
                heap.free(e.key)
            if heap.faulted > before:
                faulted[e.phase] = faulted.get(e.phase, 0) + heap.faulted - before
        for key in [k for k in heap.chunks if k not in kept]:
            heap.free(key)
    return faulted
