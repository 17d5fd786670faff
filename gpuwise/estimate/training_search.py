"""What training would fit (docs/memory.md, "Training stacks' memory features"): where a
plan does not fit its devices, the memory features gpuwise models tried together, and the
fastest few that fit, each with its memory and step time.

The features are those a user turns on without changing what is trained: activation
checkpointing, a chunked loss (torchtune's), an 8-bit optimizer and the optimizer step in the
backward (torchtune's optimizer_in_bwd, one device). Offloading to host memory is not tried:
the time model does not charge its transfers, so it would rank as free. Where none of them
fits a full fine-tune, LoRA and QLoRA (which train adapters, not the model) are tried with
them. ZeRO-3 over more devices is `train`'s own answer (`devices_for_training`).
Every estimate is the memory model's, so an answer here is `gpuwise train` with those flags.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from gpuwise.catalog.hardware import Hardware
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.capability import training_refusal
from gpuwise.estimate.memory.fits import max_training_batch
from gpuwise.estimate.memory.training import estimate_training
from gpuwise.workload import Architecture
from gpuwise.workload.plans import TrainingPlan

SHOWN = 3  # the fastest this many that fit
ADAM = ("adamw", "adamw_fused")


@dataclass(frozen=True)
class FitOption:
    """A plan that fits: the flags that make it from the user's, its memory and step."""

    plan: TrainingPlan
    flags: tuple[str, ...]
    total_bytes: int
    capacity_bytes: int
    step_s: float | None  # None: no speed figures for the device
    trains: str  # what it trains: "the model" or "adapters (LoRA)" / "adapters on a 4-bit base"


@dataclass(frozen=True)
class FitSearch:
    """The fastest plans that fit (empty: none on these devices) and how many were tried."""

    options: tuple[FitOption, ...]
    tried: int
    # where nothing fits at the plan's batch: the largest batch that does with checkpointing
    # (0: none; None: not searched), to reach the batch by accumulating gradients
    checkpointed_batch: int | None = None


def _variants(plan: TrainingPlan) -> Iterator[tuple[TrainingPlan, tuple[str, ...]]]:
    """The plan with each combination of the features, and the flags that give it."""
    adam = plan.optimizer in ADAM
    one = plan.gpus == 1 and plan.zero == 0
    for ckpt, chunked, eight, in_bwd in itertools.product(
            (False, True), (False, True), (False, True) if adam else (False,),
            (False, True) if one else (False,)):
        if (ckpt and plan.checkpointing) or (chunked and plan.loss != "full"):
            continue
        p, flags = plan, list[str]()
        if ckpt:
            p, flags = replace(p, checkpointing=True), [*flags, "--checkpointing"]
        if chunked:
            p, flags = replace(p, loss="chunked"), [*flags, "--loss chunked"]
        if eight:
            p, flags = replace(p, optimizer="adamw8bit"), [*flags, "--optimizer adamw8bit"]
        if in_bwd:
            p, flags = replace(p, optimizer_in_backward=True), [*flags, "--optimizer-in-backward"]
        yield p, tuple(flags)


TRAINS = {"full": "the model", "lora": "adapters (LoRA)", "qlora": "adapters on a 4-bit base"}


def search_fits(arch: Architecture, plan: TrainingPlan, hw: Hardware,
                step_time: Callable[[TrainingPlan], float | None]) -> FitSearch:
    """The fastest `SHOWN` plans that fit `hw` (`step_time` times one; None where it cannot),
    the user's way of training first: LoRA and QLoRA only where a full fine-tune fits in no
    combination."""
    found: list[FitOption] = []
    tried = 0
    ways = [plan.finetune] if plan.finetune != "full" else ["full", "lora", "qlora"]
    for way in ways:
        base = replace(plan, finetune=way) if way != plan.finetune else plan
        if training_refusal(base, hw) is not None:
            continue
        extra = () if way == plan.finetune else (f"--finetune {way}",)
        for variant, flags in _variants(base):
            tried += 1
            try:
                est = estimate_training(arch, variant, hw)
            except GpuwiseError:
                continue
            if est.fits:
                found.append(FitOption(variant, (*extra, *flags), est.total_bytes,
                                       est.capacity_bytes, step_time(variant), TRAINS[way]))
        if found:
            break
    smaller = None if found else max_training_batch(arch, replace(plan, checkpointing=True), hw)
    return FitSearch(_fastest(found), tried, smaller)


def _fastest(found: list[FitOption]) -> tuple[FitOption, ...]:
    """The fastest `SHOWN`, fewest flags first among steps within 1% of each other; one that
    only adds flags to a faster one shown is left out."""
    def key(o: FitOption) -> tuple[bool, float, int, int]:
        return (o.step_s is None, round(math.log(o.step_s), 2) if o.step_s else 0.0,
                len(o.flags), o.total_bytes)

    shown: list[FitOption] = []
    for o in sorted(found, key=key):
        if not any(set(s.flags) <= set(o.flags) for s in shown):
            shown.append(o)
        if len(shown) == SHOWN:
            break
    return tuple(shown)
