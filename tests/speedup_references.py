"""The host replays as they were before issue 38's speed-ups, kept as the reference the
faster ones must equal (tests/test_estimate_speedups.py): glibc's heap (estimate/speed/
page_faults.py), the resident-set heap and its replay (estimate/memory/host_replay.py),
and generate()'s tensors (workload/process_heap.py), verbatim."""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuwise.catalog.allocators import AllocatorChoice, HostAllocator, host_allocator
from gpuwise.workload.arch import Architecture
from gpuwise.workload.ops import Shape
from gpuwise.workload.prefill_heap import HeapTrace, layer_tensors, norm_tensors
from gpuwise.workload.process_heap import _rotary_tables, _sample
from gpuwise.workload.traced import HeapEvent

NEVER = 1 << 62
WARMUP_PASSES = 3


@dataclass
class GlibcHeap:  # gpuwise/estimate/speed/page_faults.py before issue 38
    """The main arena: a heap [0, end) whose top chunk starts at `top`, free chunks below
    it, and mapped chunks beside it. `touched` is the end of the pages written since the
    heap last shrank; `faulted` counts the bytes faulted in. The thresholds start at
    glibc's defaults (`rules`)."""

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
        mapped = self._pages(size + self.rules.chunk_header_bytes)
        self.faulted += mapped
        self.chunks[key] = (-1, mapped, True)

    def _memalign(self, key: int, nbytes: int) -> None:
        """glibc's _int_memalign: request2size(nb + alignment + MINSIZE) from the best-fitting
        free chunk (the rest split off when at least MINSIZE) or the top; the tensor's chunk
        at the first aligned spot, leader and trailer given back (module docstring)."""
        r = self.rules
        nb = self._request2size(nbytes)
        need = self._request2size(nb + r.tensor_alignment + r.min_chunk_bytes)
        start, taken = self._take(need)
        if start is None:
            start, taken = self._from_top(need), need
            if start is None:
                self._map(key, need)
                return
        lead = self._leader(start)
        rest = taken - lead - nb
        size = nb + (rest if rest <= r.min_chunk_bytes else 0)
        self._touch(start + lead + size)
        self.chunks[key] = (start + lead, size, False)
        for piece, length in ((start, lead), (start + lead + size, taken - lead - size)):
            if length:
                self._release(piece, length)

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
        best = None
        for i, (_, free) in enumerate(self.free_chunks):
            if free >= need and (best is None or free < self.free_chunks[best][1]):
                best = i
        if best is None:
            return None, 0
        start, free = self.free_chunks.pop(best)
        if free - need >= self.rules.min_chunk_bytes:
            bisect.insort(self.free_chunks, (start + need, free - need))
            return start, need
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
        start, size = self._coalesce(start, size)
        if start + size >= self.top:
            self.top = start
        else:
            bisect.insort(self.free_chunks, (start, size))
        return size

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


@dataclass
class ResidentHeap(GlibcHeap):  # estimate/memory/host_allocator.py before issue 38
    """glibc's heap (or another allocator's, `choice`) with what is resident counted: the
    heap's pages written since it last shrank, plus the mapped chunks alive."""

    choice: AllocatorChoice | None = None
    live: int = 0
    mapped: int = 0
    peak_live: int = 0
    peak_resident: int = 0
    sizes: dict[int, int] = field(default_factory=dict)
    carve: int = 0  # bytes small allocations take from each freed heap chunk (the choice's)
    pinned: int = 0  # how many pieces stay taken outside a training forward (the choice's)
    for_run: bool = False  # this free's piece stays for the run (a training forward)
    recent: deque[tuple[int, int]] = field(default_factory=deque)  # the pinned pieces

    def __post_init__(self) -> None:
        super().__post_init__()
        c = self.choice
        self.pinned = c.pinned_small_chunks if c is not None else 0
        self.memalign = c is None or c.name == "glibc" or bool(c.mmap_threshold)
        if c is not None and c.mmap_threshold:  # glibc pinned: no dynamic thresholds
            self.mmap_threshold, self.trim_threshold = c.mmap_threshold, c.trim_threshold
        elif c is not None and c.name != "glibc":  # extents or spans: kept, never trimmed
            self.mmap_threshold = c.returned_from_bytes or NEVER
            self.trim_threshold = NEVER
        else:  # where the process's imports left glibc's thresholds (allocators.toml)
            at_build = max(self.mmap_threshold, self.rules.mmap_threshold_at_build)
            self.mmap_threshold, self.trim_threshold = at_build, 2 * at_build

    @property
    def dynamic(self) -> bool:
        return self.choice is None or self.choice.name == "glibc"

    @property
    def resident(self) -> int:
        return self._pages(self.touched) + self.mapped

    def _chunk(self, nbytes: int) -> int:
        c = self.choice
        if c is None or c.name == "glibc" or c.mmap_threshold:
            return super()._chunk(nbytes)
        size = nbytes
        if c.size_classes_per_doubling and size > c.page_bytes:
            spacing = 2 ** (math.ceil(math.log2(size)) - 1) // c.size_classes_per_doubling
            size = -(-size // spacing) * spacing
        return -(-size // c.page_bytes) * c.page_bytes

    def malloc(self, key: int, nbytes: int) -> None:
        super().malloc(key, nbytes)
        _, size, mapped = self.chunks[key]
        self.mapped += size if mapped else 0
        self.sizes[key] = nbytes
        self.live += nbytes
        self.peak_live = max(self.peak_live, self.live)
        self.peak_resident = max(self.peak_resident, self.resident)

    def free(self, key: int) -> None:
        entry = self.chunks.get(key)
        if entry is None:
            return
        self.live -= self.sizes.pop(key)
        if entry[2]:
            self.mapped -= entry[1]
            if not self.dynamic:  # unmapped, the thresholds fixed
                del self.chunks[key]
                return
        super().free(key)
        if self.carve and not entry[2]:
            self._carve(entry[0])

    def enter(self, phase: str, training: bool) -> None:
        """From the run's first phase on, small requests carve every chunk a tensor frees
        (allocators.toml); whose splits stay: a training forward's, and a checkpointed
        layer's recomputed forward's, for the run; every other phase's (a backward, an
        optimizer step, an inference) only the last `pinned_small_chunks`, as tcache holds
        them."""
        c = self.choice
        self.carve = c.carved_by_small_bytes if c is not None else 0
        self.for_run = c is not None and training and phase in ("forward", "recompute")

    def _carve(self, start: int) -> None:
        """Small allocations take the first bytes of the free chunk that now holds `start`
        (allocators.toml, carved_by_small_bytes): a training forward's for the rest of the
        run; elsewhere only the last `pinned` pieces stay taken, the oldest given back as a
        new one is taken (allocators.toml, pinned_small_chunks)."""
        i = bisect.bisect_right(self.free_chunks, (start, NEVER)) - 1
        if i < 0:
            return
        begin, size = self.free_chunks[i]
        if not begin <= start < begin + size or size <= self.carve:
            return
        self.free_chunks[i] = (begin + self.carve, size - self.carve)  # order unchanged
        if self.for_run:
            return
        self.recent.append((begin, self.carve))
        while len(self.recent) > self.pinned:
            piece, length = self.recent.popleft()
            self.chunks[-1] = (piece, length, False)
            GlibcHeap.free(self, -1)


def replay_resident(passes: list[list[HeapEvent]], choice: AllocatorChoice,
                    training: bool = False) -> ResidentHeap:
    """Run each pass in order; what a pass leaves is given back at its end, except tensors
    `kept` (an optimizer's states), which later passes do not take again. Small allocations
    carve the chunks freed tensors leave (`ResidentHeap.enter`)."""
    heap = ResidentHeap(choice=choice)
    kept: set[int] = set()
    phase = ""
    for n, events in enumerate(passes):
        for e in events:
            if e.kept and n:
                continue
            if e.kept:
                kept.add(e.key)
            if e.phase != phase:
                phase = e.phase
                heap.enter(phase, training)
            if e.nbytes:
                heap.malloc(e.key, e.nbytes)
            else:
                heap.free(e.key)
        for key in [k for k in heap.chunks if k not in kept]:
            heap.free(key)
    return heap


def _decode_step(h: HeapTrace, arch: Architecture, s: Shape, t: int, stride: int) -> None:
    """A new token (`stride` of them at once): each layer's cache concatenated into a new
    tensor of `t + stride` positions (keys, then values; a fused projection's whole output
    goes once both are replaced)."""
    c, kv = s.compute_bytes, s.kv_bytes
    cached = s.batch * arch.num_kv_heads * arch.head_dim * (t + stride) * kv
    repeated = s.batch * arch.num_heads * arch.head_dim * (t + stride) * c
    for layer in range(arch.num_layers):
        for name in (f"k{layer}", f"v{layer}"):
            h.take(name + ".new", cached)
            h.drop(name)
            h.rename(name + ".new", name)
        h.drop(f"qkv{layer}")
        if s.attention == "eager" and arch.num_kv_heads != arch.num_heads:
            h.take("k.rep", repeated)
            h.take("v.rep", repeated)
            h.drop("k.rep", "v.rep")
    _sample(h, arch, s.batch, c)


def generate_events(arch: Architecture, s: Shape, new_tokens: int,
                    stride: int = 1) -> list[HeapEvent]:
    """One generate() call of `new_tokens` after a prompt of `s.tokens` (`s.context` equal);
    with `stride` > 1 each decode step stands for that many, its cache grown by as many
    positions (a long generation replayed in fewer steps)."""
    h = HeapTrace()
    h.cache = True  # the prefill fills a fresh DynamicCache: copies of k and v
    c, rows = s.compute_bytes, s.rows
    h.take("x", rows * arch.hidden_size * c)
    _rotary_tables(h, arch, rows, c)
    if s.attention == "eager":  # the 4-D float mask of the whole prompt, kept to the end
        h.take("mask", s.batch * s.tokens * s.context * c)
    for layer in range(arch.num_layers):
        layer_tensors(h, arch, s, layer)
    norm_tensors(h, arch, rows * arch.hidden_size, c, "final")
    h.drop("x", "mask", "cos", "sin")
    _sample(h, arch, s.batch, c)
    h.drop("final")
    for step in range(max(0, new_tokens - 1)):
        _decode_step(h, arch, s, s.context + step * stride, stride)
    h.drop(*list(h.live))
    return h.events
