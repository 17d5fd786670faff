"""The CUDA caching allocator replay and the rows a GPU process adds (estimate/memory/
cuda_allocator.py, cuda_rows.py): each rule of c10/cuda/CUDACachingAllocator.cpp checked on
a sequence whose answer follows from that rule alone."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.catalog.cuda_allocator import cublas_workspace_bytes, cuda_allocator
from gpuwise.estimate.memory.cuda_allocator import ReplayPeak, replay
from gpuwise.estimate.memory.cuda_rows import device_slack, inference_peak, training_peak
from gpuwise.estimate.memory.training import estimate_training
from gpuwise.estimate.runtimes import estimate_inference
from gpuwise.workload import from_config
from gpuwise.workload.plans import InferencePlan, TrainingPlan

MIB = 1 << 20


def test_small_requests_round_to_512_bytes_in_2_mib_segments():
    peak = replay([(1, 100), (2, 600)])
    assert peak.allocated == 512 + 1024
    assert peak.reserved == 2 * MIB


def test_requests_between_1_and_10_mib_share_a_20_mib_segment():
    peak = replay([(1, 5 * MIB), (2, 5 * MIB), (3, 5 * MIB)])
    assert peak.reserved == 20 * MIB
    assert peak.slack == 5 * MIB


def test_requests_from_10_mib_round_up_to_2_mib():
    peak = replay([(1, 11 * MIB)])
    assert peak.reserved == 12 * MIB
    # 1 MiB is left: a large block is split only when more than 1 MiB remains
    assert peak.allocated == 12 * MIB
    # a little more than 1 MiB left: split, the rest stays free in the segment
    assert replay([(1, 11 * MIB - 1024)]).allocated == 11 * MIB - 1024


def test_freed_blocks_merge_within_a_segment_only():
    # two 32 MiB tensors in two segments; freeing the first leaves a 32 MiB hole that a
    # 34 MiB request cannot use, so a third segment is reserved
    peak = replay([(1, 32 * MIB), (2, 32 * MIB), (1, 0), (3, 34 * MIB)])
    assert peak.reserved == (32 + 32 + 34) * MIB
    # an out-of-memory retry could give the wholly free first segment back
    assert peak.pinned == (32 + 34) * MIB


def test_best_fit_reuses_the_smallest_free_block():
    events = [(1, 40 * MIB), (2, 24 * MIB), (1, 0), (2, 0), (3, 24 * MIB)]
    assert replay(events).reserved == 64 * MIB  # reused the 24 MiB segment, no new one


def test_expandable_segments_grow_one_segment_and_remove_the_hole():
    events = [(1, 32 * MIB), (1, 0), (2, 34 * MIB)]
    assert replay(events).reserved == (32 + 34) * MIB
    # one segment mapped in 20 MiB pages: the freed 32 MiB merges with the tail
    assert replay(events, expandable=True).reserved == 40 * MIB


def test_expandable_segments_remove_most_of_a_generation_slack():
    arch = from_config(resolve_model("llama-3.1-8b").config)
    default = inference_peak(arch, 32, 512, 16, 2, "sdpa", False, False)
    expandable = inference_peak(arch, 32, 512, 16, 2, "sdpa", False, True)
    assert default.slack > 500 * MIB  # the KV cache's growth strands whole segments
    assert expandable.slack < default.slack / 2
    assert expandable.requested == default.requested


def test_training_replay_grads_fragment_the_pool_but_a_retry_releases_free_segments():
    arch = from_config(resolve_model("llama-3.1-70b").config)
    peak = training_peak(arch, 1, 4096, 2, 4, "sdpa", False, 4096, True, False)
    assert peak.slack > 10 * peak.pinned_slack


def test_device_slack_is_the_pool_where_there_is_room_else_what_fills_the_device():
    peak = ReplayPeak(reserved=10 * MIB, requested=4 * MIB, allocated=4 * MIB, pinned=6 * MIB)
    assert device_slack(peak, capacity=100 * MIB, others=50 * MIB) == 6 * MIB
    assert device_slack(peak, capacity=100 * MIB, others=97 * MIB) == 3 * MIB
    assert device_slack(peak, capacity=100 * MIB, others=99 * MIB) == 2 * MIB  # pinned


def test_cublas_workspace_is_32_mib_on_hopper_and_8_mib_before():
    assert cublas_workspace_bytes("h100-sxm") == 32 * MIB
    assert cublas_workspace_bytes("h200-sxm") == 32 * MIB
    assert cublas_workspace_bytes("a100-sxm-80gb") == 4096 * 1024 * 2 + 16 * 1024 * 8
    assert cublas_workspace_bytes("mi300x") == 128 * MIB


def test_gpu_rows_replace_the_fixed_overhead():
    arch = from_config(resolve_model("qwen2.5-0.5b").config)
    hw = find_hardware("h200-sxm")
    est = estimate_inference(arch, InferencePlan(prompt_tokens=512, new_tokens=32), hw)
    rules = cuda_allocator()
    assert est.breakdown["overhead"] == rules.cuda_context_bytes
    assert est.breakdown["cublas_workspace"] == 32 * MIB
    assert est.breakdown["allocator_slack"] > 0
    # torch.cuda.max_memory_reserved: everything but the context
    assert est.model_bytes == est.total_bytes - rules.cuda_context_bytes
    assert est.allocated_bytes == est.model_bytes - est.breakdown["allocator_slack"]
    cpu = estimate_inference(arch, InferencePlan(prompt_tokens=512, new_tokens=32),
                             replace(hw, kind="cpu"))
    assert "allocator_slack" not in cpu.breakdown and "cublas_workspace" not in cpu.breakdown


def test_nccl_buffers_outside_the_pool_per_communicator():
    arch = from_config(resolve_model("llama-3.1-8b").config)
    hw = find_hardware("h100-sxm")
    one = estimate_training(arch, TrainingPlan(batch=1, seq=1024), hw)
    dp = estimate_training(arch, TrainingPlan(batch=1, seq=1024, gpus=8, zero=3), hw)
    both = estimate_training(arch, TrainingPlan(batch=1, seq=1024, gpus=8, tp=2, zero=3), hw)
    nccl = cuda_allocator().nccl_communicator_bytes
    assert one.breakdown["nccl_buffers"] == 0
    assert dp.breakdown["nccl_buffers"] == nccl
    assert both.breakdown["nccl_buffers"] == 2 * nccl
    assert dp.model_bytes == dp.total_bytes - dp.breakdown["overhead"] - nccl


@pytest.mark.parametrize("headroom_share, verdict", [(0.5, "yes"), (0.01, "tight"), (-0.01, "no")])
def test_fits_keeps_a_margin(headroom_share, verdict):
    arch = from_config(resolve_model("llama-3.1-8b").config)
    plan = InferencePlan(prompt_tokens=1024, new_tokens=32)
    hw = find_hardware("h100-sxm")
    total = estimate_inference(arch, plan, hw).total_bytes
    sized = replace(hw, memory_bytes=int(total * (1 + headroom_share)))
    est = estimate_inference(arch, plan, sized)
    assert est.verdict == verdict
    if verdict == "tight":
        assert est.fits and est.headroom_bytes < est.margin_bytes


def test_a_cpu_process_keeps_a_wider_margin_than_a_gpu_pool():
    """Default CPU processes of one plan differ by up to ~10% (allocators.toml, [host_fits]):
    a CPU plan's margin is 10% of what it takes beyond the baseline, a GPU's 5% (or its
    allocator slack); headroom of 7% is tight on the CPU."""
    arch = from_config(resolve_model("gpt2").config)
    plan = InferencePlan(batch=2, prompt_tokens=512, new_tokens=8, weights="fp32")
    cpu, gpu = find_hardware("cpu-cloud-32vcpu"), find_hardware("h100-sxm")
    on_cpu, on_gpu = estimate_inference(arch, plan, cpu), estimate_inference(arch, plan, gpu)
    assert on_cpu.margin_bytes == pytest.approx(0.10 * on_cpu.model_bytes, abs=1)
    slack = on_gpu.breakdown.get("allocator_slack", 0)
    assert on_gpu.margin_bytes == pytest.approx(max(slack, 0.05 * on_gpu.model_bytes), abs=1)
    sized = replace(cpu, memory_bytes=on_cpu.total_bytes + int(0.07 * on_cpu.model_bytes))
    assert estimate_inference(arch, plan, sized).verdict == "tight"
