"""How many devices a workload needs on one kind of hardware, from the memory estimators and
the time model: devices for memory (tensor parallel for inference, ZeRO-3 for training), then
replicas (inference) or data-parallel doubling (training) for throughput and deadlines."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.runtime_speed import runtime_speed
from gpuwise.estimate.cost.prices import Usage
from gpuwise.estimate.memory.fits import devices_for_inference, devices_for_training
from gpuwise.estimate.memory.inference import estimate_inference
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.inference_time import InferenceTime, estimate_inference_time
from gpuwise.estimate.speed.training_time import estimate_training_time
from gpuwise.workload import Architecture
from gpuwise.workload.deployments import ServeLoad, TrainLoad
from gpuwise.workload.plans import InferencePlan, TrainingPlan

MAX_TENSOR_PARALLEL = 8  # one node: tensor parallelism across nodes is not modelled
MAX_TRAIN_DEVICES = 1024
BATCHES = tuple(1 << i for i in range(11))  # 1 ... 1024 sequences decoded together


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

    @property
    def devices(self) -> int:
        return self.devices_per_replica * self.replicas


def _fits_split(arch: Architecture, plan: InferencePlan, hw: Hardware, tp: int) -> bool:
    """Weights and cache split over `tp` devices, the runtime's overhead on each."""
    est = estimate_inference(arch, plan, hw)
    return est.model_bytes / tp + est.breakdown["overhead"] <= hw.memory_bytes


def _latency(t: InferenceTime, ttft: float, load: ServeLoad) -> tuple[float, list[str]]:
    ratios, misses = [0.0], []
    if load.tpot_ms is not None:
        ratios.append(t.decode_s_per_token * 1e3 / load.tpot_ms)
        if ratios[-1] > 1:
            misses.append("ms/tok")
    if load.ttft_ms is not None:
        ratios.append(ttft * 1e3 / load.ttft_ms)
        if ratios[-1] > 1:
            misses.append("TTFT")
    return max(ratios), misses


def size_serving(arch: Architecture, load: ServeLoad, cand: Candidate, weights: str,
                 runtime: str = "transformers") -> Sizing | str:  # fmt: skip
    """Replicas of `devices_per_replica` devices, sized at the batch that serves a request in
    the least device time within the latency targets. A string says why there is no sizing:
    no speed figures, or the model does not fit (CPU, Mac: one device; GPU: up to 8-way TP)."""
    hw = cand.hw
    base = InferencePlan(batch=1, prompt_tokens=load.prompt_tokens,
                         new_tokens=load.output_tokens, weights=weights)  # fmt: skip
    tp = devices_for_inference(arch, base, hw)
    # Tensor parallelism needs a device interconnect: CPUs and Macs serve on one device.
    most = MAX_TENSOR_PARALLEL if hw.kind in ("gpu", "tpu") else 1
    if cand.rates is None:
        return f"speed not known: {cand.rates_how}"
    if hw.kind not in runtime_speed(runtime).devices:
        return f"{runtime} does not run on a {hw.kind}"
    if tp is None or tp > most:
        return f"{weights} weights do not fit on {most} device(s)"
    rows: list[tuple[int, InferenceTime]] = []
    for b in BATCHES:
        plan = replace(base, batch=b)
        if not _fits_split(arch, plan, hw, tp):
            break
        rows.append((b, estimate_inference_time(arch, plan, cand.rates, runtime, tp=tp)))
    if not rows:
        return f"{weights} weights fit, but no batch of this context does"
    ttft = rows[0][1].prefill_s  # the prefill of one prompt yields the first token
    mu = load.measured_util or 1.0  # a pipeline measured at mu busy stretches every step

    def work_s(row: tuple[int, InferenceTime]) -> float:
        """Replica seconds one request takes: its prefill, and its share of decode steps."""
        return (ttft + load.output_tokens * row[1].decode_s_per_token / row[0]) / mu

    def in_flight(row: tuple[int, InferenceTime], rate: float) -> float:
        """Requests in flight at `rate` a second (Little's law: rate x time in the system)."""
        return rate * (ttft + load.output_tokens * row[1].decode_s_per_token) / mu

    checked = [(row, *_latency(row[1], ttft, load)) for row in rows]
    ok = [c for c in checked if not c[2]] or checked[:1]
    # Replicas for the busy share asked for, at the batch that serves a request cheapest.
    replicas = max(1, math.ceil(load.arrivals_per_s * min(work_s(c[0]) for c in ok)
                                / load.max_utilisation))  # fmt: skip
    extra: list[str] = []
    if cand.max_replicas is not None and replicas > cand.max_replicas:
        extra.append(f"load needs {replicas}")
        over, replicas = replicas / cand.max_replicas, cand.max_replicas
    rate = load.arrivals_per_s / replicas
    # The batch the load forms: the smallest that holds the requests in flight.
    row, ratio, misses = next((c for c in ok if in_flight(c[0], rate) <= c[0][0]), ok[-1])
    if extra:
        ratio, misses = max(ratio, over), [*misses, *extra]
    # A replica computes whenever a request is in flight: with Poisson arrivals, 1 - e^-c of
    # the time for c in flight on average; of that, the chip is busy the measured share.
    occupied = 1.0 - math.exp(-in_flight(row, rate))
    usage = Usage(tp * replicas, occupied * mu * load.service_hours_per_month,
                  load.service_hours_per_month, load.tokens_per_month, load.requests_per_month)  # fmt: skip
    b, t = row
    return Sizing(cand, weights, tp, replicas, b, usage, not misses, tuple(misses), ratio,
                  ttft, t.decode_s_per_token, t.tokens_per_s * mu)  # fmt: skip


def size_training(arch: Architecture, plan: TrainingPlan, load: TrainLoad,
                  cand: Candidate) -> Sizing | str:  # fmt: skip
    """Devices that fit the model (ZeRO-3 beyond one), doubled until a month's tokens train
    within the deadline. A string says why there is no sizing (no speed figures, no fit)."""
    hw = cand.hw
    n = devices_for_training(arch, plan, hw)
    alone = hw.kind not in ("gpu", "tpu")  # no device interconnect: one device only
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
                  tokens_per_s=tokens_per_s, job_hours=hours)  # fmt: skip
