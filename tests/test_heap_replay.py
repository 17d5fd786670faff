"""The allocator replay (gpuwise.estimate.speed.page_faults) against glibc's rules worked by hand:
what is mapped, when the thresholds move, when the heap shrinks and must fault again."""

from __future__ import annotations

import pytest

from gpuwise.catalog.allocators import host_allocator
from gpuwise.estimate.speed.page_faults import GlibcHeap, replay
from gpuwise.workload.traced import HeapEvent

MIB = 2**20
MMAP_THRESHOLD_MAX = host_allocator().mmap_threshold_max
TOP_PAD = host_allocator().top_pad


def take_and_give(*sizes: int, first_key: int = 0) -> list[HeapEvent]:
    """Take every size, then give them all back in the same order."""
    keys = range(first_key, first_key + len(sizes))
    return [*(HeapEvent(k, n) for k, n in zip(keys, sizes, strict=True)),
            *(HeapEvent(k, 0) for k in keys)]


def test_a_large_request_is_mapped_until_its_free_raises_the_threshold():
    heap = GlibcHeap()
    heap.malloc(1, MIB)
    assert heap.chunks[1][2] and heap.faulted >= MIB  # mapped: past the 128 KiB threshold
    heap.free(1)
    assert heap.mmap_threshold > MIB and heap.trim_threshold == 2 * heap.mmap_threshold
    heap.malloc(2, MIB)
    assert not heap.chunks[2][2]  # the same size now comes from the heap
    # one pass settles: the heap keeps the megabyte (below the trim threshold), no faults
    assert replay(take_and_give(MIB), passes=1) == {"forward": pytest.approx(MIB, rel=0.01)}
    assert replay(take_and_give(MIB), passes=3) == {}


def test_a_heap_whose_free_top_reaches_twice_the_threshold_shrinks_and_faults_again():
    # 1 MiB freed from a mapping sets the trim threshold to ~2 MiB; three 0.9 MiB tensors
    # then come from the heap and, given back, leave ~2.7 MiB on top: the heap shrinks to
    # its top pad and every pass faults the 2.7 MiB back in, less the pad
    events = [*take_and_give(MIB), *take_and_give(*(int(0.9 * MIB),) * 3, first_key=10)]
    assert replay(events)["forward"] == pytest.approx(2.7 * MIB - TOP_PAD, rel=0.01)
    # two of them (1.8 MiB on top, below 2 MiB) stay in the heap: nothing faults
    fewer = [*take_and_give(MIB), *take_and_give(*(int(0.9 * MIB),) * 2, first_key=10)]
    assert replay(fewer) == {}


def test_past_glibc_ceiling_every_pass_maps_afresh_and_the_threshold_stays():
    big = MMAP_THRESHOLD_MAX + MIB
    assert replay(take_and_give(big))["forward"] >= big
    heap = GlibcHeap()
    heap.malloc(1, big)
    heap.free(1)
    assert heap.mmap_threshold < MIB


def test_reuse_of_a_freed_chunk_faults_nothing_and_coalescing_merges_neighbours():
    heap = GlibcHeap()
    heap.mmap_threshold = heap.trim_threshold = 64 * MIB  # all from the heap, never trimmed
    for key in range(3):
        heap.malloc(key, MIB)
    before = heap.faulted
    heap.free(0)
    heap.free(1)
    assert len(heap.free_chunks) == 1  # the two neighbours are one chunk
    heap.malloc(9, int(1.5 * MIB))  # fits the merged 2 MiB
    assert heap.faulted == before and heap.chunks[9][0] == 0


def test_kept_tensors_are_taken_once_and_freed_before_sets_the_thresholds():
    kept = [HeapEvent(-1, 4 * MIB, "optimizer", kept=True)]
    first = replay([*kept, *take_and_give(MIB)], passes=1)
    assert first["optimizer"] >= 4 * MIB
    assert "optimizer" not in replay([*kept, *take_and_give(MIB)], passes=2)
    # a 3 MiB tensor freed before the first pass: the 1 MiB tensor is never mapped, and
    # the heap (1 MiB + pad, under the 6 MiB trim threshold) keeps it
    assert replay(take_and_give(MIB), passes=2, freed_before=(3 * MIB,)) == {}
    assert TOP_PAD < MIB
