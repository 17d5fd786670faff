"""`gpuwise train`: memory and time of one training step, and what fits (docs/memory.md,
docs/speed.md)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuwise.app.fp32_line import Fp32Alternative
from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.models import ResolvedModel
from gpuwise.estimate.capability import check_training, training_dtype_here
from gpuwise.estimate.memory import fits
from gpuwise.estimate.memory.breakdown import MemoryEstimate
from gpuwise.estimate.memory.training import estimate_training
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.precision_advice import fp32_training
from gpuwise.estimate.speed.training_time import (
    TrainingTime,
    estimate_training_time,
    slow_faults_step_s,
    step_fault_s,
)
from gpuwise.estimate.training_search import FitSearch, search_fits
from gpuwise.measure.probe.rates_source import rates_for
from gpuwise.workload import Architecture
from gpuwise.workload.limits import MAX_TRAIN_TOKENS, check_number
from gpuwise.workload.plans import TrainingPlan, check_tensor_parallel


@dataclass(frozen=True)
class TrainingFits:
    max_batch: int
    devices_needed_zero3: int | None
    with_checkpointing_bytes: int


@dataclass(frozen=True)
class PageFaults:
    """A probed CPU's page faults in the step: seconds at the probed first-touch rate, and
    the step at the slowest first touch the probe saw with memory in use (if it saw one)."""

    step_fault_s: float
    slow_step_s: float | None
    slow_bytes_per_s: float


@dataclass(frozen=True)
class TrainAnswer:
    model: ResolvedModel
    arch: Architecture
    hardware: Hardware
    plan: TrainingPlan
    memory: MemoryEstimate
    fits: TrainingFits
    time: TrainingTime | None
    rates_source: str  # where the rates came from, or why there are none
    faults: PageFaults
    fp32: Fp32Alternative[TrainingTime] | None
    train_tokens: float
    # where the plan does not fit: the fastest plans with gpuwise's memory features that do
    fit_search: FitSearch | None = None
    stack: str = ""  # the stack a --config file named ("torchtune ... recipe"); "": none


def default_dtype(hw: Hardware) -> str:
    """`--dtype` where none is given: mixed-bf16, or what the device computes in instead."""
    return training_dtype_here("mixed-bf16", hw)


def train(model: ResolvedModel, arch: Architecture, hw: Hardware, plan: TrainingPlan,
          train_tokens: float = 0) -> TrainAnswer:
    """Memory, what fits, and (where the device has rates) the step's time and its faults."""
    check_tensor_parallel(arch, plan)
    check_training(plan, hw)
    check_number(train_tokens, "--train-tokens", MAX_TRAIN_TOKENS, zero_ok=True,
                 hint="give the number of tokens to train on, e.g. 2e9 (0: none)")
    found = TrainingFits(fits.max_training_batch(arch, plan, hw),
                         fits.devices_for_training(arch, plan, hw),
                         estimate_training(arch, replace(plan, checkpointing=True), hw).total_bytes)
    rates, how = rates_for(hw)
    memory = estimate_training(arch, plan, hw)  # its notes say how compile's layers are saved
    timing = step_time(arch, plan, rates, memory) if rates else None
    faults = _faults(arch, plan, rates, timing, memory.paged_on_host_bytes)
    fp32 = _fp32(arch, plan, hw, rates, timing) if rates and timing else None
    searched = None
    if not memory.fits:
        def step_s(p: TrainingPlan, est: MemoryEstimate) -> float | None:
            return step_time(arch, p, rates, est).step_s if rates else None
        searched = search_fits(arch, plan, hw, step_s)
    return TrainAnswer(model, arch, hw, plan, memory, found, timing, how, faults, fp32,
                       train_tokens, searched)


def step_time(arch: Architecture, plan: TrainingPlan, rates: DeviceRates,
              memory: MemoryEstimate) -> TrainingTime:
    """The plan's step on `rates` with the paged states `memory` puts in host memory."""
    return estimate_training_time(arch, plan, rates,
                                  paged_on_host_bytes=memory.paged_on_host_bytes)


def _faults(arch: Architecture, plan: TrainingPlan, rates: DeviceRates | None,
            timing: TrainingTime | None, paged: float) -> PageFaults:
    if rates is None or timing is None:
        return PageFaults(0.0, None, 0.0)
    fault_s = step_fault_s(arch, plan, rates, timing, paged_on_host_bytes=paged)
    slow = slow_faults_step_s(arch, plan, rates, paged_on_host_bytes=paged) if fault_s else None
    slow_rate = rates.kernels.slow_fresh_bytes_per_s if rates.kernels else 0.0
    return PageFaults(fault_s, slow, slow_rate)


def _fp32(arch: Architecture, plan: TrainingPlan, hw: Hardware, rates: DeviceRates,
          own: TrainingTime) -> Fp32Alternative[TrainingTime] | None:
    fp32 = fp32_training(arch, plan, rates, own.step_s)
    if fp32 is None:
        return None
    return Fp32Alternative(fp32, estimate_training(arch, replace(plan, dtype="fp32"), hw).total_bytes)


@dataclass(frozen=True)
class BatchPoint:
    """The plan at another batch: its step and tokens/s, and its memory (estimated)."""

    batch: int
    step_s: float
    tokens_per_s: float
    memory: MemoryEstimate


LARGEST_BATCH_SWEPT = 4096


def batch_sweep(answer: TrainAnswer) -> list[BatchPoint]:
    """The batch doubled from 1 to twice the largest that fits (at least 8; and the plan's
    own batch), each timed and sized like the plan: the HTML report's speed and memory
    figures. Batches that do not fit are kept, their `memory.fits` false."""
    arch, plan, hw = answer.arch, answer.plan, answer.hardware
    rates, _ = rates_for(hw)
    if rates is None or answer.time is None:
        return []
    top = min(max(2 * answer.fits.max_batch, 8), LARGEST_BATCH_SWEPT)
    batches = sorted({plan.batch, *(2**i for i in range(13) if 2**i <= top)})
    points = []
    for batch in batches:
        p = replace(plan, batch=batch)
        memory = estimate_training(arch, p, hw)
        t = step_time(arch, p, rates, memory)
        points.append(BatchPoint(batch, t.step_s, t.tokens_per_s, memory))
    return points
