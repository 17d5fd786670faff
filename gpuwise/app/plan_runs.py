"""`gpuwise plan`'s runs after the search (docs/plan.md, "The frontier"): the chosen fleet at the
rate asked, and each configuration at its knee. A pipeline's replica is pp engines in flight
(estimate/serve/pipeline.py); a disaggregated configuration is two pools
(estimate/cost/disaggregated.py), each run at its own share of the load and targets."""

from __future__ import annotations

from gpuwise.estimate.cost.disaggregated import Pools, at_load, joined, pools_knee
from gpuwise.estimate.plan.closed_loop import LoadRun
from gpuwise.estimate.plan.frontier import SpeedPoint
from gpuwise.estimate.plan.search import Evaluated, Problem, Searched, pools_for, prepared_for
from gpuwise.estimate.serve.metrics import ServeSummary, Slo
from gpuwise.estimate.serve.simulate import Engine
from gpuwise.estimate.serve.steady_load import steady_run
from gpuwise.estimate.serve.sweep import knee, meets
from gpuwise.workload.deployments import ServeLoad
from gpuwise.workload.requests import Lengths

KNEES = 12  # devices and runtimes whose knee the speed frontier is drawn from
KNEE_REQUESTS = 200


def slo_of(load: ServeLoad) -> Slo:
    return Slo(None if load.ttft_ms is None else load.ttft_ms / 1e3,
               None if load.tpot_ms is None else load.tpot_ms / 1e3)


def engine_of(p: Problem, e: Evaluated) -> Engine | None:
    """The configuration's engine (a pipeline's: one of its batches in flight); None for
    two pools, or where it has none."""
    if e.config.disagg:
        return None
    prep = prepared_for(p, e.config)
    return None if isinstance(prep, str) else prep.engine


def replica_engine(p: Problem, e: Evaluated) -> Engine | None:
    """The engine a whole replica is, for runs that deal clients or a trace to replicas: None
    for a pipeline (pp engines) or two pools, which are left as the search sized them."""
    return None if e.config.pp > 1 else engine_of(p, e)


def _pools(p: Problem, e: Evaluated) -> Pools | None:
    pools = pools_for(p, e.config)
    return None if isinstance(pools, str) else pools


def at_rate(p: Problem, e: Evaluated) -> tuple[ServeSummary, LoadRun] | None:
    """The chosen fleet at the rate itself: each engine's share, in steady state (two pools:
    each pool's, joined as a request sees them)."""
    load, replicas = p.load, e.sizing.replicas
    if e.config.disagg:
        pools = _pools(p, e)
        if pools is None:
            return None
        n_p = e.sizing.prefill_replicas
        rec = joined(pools, *at_load(pools, load, n_p, replicas - n_p))
    else:
        engine = engine_of(p, e)
        if engine is None:
            return None
        lengths = Lengths(load.prompt_tokens, load.output_tokens)
        rec = steady_run(engine, load.arrivals_per_s / (replicas * e.config.pp), lengths,
                         slo_of(load))
    return rec, LoadRun("rate", replicas, 0, replicas, 0, load.arrivals_per_s,
                        meets(rec, slo_of(load)), (rec.requests, rec.warmup_requests))


def speed_points(p: Problem, found: Searched, costs: tuple[Evaluated, ...]) -> list[SpeedPoint]:
    """The knee of each device and runtime's best configuration that meets the targets, and
    of those on the cost frontier: the speed frontier's points."""
    best: dict[tuple[str, str], Evaluated] = {}
    for e in sorted((e for e in found.evaluated if e.meets), key=lambda e: e.rank):
        best.setdefault((e.config.device, e.config.runtime), e)
    chosen = list({e.config: e for e in [*list(best.values())[:KNEES], *costs]}.values())
    return [pt for e in chosen if (pt := _knee(p, e)) is not None]


def _knee(p: Problem, e: Evaluated) -> SpeedPoint | None:
    load = p.load
    if e.config.disagg:
        pools = _pools(p, e)
        got = pools_knee(pools, load, KNEE_REQUESTS) if pools is not None else None
        if got is None:
            return None
        per_device, per_user = got
        return SpeedPoint(e, per_device * e.config.tp / load.output_tokens, per_device,
                          per_user)
    engine = engine_of(p, e)
    if engine is None:
        return None
    swept = knee(engine, Lengths(load.prompt_tokens, load.output_tokens), KNEE_REQUESTS,
                 slo_of(load))
    rate = swept.max_rate_meeting_slo
    at = [pt for pt in swept.curve if pt.rate == rate]
    if not rate or not at or not at[0].summary.tpot_s.p90:
        return None
    return SpeedPoint(e, rate, rate * load.output_tokens / e.config.tp,
                      1.0 / at[0].summary.tpot_s.p90)
