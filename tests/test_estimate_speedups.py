"""The speed-ups keep every answer (issue 38): the CUDA allocator replay against the
implementation it replaced, kept here as the reference, and the context search that rules
plans out without a replay against the search that replays every plan it asks about; the
host replays (glibc's heap, the resident set, generate()'s tensors) against theirs, kept in
tests/speedup_references.py."""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field, replace

import pytest
import speedup_references as ref

from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.catalog.allocators import allocator_choice
from gpuwise.catalog.cuda_allocator import CudaAllocatorRules, cuda_allocator
from gpuwise.estimate.memory import fits
from gpuwise.estimate.memory.cuda_allocator import ReplayPeak, replay
from gpuwise.estimate.memory.cuda_rows import (
    DECODE_STEPS_REPLAYED,
    generate_events,
    inference_peak,
)
from gpuwise.estimate.memory.host_replay import replay_pairs, replay_resident
from gpuwise.estimate.speed.page_faults import GlibcHeap
from gpuwise.estimate.speed.page_faults import replay as fault_replay
from gpuwise.workload import Architecture, from_config, process_heap
from gpuwise.workload.ops import Shape
from gpuwise.workload.plans import ALLOCATORS, InferencePlan
from gpuwise.workload.prefill_heap import HeapTrace, layer_tensors, norm_tensors
from gpuwise.workload.traced import HeapEvent

MIB = 1 << 20


@dataclass(eq=False)
class _Block:
    segment: int
    offset: int
    size: int
    free: bool = True
    prev: _Block | None = None
    next: _Block | None = None

    @property
    def sort_key(self) -> tuple[int, int, int]:
        return (self.size, self.segment, self.offset)


@dataclass
class ReferenceAllocator:
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
    peak: ReplayPeak = ReplayPeak(0, 0, 0, 0)

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
        size = self.rounded(nbytes)
        small = size <= self.rules.small_size_bytes
        block = self._best_fit(size, small) or self._grow(size, small)
        self._unlist(block)
        self._split(block, size, small)
        block.free = False
        self.live[key] = (block, nbytes)
        self._pin(block.segment, +1)
        self.requested += nbytes
        self.allocated += block.size
        self.peak = ReplayPeak(max(self.peak.reserved, self.reserved),
                               max(self.peak.requested, self.requested),
                               max(self.peak.allocated, self.allocated),
                               max(self.peak.pinned, self.pinned))

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
        key = block.sort_key
        bisect.insort(self.free_keys.setdefault(self.small_segment[block.segment], []), key)
        self.free_blocks[key] = block
        if self.expandable and block.next is None:
            self.tails[self.small_segment[block.segment]] = block

    def _unlist(self, block: _Block) -> None:
        key = block.sort_key
        if self.free_blocks.pop(key, None) is None:
            return
        keys = self.free_keys[self.small_segment[block.segment]]
        del keys[bisect.bisect_left(keys, key)]

    def _best_fit(self, size: int, small: bool) -> _Block | None:
        keys = self.free_keys.get(small, [])
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
        if small or self.expandable:
            keep = remaining >= self.rules.min_block_bytes
        else:
            keep = remaining > self.rules.small_size_bytes
        if not keep:
            return
        rest = _Block(block.segment, block.offset + size, remaining, prev=block, next=block.next)
        if block.next is not None:
            block.next.prev = rest
        block.next = rest
        block.size = size
        self._list(rest)




def reference_replay(events: list[tuple[int, int]], expandable: bool = False) -> ReplayPeak:
    alloc = ReferenceAllocator(expandable=expandable)
    for key, nbytes in events:
        if nbytes > 0:
            alloc.malloc(key, nbytes)
        else:
            alloc.free(key)
    return alloc.peak


def _random_events(rng: random.Random) -> list[tuple[int, int]]:
    live: list[int] = []
    events: list[tuple[int, int]] = []
    for key in range(1, rng.randint(2, 80)):
        if live and rng.random() < 0.45:
            events.append((live.pop(rng.randrange(len(live))), 0))
        live.append(key)
        top = rng.choice([4096, 3 * MIB, 40 * MIB, 300 * MIB])
        events.append((key, rng.randint(1, top)))
    return events + [(k, 0) for k in rng.sample(live, len(live) // 2)]


@pytest.mark.parametrize("expandable", [False, True])
def test_replay_equals_the_reference_on_random_sequences(expandable: bool) -> None:
    rng = random.Random(38)
    for _ in range(1500):
        events = _random_events(rng)
        assert replay(events, expandable) == reference_replay(events, expandable), events


@pytest.mark.parametrize("expandable", [False, True])
@pytest.mark.parametrize("prompt", [1, 700, 30_000])
def test_replay_equals_the_reference_on_a_generation(prompt: int, expandable: bool) -> None:
    arch = from_config(resolve_model("qwen2.5-0.5b").config)
    events = generate_events(arch, 2, prompt, 40, 2.0, "sdpa", False)
    assert replay(events, expandable) == reference_replay(events, expandable)


@pytest.mark.parametrize("model", ["gpt2", "llama-3.1-8b", "qwen2.5-7b", "mixtral-8x7b"])
@pytest.mark.parametrize("device", ["rtx-4090", "a100-sxm-40gb", "t4", "m3-max", "cpu-cloud-32vcpu"])
def test_max_context_is_the_search_that_replays_every_plan(model: str, device: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    arch = from_config(resolve_model(model).config)
    hw = find_hardware(device)
    plans = [InferencePlan(prompt_tokens=512, new_tokens=128, weights=w)
             for w in ("fp32", "bf16", "int4")]
    plans.append(replace(plans[1], expandable_segments=True))
    pruned = [fits.max_context(arch, p, hw) for p in plans]
    inference_peak.cache_clear()
    monkeypatch.setattr(fits, "_over_without_slack", lambda *_: False)
    assert pruned == [fits.max_context(arch, p, hw) for p in plans]


def reference_generate_events(arch: Architecture, batch: int, prompt: int, new_tokens: int,
                              c: float, attention: str,
                              all_logits: bool) -> list[tuple[int, int]]:
    """generate_events as it was, each decode step through HeapTrace's take, drop, rename."""
    h = HeapTrace()
    h.small = 0
    s = Shape(batch, prompt, prompt, c, c, c, attention)
    rows = batch * prompt
    h.take("x", rows * arch.hidden_size * c)
    for layer in range(arch.num_layers):
        layer_tensors(h, arch, s, layer)
    norm_tensors(h, arch, rows * arch.hidden_size, c, "final")
    h.take("logits", batch * (prompt if all_logits else 1) * arch.vocab_size * c)
    h.drop("x", "final")
    h.take("next", batch * arch.vocab_size * 4)
    h.drop("logits")
    kv = arch.kv_dim * c * batch
    for step in range(min(max(0, new_tokens - 1), DECODE_STEPS_REPLAYED)):
        for layer in range(arch.num_layers):
            for name in (f"k{layer}", f"v{layer}"):
                h.take(name + ".new", kv * (prompt + step + 1))
                h.drop(name)
                h.rename(name + ".new", name)
            h.drop(f"qkv{layer}")
    h.drop(*list(h.live))
    return [(e.key, e.nbytes) for e in h.events]


@pytest.mark.parametrize("model", ["gpt2", "llama-3.1-8b", "gemma-2-9b", "phi-2", "falcon-7b"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 2.0, "sdpa", False), (1, 512, 128, 2.0, "sdpa", False),
                                   (3, 700, 5, 4.0, "eager", True), (2, 100, 2, 1.0, "flash", False)])
def test_generate_events_equal_the_traced_decode_steps(model: str, shape: tuple) -> None:  # type: ignore[type-arg]
    arch = from_config(resolve_model(model).config)
    assert generate_events(arch, *shape) == reference_generate_events(arch, *shape)


# The host replays (issue 38, bare `gpuwise`): glibc's heap with its free chunks listed by
# size as well as by start, the resident-set replay of an inference with glibc's steps
# written out in one loop, and generate()'s events made as pairs, against the
# implementations they replaced (tests/speedup_references.py).

HEAP_STATE = ("top", "end", "touched", "faulted", "mmap_threshold", "trim_threshold",
              "free_chunks", "chunks")
RESIDENT_STATE = (*HEAP_STATE, "live", "mapped", "peak_live", "peak_resident", "recent")


def _state(heap: object, names: tuple[str, ...]) -> dict[str, object]:
    return {name: getattr(heap, name) for name in names}


def _random_pairs(rng: random.Random) -> list[tuple[int, int]]:
    """Tensors taken and given back in a random order, sized around glibc's thresholds: below
    the mmap threshold the imports leave, between it and the most it rises to, above."""
    live: list[int] = []
    pairs: list[tuple[int, int]] = []
    for key in range(1, rng.randint(2, 160)):
        if live and rng.random() < 0.45:
            pairs.append((live.pop(rng.randrange(len(live))), 0))
        live.append(key)
        top = rng.choice([96 * 1024, MIB, 3 * MIB, 40 * MIB, 300 * MIB])
        pairs.append((key, rng.randint(64 * 1024, top)))
    return pairs + [(k, 0) for k in rng.sample(live, len(live) // 2)]


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_resident_replay_equals_the_reference_on_random_sequences(allocator: str) -> None:
    rng = random.Random(38)
    choice = allocator_choice(allocator)
    for _ in range(400):
        pairs = _random_pairs(rng)
        events = [HeapEvent(key, nbytes) for key, nbytes in pairs]
        want = _state(ref.replay_resident([events], choice), RESIDENT_STATE)
        assert _state(replay_pairs(pairs, choice), RESIDENT_STATE) == want, pairs
        assert _state(replay_resident([events], choice), RESIDENT_STATE) == want, pairs


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_resident_replay_equals_the_reference_on_training_phases(allocator: str) -> None:
    """The methods the one-loop replay leaves to others: a training step's phases (a
    forward's carved pieces kept for the run) and kept tensors over two passes."""
    rng = random.Random(24)
    choice = allocator_choice(allocator)
    for _ in range(150):
        pairs = _random_pairs(rng)
        third = len(pairs) // 3
        events = [HeapEvent(key, nbytes, "forward" if i < third else "backward",
                            kept=nbytes > 0 and key % 7 == 0)
                  for i, (key, nbytes) in enumerate(pairs)]
        want = ref.replay_resident([events, events], choice, training=True)
        got = replay_resident([events, events], choice, training=True)
        assert _state(got, RESIDENT_STATE) == _state(want, RESIDENT_STATE), events


@pytest.mark.parametrize("memalign", [False, True])
def test_glibc_heap_equals_the_reference_on_random_sequences(memalign: bool) -> None:
    rng = random.Random(5)
    for _ in range(300):
        pairs = _random_pairs(rng)
        heap, want = GlibcHeap(memalign=memalign), ref.GlibcHeap(memalign=memalign)
        for key, nbytes in pairs:
            for h in (heap, want):
                if nbytes:
                    h.malloc(key, nbytes)
                else:
                    h.free(key)
            assert _state(heap, HEAP_STATE) == _state(want, HEAP_STATE), pairs
        events = [HeapEvent(key, nbytes) for key, nbytes in pairs]
        assert fault_replay(events) == ref.replay(events)


CPU_SHAPES = [(1, 1, 2.0, 2.0, "sdpa", 17, 16), (1, 2048, 2.0, 2.0, "sdpa", 17, 16),
              (2, 700, 4.0, 4.0, "eager", 5, 1), (1, 300_000, 2.0, 1.0, "sdpa", 17, 16),
              (3, 9000, 2.0, 2.0, "eager", 3, 40)]


@pytest.mark.parametrize("model", ["gpt2", "llama-3.1-8b", "gemma-2-9b", "phi-2", "qwen2.5-0.5b",
                                   "mixtral-8x7b"])
@pytest.mark.parametrize("shape", CPU_SHAPES)
def test_host_generate_replay_equals_the_reference(model: str, shape: tuple) -> None:  # type: ignore[type-arg]
    arch = from_config(resolve_model(model).config)
    batch, prompt, c, kv, attention, steps, stride = shape
    s = Shape(batch, prompt, prompt, c, c, kv, attention)
    events = ref.generate_events(arch, s, steps, stride)
    assert process_heap.generate_events(arch, s, steps, stride) == events
    pairs = process_heap.generate_pairs(arch, s, steps, stride)
    for allocator in ("glibc", "jemalloc"):
        choice = allocator_choice(allocator)
        want = _state(ref.replay_resident([events], choice), RESIDENT_STATE)
        assert _state(replay_pairs(pairs, choice), RESIDENT_STATE) == want


def test_replay_of_a_segment_past_the_one_loops_offsets_equals_the_reference() -> None:
    """A tensor of 2**64 bytes or more (no device holds one, a plan may still ask) leaves
    the one-loop replay for the allocator's class."""
    events = [(1, 3 * MIB), (2, 1 << 65), (3, 5 * MIB), (1, 0), (4, 2 * MIB), (2, 0), (3, 0)]
    assert replay(events) == reference_replay(events)


@pytest.mark.parametrize(("model", "device"), [("qwen2.5-0.5b", "cpu-cloud-32vcpu"),
                                               ("gpt2", "cpu-cloud-32vcpu"),
                                               ("qwen2.5-0.5b", "t4"), ("gpt2", "rtx-4090")])  # fmt: skip
def test_check_rows_equal_those_of_the_replays_they_replaced(model: str, device: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """check's rows, max context included, with every replay (host and CUDA) and its events
    as they were: the same numbers."""
    from gpuwise.estimate.memory import cuda_rows, host_allocator
    from gpuwise.estimate.memory.check_rows import check_rows

    arch = from_config(resolve_model(model).config)
    hw = find_hardware(device)
    plan = InferencePlan(prompt_tokens=700, new_tokens=40)
    host_allocator._generate_slack.cache_clear()
    inference_peak.cache_clear()
    rows = check_rows(arch, plan, hw)

    def old_slack(arch: Architecture, allocator: str, shape: Shape, steps: int,
                  stride: int) -> host_allocator.AllocatorSlack:  # fmt: skip
        choice = allocator_choice(allocator)
        heap = ref.replay_resident([ref.generate_events(arch, shape, steps, stride)], choice)
        return host_allocator.AllocatorSlack(choice.name, max(0, heap.peak_resident - heap.peak_live),
                                             heap.peak_live, heap.peak_resident,
                                             heap.mmap_threshold)  # fmt: skip

    def old_peak(arch: Architecture, batch: int, prompt: int, new_tokens: int, c: float,
                 attention: str, all_logits: bool, expandable: bool) -> ReplayPeak:  # fmt: skip
        events = reference_generate_events(arch, batch, prompt, new_tokens, c, attention, all_logits)
        return reference_replay(events, expandable)

    monkeypatch.setattr(host_allocator, "_generate_slack", old_slack)
    monkeypatch.setattr(cuda_rows, "inference_peak", old_peak)
    assert check_rows(arch, plan, hw) == rows
