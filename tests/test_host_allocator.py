"""What a CPU process keeps resident beyond its live tensors (estimate.memory.host_allocator):
glibc's rules worked by hand (the dynamic mmap threshold, the heap's high-water mark, trimming,
holes), the other allocators' rules, the run's tensors (workload.process_heap) and the
estimate's "allocator" row."""

from __future__ import annotations

import pytest
from catalogue_archs import arch
from heap_walk import held_at_end, walk

from gpuwise.catalog import find_hardware
from gpuwise.catalog.allocators import allocator_choice, allocator_choices, host_allocator
from gpuwise.estimate import InferencePlan, TrainingPlan
from gpuwise.estimate.memory.host_allocator import allocator_slack
from gpuwise.estimate.memory.host_replay import ResidentHeap, replay_resident
from gpuwise.estimate.memory.training import estimate_training
from gpuwise.estimate.runtimes import estimate_inference
from gpuwise.estimate.speed.page_faults import GlibcHeap
from gpuwise.workload.ops import Shape
from gpuwise.workload.plans import ALLOCATORS
from gpuwise.workload.process_heap import generate_events, training_step_events
from gpuwise.workload.traced import HeapEvent

MIB = 2**20
TOP_PAD = host_allocator().top_pad
AT_BUILD = host_allocator().mmap_threshold_at_build  # where the imports left the threshold
BIG = 4 * MIB  # over it: mapped until a freed mapping raises the threshold
CPU = find_hardware("cpu-cloud-32vcpu")
GPU = find_hardware("h100-sxm")


def heap(name: str = "glibc") -> ResidentHeap:
    return ResidentHeap(choice=allocator_choice(name))


def test_a_freed_mapped_tensor_sends_the_next_one_to_the_heap_where_it_stays_resident():
    h = heap()
    h.malloc(1, BIG)
    assert h.chunks[1][2] and h.resident == pytest.approx(BIG, rel=0.01)  # mapped
    h.free(1)
    assert h.resident == 0  # unmapped at once
    assert h.mmap_threshold > BIG and h.trim_threshold == 2 * h.mmap_threshold
    h.malloc(2, BIG)
    assert not h.chunks[2][2]  # the same size now comes from the heap...
    h.free(2)
    # ...and stays resident: the free top (4 MiB + pad) is under the 8 MiB trim threshold,
    # and the pages written stay (the pad's, never written, are not resident)
    assert h.live == 0 and h.resident == pytest.approx(BIG, rel=0.01)
    assert h.end - h.top >= BIG + TOP_PAD


def test_the_imports_have_raised_the_threshold_before_the_model_is_built():
    h = heap()
    assert h.mmap_threshold == AT_BUILD > host_allocator().mmap_threshold_min
    h.malloc(1, MIB)  # under it: from the heap at once
    h.malloc(2, BIG)
    assert not h.chunks[1][2] and h.chunks[2][2]
    assert heap("glibc-mmap64k").mmap_threshold == 65536  # pinned: as set


def test_a_tensor_does_not_fit_the_chunk_a_tensor_of_its_size_left():
    # _int_memalign asks for the tensor's chunk + 64 + MINSIZE: a freed chunk with its 48-byte
    # leaders is 96 bytes over the tensor's, 16 short; a slightly smaller tensor fits
    for n, fits in ((MIB, False), (MIB - 16, True)):
        h = heap()
        h.malloc(0, MIB)
        h.malloc(1, MIB // 2)  # a neighbour that stays
        h.free(0)
        h.malloc(2, n)
        assert (h.chunks[2][0] < h.chunks[1][0]) is fits
        assert h.resident >= h.live + (0 if fits else MIB)


def test_memalign_places_each_tensor_at_a_64_byte_aligned_spot_after_a_leader():
    h = GlibcHeap(memalign=True, mmap_threshold=8 * MIB)
    h.malloc(0, MIB)
    h.malloc(1, MIB)
    (a, size_a, _), (b, _, _) = h.chunks[0], h.chunks[1]
    assert size_a == MIB + 16  # request2size: the request + SIZE_SZ, to 16 bytes
    assert (a + 16) % 64 == 0 and (b + 16) % 64 == 0  # the user pointers are aligned
    assert a == 48 and b == a + size_a + 48  # leaders of 48 bytes; the trailer went back
    assert h.top == b + MIB + 16


def test_pinned_at_64_kib_every_tensor_is_mapped_and_nothing_stays():
    h = heap("glibc-mmap64k")
    for key in range(3):
        h.malloc(key, MIB)
        h.free(key)
    assert h.mmap_threshold == 65536 and h.resident == 0
    assert h.peak_resident == pytest.approx(h.peak_live, rel=0.01)


def test_the_heap_shrinks_only_when_its_free_top_reaches_twice_the_threshold():
    h = heap()
    h.malloc(0, BIG)
    h.free(0)  # threshold ~4 MiB, trim threshold ~8 MiB
    for key in (1, 2, 3):
        h.malloc(key, int(0.9 * BIG))
    for key in (1, 2, 3):
        h.free(key)
    assert h.resident <= TOP_PAD + 4096  # 10.8 MiB on top: trimmed back to the pad
    assert h.peak_resident == pytest.approx(2.7 * BIG, rel=0.02)


def test_a_hole_too_small_for_a_growing_tensor_keeps_its_pages():
    # the KV cache's pattern: a tensor replaced by a larger copy leaves its old place empty
    h = heap()
    h.malloc(0, 4 * MIB)
    h.free(0)  # from now on up to 4 MiB comes from the heap
    h.malloc(1, MIB)
    h.malloc(2, MIB // 2)  # a neighbour that stays
    h.malloc(3, MIB + 65536)  # the bigger copy cannot use the first's hole...
    h.free(1)
    assert h.resident >= h.live + MIB  # ...whose megabyte stays resident


def test_a_training_forwards_pieces_stay_for_the_run_and_a_backwards_only_the_last():
    # a small request takes the start of a chunk a freed tensor left, so a smaller tensor no
    # longer fits it; a training forward's pieces stay for the run, a backward's only while
    # they are among the last `pinned_small_chunks` (tcache)
    glibc = allocator_choice("glibc")
    held = {}
    for phase in ("forward", "recompute", "backward"):  # recompute: a checkpointed layer's
        events = [HeapEvent(1, MIB, phase), HeapEvent(2, MIB // 2, phase),  # a neighbour stays
                  HeapEvent(1, 0, phase),
                  HeapEvent(3, MIB - 512, phase)]  # fits the hole (memalign's 112 bytes over)
        held[phase] = replay_resident([events], glibc, training=True).peak_resident
    assert held["forward"] == held["recompute"] == held["backward"]  # the smaller one on top
    assert held["forward"] >= 2 * MIB + MIB // 2 - 4096  # the three side by side
    # a forward's pieces stay taken for the run: what the passes gave back merges above them
    first = [HeapEvent(1, MIB), HeapEvent(2, MIB // 2), HeapEvent(1, 0)]
    heap = replay_resident([first, first], glibc, training=True)
    assert heap.top == 2 * glibc.carved_by_small_bytes  # one piece a pass
    # a backward's go once newer ones push them out of the last `pinned_small_chunks`
    back = [[HeapEvent(1, MIB, "backward"), HeapEvent(2, MIB // 2, "backward"),
             HeapEvent(1, 0, "backward")]] * (glibc.pinned_small_chunks + 2)
    heap = replay_resident(back, glibc, training=True)
    assert len(heap.recent) == glibc.pinned_small_chunks


def test_an_inference_keeps_only_the_last_pieces_tcache_would_hold():
    # no graph grows: only the last `pinned_small_chunks` pieces stay taken, the oldest
    # given back (and merged) as a new one is taken
    glibc = allocator_choice("glibc")
    pinned = glibc.pinned_small_chunks
    heap = ResidentHeap(choice=glibc)
    heap.enter("forward", training=False)
    for key in range(2 * pinned + 4):
        heap.malloc(key, MIB // 4)
    starts = [heap.chunks[key][0] for key in range(0, 2 * pinned + 4, 2)]
    for key in range(0, 2 * pinned + 4, 2):  # every other one goes, its neighbours stay
        heap.free(key)
    assert len(heap.recent) == pinned
    assert min(start for start, _ in heap.recent) > starts[1]  # the two oldest went back
    free = dict(heap.free_chunks)
    assert free.get(starts[0] - heap._leader(0), 0) >= MIB // 4  # and merged with their hole


def test_only_glibc_carves():
    assert allocator_choice("glibc").carved_by_small_bytes > 0
    for name in ("glibc-mmap64k", "jemalloc", "tcmalloc"):
        assert allocator_choice(name).carved_by_small_bytes == 0
    infer = InferencePlan(batch=2, prompt_tokens=512, new_tokens=8)
    train = TrainingPlan(batch=2, seq=256)
    smollm = arch("smollm2-135m")
    assert allocator_slack(smollm, train).slack_bytes > 100 * MIB  # its gradients go on top
    assert allocator_slack(smollm, infer).slack_bytes < 40 * MIB


def test_tcmalloc_keeps_what_glibc_would_unmap_and_jemalloc_gives_back_oversize():
    big = [HeapEvent(1, 64 * MIB), HeapEvent(1, 0), HeapEvent(2, BIG), HeapEvent(2, 0)]
    glibc = replay_resident([big], allocator_choice("glibc"))
    tcmalloc = replay_resident([big], allocator_choice("tcmalloc"))
    jemalloc = replay_resident([big], allocator_choice("jemalloc"))
    assert glibc.resident < MIB  # 64 MiB unmapped; 4 MiB mapped, then unmapped
    assert tcmalloc.resident >= 64 * MIB  # every freed span kept
    assert jemalloc.resident < BIG + MIB  # over 8 MiB: the oversize arena keeps nothing


def test_jemalloc_rounds_to_four_size_classes_a_doubling():
    h = heap("jemalloc")
    assert h._chunk(5 * MIB) == 5 * MIB  # a class: 4, 5, 6, 7, 8 MiB
    assert h._chunk(5 * MIB + 1) == 6 * MIB
    assert heap("tcmalloc")._chunk(300_000) % 8192 == 0


def test_kept_tensors_are_taken_on_the_first_pass_only():
    step = [HeapEvent(1, 2 * MIB, "optimizer", kept=True), HeapEvent(2, MIB), HeapEvent(2, 0)]
    h = replay_resident([step, step], allocator_choice("glibc"))
    assert h.live == 2 * MIB and set(h.chunks) == {1}


def _shape(batch: int, tokens: int, c: int, attention: str = "sdpa") -> Shape:
    return Shape(batch, tokens, tokens, c, c, c, attention)


@pytest.mark.parametrize(("name", "attention"), [("smollm2-135m", "sdpa"), ("gpt2", "eager"),
                                                 ("pythia-70m", "sdpa"),
                                                 ("qwen2.5-0.5b", "eager")])
def test_generate_gives_back_everything_and_grows_the_cache_each_step(name, attention):
    a = arch(name)
    events = generate_events(a, _shape(1, 512, 4, attention), new_tokens=8)
    assert not held_at_end(events)
    taken = [e.key for e in events if e.nbytes]
    assert len(set(taken)) == len(taken)
    one = a.num_kv_heads * a.head_dim * 4  # a layer's keys, per position
    sizes = {e.nbytes for e in events}
    assert {one * 513, one * 519} <= sizes  # the first and the last decode step's copies


def test_a_training_step_puts_the_vocabulary_sized_tensors_back_and_lora_steps_the_adapters():
    a = arch("smollm2-135m")
    s = _shape(2, 256, 4)
    full = training_step_events(a, s, 4, "adamw", False)
    logits = 2 * 256 * a.vocab_size * 4
    assert sum(e.nbytes == logits for e in full) >= 3  # log_softmax's output and two grads
    lora = training_step_events(a, s, 4, "adamw", False, trains_weights=False, lora_rank=16)
    adapter = 1536 * 16 * 4  # the adapters of 64 KiB and more, their gradients kept
    held = held_at_end(lora)
    assert {e.nbytes for e in lora if e.key in held and e.nbytes} == {adapter}
    assert {e.nbytes for e in lora if e.phase == "optimizer" and e.nbytes} == {adapter}
    assert max(n for *_, n in walk(lora)) < max(n for *_, n in walk(full))


def test_lora_projections_give_back_the_base_output_and_the_adapters_in_the_forward():
    # peft: result = result + lora_B(lora_A(x)) * scaling; three tensors a projection go
    a = arch("smollm2-135m")
    s = _shape(2, 256, 4)
    full = [e for e in training_step_events(a, s, 4, "adamw", False) if e.phase == "forward"]
    lora = [e for e in training_step_events(a, s, 4, "adamw", False, trains_weights=False)
            if e.phase == "forward"]
    projections = 7 * a.num_layers
    freed = sum(not e.nbytes for e in lora) - sum(not e.nbytes for e in full)
    # and the scaled adapters' output is what RMSNorm's `weight * x` no longer saves
    norms = 2 * a.num_layers + 1
    assert freed == 3 * projections + norms
    assert sum(e.nbytes > 0 for e in lora) - sum(e.nbytes > 0 for e in full) == 3 * projections


def test_every_allocator_a_plan_names_is_in_the_catalogue_and_the_default_is_glibc():
    assert tuple(allocator_choices()) == ALLOCATORS
    assert InferencePlan().allocator == TrainingPlan().allocator == "glibc"
    assert allocator_choice("glibc").env_vars == {}
    assert allocator_choice("jemalloc").preload == "libjemalloc.so.2"


def test_a_cpu_estimate_has_the_allocator_row_and_a_gpu_estimate_has_none():
    a = arch("smollm2-135m")
    plan = TrainingPlan(batch=2, seq=256, dtype="fp32")
    cpu = estimate_training(a, plan, CPU)
    assert "allocator" in cpu.breakdown and cpu.total_bytes == sum(cpu.breakdown.values())
    assert cpu.phases[cpu.peak_phase] == cpu.total_bytes
    assert "allocator" not in estimate_training(a, plan, GPU).breakdown
    pinned = estimate_inference(a, InferencePlan(prompt_tokens=512, new_tokens=8,
                                                 allocator="glibc-mmap64k"), CPU)
    assert pinned.breakdown["allocator"] < MIB


@pytest.mark.parametrize("plan", [InferencePlan(batch=1, prompt_tokens=1024, new_tokens=64,
                                                weights="bf16"),
                                  TrainingPlan(batch=1, seq=512, dtype="bf16")])
def test_pinned_glibc_keeps_only_its_page_rounding(plan):
    a = arch("qwen2.5-0.5b")
    kept = {name: allocator_slack(a, _with(plan, name)) for name in ALLOCATORS}
    pinned = kept["glibc-mmap64k"]
    assert 0 <= pinned.slack_bytes < 0.005 * pinned.peak_live_bytes
    assert all(k.peak_resident_bytes >= k.peak_live_bytes for k in kept.values())


def _with(plan: InferencePlan | TrainingPlan, allocator: str) -> InferencePlan | TrainingPlan:
    from dataclasses import replace

    return replace(plan, allocator=allocator)
