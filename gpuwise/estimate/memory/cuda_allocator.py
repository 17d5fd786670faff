"""PyTorch's CUDA caching allocator, replayed: what `torch.cuda.memory_reserved` holds while
a list of tensors is taken and given back.

The rules are c10/cuda/CUDACachingAllocator.cpp's (constants in catalog/data/cuda_allocator.toml):

- every request is rounded up to 512 bytes; up to 1 MiB it comes from the small pool, above
  from the large pool;
- a request is served by the smallest free block of its pool that fits (best fit); a free
  block is split when what remains is at least 512 bytes (small pool) or more than 1 MiB
  (large pool), otherwise the whole block is handed out;
- when no free block fits, a new segment is reserved (cudaMalloc): 2 MiB for a small
  request, 20 MiB for a request under 10 MiB, the request rounded up to 2 MiB above;
- a freed block merges with free neighbours of its own segment only; segments stay reserved
  (until `empty_cache`, or an out-of-memory retry).

With `expandable_segments:True` (PYTORCH_CUDA_ALLOC_CONF) each pool is one segment that maps
more pages (2 MiB small, 20 MiB large) at its end when nothing free fits, and a block splits
whenever 512 bytes remain, so freed neighbours always merge and little is stranded.

The replay is exact for the rules above and the order given; it does not model several
streams, CUDA graphs' private pools or `max_split_size_mb`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuwise.catalog.cuda_allocator import CudaAllocatorRules, cuda_allocator


class _Block:
    """A block of a segment, linked to its neighbours; `key` its place in the free lists."""

    __slots__ = ("segment", "offset", "size", "free", "prev", "next")

    def __init__(self, segment: int, offset: int, size: int, prev: _Block | None = None,
                 next: _Block | None = None) -> None:
        self.segment = segment
        self.offset = offset
        self.size = size
        self.free = True
        self.prev = prev
        self.next = next

    @property
    def sort_key(self) -> tuple[int, int, int]:
        return (self.size, self.segment, self.offset)


@dataclass(frozen=True)
class ReplayPeak:
    """The replay's high-water marks, in bytes."""

    reserved: int  # memory_reserved at its peak, with the pool never emptied
    requested: int  # bytes of the live tensors at their peak (what the estimators add up)
    allocated: int  # memory_allocated at its peak: live blocks, unsplit remainders included
    pinned: int  # segments holding a live block, at their peak: what an out-of-memory retry,
    # which gives back every wholly free segment, cannot release

    @property
    def slack(self) -> int:
        """Reserved beyond the live tensors at their peak, on a device with room to spare."""
        return max(0, self.reserved - self.requested)

    @property
    def pinned_slack(self) -> int:
        """What the allocator needs beyond the live tensors where memory runs short."""
        return max(0, self.pinned - self.requested)


@dataclass
class CachingAllocator:
    """The allocator's state: segments of linked blocks, and each pool's free blocks sorted
    by (size, segment, offset) for the best-fit search."""

    expandable: bool = False
    rules: CudaAllocatorRules = field(default_factory=cuda_allocator)
    segment_sizes: list[int] = field(default_factory=list)
    segment_live: list[int] = field(default_factory=list)
    small_segment: list[bool] = field(default_factory=list)
    tails: dict[bool, _Block] = field(default_factory=dict)  # expandable: each pool's last block
    free_keys: dict[bool, list[tuple[int, int, int]]] = field(default_factory=dict)
    free_blocks: dict[tuple[int, int, int], _Block] = field(default_factory=dict)
    live: dict[int, tuple[_Block, int]] = field(default_factory=dict)
    reserved: int = 0
    pinned: int = 0
    requested: int = 0
    allocated: int = 0
    # the high-water marks, kept as numbers while the replay runs (`peak` reads them)
    peak_reserved: int = 0
    peak_requested: int = 0
    peak_allocated: int = 0
    peak_pinned: int = 0

    def __post_init__(self) -> None:
        r = self.rules
        self._unit, self._small = r.min_block_bytes, r.small_size_bytes
        for small in (False, True):
            self.free_keys.setdefault(small, [])

    @property
    def peak(self) -> ReplayPeak:
        return ReplayPeak(self.peak_reserved, self.peak_requested, self.peak_allocated,
                          self.peak_pinned)

    def rounded(self, nbytes: int) -> int:
        unit = self.rules.min_block_bytes
        return max(unit, -(-nbytes // unit) * unit)

    def segment_bytes(self, size: int) -> int:
        """cudaMalloc'd bytes of a new segment for a request of `size` (get_allocation_size)."""
        r = self.rules
        if size <= r.small_size_bytes:
            return r.small_buffer_bytes
        if size < r.min_large_alloc_bytes:
            return r.large_buffer_bytes
        return -(-size // r.round_large_bytes) * r.round_large_bytes

    def malloc(self, key: int, nbytes: int) -> None:
        unit = self._unit
        size = max(unit, -(-nbytes // unit) * unit)
        small = size <= self._small
        keys = self.free_keys[small]
        i = bisect.bisect_left(keys, (size, -1, -1))  # best fit: the smallest that holds it
        if i < len(keys):
            block = self.free_blocks.pop(keys.pop(i))
        else:
            block = self._grow(size, small)
            self._unlist(block)
        self._split(block, size, small)
        block.free = False
        self.live[key] = (block, nbytes)
        self._pin(block.segment, +1)
        self.requested += nbytes
        self.allocated += block.size
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
        if self.requested > self.peak_requested:
            self.peak_requested = self.requested
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        if self.pinned > self.peak_pinned:
            self.peak_pinned = self.pinned

    def free(self, key: int) -> None:
        found = self.live.pop(key, None)
        if found is None:
            return
        block, nbytes = found
        self.requested -= nbytes
        self.allocated -= block.size
        self._pin(block.segment, -1)
        block.free = True
        for other in (block.next, block.prev):
            if other is not None and other.free:
                self._unlist(other)
                block = self._merge(block, other)
        self._list(block)

    def _pin(self, segment: int, change: int) -> None:
        """Segments holding a live block cannot be given back (expandable: the one segment
        is pinned up to its last live block's pages)."""
        before = self.segment_live[segment]
        self.segment_live[segment] += change
        if self.expandable:
            self.pinned = self.reserved - self._free_tail_pages()
        elif before == 0 and change > 0:
            self.pinned += self.segment_sizes[segment]
        elif self.segment_live[segment] == 0:
            self.pinned -= self.segment_sizes[segment]

    def _free_tail_pages(self) -> int:
        total = 0
        for small, tail in self.tails.items():
            page = self.rules.small_buffer_bytes if small else self.rules.large_buffer_bytes
            if tail.free:
                total += tail.size // page * page
        return total

    @staticmethod
    def _merge(a: _Block, b: _Block) -> _Block:
        first, second = (a, b) if a.offset < b.offset else (b, a)
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        return first

    def _list(self, block: _Block) -> None:
        key = (block.size, block.segment, block.offset)
        bisect.insort(self.free_keys[self.small_segment[block.segment]], key)
        self.free_blocks[key] = block
        if self.expandable and block.next is None:
            self.tails[self.small_segment[block.segment]] = block

    def _unlist(self, block: _Block) -> None:
        key = (block.size, block.segment, block.offset)
        if self.free_blocks.pop(key, None) is None:
            return
        keys = self.free_keys[self.small_segment[block.segment]]
        del keys[bisect.bisect_left(keys, key)]

    def _best_fit(self, size: int, small: bool) -> _Block | None:
        keys = self.free_keys[small]
        i = bisect.bisect_left(keys, (size, -1, -1))
        return self.free_blocks[keys[i]] if i < len(keys) else None

    def _grow(self, size: int, small: bool) -> _Block:
        """A new segment, or (expandable) more pages mapped at the end of the pool's one."""
        if not self.expandable:
            return self._new_segment(self.segment_bytes(size), small)
        page = self.rules.small_buffer_bytes if small else self.rules.large_buffer_bytes
        tail = self.tails.get(small)
        if tail is None:
            return self._new_segment(-(-size // page) * page, small)
        have = tail.size if tail.free else 0
        grow = -(-(size - have) // page) * page
        self.reserved += grow
        self.segment_sizes[tail.segment] += grow
        if tail.free:
            self._unlist(tail)
            tail.size += grow
        else:
            tail = _Block(tail.segment, tail.offset + tail.size, grow, prev=tail)
            tail.prev.next = tail  # type: ignore[union-attr]
        self.tails[small] = tail
        self._list(tail)
        return tail

    def _new_segment(self, nbytes: int, small: bool) -> _Block:
        block = _Block(len(self.segment_sizes), 0, nbytes)
        self.segment_sizes.append(nbytes)
        self.segment_live.append(0)
        self.small_segment.append(small)
        self.reserved += nbytes
        self._list(block)
        return block

    def _split(self, block: _Block, size: int, small: bool) -> None:
        """should_split: keep the rest as a free block when it is big enough."""
        remaining = block.size - size
        if remaining < self._unit if small or self.expandable else remaining <= self._small:
            return
        rest = _Block(block.segment, block.offset + size, remaining, prev=block, next=block.next)
        if block.next is not None:
            block.next.prev = rest
        block.next = rest
        block.size = size
        self._list(rest)


def replay(events: Iterable[tuple[int, int]], expandable: bool = False) -> ReplayPeak:
    """Replay (key, bytes) events in order: bytes > 0 takes a tensor under `key`, 0 gives
    it back. Returns the peaks."""
    if not expandable:
        events = events if isinstance(events, list) else list(events)
        peak = _replay_segments(events, cuda_allocator())
        if peak is not None:
            return peak
    alloc = CachingAllocator(expandable=expandable)
    malloc, free = alloc.malloc, alloc.free
    for key, nbytes in events:
        if nbytes > 0:
            malloc(key, nbytes)
        else:
            free(key)
    return alloc.peak


OFFSETS = 1 << 64  # past any segment's size: a free block's place in its pool's list is
# size * SIZES + segment * OFFSETS + offset, ordered as (size, segment, offset)
SEGMENTS = 1 << 32
SIZES = SEGMENTS * OFFSETS


def _replay_segments(events: list[tuple[int, int]], rules: CudaAllocatorRules) -> ReplayPeak | None:
    """`CachingAllocator`'s malloc and free without expandable segments, written out in one
    loop with its state in locals (a search replays thousands of events, each a few calls
    deep). A block is a list, [size, offset, free, previous, next, its segment's record,
    the bytes its tensor asked for] (no object to construct), and a segment's record is
    [live blocks, bytes, pool (1 small, 0 large), segment * OFFSETS]. None where a segment
    would pass OFFSETS (the class then replays)."""
    unit, small_max = rules.min_block_bytes, rules.small_size_bytes
    small_buffer, large_buffer = rules.small_buffer_bytes, rules.large_buffer_bytes
    min_large, round_large = rules.min_large_alloc_bytes, rules.round_large_bytes
    pools: tuple[list[int], list[int]] = ([], [])  # each pool's free blocks' places, sorted
    free_blocks: dict[int, list[Any]] = {}
    segments = 0
    live: dict[int, list[Any]] = {}
    reserved = pinned = requested = allocated = 0
    peak_reserved = peak_pinned = peak_requested = peak_allocated = 0
    bisect_left, insort = bisect.bisect_left, bisect.insort
    for key, nbytes in events:
        if nbytes > 0:
            size = -(-nbytes // unit) * unit
            if size < unit:
                size = unit
            small = size <= small_max
            keys = pools[small]
            i = bisect_left(keys, size * SIZES)  # best fit
            if i < len(keys):
                block = free_blocks.pop(keys.pop(i))
                record = block[5]
            else:  # a new segment (segment_bytes), its one block taken at once
                if small:
                    grown = small_buffer
                elif size < min_large:
                    grown = large_buffer
                else:
                    grown = -(-size // round_large) * round_large
                if grown >= OFFSETS or segments >= SEGMENTS:
                    return None
                record = [0, grown, small, segments * OFFSETS]
                segments += 1
                block = [grown, 0, True, None, None, record, 0]
                reserved += grown
                if reserved > peak_reserved:
                    peak_reserved = reserved
            remaining = block[0] - size  # _split: the rest stays free when big enough
            if remaining >= unit if small else remaining > small_max:
                after = block[4]
                offset = block[1] + size
                rest = [remaining, offset, True, block, after, record, 0]
                if after is not None:
                    after[3] = rest
                block[4] = rest
                block[0] = size
                place = remaining * SIZES + record[3] + offset
                insort(keys, place)
                free_blocks[place] = rest
            else:
                size = block[0]
            block[2] = False
            block[6] = nbytes
            live[key] = block
            if not record[0]:  # _pin
                pinned += record[1]
                if pinned > peak_pinned:
                    peak_pinned = pinned
            record[0] += 1
            requested += nbytes
            if requested > peak_requested:
                peak_requested = requested
            allocated += size
            if allocated > peak_allocated:
                peak_allocated = allocated
            continue
        found = live.pop(key, None)
        if found is None:
            continue
        block = found
        requested -= block[6]
        size = block[0]
        allocated -= size
        record = block[5]
        record[0] -= 1
        if not record[0]:
            pinned -= record[1]
        keys = pools[record[2]]
        base = record[3]
        after = block[4]
        before = block[3]
        if after is not None and after[2]:  # merged with its free neighbours (_merge)
            place = after[0] * SIZES + base + after[1]
            del free_blocks[place]
            del keys[bisect_left(keys, place)]
            size += after[0]
            after = after[4]
            block[4] = after
            if after is not None:
                after[3] = block
        if before is not None and before[2]:
            place = before[0] * SIZES + base + before[1]
            del free_blocks[place]
            del keys[bisect_left(keys, place)]
            size += before[0]
            before[4] = after
            if after is not None:
                after[3] = before
            block = before
        else:
            block[2] = True
        block[0] = size
        place = size * SIZES + base + block[1]
        insort(keys, place)
        free_blocks[place] = block
    return ReplayPeak(peak_reserved, peak_requested, peak_allocated, peak_pinned)
