"""What a CPU process keeps resident beyond its live tensors: the plan's run replayed through
the host allocator's rules (the "allocator" row of a CPU estimate). Pure: no I/O, no torch.

glibc as users start it (malloc/malloc.c; the values in catalog/data/allocators.toml):

- a request that no free chunk and not the heap's top can hold is mapped on its own when it is
  at least the mmap threshold, else the heap grows (sysmalloc); the threshold starts at 128
  KiB, but a torch + transformers process's imports have raised it to 1.9 MiB before the
  model is built (`mmap_threshold_at_build`), and the replay starts there;
- a tensor comes through posix_memalign at 64 bytes, and _int_memalign asks for its chunk +
  64 + MINSIZE and gives back a leader before the aligned spot and the trailer after it: the
  chunk a freed tensor leaves (with the 48-byte leaders beside it) is 16 bytes too small for a
  tensor of its size, which goes on top (`GlibcHeap.memalign`);
- freeing a mapped chunk unmaps it and raises the threshold to its size, up to 32 MiB, and the
  trim threshold to twice that (__libc_free): from then on tensors of that size come from the
  heap, and the heap's pages stay resident after they are freed;
- a freed heap chunk is coalesced with free neighbours and reused best fit; only when it
  borders the top and the top reaches the trim threshold does the heap shrink (_int_free,
  systrim). Free chunks inside the heap keep their pages.

So after the first large tensor is freed, a process holds the high-water mark of its heap,
holes included, plus what is mapped now. The replay (`estimate/speed/page_faults.GlibcHeap`,
with the resident pages counted) runs the tensors `workload/process_heap.py` lists and reports
the most the process held against the most its tensors held; the difference is the row.
Other allocators (`--allocator`): glibc pinned at a 64 KiB threshold keeps nothing; jemalloc
keeps freed extents below its oversize threshold (8 MiB) for its 10 s dirty decay and rounds
to four size classes a doubling; tcmalloc keeps every freed span (8 KiB pages). Tensors below
64 KiB and allocations outside PyTorch's (the interpreter's, oneDNN's) are not replayed one by
one; what they do to the tensors' chunks is: a small request that no bin of its size holds is
served from the start of a chunk a freed tensor left (the last remainder, or the best-fitting
larger free chunk), so the chunk no longer holds the next tensor of its own size and that
tensor goes on top. Freed, the small chunk waits in tcache and keeps the split. A training
forward's splits stay for the run; elsewhere (a backward, an optimizer step, an inference)
only the last `pinned_small_chunks` do (`carved_by_small_bytes`; docs/memory.md, "On a CPU").
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field, replace
from functools import lru_cache

from gpuwise.catalog.allocators import AllocatorChoice, allocator_choice
from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.hardware import Hardware
from gpuwise.estimate.memory.blas_buffers import blas_buffer_bytes
from gpuwise.estimate.speed.page_faults import GlibcHeap
from gpuwise.workload import Architecture
from gpuwise.workload.ops import Shape
from gpuwise.workload.plans import InferencePlan, TrainingPlan
from gpuwise.workload.process_heap import generate_pairs, training_step_events
from gpuwise.workload.traced import HeapEvent

NEVER = 1 << 62
DECODE_STEPS_REPLAYED = 16  # more new tokens are replayed in as many steps, each a stride long
TRAINING_STEPS = 2  # as `gpuwise validate` runs them (measure/runs/jobs.py)


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


@dataclass(frozen=True)
class AllocatorSlack:
    """The most the process held beyond the most its tensors held, in the replay."""

    allocator: str
    slack_bytes: int
    peak_live_bytes: int
    peak_resident_bytes: int
    mmap_threshold_bytes: int  # glibc's threshold at the end of the run


@lru_cache(maxsize=256)
def _generate_slack(arch: Architecture, allocator: str, shape: Shape, steps: int,
                    stride: int) -> AllocatorSlack:
    return _slack_of(replay_pairs(generate_pairs(arch, shape, steps, stride),
                                  allocator_choice(allocator)))


@lru_cache(maxsize=128)
def _training_slack(arch: Architecture, allocator: str, shape: Shape, param: float,
                    optimizer: str, checkpointing: bool, full: bool,
                    lora_rank: int = 0) -> AllocatorSlack:
    step = training_step_events(arch, shape, param, optimizer, checkpointing, trains_weights=full,
                                lora_rank=lora_rank)
    return _slack(allocator, [step] * TRAINING_STEPS, training=True)


def _slack(allocator: str, passes: list[list[HeapEvent]], training: bool = False) -> AllocatorSlack:
    return _slack_of(replay_resident(passes, allocator_choice(allocator), training))


def _slack_of(heap: ResidentHeap) -> AllocatorSlack:
    assert heap.choice is not None
    return AllocatorSlack(heap.choice.name, max(0, heap.peak_resident - heap.peak_live),
                          heap.peak_live, heap.peak_resident, heap.mmap_threshold)


def allocator_slack(arch: Architecture, plan: InferencePlan | TrainingPlan) -> AllocatorSlack:
    """What the plan's allocator keeps beyond the live tensors at the process's peak. The
    replay is cached on what it depends on (the tensors' shapes and dtypes), so plans that
    differ only in their weight format share one."""
    s = _plan_shape(plan)
    if isinstance(plan, InferencePlan):
        stride = max(1, -(-plan.new_tokens // DECODE_STEPS_REPLAYED))
        steps = -(-max(0, plan.new_tokens - 1) // stride)
        return _generate_slack(arch, plan.allocator, s, steps + 1, stride)
    full = plan.finetune == "full"
    return _training_slack(arch, plan.allocator, s, s.weight_bytes, plan.optimizer,
                           plan.checkpointing, full, 0 if full else plan.lora_rank)


def _plan_shape(plan: InferencePlan | TrainingPlan) -> Shape:
    """The prefill's shape, or a training step's (its weights fp32 under autocast)."""
    if isinstance(plan, InferencePlan):
        fmt = plan.weight_format
        c = weight_format(fmt.compute_dtype).bytes_per_element
        kv = weight_format(plan.kv_dtype or fmt.compute_dtype).bytes_per_element
        return Shape(plan.batch, plan.prompt_tokens, plan.prompt_tokens, c, c, kv, plan.attention)
    c = weight_format(plan.compute_dtype).bytes_per_element
    param = 4.0 if plan.mixed else c
    return Shape(plan.batch, plan.seq, plan.seq, c, param, c, plan.attention)


def host_allocator_rows(arch: Architecture, plan: InferencePlan | TrainingPlan, hw: Hardware,
                        held: float | None = None) -> dict[str, float]:
    """The "allocator" row of a CPU estimate (what the plan's host allocator keeps beyond the
    live tensors) and the "blas_buffers" row (the matrix products' packing buffers,
    blas_buffers.py); no rows elsewhere. `held` stands in for the replay: a search holds one
    replay's slack while it narrows (fits.py)."""
    if hw.kind != "cpu":
        return {}
    slack = allocator_slack(arch, plan).slack_bytes if held is None else held
    return {"allocator": float(slack), "blas_buffers": float(_blas_buffers(arch, plan, hw))}


def blas_threads(plan: InferencePlan | TrainingPlan, hw: Hardware) -> int:
    """The threads a CPU plan's matrix products run on: the plan's, else one a core."""
    return max(1, getattr(plan, "threads", None) or hw.compute_units)


def _blas_buffers(arch: Architecture, plan: InferencePlan | TrainingPlan, hw: Hardware) -> int:
    """The packing buffers the plan's matrix products leave on the host's threads
    (`blas_buffers`): the prefill and a decode step, or a training step."""
    threads, s = blas_threads(plan, hw), _plan_shape(plan)
    if isinstance(plan, InferencePlan):
        decode = replace(s, tokens=1, context=plan.context_tokens)
        return blas_buffer_bytes(arch, [s, decode], threads)
    return blas_buffer_bytes(arch, [replace(s, logits_tokens=plan.seq)], threads,
                             training=True, trains_weights=plan.finetune == "full")


def host_allocator_row(arch: Architecture, plan: InferencePlan | TrainingPlan, hw: Hardware,
                       parts: dict[str, float], notes: list[str],
                       held: float | None = None) -> float:
    """`host_allocator_rows` put into `parts` before the overhead, with a note naming the
    allocator; the bytes it adds (0 off a CPU)."""
    rows = host_allocator_rows(arch, plan, hw, held)
    if not rows:
        return 0.0
    overhead = parts.pop("overhead")
    parts.update(rows, overhead=overhead)
    notes.append(f"allocator: {allocator_choice(plan.allocator).label}; it keeps "
                 f"{rows['allocator'] / 2**20:,.0f} MiB beyond the live tensors at the peak "
                 "(docs/memory.md, the CPU process)")
    notes.append(f"blas_buffers: the matrix products' packing buffers, kept by each of "
                 f"{blas_threads(plan, hw)} threads (docs/memory.md, the CPU process)")
    return sum(rows.values())
