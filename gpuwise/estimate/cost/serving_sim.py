"""Replicas for a serving load from the serving simulation (estimate/serve/; docs/cost.md,
"How an option is sized"): the highest request rate a replica sustains within
the latency targets, with the headroom asked for, under the runtime each device really runs."""

from __future__ import annotations

import math
from dataclasses import replace

from gpuwise.catalog.runtime_speed import runtime_speed
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.capability import Device, kernel_here, plan_refusal, weights_here
from gpuwise.estimate.cost.prices import Usage
from gpuwise.estimate.cost.sizing import MAX_TENSOR_PARALLEL, Candidate, Sizing
from gpuwise.estimate.memory.fits import devices_for_inference
from gpuwise.estimate.runtimes import runtime_unit
from gpuwise.estimate.serve.metrics import Slo, summary
from gpuwise.estimate.serve.replica import ReplicaOptions, build_engine, no_load_latency
from gpuwise.estimate.serve.simulate import Engine, simulate
from gpuwise.estimate.serve.sweep import Sweep, knee
from gpuwise.workload import Architecture
from gpuwise.workload.deployments import ServeLoad
from gpuwise.workload.plans import InferencePlan
from gpuwise.workload.requests import Lengths, poisson_requests

SIZING_REQUESTS = 200  # a sizing sweep's requests a rate: p90s within ~5% of 1000 requests
# What each kind of device serves with when the user does not say (issue 23): vLLM on GPUs,
# llama.cpp on CPUs and Apple silicon, transformers elsewhere.
DEFAULT_RUNTIME = {"gpu": "vllm", "cpu": "llama.cpp", "apple": "llama.cpp"}


def runtime_for(kind: str, asked: str) -> str:
    return DEFAULT_RUNTIME.get(kind, "transformers") if asked == "auto" else asked


def size_serving_simulated(arch: Architecture, load: ServeLoad, cand: Candidate, weights: str,
                           runtime: str = "auto",
                           deployment: InferencePlan | None = None) -> Sizing | str:
    """Replicas of `tp` devices at the highest rate a replica meets the targets at (for 90%
    of requests; without targets, short of saturation), times the busy share asked for. A
    string says why there is no sizing. `deployment`: the plan's other settings (KV dtype,
    context, attention, threads...), as check, infer and serve take them."""
    hw, rt = cand.hw, runtime_for(cand.hw.kind, runtime)
    if cand.rates is None:
        return f"speed not known: {cand.rates_how}"
    if hw.kind not in runtime_speed(rt).devices:
        return f"{rt} does not run on a {hw.kind}"
    try:  # a setting this runtime or device cannot take rules the option out, said why
        plan = replace(deployment or InferencePlan(), prompt_tokens=load.prompt_tokens,
                       new_tokens=load.output_tokens, weights=weights_here(weights, Device.of(hw)),
                       runtime=rt, stored_weights=None, batch=1, tp=1)
        if (refused := plan_refusal(plan, hw)) is not None:
            return refused.line()
        plan = kernel_here(plan, hw)
        if "gpu_layers" in runtime_unit(rt).reads and plan.gpu_layers is None:
            # a fleet is sized with every layer on its devices, none moved to the host
            plan = replace(plan, gpu_layers=arch.num_layers)
        tp = devices_for_inference(arch, plan, hw)
        most = MAX_TENSOR_PARALLEL if hw.kind in ("gpu", "tpu") else 1
        if tp is None or tp > most:
            return f"{weights} weights do not fit on {most} device(s) under {rt}"
        engine = build_engine(arch, replace(plan, tp=tp), hw, cand.rates, ReplicaOptions(tp=tp))
        return _sized(arch, load, cand, replace(plan, tp=tp), engine)
    except GpuwiseError as exc:
        return str(exc)


# The knee of one replica does not depend on the volume of requests: computed once for the
# sizings of a sweep of loads (advise's candidates, a property test's examples).
_KNEES: dict[tuple[object, ...], Sweep] = {}


def _knee(engine: Engine, key: tuple[object, ...], lengths: Lengths, slo: Slo) -> Sweep:
    if key not in _KNEES:
        if len(_KNEES) > 256:
            _KNEES.clear()
        _KNEES[key] = knee(engine, lengths, SIZING_REQUESTS, slo)
    return _KNEES[key]


def _sized(arch: Architecture, load: ServeLoad, cand: Candidate, plan: InferencePlan,
           engine: Engine) -> Sizing:
    weights, rt, tp = plan.weights, plan.runtime, plan.tp
    lengths = Lengths(load.prompt_tokens, load.output_tokens)
    slo = Slo(None if load.ttft_ms is None else load.ttft_ms / 1e3,
              None if load.tpot_ms is None else load.tpot_ms / 1e3)
    ttft0, tpot0 = no_load_latency(engine, load.prompt_tokens, load.output_tokens)
    rates = cand.rates
    assert rates is not None
    # What the knee depends on, by value (an object's id may be reused once it is freed).
    key = (arch, cand.hw.id, rates.source, rates.bandwidth_bytes_per_s,
           tuple(sorted(rates.peak_flops.items())), plan, lengths, slo)
    knee = _knee(engine, key, lengths, slo)
    per_replica = (knee.max_rate_meeting_slo or knee.rate_ceiling / 5) * load.max_utilisation
    replicas = max(1, math.ceil(load.arrivals_per_s / per_replica))
    misses, ratio = _misses(load, ttft0, tpot0, knee.max_rate_meeting_slo)
    if cand.max_replicas is not None and replicas > cand.max_replicas:
        misses.append(f"load needs {replicas}")
        ratio, replicas = max(ratio, replicas / cand.max_replicas), cand.max_replicas
    rate = load.arrivals_per_s / replicas
    rec = summary(simulate(engine, poisson_requests(rate, SIZING_REQUESTS, lengths)), slo)
    usage = Usage(tp * replicas, rec.busy_fraction * load.service_hours_per_month,
                  load.service_hours_per_month, load.tokens_per_month, load.requests_per_month)
    tpot = rec.tpot_s.p50 or 0.0
    batch = max(1, round(rec.output_tokens_per_s * tpot))  # sequences decoding at once
    return Sizing(cand, f"{weights} ({rt})", tp, replicas, batch, usage, not misses,
                  tuple(misses), ratio, rec.ttft_s.p90, rec.tpot_s.p90,
                  rec.output_tokens_per_s)


def _misses(load: ServeLoad, ttft0: float, tpot0: float,
            knee: float | None) -> tuple[list[str], float]:
    """What no rate meets: a target below one request's own latency."""
    misses, ratios = [], [0.0]
    if load.tpot_ms is not None:
        ratios.append(tpot0 * 1e3 / load.tpot_ms)
        if ratios[-1] > 1:
            misses.append("ms/tok")
    if load.ttft_ms is not None:
        ratios.append(ttft0 * 1e3 / load.ttft_ms)
        if ratios[-1] > 1:
            misses.append("TTFT")
    if not misses and not knee:
        misses.append("no rate meets the targets")
    return misses, max(ratios)
