"""A transformers training step's tensors as the host allocator sees them
(workload.training_heap), the faults their replay finds against those measured, and how the
training estimate charges them."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from catalogue_archs import arch
from heap_walk import held_at_end, most_held, peak_bytes

from gpuwise.catalog import find_hardware
from gpuwise.catalog.allocators import host_allocator
from gpuwise.estimate import TrainingPlan
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.estimate.speed.page_faults import replay
from gpuwise.estimate.speed.probed_kernels import KernelRates
from gpuwise.estimate.speed.training_time import estimate_training_time, training_fault_bytes
from gpuwise.workload.ops import Shape
from gpuwise.workload.training_heap import (
    adapter_step_events,
    layer_weights,
    optimizer_events,
    step_events,
    training_heap_events,
)

MB = 1e6
SMALL = host_allocator().untracked_below_bytes
GLIBC_MMAP_THRESHOLD_MAX = host_allocator().mmap_threshold_max
GPU = rates_from_spec(find_hardware("h100-sxm"))
FRESH = {"fresh": {"bytes_per_s": 4e9, "threshold": GLIBC_MMAP_THRESHOLD_MAX}}
CPU = replace(GPU, kind="cpu", kernel_latency_s=0.0, kernels=KernelRates.from_record(FRESH))


def _shape(batch: int, seq: int, c: int, attention: str = "sdpa") -> Shape:
    return Shape(batch, seq, seq, c, c, c, attention, seq)


def _faults(name: str, batch: int, seq: int, c: int, optimizer: str = "adamw",
            attention: str = "sdpa") -> dict[str, float]:
    events = training_heap_events(arch(name), _shape(batch, seq, c, attention), c, optimizer)
    return {k: v / MB for k, v in replay(events, passes=2).items()}


@pytest.mark.parametrize(("name", "checkpointing", "param_bytes"),
                         [("smollm2-135m", False, 4), ("gpt2", False, 4), ("pythia-70m", True, 4),
                          ("qwen2.5-0.5b", False, 2), ("smollm2-135m", True, 4),
                          ("smollm2-135m", False, 4.0001)])
def test_every_tensor_is_taken_once_and_given_back_at_most_once(name, checkpointing, param_bytes):
    s = _shape(2, 256, 2 if param_bytes == 2 else 4)
    events = training_heap_events(arch(name), s, param_bytes, "adamw", checkpointing)
    taken = [e.key for e in events if e.nbytes]
    assert len(set(taken)) == len(taken)
    assert all(e.nbytes >= SMALL for e in events if e.nbytes)
    live = held_at_end(events)  # given back only while it is held
    # What is left at the end: the gradients (to zero_grad) and the optimizer's states.
    kept = {e.key for e in events if e.kept}
    grads = [e for e in events if e.key in live - kept]
    assert all(e.phase == "backward" for e in grads)
    weights = [n for n in layer_weights(arch(name)) * arch(name).num_layers if n * 4 >= SMALL]
    assert len(grads) == len(weights)


def test_the_backward_gives_back_all_the_forward_saved_and_checkpointing_saves_less():
    a, s = arch("smollm2-135m"), _shape(1, 512, 4)

    def forward_peak(checkpointing: bool) -> int:
        events = training_heap_events(a, s, 4, "adamw", checkpointing)
        return peak_bytes(itertools.takewhile(lambda e: e.phase == "forward", events))

    saved, checkpointed = forward_peak(False), forward_peak(True)
    layer_inputs = a.num_layers * s.rows * a.hidden_size * 4
    assert saved > 10 * layer_inputs  # every layer's intermediates
    assert layer_inputs <= checkpointed < layer_inputs + 12 * s.rows * a.intermediate_size * 4


def test_qwen25_bf16_faults_its_mlp_gradients_and_adamw_temporaries_as_measured():
    """Measured (AMD EPYC guest, `ru_minflt` around each phase of a steady step, the
    vocabulary-sized tensors taken out): backward 630-660 MB, optimizer 834 MB (72 MLP
    tensors of 8.7 MB, AdamW's root and quotient each). The replay: 463 and 625 MB."""
    faults = _faults("qwen2.5-0.5b", 1, 128, 2)
    assert 0.6 * 645 <= faults["backward"] <= 1.4 * 645
    assert 0.6 * 834 <= faults["optimizer"] <= 1.4 * 834


@pytest.mark.parametrize(("name", "batch", "c", "optimizer", "attention"),
                         [("gpt2", 2, 4, "adamw", "eager"), ("smollm2-135m", 2, 4, "adamw", "sdpa"),
                          ("pythia-70m", 4, 4, "sgd", "sdpa")])
def test_fp32_steps_whose_activations_leave_room_fault_little_after_the_forward(
        name, batch, c, optimizer, attention):
    """Measured: their backward and optimizer fault only their vocabulary-sized tensors
    (within 0-120 MB); the heap the activations leave serves the rest."""
    faults = _faults(name, batch, 256, c, optimizer, attention)
    assert faults.get("backward", 0) < 50 and faults.get("optimizer", 0) < 50


def test_adamw_keeps_each_quotient_until_the_next_parameter_replaces_it():
    events = optimizer_events(arch("smollm2-135m"), "adamw", 4, 0)
    states = [e for e in events if e.kept]
    temporaries = [e for e in events if not e.kept]
    weights = [n for n in layer_weights(arch("smollm2-135m")) * 30 if n * 4 >= SMALL]
    assert len(states) == 2 * len(weights)
    assert not held_at_end(temporaries)
    assert most_held(temporaries) == 3  # the old quotient, the new root and quotient
    assert not any(e.nbytes >= GLIBC_MMAP_THRESHOLD_MAX for e in events)
    assert [e for e in optimizer_events(arch("smollm2-135m"), "sgd", 4, 0) if not e.kept] == []


def test_a_probed_cpu_charges_the_replayed_faults_to_backward_and_optimizer_only():
    plan = TrainingPlan(batch=1, seq=128, dtype="bf16", optimizer="adamw")
    a = arch("qwen2.5-0.5b")
    on_cpu = estimate_training_time(a, plan, CPU)
    faults = training_fault_bytes(a, _shape(1, 128, 2), 2, "adamw", False)
    for phase in (on_cpu.backward, on_cpu.optimizer):
        rows = [t for t in phase.ops if t.op.name == "page faults"]
        assert len(rows) == 1 and rows[0].op.bytes == faults[phase.name]
        assert rows[0].seconds == pytest.approx(faults[phase.name] / 4e9) and rows[0].seconds > 0
    assert not any(t.op.name == "page faults" for t in on_cpu.forward.ops)
    on_gpu = estimate_training_time(a, plan, GPU)
    assert not any(t.op.name == "page faults" for t in on_gpu.backward.ops + on_gpu.optimizer.ops)
    lora = estimate_training_time(a, replace(plan, finetune="lora"), CPU)
    assert not any(t.op.name == "page faults" for t in lora.backward.ops)


def test_a_lora_projections_backward_sums_the_gradients_through_the_adapters_and_the_base():
    # peft: result + lora_B(lora_A(x)) * scaling; the backward takes the scaled output
    # gradient, the input's gradient through lora_A and through the base, and their sum; the
    # frozen base takes no weight gradient
    a = arch("smollm2-135m")
    s = Shape(2, 256, 256, 4, 4, 4, "sdpa")
    taken = {}
    for adapted in (False, True):
        events = training_heap_events(a, s, 4, "sgd", False, adapted=adapted)
        taken[adapted] = sum(1 for e in events if e.nbytes and e.phase == "backward")
    projections = len(layer_weights(a)) * a.num_layers
    assert taken[True] - taken[False] == (3 - 1) * projections


def test_lora_adapters_of_64_kib_take_gradients_kept_to_zero_grad_and_an_adamw_step():
    # SmolLM2-135M, rank 16: lora_B of gate and up (1536 x 16) and lora_A of down (16 x 1536)
    # are 96 KiB in fp32; the other adapters are below 64 KiB
    a = arch("smollm2-135m")
    s = Shape(2, 256, 256, 4, 4, 4, "sdpa")
    events = training_heap_events(a, s, 4, "adamw", False, adapted=True, lora_rank=16)
    adapter = 1536 * 16 * 4
    grads = [e for e in events if e.nbytes == adapter and e.phase == "backward"]
    assert len(grads) == 3 * a.num_layers and {e.key for e in grads} <= held_at_end(events)
    step = [e for e in events if e.phase == "optimizer"]
    assert {e.nbytes for e in step if e.nbytes} == {adapter}
    assert sum(e.kept for e in step) == 2 * 3 * a.num_layers  # exp_avg, exp_avg_sq
    assert sum(1 for e in step if e.nbytes and not e.kept) == 2 * 3 * a.num_layers  # root, denom
    assert adapter_step_events(a, "adamw", 16, 1) == step_events(
        [adapter] * 3 * a.num_layers, "adamw", itertools.count(1)
    )


def _forward_sizes(events: list, nbytes: int) -> int:
    return sum(1 for e in events if e.nbytes == nbytes and e.phase == "forward")


def test_the_detailed_step_copies_k_and_v_into_the_cache_unless_checkpointed():
    # transformers' DynamicLayer.update cats each onto an empty tensor; checkpointing turns
    # the cache off
    a = arch("smollm2-135m")
    s = Shape(2, 256, 256, 4, 4, 4, "sdpa")
    kv = 2 * 256 * a.kv_dim * 4
    for checkpointing in (False, True):
        coarse = training_heap_events(a, s, 4, "sgd", checkpointing)
        fine = training_heap_events(a, s, 4, "sgd", checkpointing, detailed=True)
        copies = _forward_sizes(fine, kv) - _forward_sizes(coarse, kv)
        assert copies == (0 if checkpointing else 2 * a.num_layers)


def test_the_detailed_step_frees_in_the_forward_what_autograd_does_not_save():
    # rotary's products, RMSNorm's pow, the residual sums' operands: given back before the
    # backward, the same tensors taken
    a = arch("smollm2-135m")
    s = Shape(2, 256, 256, 4, 4, 4, "sdpa")
    coarse = training_heap_events(a, s, 4, "sgd", False)
    fine = training_heap_events(a, s, 4, "sgd", False, detailed=True)
    forward = [e for e in fine if e.phase == "forward"]
    freed = sum(1 for e in forward if not e.nbytes)
    assert freed > sum(1 for e in coarse if e.phase == "forward" and not e.nbytes) + a.num_layers
    taken = [e.key for e in fine if e.nbytes]
    given = [e.key for e in fine if not e.nbytes]
    assert len(set(taken)) == len(taken) and len(set(given)) == len(given)


def test_the_detailed_backward_takes_k_and_v_gradients_and_sums_sibling_projections():
    # the CPU flash kernel's backward zero-fills the gradients of q, k and v; the input
    # gradients of q, k, v (and of gate, up) are summed into new tensors (input_buffer.cpp)
    a = arch("smollm2-135m")
    s = Shape(2, 256, 256, 4, 4, 4, "sdpa")
    kv, hidden = 2 * 256 * a.kv_dim * 4, 2 * 256 * a.hidden_size * 4
    coarse = training_heap_events(a, s, 4, "sgd", True)
    fine = training_heap_events(a, s, 4, "sgd", True, detailed=True)

    def backward(events: list, nbytes: int) -> int:  # a recomputed layer's forward included
        return sum(1 for e in events if e.nbytes == nbytes and e.phase in ("backward", "recompute"))

    assert backward(fine, kv) - backward(coarse, kv) == 2 * a.num_layers
    # the three sums a layer the detailed step takes, less the flash output's copy the
    # coarse list takes, in the recomputed forward and for its gradient; and each RMSNorm's
    # backward scratch (five fp32 products of the hidden size: two norms a layer, and the
    # final one)
    scratch = 5 * (a.norms_per_layer * a.num_layers + 1)
    assert backward(fine, hidden) - backward(coarse, hidden) == (3 - 2) * a.num_layers + scratch


def test_the_detailed_step_gives_back_eager_scores_but_keeps_the_softmax():
    # q @ k^T, its scaling and its mask save nothing a backward needs; softmax saves its
    # output: of the four score-sized tensors of a layer, one is alive when the forward ends
    a = arch("pythia-160m")
    s = Shape(1, 512, 512, 4, 4, 4, "eager")
    scores = a.num_heads * 512 * 512 * 4  # twice the MLP's 512 x 3072 activations
    events = training_heap_events(a, s, 4, "adamw", False, detailed=True)
    forward = [e for e in events if e.phase == "forward"]
    taken = {e.key for e in forward if e.nbytes == scores}
    freed = {e.key for e in forward if not e.nbytes} & taken
    assert len(taken) == 4 * a.num_layers and len(taken - freed) == a.num_layers


def test_a_half_precision_lora_base_saves_an_fp32_copy_of_each_projections_input():
    # peft casts x to lora_A's fp32 before the adapters (`_cast_input_dtype`): one copy per
    # projection, saved by lora_A to the backward; an fp32 base takes none
    a = arch("qwen2.5-0.5b")
    wide = 256 * a.intermediate_size * 4  # the down projection's input, in fp32
    saved = {}
    for c, adapted in ((2, True), (4, True), (4, False)):
        s = Shape(1, 256, 256, c, c, c, "sdpa")
        events = training_heap_events(a, s, c, "adamw", False, adapted=adapted, detailed=True,
                                      lora_rank=16)
        forward = {e.key for e in events if e.phase == "forward" and e.nbytes == wide}
        freed_later = {e.key for e in events if e.phase == "backward" and not e.nbytes}
        saved[c, adapted] = len(forward & freed_later)
    assert saved[2, True] == a.num_layers  # bf16 activations are half as wide
    assert saved[4, True] == saved[4, False]


def test_the_detailed_step_takes_no_copy_of_the_cpu_flash_attentions_output():
    # the CPU flash kernel's output is laid out (batch, tokens, heads, dim): its
    # transpose(1, 2).contiguous() is the same tensor; the coarse list copies it
    a = arch("smollm2-135m")
    s = Shape(2, 256, 256, 4, 4, 4, "sdpa")
    q = 2 * 256 * a.q_dim * 4
    coarse = training_heap_events(a, s, 4, "sgd", True)
    fine = training_heap_events(a, s, 4, "sgd", True, detailed=True)
    assert _forward_sizes(coarse, q) - _forward_sizes(fine, q) == a.num_layers


def test_a_checkpointed_layers_recomputation_is_its_own_phase_in_the_detailed_step():
    # its forward builds the layer's graph again, so the host replay carves what it frees as
    # a forward's; the coarse list keeps it in the backward
    a = arch("smollm2-135m")
    s = Shape(2, 256, 256, 4, 4, 4, "sdpa")
    fine = training_heap_events(a, s, 4, "sgd", True, detailed=True)
    coarse = training_heap_events(a, s, 4, "sgd", True)
    assert sum(e.phase == "recompute" for e in fine) > 10 * a.num_layers
    assert not any(e.phase == "recompute" for e in coarse)
    assert not any(e.phase == "recompute" for e in training_heap_events(a, s, 4, "sgd", False,
                                                                        detailed=True))
