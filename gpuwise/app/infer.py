"""`gpuwise infer`: memory and time of generating text, and what fits (docs/memory.md,
docs/speed.md)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuwise.app.fp32_line import Fp32Alternative
from gpuwise.catalog.hardware import Hardware, find_hardware
from gpuwise.catalog.models import ResolvedModel
from gpuwise.estimate.memory import fits
from gpuwise.estimate.memory.breakdown import MemoryEstimate
from gpuwise.estimate.runtimes import estimate_inference, ignored_options, runtime_unit
from gpuwise.estimate.speed.device_rates import DeviceRates, rates_from_spec
from gpuwise.estimate.speed.inference_time import InferenceTime, estimate_inference_time
from gpuwise.estimate.speed.precision_advice import fp32_inference, fp32_weights
from gpuwise.estimate.speed.roofline import without_faults
from gpuwise.measure.probe.rates_source import rates_for
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan, check_tp_degree

LARGEST_BATCH_TRIED = 4096


@dataclass(frozen=True)
class InferenceFits:
    max_batch: int
    max_context_batch1: int
    precision_that_fits: str | None
    devices_needed: int | None
    context: int | None = None  # the context they hold, where the runtime allocates it up front


@dataclass(frozen=True)
class ThroughputPoint:
    batch: int
    tokens_per_s: float
    decode_s_per_token: float


@dataclass(frozen=True)
class InferAnswer:
    model: ResolvedModel
    arch: Architecture
    hardware: Hardware
    plan: InferencePlan
    weights_source: str
    memory: MemoryEstimate
    fits: InferenceFits
    time: InferenceTime | None
    rates_source: str  # where the rates came from, or why there are none
    throughput: list[ThroughputPoint]
    fp32: Fp32Alternative[InferenceTime] | None
    rates: DeviceRates | None = None  # the device's rates the time was estimated from
    tp: int = 1  # tensor-parallel devices the time is of (the plan's)
    # seconds of each phase that are page faults at the probed first-touch rate (a CPU's)
    page_faults_s: dict[str, float] | None = None
    replicas: int = 1  # --gpus / --tp: copies of this deployment, each answering alone


def infer(model: ResolvedModel, arch: Architecture, hw: Hardware, plan: InferencePlan,
          weights_source: str = "", replicas: int = 1) -> InferAnswer:
    """Memory, what fits, and (where the device has rates) prefill and decode time, the time
    over `tp` tensor-parallel devices. Options the runtime ignores are among the memory
    estimate's notes."""
    tp = plan.tp
    check_tp_degree(arch, tp)
    memory = estimate_inference(arch, plan, hw)
    unit = runtime_unit(plan.runtime)
    plan = unit.as_run(arch, plan, hw)  # the context (llama.cpp: and layers) it picks, if any
    held = (plan.context_alloc or arch.max_position) if unit.own_memory_rules else None
    found = InferenceFits(fits.max_inference_batch(arch, plan, hw), fits.max_context(arch, plan, hw),
                          fits.precision_that_fits(arch, plan, hw),
                          fits.devices_for_inference(arch, plan, hw), held)
    rates, how = rates_for(hw)
    host = offload_host(plan, hw)
    timing = estimate_inference_time(arch, plan, rates, tp=tp, host=host) if rates else None
    curve = throughput_curve(arch, plan, hw, rates, tp) if rates else []
    fp32 = _fp32(arch, plan, hw, rates, timing) if rates and timing and tp == 1 else None
    memory = replace(memory, notes=(*memory.notes, *ignored_options(plan), *tp_notes(plan),
                                    *replica_notes(replicas)))
    faults = page_faults_s(arch, plan, rates, timing, tp, host) if rates and timing else None
    return InferAnswer(model, arch, hw, plan, weights_source or f"estimated ({plan.weights})",
                       memory, found, timing, how, curve, fp32, rates, tp, faults, replicas)


def page_faults_s(arch: Architecture, plan: InferencePlan, rates: DeviceRates,
                  timing: InferenceTime, tp: int = 1,
                  host: DeviceRates | None = None) -> dict[str, float]:
    """Seconds of prefill and of a decode step that are page faults at the probed first-touch
    rate: the estimate less the same estimate charging none (0 off a probed CPU)."""
    quiet = estimate_inference_time(arch, plan, without_faults(rates), tp=tp, host=host)
    return {"prefill": timing.prefill_s - quiet.prefill_s,
            "decode": timing.decode_s_per_token - quiet.decode_s_per_token}


def tp_notes(plan: InferencePlan) -> tuple[str, ...]:
    """What --tp changes: the time, and where the runtime shards them, the memory a device."""
    tp = plan.tp
    if tp == 1:
        return ()
    if runtime_unit(plan.runtime).shards_memory:
        return (f"--tp {tp}: the time is of {tp} devices splitting each layer (their "
                "all-reduces included); the memory is one device's share",)
    return (f"--tp {tp}: the time is of {tp} devices splitting each layer (their all-reduces "
            "included); the memory is the whole model's on one device (see 'devices needed')",)


def replica_notes(replicas: int) -> tuple[str, ...]:
    if replicas == 1:
        return ()
    return (f"--gpus: {replicas} replicas of this deployment, each with its own requests: "
            f"{replicas}x the tokens a second in all, the same time a request",)


# The host of layers llama.cpp keeps off the GPU (-ngl) when the device is from the catalogue:
# a 32-vCPU cloud host (DDR5, ~100 GB/s), what a rented single GPU comes with.
OFFLOAD_HOST = "cpu-cloud-32vcpu"


def offload_host(plan: InferencePlan, hw: Hardware) -> DeviceRates | None:
    """The rates layers past --gpu-layers (and experts under --cpu-moe) run at: this
    machine's CPU where it is the GPU's host (`--on local`), else a catalogue cloud host;
    None without either."""
    if (plan.gpu_layers is None and not plan.cpu_moe_layers) or hw.kind == "cpu":
        return None
    if hw.source == "measured":
        from gpuwise.measure.hardware.detect import cpu_hardware, detect_local

        cpu = cpu_hardware(detect_local(use_torch=False))
    else:
        cpu = find_hardware(OFFLOAD_HOST)
    return rates_for(cpu)[0] or rates_from_spec(find_hardware(OFFLOAD_HOST))


def throughput_curve(arch: Architecture, plan: InferencePlan, hw: Hardware,
                     rates: DeviceRates, tp: int = 1) -> list[ThroughputPoint]:
    """Decode tokens/s as the batch doubles, until memory runs out."""
    curve = []
    batch = 1
    while batch <= LARGEST_BATCH_TRIED:
        p = replace(plan, batch=batch)
        if not estimate_inference(arch, p, hw).fits:
            break
        t = estimate_inference_time(arch, p, rates, tp=tp, host=offload_host(p, hw))
        curve.append(ThroughputPoint(batch, t.tokens_per_s, t.decode_s_per_token))
        batch *= 2
    return curve


def _fp32(arch: Architecture, plan: InferencePlan, hw: Hardware, rates: DeviceRates,
          own: InferenceTime) -> Fp32Alternative[InferenceTime] | None:
    fp32 = fp32_inference(arch, plan, rates, own)
    if fp32 is None:
        return None
    return Fp32Alternative(fp32, estimate_inference(arch, fp32_weights(plan), hw).total_bytes)
