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

With `memalign` (the resident-set replay, estimate/memory/host_replay.py) a tensor is taken
as PyTorch takes it, through posix_memalign at 64 bytes (c10/core/impl/alloc_cpu.cpp), and
glibc's `_int_memalign` (malloc/malloc.c) does the arithmetic: it asks `_int_malloc` for
request2size(nb + alignment + MINSIZE), nb the tensor's own chunk (request2size of its bytes),
so a free chunk must hold 112 bytes more than the tensor's chunk; it then gives back the leader
before the first 64-byte aligned spot at least MINSIZE in, and the trailer past nb when it is
over MINSIZE (both coalesced, as malloc_consolidate does at the next large request). A chunk
freed by a tensor, with the 48-byte leaders on either side, is 96 bytes over its size: a tensor
of the same size does not fit in it and goes on top (docs/memory.md, "On a CPU").
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
    glibc's defaults (`rules`). The free chunks are listed twice: by start (`free_chunks`,
    for coalescing) and by size (`by_size`, for the best fit: the smallest that holds a
    request, the lowest of equal ones)."""

    rules: HostAllocator = field(default_factory=host_allocator, repr=False)
    memalign: bool = False  # tensors through posix_memalign, split as _int_memalign splits them
    mmap_threshold: int = 0
    trim_threshold: int = 0
    top: int = 0
    end: int = 0
    touched: int = 0
    faulted: int = 0
    free_chunks: list[tuple[int, int]] = field(default_factory=list)  # (start, size), sorted
    chunks: dict[int, tuple[int, int, bool]] = field(default_factory=dict)  # key: start, size, mapped
    by_size: list[tuple[int, int]] = field(default_factory=list, repr=False)  # (size, start)

    def __post_init__(self) -> None:
        r = self.rules
        self.mmap_threshold = self.mmap_threshold or r.mmap_threshold_min
        self.trim_threshold = self.trim_threshold or r.trim_threshold
        self.by_size = sorted((size, start) for start, size in self.free_chunks)
        # the rules read on every request, as plain attributes
        self._align, self._header = r.malloc_alignment, r.chunk_header_bytes
        self._minsize, self._tensor_align, self._page = (r.min_chunk_bytes, r.tensor_alignment,
                                                         r.page_bytes)

    def _chunk(self, nbytes: int) -> int:
        """glibc's chunk for a request aligned as PyTorch's posix_memalign aligns a tensor:
        header and alignment slack, rounded to glibc's alignment."""
        r = self.rules
        align = r.malloc_alignment
        return (nbytes + r.chunk_header_bytes + r.tensor_alignment + align - 1) // align * align

    def _pages(self, nbytes: int) -> int:
        page = self._page
        return (nbytes + page - 1) // page * page

    def malloc(self, key: int, nbytes: int) -> None:
        if self.memalign:
            self._memalign(key, nbytes)
            return
        size = self._chunk(nbytes)
        start = self._best_fit(size)
        if start is None:  # the top chunk, else the system: a mapping, or a larger heap
            start = self._from_top(size)
            if start is None:
                self._map(key, size)
                return
        self._touch(start + size)
        self.chunks[key] = (start, size, False)

    def _from_top(self, size: int) -> int | None:
        """`size` bytes off the top chunk, the heap grown as sysmalloc grows it; None: the
        request is at least the mmap threshold and mapped on its own instead."""
        if self.top + size > self.end:
            if size >= self.mmap_threshold:
                return None
            self.end = self._pages(self.top + size + self.rules.top_pad)
        start = self.top
        self.top += size
        return start

    def _map(self, key: int, size: int) -> None:
        mapped = self._pages(size + self._header)
        self.faulted += mapped
        self.chunks[key] = (-1, mapped, True)

    def _memalign(self, key: int, nbytes: int) -> None:
        """glibc's _int_memalign: request2size(nb + alignment + MINSIZE) from the best-fitting
        free chunk (the rest split off when at least MINSIZE) or the top; the tensor's chunk
        at the first aligned spot, leader and trailer given back (module docstring)."""
        align, header, minsize, tensor_align = (self._align, self._header, self._minsize,
                                                self._tensor_align)
        nb = (nbytes + header + align - 1) // align * align  # _request2size, inlined
        if nb < minsize:
            nb = minsize
        need = (nb + tensor_align + minsize + header + align - 1) // align * align
        start, taken = self._take(need)
        if start is None:
            start, taken = self._from_top(need), need
            if start is None:
                self._map(key, need)
                return
        lead = -(start + 2 * header) % tensor_align  # _leader, inlined
        if 0 < lead < minsize:
            lead += tensor_align
        rest = taken - lead - nb
        size = nb + (rest if rest <= minsize else 0)
        upto = start + lead + size
        if upto > self.touched:  # _touch, inlined
            page = self._page
            self.faulted += (upto + page - 1) // page * page - (
                (self.touched + page - 1) // page * page)
            self.touched = upto
        self.chunks[key] = (start + lead, size, False)
        if lead:
            self._release(start, lead)
        if taken - lead - size:
            self._release(upto, taken - lead - size)

    def _request2size(self, nbytes: int) -> int:
        """glibc's request2size: the request plus SIZE_SZ rounded up to MALLOC_ALIGNMENT, at
        least MINSIZE."""
        r = self.rules
        align = r.malloc_alignment
        size = (nbytes + r.chunk_header_bytes + align - 1) // align * align
        return max(r.min_chunk_bytes, size)

    def _leader(self, start: int) -> int:
        """What _int_memalign gives back before the aligned spot of a chunk at `start` (the
        user pointer is 2 * SIZE_SZ past the chunk; position 0 is 64-byte aligned): nothing
        when the pointer is aligned, else the distance to the next aligned spot, one
        alignment further when that is under MINSIZE."""
        r = self.rules
        user = start + 2 * r.chunk_header_bytes
        lead = -user % r.tensor_alignment
        return lead + r.tensor_alignment if 0 < lead < r.min_chunk_bytes else lead

    def _take(self, need: int) -> tuple[int | None, int]:
        """The best-fitting free chunk of at least `need` bytes: its start and the bytes
        taken (all of it when the rest would be under MINSIZE)."""
        by_size = self.by_size
        j = bisect.bisect_left(by_size, (need,))
        if j == len(by_size):
            return None, 0
        free, start = by_size.pop(j)
        chunks = self.free_chunks
        i = bisect.bisect_left(chunks, (start,))
        rest = free - need
        if rest >= self._minsize:
            chunks[i] = (start + need, rest)
            bisect.insort(by_size, (rest, start + need))
            return start, need
        del chunks[i]
        return start, free

    def free(self, key: int) -> None:
        entry = self.chunks.pop(key, None)
        if entry is None:
            return
        start, size, mapped = entry
        if mapped:  # __libc_free raises the thresholds to the chunk's size (past its leader)
            size -= self._leader(0) if self.memalign else 0
            if self.mmap_threshold < size <= self.rules.mmap_threshold_max:
                self.mmap_threshold, self.trim_threshold = size, 2 * size
            return
        size = self._release(start, size)
        trims = size >= self.rules.fastbin_consolidation_threshold
        if trims and self.end - self.top >= self.trim_threshold:
            self.end = self._pages(self.top + self.rules.top_pad)
            self.touched = min(self.touched, self.end)

    def _release(self, start: int, size: int) -> int:
        """A free chunk coalesced with its free neighbours, then binned or merged into the
        top; its coalesced size."""
        chunks, by_size = self.free_chunks, self.by_size
        i = bisect.bisect_left(chunks, (start,))  # _coalesce, inlined
        if i < len(chunks) and chunks[i][0] == start + size:
            after = chunks.pop(i)[1]
            del by_size[bisect.bisect_left(by_size, (after, start + size))]
            size += after
        if i > 0:
            before, length = chunks[i - 1]
            if before + length == start:
                del chunks[i - 1]
                del by_size[bisect.bisect_left(by_size, (length, before))]
                size += length
                start = before
                i -= 1
        if start + size >= self.top:
            self.top = start
        else:
            chunks.insert(i, (start, size))
            bisect.insort(by_size, (size, start))
        return size

    def _touch(self, upto: int) -> None:
        if upto > self.touched:
            self.faulted += self._pages(upto) - self._pages(self.touched)
            self.touched = upto

    def _best_fit(self, size: int) -> int | None:
        by_size = self.by_size
        j = bisect.bisect_left(by_size, (size,))
        if j == len(by_size):
            return None
        free, start = by_size.pop(j)
        chunks = self.free_chunks
        i = bisect.bisect_left(chunks, (start,))
        if free > size:
            chunks[i] = (start + size, free - size)
            bisect.insort(by_size, (free - size, start + size))
        else:
            del chunks[i]
        return start


def replay(events: Sequence[HeapEvent], passes: int = WARMUP_PASSES + 1,
           freed_before: Sequence[int] = ()) -> dict[str, int]:
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
