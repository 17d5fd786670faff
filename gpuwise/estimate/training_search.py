"""What training would fit (docs/memory.md, "Training stacks' memory features"): where a
plan does not fit its devices, the memory features gpuwise models tried together, and the
fastest few that fit, each with its memory and step time.

The features are those a user turns on without changing what is trained: activation
checkpointing, a chunked loss (torchtune's), an 8-bit optimizer or a paged one (its states
in unified memory), the optimizer step in the backward (torchtune's optimizer_in_bwd, one
device), and offloading the optimizer, the parameters or the activations to host memory
(each charged its copies, host step and paging: estimate/speed/host_traffic.py). Where none
of them fits a full fine-tune, LoRA and QLoRA (which train adapters, not the model) are tried
with them. ZeRO-3 over more devices is `train`'s own answer (`devices_for_training`).
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
from gpuwise.estimate.memory.breakdown import MemoryEstimate
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


# What may live in host memory, by how it is trained: a full fine-tune's optimizer (ZeRO-Offload)
# or its parameters with their states (FSDP2 CPUOffloadPolicy), and anyone's activations.
OFFLOADS = {"full": ((), ("activations",), ("optimizer",), ("optimizer", "activations"),
                     ("params",), ("params", "activations")),
            "lora": ((), ("activations",)), "qlora": ((), ("activations",))}


def _optimizers(plan: TrainingPlan) -> tuple[str, ...]:
    """The user's optimizer, and where it is Adam, bitsandbytes' 8-bit and paged 8-bit ones."""
    if plan.optimizer in ADAM:
        return (plan.optimizer, "adamw8bit", "paged_adamw8bit")
    if plan.optimizer == "adamw8bit":
        return (plan.optimizer, "paged_adamw8bit")
    return (plan.optimizer,)


def _combines(plan: TrainingPlan, optimizer: str, in_bwd: bool, offload: tuple[str, ...]) -> bool:
    """Whether the stacks run these together: DeepSpeed's and FSDP2's host steps run
    torch's or DeepSpeed's Adam, not bitsandbytes' (CUDA only) nor a step in the backward."""
    on_host = bool({"optimizer", "params"} & {*offload, *plan.offload})
    return not (on_host and (optimizer != plan.optimizer or in_bwd or plan.optimizer_in_backward))


def _variants(plan: TrainingPlan) -> Iterator[tuple[TrainingPlan, tuple[str, ...]]]:
    """The plan with each combination of the features, and the flags that give it."""
    one = plan.gpus == 1 and plan.zero == 0
    offloads = OFFLOADS[plan.finetune] if not plan.offload else ((),)
    for ckpt, chunked, optimizer, in_bwd, offload in itertools.product(
            (False, True), (False, True), _optimizers(plan),
            (False, True) if one else (False,), offloads):
        if ((ckpt and plan.checkpointing) or (chunked and plan.loss != "full")
                or (in_bwd and plan.optimizer_in_backward)
                or not _combines(plan, optimizer, in_bwd, offload)):
            continue
        p, flags = plan, list[str]()
        if ckpt:
            p, flags = replace(p, checkpointing=True), [*flags, "--checkpointing"]
        if chunked:
            p, flags = replace(p, loss="chunked"), [*flags, "--loss chunked"]
        if optimizer != plan.optimizer:
            p, flags = replace(p, optimizer=optimizer), [*flags, f"--optimizer {optimizer}"]
        if in_bwd:
            p, flags = replace(p, optimizer_in_backward=True), [*flags, "--optimizer-in-backward"]
        if offload:
            p, flags = replace(p, offload=offload), [*flags, f"--offload {','.join(offload)}"]
        yield p, tuple(flags)


TRAINS = {"full": "the model", "lora": "adapters (LoRA)", "qlora": "adapters on a 4-bit base"}


def search_fits(arch: Architecture, plan: TrainingPlan, hw: Hardware,
                step_time: Callable[[TrainingPlan, MemoryEstimate], float | None]) -> FitSearch:
    """The fastest `SHOWN` plans that fit `hw` (`step_time` times one with its memory, whose
    paged states in host memory cost it time; None where it cannot),
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
            if training_refusal(variant, hw) is not None:
                continue
            tried += 1
            try:  # over even without the allocator's slack: no replay spent on it
                if not estimate_training(arch, variant, hw, without_slack=True).fits:
                    continue
                est = estimate_training(arch, variant, hw)
            except GpuwiseError:
                continue
            if est.verdict == "yes":  # fits with the margin: not an out-of-memory gamble
                found.append(FitOption(variant, (*extra, *flags), est.total_bytes,
                                       est.capacity_bytes, step_time(variant, est), TRAINS[way]))
        if found:
            break
    smaller = None if found else max_training_batch(arch, replace(plan, checkpointing=True), hw)
    return FitSearch(_fastest(found), tried, smaller)


def _fastest(found: list[FitOption]) -> tuple[FitOption, ...]:
    """The fastest `SHOWN`, fewest flags first among steps within 1% of each other; one that
    only adds flags to a faster one shown, or is no faster than one shown and needs no less
    memory, is left out."""
    def key(o: FitOption) -> tuple[bool, float, int, int]:
        return (o.step_s is None, round(math.log(o.step_s), 2) if o.step_s else 0.0,
                len(o.flags), o.total_bytes)

    def dominated(o: FitOption, s: FitOption) -> bool:
        if set(s.flags) <= set(o.flags):
            return True
        same_speed = o.step_s is None or (s.step_s is not None and s.step_s <= 1.01 * o.step_s)
        return same_speed and s.total_bytes <= o.total_bytes

    shown: list[FitOption] = []
    for o in sorted(found, key=key):
        if not any(dominated(o, s) for s in shown):
            shown.append(o)
        if len(shown) == SHOWN:
            break
    return tuple(shown)
