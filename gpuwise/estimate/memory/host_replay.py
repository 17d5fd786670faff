"""The host allocator's replay with the resident pages counted (docs/memory.md, "The CPU
process"): glibc's heap (estimate/speed/page_faults.GlibcHeap) with what each pass keeps
resident, tensors carved by small requests, and a one-loop replay of an inference's
(key, bytes) pairs that runs glibc's steps inline (the hot path of every CPU estimate;
tests/speedup_references.py keeps the step-by-step replay it equals). What the replay
means for a plan is estimate/memory/host_allocator.py."""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field

from gpuwise.catalog.allocators import AllocatorChoice
from gpuwise.estimate.speed.page_faults import GlibcHeap
from gpuwise.workload.traced import HeapEvent

NEVER = 1 << 62


@dataclass
class ResidentHeap(GlibcHeap):
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
        self._dynamic = self.dynamic

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
        if self.memalign:
            self._memalign(key, nbytes)
        else:
            GlibcHeap.malloc(self, key, nbytes)
        _, size, mapped = self.chunks[key]
        if mapped:
            self.mapped += size
        self.sizes[key] = nbytes
        live = self.live = self.live + nbytes
        if live > self.peak_live:
            self.peak_live = live
        page = self._page
        resident = (self.touched + page - 1) // page * page + self.mapped
        if resident > self.peak_resident:
            self.peak_resident = resident

    def free(self, key: int) -> None:
        entry = self.chunks.get(key)
        if entry is None:
            return
        self.live -= self.sizes.pop(key)
        if entry[2]:
            self.mapped -= entry[1]
            if not self._dynamic:  # unmapped, the thresholds fixed
                del self.chunks[key]
                return
        GlibcHeap.free(self, key)
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
        by_size = self.by_size
        del by_size[bisect.bisect_left(by_size, (size, begin))]
        bisect.insort(by_size, (size - self.carve, begin + self.carve))
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


def replay_pairs(pairs: list[tuple[int, int]], choice: AllocatorChoice) -> ResidentHeap:
    """`replay_resident` of one pass of the forward phase (an inference), its events (key,
    bytes) pairs. A tensor glibc maps on its own (no free chunk and not the top holds it,
    and it is at least the mmap threshold: most of a long prompt's) is taken and given back
    here, as `ResidentHeap.malloc` and `free` would; the rest goes through them."""
    heap = ResidentHeap(choice=choice)
    if not pairs:
        return heap
    heap.enter("forward", False)
    if not (heap.memalign and heap._dynamic):
        for key, nbytes in pairs:
            if nbytes:
                heap.malloc(key, nbytes)
            else:
                heap.free(key)
    else:
        _replay_glibc(heap, pairs)
    for key in list(heap.chunks):
        heap.free(key)
    return heap


SPAN = 1 << 48  # past any heap offset: a free chunk's place in the best-fit list is size * SPAN + start


def _replay_glibc(heap: ResidentHeap, pairs: list[tuple[int, int]]) -> None:
    """The pairs through glibc with its dynamic thresholds and tensors through
    posix_memalign: `ResidentHeap.malloc` (GlibcHeap._memalign, _take, _from_top, _map) and
    `ResidentHeap.free` (GlibcHeap.free, _release, _carve) written out in one loop, the
    heap's state in locals (a search replays thousands of events, each a few calls deep).
    The free chunks are held by start and by end (coalescing looks its neighbours up) and
    as size * SPAN + start in a sorted list (the best fit: the smallest that holds the
    request, the lowest of equal ones); the heap's lists are rebuilt from them at the end."""
    rules = heap.rules
    align, header, minsize, tensor_align, page = (heap._align, heap._header, heap._minsize,
                                                  heap._tensor_align, heap._page)
    top_pad, consolidates = rules.top_pad, rules.fastbin_consolidation_threshold
    lead0, most = heap._leader(0), rules.mmap_threshold_max
    chunks, sizes = heap.chunks, heap.sizes
    recent, pinned, carve, for_run = heap.recent, heap.pinned, heap.carve, heap.for_run
    top, end, touched, faulted = heap.top, heap.end, heap.touched, heap.faulted
    threshold, trim = heap.mmap_threshold, heap.trim_threshold
    live, mapped, peak_live, peak_resident = (heap.live, heap.mapped, heap.peak_live,
                                              heap.peak_resident)
    at_start = dict(heap.free_chunks)  # start: size
    at_end = {start + size: start for start, size in heap.free_chunks}  # end: start
    fits = sorted(size * SPAN + start for start, size in heap.free_chunks)
    bisect_left, insort = bisect.bisect_left, bisect.insort
    released = 0

    def release(start: int, size: int) -> int:
        """GlibcHeap._release: coalesced, then listed or merged into the top. Returns the
        chunk's start, negative (-1 - start) where it went into the top; its size in
        `released`."""
        nonlocal top, released
        after = at_start.pop(start + size, None)
        if after is not None:
            del at_end[start + size + after]
            del fits[bisect_left(fits, after * SPAN + start + size)]
            size += after
        before = at_end.pop(start, None)
        if before is not None:
            del at_start[before]
            del fits[bisect_left(fits, (start - before) * SPAN + before)]
            size += start - before
            start = before
        released = size
        if start + size >= top:
            top = start
            return -1 - start
        at_start[start] = size
        at_end[start + size] = start
        insort(fits, size * SPAN + start)
        return start

    for key, nbytes in pairs:
        if nbytes:  # ResidentHeap.malloc through GlibcHeap._memalign
            nb = max(minsize, (nbytes + header + align - 1) // align * align)
            need = (nb + tensor_align + minsize + header + align - 1) // align * align
            j = bisect_left(fits, need * SPAN)
            if j < len(fits):  # _take
                fit = fits.pop(j)
                free, start = divmod(fit, SPAN)
                del at_start[start], at_end[start + free]
                rest = free - need
                if rest >= minsize:
                    at_start[start + need] = rest
                    at_end[start + free] = start + need
                    insort(fits, fit + need * (1 - SPAN))  # (rest, start + need)
                    taken = need
                else:
                    taken = free
            else:  # _from_top, else _map
                if top + need > end:
                    if need >= threshold:
                        size = (need + header + page - 1) // page * page
                        faulted += size
                        chunks[key] = (-1, size, True)
                        mapped += size
                        sizes[key] = nbytes
                        live += nbytes
                        if live > peak_live:
                            peak_live = live
                        resident = (touched + page - 1) // page * page + mapped
                        if resident > peak_resident:
                            peak_resident = resident
                        continue
                    end = (top + need + top_pad + page - 1) // page * page
                # Off the top: no free chunk borders the top, so the leader is listed as
                # it is and the trailer goes back into the top (GlibcHeap._release).
                start = top
                lead = -(start + 2 * header) % tensor_align  # _leader
                if 0 < lead < minsize:
                    lead += tensor_align
                rest = need - lead - nb
                size = nb + (rest if rest <= minsize else 0)
                upto = start + lead + size
                top = upto if need - lead - size else start + need
                if upto > touched:  # _touch
                    faulted += (upto + page - 1) // page * page - (touched + page - 1) // page * page
                    touched = upto
                chunks[key] = (start + lead, size, False)
                if lead:
                    at_start[start] = lead
                    at_end[upto - size] = start
                    insort(fits, lead * SPAN + start)
                sizes[key] = nbytes
                live += nbytes
                if live > peak_live:
                    peak_live = live
                resident = (touched + page - 1) // page * page + mapped
                if resident > peak_resident:
                    peak_resident = resident
                continue
            lead = -(start + 2 * header) % tensor_align  # _leader
            if 0 < lead < minsize:
                lead += tensor_align
            rest = taken - lead - nb
            size = nb + (rest if rest <= minsize else 0)
            upto = start + lead + size
            if upto > touched:  # _touch
                faulted += (upto + page - 1) // page * page - (touched + page - 1) // page * page
                touched = upto
            chunks[key] = (start + lead, size, False)
            if lead:
                release(start, lead)
            if taken - lead - size:
                release(upto, taken - lead - size)
            sizes[key] = nbytes
            live += nbytes
            if live > peak_live:
                peak_live = live
            resident = (touched + page - 1) // page * page + mapped
            if resident > peak_resident:
                peak_resident = resident
            continue
        entry = chunks.pop(key, None)  # ResidentHeap.free
        if entry is None:
            continue
        live -= sizes.pop(key)
        start, size, is_mapped = entry
        if is_mapped:  # unmapped: the thresholds rise to its size (GlibcHeap.free)
            mapped -= size
            size -= lead0
            if threshold < size <= most:
                threshold, trim = size, 2 * size
            continue
        after = at_start.pop(start + size, None)  # GlibcHeap._release, inlined
        if after is not None:
            del at_end[start + size + after]
            del fits[bisect_left(fits, after * SPAN + start + size)]
            size += after
        before = at_end.pop(start, None)
        if before is not None:
            del at_start[before]
            del fits[bisect_left(fits, (start - before) * SPAN + before)]
            size += start - before
            start = before
        if start + size >= top:
            top = start
            if size >= consolidates and end - top >= trim:  # systrim
                end = (top + top_pad + page - 1) // page * page
                touched = min(touched, end)
            continue
        if size >= consolidates and end - top >= trim:
            end = (top + top_pad + page - 1) // page * page
            touched = min(touched, end)
        # ResidentHeap._carve: the free chunk now holding the tensor's start is the
        # coalesced one, listed with its first `carve` bytes taken
        if not carve or size <= carve:
            at_start[start] = size
            at_end[start + size] = start
            insort(fits, size * SPAN + start)
            continue
        begin = start
        at_start[begin + carve] = size - carve
        at_end[begin + size] = begin + carve
        insort(fits, (size - carve) * SPAN + begin + carve)
        if for_run:
            continue
        recent.append((begin, carve))
        while len(recent) > pinned:
            piece, length = recent.popleft()
            release(piece, length)
            if released >= consolidates and end - top >= trim:
                end = (top + top_pad + page - 1) // page * page
                touched = min(touched, end)
    heap.top, heap.end, heap.touched, heap.faulted = top, end, touched, faulted
    heap.mmap_threshold, heap.trim_threshold = threshold, trim
    heap.live, heap.mapped, heap.peak_live, heap.peak_resident = (live, mapped, peak_live,
                                                                  peak_resident)
    heap.free_chunks[:] = sorted(at_start.items())
    heap.by_size[:] = [divmod(fit, SPAN) for fit in fits]
