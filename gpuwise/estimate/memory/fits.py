"""Answers, not just numbers: the largest batch or context that fits, the precision that
fits, and how many devices a plan needs. Each is a search over the pure estimators."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from gpuwise.catalog.hardware import Hardware
from gpuwise.estimate.capability import Device, plan_refusal, weights_here
from gpuwise.estimate.memory.cuda_rows import uses_cuda_allocator
from gpuwise.estimate.memory.host_allocator import host_allocator_rows
from gpuwise.estimate.memory.training import estimate_training
from gpuwise.estimate.runtimes import estimate_inference, runtime_unit
from gpuwise.workload import Architecture
from gpuwise.workload.plans import MAX_TOKENS, InferencePlan, TrainingPlan

PRECISIONS = ("bf16", "fp8", "int8", "int4")


def _largest(fits, low: int, high: int) -> int:  # type: ignore[no-untyped-def]
    """The largest n in [low, high] with fits(n), assuming fits is monotone; 0 if none."""
    if not fits(low):
        return 0
    if fits(high):
        return high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


Plan = InferencePlan | TrainingPlan
SETTLING_ROUNDS = 4  # replays a held-slack search may take before it checks its answer


def _largest_settled(arch: Architecture, hw: Hardware, sized: Callable[[int], Plan],
                     low: int, high: int) -> int:
    """The largest n in [low, high] whose plan `sized(n)` fits, the host allocator's slack
    included. The slack is a heap replay (docs/memory.md, the CPU process), too slow to run at
    every step of a search, so the search holds one replay's slack while it narrows: held at
    the slack of a plan at least as large as the answer it is safe, held at a smaller plan's
    it is optimistic; the two answers bracket the true one and close in within a few replays.
    The last steps between the two replay at each step; if the slack does not grow with the
    plan after all, the whole search replays at every step."""
    def estimate(n: int, held: float | None) -> bool:
        plan = sized(n)
        if isinstance(plan, InferencePlan):
            if _over_without_slack(arch, plan, hw, held):
                return False
            return estimate_inference(arch, plan, hw, held_slack=held).fits
        if uses_cuda_allocator(hw) and not estimate_training(arch, plan, hw,
                                                             without_slack=True).fits:
            return False  # over even with no slack: ruled out without the replay
        return estimate_training(arch, plan, hw, held_slack=held).fits

    def slack(n: int) -> float:
        return host_allocator_rows(arch, sized(n), hw).get("allocator", 0.0)

    def held_search(at: int, lo: int, hi: int) -> int:
        held = slack(at)
        return _largest(lambda n: estimate(n, held), lo, hi)

    upper = held_search(low, low, high)
    lower = 0
    for _ in range(SETTLING_ROUNDS):
        if upper == 0:
            return 0
        lower = held_search(upper, low, upper)
        if lower in (0, upper):
            break
        upper = held_search(lower, lower, upper)
    if lower and estimate(lower, None):  # the last few steps each with its own replay
        return _largest(lambda n: estimate(n, None), lower, max(lower, upper))
    return _largest(lambda n: estimate(n, None), low, high)


def _over_without_slack(arch: Architecture, plan: InferencePlan, hw: Hardware,
                        held: float | None) -> bool:
    """The plan does not fit even with no allocator slack, so it does not fit with any (the
    slack is never negative and no other part depends on it): ruled out without the replay
    its estimate would run. False where no replay would run (a held host slack, a serving
    runtime's own rules), as the estimate itself is as quick."""
    if runtime_unit(plan.runtime).own_memory_rules:
        return False
    if not uses_cuda_allocator(hw) and (hw.kind != "cpu" or held is not None):
        return False
    return not estimate_inference(arch, plan, hw, without_slack=True).fits


def max_inference_batch(arch: Architecture, plan: InferencePlan, hw: Hardware) -> int:
    return _largest_settled(arch, hw, lambda b: replace(plan, batch=b), 1, 1 << 16)


def max_context(arch: Architecture, plan: InferencePlan, hw: Hardware) -> int:
    """Largest prompt + generated tokens that fit at batch 1, up to the model's own limit
    (the positions it was trained for: no runtime serves more without rope scaling)."""
    new = plan.new_tokens
    # a runtime that allocates its context up front is asked for this one (--ctx)
    allocates = runtime_unit(plan.runtime).own_memory_rules

    def sized(ctx: int) -> InferencePlan:
        return replace(plan, batch=1, prompt_tokens=max(1, ctx - new), new_tokens=min(new, ctx - 1),
                       context_alloc=ctx if allocates else plan.context_alloc)

    limit = arch.max_position
    if (new + 1 <= limit < MAX_TOKENS and not _over_without_slack(arch, sized(limit), hw, None)
            and estimate_inference(arch, sized(limit), hw).fits):
        return limit  # else the search over every context, as without a limit
    if _over_without_slack(arch, sized(new + 1), hw, None):
        return 0  # not even the shortest context fits: no replay spent on the search
    return _largest_settled(arch, hw, sized, new + 1, MAX_TOKENS)


def max_training_batch(arch: Architecture, plan: TrainingPlan, hw: Hardware) -> int:
    return _largest_settled(arch, hw, lambda b: replace(plan, batch=b), 1, 1 << 16)


def precision_that_fits(arch: Architecture, plan: InferencePlan, hw: Hardware) -> str | None:
    """The highest-precision weight format (bf16 down to int4) that runs on `hw` and fits,
    or None."""
    device = Device.of(hw)
    for fmt in PRECISIONS:
        sized = replace(plan, weights=weights_here(fmt, device), stored_weights=None)
        if plan_refusal(sized, hw) is None and estimate_inference(arch, sized, hw).fits:
            return sized.weights
    return None


def devices_for_inference(arch: Architecture, plan: InferencePlan, hw: Hardware) -> int | None:
    """Devices needed with tensor parallelism: weights and cache split, overhead on each."""
    est = estimate_inference(arch, replace(plan, tp=1), hw)
    overhead = est.breakdown["overhead"]
    room = hw.memory_bytes - overhead
    if room <= 0:
        return None
    n = max(1, math.ceil(est.model_bytes / room))
    return n if n <= 1024 else None


def devices_for_training(arch: Architecture, plan: TrainingPlan, hw: Hardware) -> int | None:
    """Smallest data-parallel device count with ZeRO-3 (FSDP) sharding that fits, if any."""
    # torchtune's optimizer in backward shards with FSDP, not DeepSpeed's ZeRO stages
    sharding = "fsdp2" if plan.optimizer_in_backward else plan.sharding
    for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        zero = plan.zero if n == 1 else 3
        sized = replace(plan, gpus=n * plan.tp, zero=zero, sharding=sharding if n > 1 else
                        plan.sharding)
        if estimate_training(arch, sized, hw).fits:
            return n * plan.tp
    return None
