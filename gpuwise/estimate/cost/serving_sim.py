"""Replicas for a serving load from the serving simulation (estimate/serve/; docs/cost.md,
"How an option is sized"): the highest request rate a replica sustains within
the latency targets, with the headroom asked for, under the runtime each device really runs."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from gpuwise.catalog.hardware import LINKED_KINDS, Hardware
from gpuwise.catalog.runtime_speed import runtime_speed
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.capability import Device, kernel_here, plan_refusal, weights_here
from gpuwise.estimate.cost.prices import Usage
from gpuwise.estimate.cost.sizing import MAX_TENSOR_PARALLEL, Candidate, Sizing
from gpuwise.estimate.memory.fits import devices_for_inference, max_context
from gpuwise.estimate.runtimes import estimate_inference, runtime_unit
from gpuwise.estimate.serve.metrics import ServeSummary, Slo
from gpuwise.estimate.serve.replica import (
    ReplicaOptions,
    build_engine,
    no_load_latency,
    rate_ceiling,
)
from gpuwise.estimate.serve.simulate import Engine
from gpuwise.estimate.serve.steady_load import steady_run
from gpuwise.estimate.serve.sweep import ATTAINMENT, meets
from gpuwise.workload import Architecture
from gpuwise.workload.deployments import ServeLoad
from gpuwise.workload.plans import InferencePlan
from gpuwise.workload.requests import Lengths

# What each kind of device serves with when the user does not say (issue 23): vLLM on GPUs
# and Gaudi (the vllm-gaudi plugin), llama.cpp on CPUs and Apple silicon, transformers
# elsewhere.
DEFAULT_RUNTIME = {"gpu": "vllm", "hpu": "vllm", "cpu": "llama.cpp", "apple": "llama.cpp"}


def runtime_for(kind: str, asked: str) -> str:
    return DEFAULT_RUNTIME.get(kind, "transformers") if asked == "auto" else asked


@dataclass(frozen=True)
class Prepared:
    """A candidate made ready to size: its plan (tensor-parallel width included), the
    replica's engine, and the fewest replicas any sizing of it can have."""

    plan: InferencePlan
    engine: Engine
    replicas_floor: int  # in engines: a pipeline of pp stages is pp engines of tp devices
    pp: int = 1

    @property
    def devices_floor(self) -> int:
        return self.plan.tp * self.replicas_floor


def size_serving_simulated(arch: Architecture, load: ServeLoad, cand: Candidate, weights: str,
                           runtime: str = "auto", deployment: InferencePlan | None = None,
                           knobs: ReplicaOptions | None = None) -> Sizing | str:
    """Replicas of `tp` devices at the highest rate a replica meets the targets at (for 90%
    of requests; without targets, short of saturation), times the busy share asked for. A
    string says why there is no sizing. `deployment`: the plan's other settings (KV dtype,
    context, attention, threads...), as check, infer and serve take them. `knobs`: the
    replica's tensor-parallel width and scheduler limits as given (gpuwise plan's search),
    instead of the fewest devices that fit and are fast enough under the runtime's defaults."""
    prep = prepare_serving(arch, load, cand, weights, runtime, deployment, knobs)
    if isinstance(prep, str):
        return prep
    try:
        return _sized(arch, load, cand, prep.plan, prep.engine, prep.pp)
    except GpuwiseError as exc:
        return str(exc)


def prepare_serving(arch: Architecture, load: ServeLoad, cand: Candidate, weights: str,
                    runtime: str = "auto", deployment: InferencePlan | None = None,
                    knobs: ReplicaOptions | None = None) -> Prepared | str:
    """Everything a sizing needs before its simulations (the plan this device and runtime
    can run, the tensor-parallel width, the engine), with the fewest replicas it can have;
    kept (`_PREPARED`), as a search asks first for these floors, then sizes some. A string
    says why there is no sizing."""
    key = (id(cand), arch, load, weights, runtime, deployment, knobs)
    kept = _PREPARED.get(key)
    if kept is None or kept[0] is not cand:  # the candidate kept alive by its entry
        if len(_PREPARED) > 4096:
            _PREPARED.clear()
        kept = _PREPARED[key] = (cand, _prepare(arch, load, cand, weights, runtime, deployment,
                                                knobs))
    return kept[1]


_PREPARED: dict[tuple[object, ...], tuple[Candidate, Prepared | str]] = {}


def _prepare(arch: Architecture, load: ServeLoad, cand: Candidate, weights: str,
             runtime: str, deployment: InferencePlan | None,
             knobs: ReplicaOptions | None = None) -> Prepared | str:
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
        plan = _longest_context_that_fits(arch, plan, hw)
        tp = devices_for_inference(arch, plan, hw)
        most = MAX_TENSOR_PARALLEL if hw.kind in LINKED_KINDS else 1
        if tp is None or tp > most:
            return f"{weights} weights do not fit on {most} device(s) under {rt}"
        if knobs is not None:  # the width asked for, if the weights fit on it
            width = knobs.tp * knobs.pp
            if tp > width or width > most:
                return f"{weights} weights do not fit on {width} device(s) under {rt}"
            engine = build_engine(arch, replace(plan, tp=knobs.tp), hw, cand.rates, knobs,
                                  cand.host)
            return Prepared(replace(plan, tp=knobs.tp), engine,
                            replicas_floor(engine, load, cand, knobs.pp), knobs.pp)
        tp, engine = _fast_enough(arch, load, plan, hw, cand, tp, most)
        return Prepared(replace(plan, tp=tp), engine, replicas_floor(engine, load, cand))
    except GpuwiseError as exc:
        return str(exc)


def replicas_floor(engine: Engine, load: ServeLoad, cand: Candidate, pp: int = 1) -> int:
    """The fewest engines a sizing can have: the load over the headroom asked for, at the
    rate no engine can exceed (where `fewest_replicas` starts), whole pipelines of `pp`, at
    most `max_replicas`."""
    ceiling = rate_ceiling(engine, load.prompt_tokens, load.output_tokens, cache_bound=True)
    need = load.arrivals_per_s / load.max_utilisation
    floor = _whole(max(1, math.ceil(need / ceiling)) if ceiling > 0 else 1, pp)
    return floor if cand.max_replicas is None else min(floor, cand.max_replicas)


def _whole(engines: int, pp: int) -> int:
    """Engines rounded up to whole pipelines of `pp` stages (pp engines each)."""
    return -(-engines // pp) * pp


def _fast_enough(arch: Architecture, load: ServeLoad, plan: InferencePlan, hw: Hardware,
                 cand: Candidate, tp: int, most: int) -> tuple[int, Engine]:
    """The fewest tensor-parallel devices, from the `tp` the weights need, whose request alone
    meets the latency targets (a wider replica cuts each step), doubling up to `most`; `tp`
    where none does."""
    assert cand.rates is not None
    first = None
    while tp <= most:
        engine = build_engine(arch, replace(plan, tp=tp), hw, cand.rates, ReplicaOptions(tp=tp),
                              cand.host)
        first = first or (tp, engine)
        ttft0, tpot0 = no_load_latency(engine, load.prompt_tokens, load.output_tokens)
        if not _misses(load, ttft0, tpot0)[0]:
            return tp, engine
        tp *= 2
    assert first is not None
    return first


def _longest_context_that_fits(arch: Architecture, plan: InferencePlan,
                               hw: Hardware) -> InferencePlan:
    """Where the runtime allocates its context up front and the model's own does not fit one
    device but the requests do, the longest that fits (vLLM's --max-model-len auto), as one
    sizing a fleet sets it, not a second device for a context no request uses."""
    if (plan.context_alloc is not None or not runtime_unit(plan.runtime).own_memory_rules
            or estimate_inference(arch, plan, hw).fits):  # given, or the default fits (or is fitted)
        return plan
    longest = max_context(arch, plan, hw)
    return replace(plan, context_alloc=longest) if longest >= plan.context_tokens else plan


# A replica's runs do not depend on the volume of requests: kept for the sizings of a sweep of
# loads (advise's candidates, a property test's examples), by what the engine is and the rate.
_RUNS: dict[tuple[object, ...], ServeSummary] = {}
MOST_REPLICAS = 1 << 16  # the search gives up past this many


def _run(engine: Engine, key: tuple[object, ...], rate: float, lengths: Lengths,
         slo: Slo) -> ServeSummary:
    at = (*key, rate)
    if at not in _RUNS:
        if len(_RUNS) > 4096:
            _RUNS.clear()
        _RUNS[at] = steady_run(engine, rate, lengths, slo)
    return _RUNS[at]


def fewest_replicas(engine: Engine, key: tuple[object, ...], need: float, lengths: Lengths,
                    slo: Slo, alone: tuple[float, float]) -> int | None:
    """The fewest replicas that between them meet the targets at `need` requests a second
    (each replica at its share, in steady state); None past MOST_REPLICAS. No replica can
    sustain more than its ceiling, so the search starts at need / ceiling; a run that misses
    says by how much (the rate it offered over the rate it served, or its worst p90 over its
    target), which sets the next count to try, until one meets; then it halves the gap, to
    one replica or 2% of the fleet."""
    ceiling = rate_ceiling(engine, lengths.prompt, lengths.output)
    low = max(1, math.ceil(need / ceiling)) if ceiling > 0 else 1
    rec = _run(engine, key, need / low, lengths, slo)
    if meets(rec, slo):
        return low
    high = _next_count(low, need / low, rec, slo, alone)
    while not meets(rec := _run(engine, key, need / high, lengths, slo), slo):
        low, high = high, _next_count(high, need / high, rec, slo, alone)
        if high > MOST_REPLICAS:
            return None
    met = rec
    missed = _run(engine, key, need / low, lengths, slo)
    halve = False
    while high - low > max(1, high // 50):  # low misses, high meets: to 2% of the fleet
        # where the share of requests within the targets crosses the line, taken as a line in
        # the rate a replica serves; halving the gap where the last guess did not halve it
        mid = (low + high) // 2 if halve else _crossing(low, high, missed, met, need)
        rec = _run(engine, key, need / mid, lengths, slo)
        halve = not halve and 2 * min(mid - low, high - mid) < high - low
        if meets(rec, slo):
            high, met = mid, rec
        else:
            low, missed = mid, rec
    return high


def _crossing(low: int, high: int, missed: ServeSummary, met: ServeSummary,
              need: float) -> int:
    """The count between `low` (its run `missed`) and `high` (`met`) at which the share of
    requests within the targets, linear in the rate each replica serves, reaches ATTAINMENT."""
    a_low, a_high = missed.slo_met_fraction, met.slo_met_fraction
    if a_high <= a_low:
        return (low + high) // 2
    r_low, r_high = need / low, need / high
    rate = r_high + (a_high - ATTAINMENT) * (r_low - r_high) / (a_high - a_low)
    return min(high - 1, max(low + 1, math.ceil(need / rate)))


def _next_count(k: int, rate: float, rec: ServeSummary, slo: Slo,
                alone: tuple[float, float]) -> int:
    """The next count to try after `k` replicas missed at `rate` each. A saturated run: k times
    the rate offered over the rate served. Else each missed p90 is taken as growing in a line
    from a request's own latency at no load, and the load cut to where that line meets the
    target (at least 5% fewer requests a replica, at most 8 times fewer)."""
    if rec.saturated and rec.requests_per_s > 0:
        ratio = rate / rec.requests_per_s
    else:
        ratio = 1.25  # every p90 within its target, the joint share short: a step
        for p90, target, own in zip((rec.ttft_s.p90, rec.tpot_s.p90), (slo.ttft_s, slo.tpot_s),
                                    alone, strict=True):
            if p90 is not None and target and p90 > target:
                ratio = max(ratio, (p90 - own) / max(target - own, 1e-3 * target))
    return max(k + 1, math.ceil(k * min(8.0, max(1.05, ratio))))


def _sized(arch: Architecture, load: ServeLoad, cand: Candidate, plan: InferencePlan,
           engine: Engine, pp: int = 1) -> Sizing:
    """Replicas so that each runs at `max_utilisation` of the highest rate it sustains within
    the targets: the fewest that meet them at the load / max_utilisation; then the fleet at the
    load itself, each replica's share of it simulated in steady state. A pipeline of `pp`
    stages is pp engines (estimate/serve/pipeline.py), its replicas whole pipelines."""
    weights, rt, tp = plan.weights, plan.runtime, plan.tp
    lengths = Lengths(load.prompt_tokens, load.output_tokens)
    slo = Slo(None if load.ttft_ms is None else load.ttft_ms / 1e3,
              None if load.tpot_ms is None else load.tpot_ms / 1e3)
    ttft0, tpot0 = no_load_latency(engine, load.prompt_tokens, load.output_tokens)
    key = (*runs_key(arch, cand, plan, engine, pp), lengths, slo)
    misses, ratio = _misses(load, ttft0, tpot0)
    need = load.arrivals_per_s / load.max_utilisation
    found = None if misses else fewest_replicas(engine, key, need, lengths, slo, (ttft0, tpot0))
    if found is None:  # no rate meets the targets: sized for a fifth of the ceiling
        per_replica = rate_ceiling(engine, load.prompt_tokens, load.output_tokens) / 5
        found = max(1, math.ceil(load.arrivals_per_s / (per_replica * load.max_utilisation)))
        misses = misses or ["no rate meets the targets"]
    replicas = _whole(found, pp)
    if cand.max_replicas is not None and replicas > cand.max_replicas:
        misses.append(f"load needs {replicas}")
        ratio, replicas = max(ratio, replicas / cand.max_replicas), cand.max_replicas
    rate = load.arrivals_per_s / replicas
    rec = _run(engine, key, rate, lengths, slo)
    usage = Usage(tp * replicas, rec.busy_fraction * load.service_hours_per_month,
                  load.service_hours_per_month, load.tokens_per_month, load.requests_per_month)
    tpot = rec.tpot_s.p50 or 0.0
    batch = max(1, round(rec.output_tokens_per_s * tpot)) * pp  # sequences decoding at once
    return Sizing(cand, f"{weights} ({rt})", tp * pp, max(1, replicas // pp), batch, usage,
                  not misses, tuple(misses), ratio, rec.ttft_s.p90, rec.tpot_s.p90,
                  rec.output_tokens_per_s * pp, attainment=rec.slo_met_fraction,
                  run_requests=(rec.requests, rec.warmup_requests))


def runs_key(arch: Architecture, cand: Candidate, plan: InferencePlan, engine: Engine,
             pp: int = 1) -> tuple[object, ...]:
    """What a replica's runs depend on, by value (an object's id may be reused once it is
    freed), but the lengths and targets: the model, the device and its rates, the plan, the
    scheduler's limits (a plan's narrower settings differ in them) and the stages."""
    rates = cand.rates
    assert rates is not None
    lim = engine.limits
    return (arch, cand.hw.id, rates.source, rates.bandwidth_bytes_per_s,
            tuple(sorted(rates.peak_flops.items())), plan, lim.max_batched_tokens,
            lim.max_seqs, lim.reserve_output, lim.overlap, pp)


def _misses(load: ServeLoad, ttft0: float, tpot0: float) -> tuple[list[str], float]:
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
    return misses, max(ratios)
