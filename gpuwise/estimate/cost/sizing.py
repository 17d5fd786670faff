"""How many devices a workload needs on one kind of hardware: the candidates and sizings both
kinds of workload share, and training's (ZeRO-3 beyond one device for memory, data-parallel
doubling for the deadline). Serving is sized from the serving simulation (serving_sim.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuwise.catalog.hardware import LINKED_KINDS, Hardware
from gpuwise.estimate.capability import training_dtype_here, training_refusal
from gpuwise.estimate.cost.prices import Usage
from gpuwise.estimate.memory.fits import devices_for_training
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.training_time import estimate_training_time
from gpuwise.workload import Architecture
from gpuwise.workload.deployments import TrainLoad
from gpuwise.workload.plans import TrainingPlan

MAX_TENSOR_PARALLEL = 8  # one node: tensor parallelism across nodes is not modelled
MAX_TRAIN_DEVICES = 1024


@dataclass(frozen=True)
class Candidate:
    """Hardware to consider, with the rates the time model uses on it."""

    hw: Hardware
    rates: DeviceRates | None
    rates_how: str
    price_usd: float | None = None  # overrides the catalogue's purchase price
    rate_usd_per_hour: float | None = None  # overrides the catalogue's on-demand rate
    label: str = ""
    max_replicas: int | None = None  # this machine: there is only one of it
    host: DeviceRates | None = None  # its host's CPU: llama.cpp's offloaded layers and experts

    @property
    def name(self) -> str:
        return self.label or self.hw.id


@dataclass(frozen=True)
class Sizing:
    """A workload on one candidate: devices, speed, and whether the target is met."""

    candidate: Candidate
    precision: str  # weight format (inference) or training dtype
    devices_per_replica: int
    replicas: int
    batch: int
    usage: Usage
    meets: bool
    misses: tuple[str, ...]  # why the target is missed
    miss_ratio: float  # estimate / target of the worst-missed target (<= 1: met)
    ttft_s: float | None = None
    tpot_s: float | None = None
    tokens_per_s: float = 0.0  # per replica (inference: generated; training: trained)
    job_hours: float | None = None
    # serving: the share of requests within the targets at the load, in steady state
    attainment: float | None = None
    # serving: the run at the load (requests, of which the warm-up): `gpuwise serve --rate
    # LOAD --gpus DEVICES --requests N --warmup W` gives the same figures
    run_requests: tuple[int, int] = (0, 0)
    # serving, disaggregated: of `replicas`, those that only prefill (0: each does both)
    prefill_replicas: int = 0

    @property
    def devices(self) -> int:
        return self.devices_per_replica * self.replicas


def size_training(arch: Architecture, plan: TrainingPlan, load: TrainLoad,
                  cand: Candidate) -> Sizing | str:
    """Devices that fit the model (ZeRO-3 beyond one), doubled until a month's tokens train
    within the deadline. A string says why there is no sizing (no speed figures, no fit)."""
    hw = cand.hw
    plan = replace(plan, dtype=training_dtype_here(plan.dtype, hw))  # mixed-fp16 on a T4
    if (refused := training_refusal(plan, hw)) is not None:
        return refused.line()
    n = devices_for_training(arch, plan, hw)
    alone = hw.kind not in LINKED_KINDS  # no device interconnect: one device only
    if cand.rates is None:
        return f"speed not known: {cand.rates_how}"
    if n is None or (alone and n > 1):
        return (
            f"the plan does not fit on {'one device' if alone else f'{MAX_TRAIN_DEVICES} devices'}"
        )
    mu = load.measured_util or 1.0
    while True:
        p = replace(plan, gpus=n, zero=plan.zero if n == plan.tp else 3)
        tokens_per_s = estimate_training_time(arch, p, cand.rates).tokens_per_s * mu
        if load.tokens_per_month is None:
            hours = float(load.hours_per_month or 0.0)
            break
        hours = load.tokens_per_month / tokens_per_s / 3600
        most = cand.max_replicas or MAX_TRAIN_DEVICES
        if hours <= load.limit_hours or alone or n * 2 > most:
            break
        n *= 2
    tokens = load.tokens_per_month or tokens_per_s * hours * 3600
    ratio = hours / load.limit_hours if load.tokens_per_month else 0.0
    misses = ("deadline",) if ratio > 1 else ()
    usage = Usage(n, hours * mu, hours, tokens)
    return Sizing(cand, plan.dtype, n, 1, plan.batch, usage, not misses, misses, ratio,
                  tokens_per_s=tokens_per_s, job_hours=hours)
