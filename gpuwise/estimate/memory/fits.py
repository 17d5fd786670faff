"""Answers, not just numbers: the largest batch or context that fits, the precision that
fits, and how many devices a plan needs. Each is a search over the pure estimators."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from gpuwise.catalog.hardware import Hardware
from gpuwise.estimate.capability import Device, plan_refusal, weights_here
from gpuwise.estimate.memory.breakdown import MemoryEstimate
from gpuwise.estimate.memory.cuda_rows import uses_cuda_allocator
from gpuwise.estimate.memory.host_allocator import host_allocator_rows
from gpuwise.estimate.memory.training import estimate_training
from gpuwise.estimate.runtimes import estimate_inference, runtime_unit
from gpuwise.workload import Architecture
from gpuwise.workload.plans import MAX_TOKENS, InferencePlan, TrainingPlan

PRECISIONS = ("bf16", "fp8", "int8", "int4")


Probe = Callable[[int], tuple[bool, float]]  # n -> (fits, bytes to spare: negative past it)


def _largest(probe: Probe, low: int, high: int, guided: bool = True) -> int:
    """The largest n in [low, high] that fits, assuming fitting is monotone in n; 0 if none.
    Each try goes where the bytes to spare at the bracket's ends, taken as a line in n, reach
    zero (memory grows about linearly with a batch or a context), the end kept twice running
    counted at half (Illinois), and to the middle after two guesses that did not halve it.
    Not `guided`: always the middle (where the bytes to spare jump: a replayed allocator's
    slack grows by segments and fills what is left of a device)."""
    fits_low, spare_low = probe(low)
    if not fits_low:
        return 0
    fits_high, spare_high = probe(high)
    if fits_high:
        return high
    spare_low, spare_high = max(spare_low, 1.0), min(spare_high, -1.0)
    stalls, side = 0, 0  # guesses running that did not halve the bracket; the end moved last
    while high - low > 1:
        mid = (low + high) // 2
        if guided and stalls < 2:
            guess = low + (high - low) * spare_low / (spare_low - spare_high)
            mid = min(high - 1, max(low + 1, round(guess)))
        stalls = stalls + 1 if stalls < 2 and 2 * min(mid - low, high - mid) < high - low else 0
        fits_mid, spare_mid = probe(mid)
        if fits_mid:
            low, spare_low = mid, max(spare_mid, 1.0)
            spare_high, side = spare_high / 2 if side > 0 else spare_high, 1
        else:
            high, spare_high = mid, min(spare_mid, -1.0)
            spare_low, side = spare_low / 2 if side < 0 else spare_low, -1
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
    def estimate(n: int, held: float | None) -> tuple[bool, float]:
        plan = sized(n)
        if isinstance(plan, InferencePlan):
            lower = _without_slack(arch, plan, hw, held)
            if lower is not None and not lower.fits:
                return False, lower.headroom_bytes  # over even with no slack: no replay
            est = estimate_inference(arch, plan, hw, held_slack=held)
            return est.fits, est.headroom_bytes
        if uses_cuda_allocator(hw):
            lower_t = estimate_training(arch, plan, hw, without_slack=True)
            if not lower_t.fits:
                return False, lower_t.headroom_bytes  # over even with no slack: no replay
        est = estimate_training(arch, plan, hw, held_slack=held)
        return est.fits, est.headroom_bytes

    def slack(n: int) -> float:
        return host_allocator_rows(arch, sized(n), hw).get("allocator", 0.0)

    # where the bytes to spare grow smoothly: a runtime's own rules, or a held host slack;
    # not where each estimate replays an allocator (CUDA's, or the host's at the last steps)
    first = sized(low)
    own = isinstance(first, InferencePlan) and runtime_unit(first.runtime).own_memory_rules
    if own:  # its rules hold no allocator's slack: one search, each step its own estimate
        return _largest(lambda n: estimate(n, None), low, high)
    smooth_held = not uses_cuda_allocator(hw)  # a held host slack; not a CUDA replay

    def held_search(at: int, lo: int, hi: int) -> int:
        held = slack(at)
        return _largest(lambda n: estimate(n, held), lo, hi, smooth_held)

    upper = held_search(low, low, high)
    lower = 0
    for _ in range(SETTLING_ROUNDS):
        if upper == 0:
            return 0
        lower = held_search(upper, low, upper)
        if lower in (0, upper):
            break
        upper = held_search(lower, lower, upper)
    if lower and estimate(lower, None)[0]:  # the last few steps each with its own replay
        return _largest(lambda n: estimate(n, None), lower, max(lower, upper), False)
    return _largest(lambda n: estimate(n, None), low, high, False)


def _without_slack(arch: Architecture, plan: InferencePlan, hw: Hardware,
                   held: float | None) -> MemoryEstimate | None:
    """The plan's estimate with no allocator slack, a lower bound (the slack is never
    negative and no other part depends on it): a plan over even so is ruled out without the
    replay its estimate would run. None where no replay would run (a held host slack, a
    serving runtime's own rules), as the estimate itself is as quick."""
    if runtime_unit(plan.runtime).own_memory_rules:
        return None
    if not uses_cuda_allocator(hw) and (hw.kind != "cpu" or held is not None):
        return None
    return estimate_inference(arch, plan, hw, without_slack=True)


def _over_without_slack(arch: Architecture, plan: InferencePlan, hw: Hardware,
                        held: float | None) -> bool:
    lower = _without_slack(arch, plan, hw, held)
    return lower is not None and not lower.fits


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
    step = runtime_unit(plan.runtime).context_step()  # contexts within one take one memory
    if step > 1:
        top = _largest_settled(arch, hw, lambda k: sized(k * step), -(-(new + 1) // step),
                               MAX_TOKENS // step)
        return top * step
    return _largest_settled(arch, hw, sized, new + 1, MAX_TOKENS)


def max_training_batch(arch: Architecture, plan: TrainingPlan, hw: Hardware) -> int:
    return _largest_settled(arch, hw, lambda b: replace(plan, batch=b), 1, 1 << 16)


def precision_that_fits(arch: Architecture, plan: InferencePlan, hw: Hardware) -> str | None:
    """The highest-precision weight format (bf16 down to int4, or the runtime's own: llama.cpp's
    GGUF types) that runs on `hw` and fits, or None."""
    device = Device.of(hw)
    for fmt in runtime_unit(plan.runtime).precisions or PRECISIONS:
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
