"""`gpuwise plan` at a load given as clients or as a trace (docs/plan.md, "The load"): the
rate the search sizes at, and the chosen fleet re-simulated at the load itself.

Clients in a closed loop (`--concurrency N`, as `gpuwise serve --concurrency` runs them) send
N / (the time a request takes) requests a second (Little's law); at a fleet that exactly meets
the targets a request takes TTFT + (output - 1) x TPOT, so the search runs at that rate. The
chosen fleet is then run closed loop, each replica with its share of the clients (ceil(N / R)),
long enough to reach its steady state (as estimate/serve/steady_load.py's runs: a warm-up of
one in-flight count of requests, then two more measured), and replicas are added until it
meets the targets there. A trace's requests are dealt to the replicas round-robin in arrival
order and one replica's share is run, as `gpuwise serve --trace --gpus` runs it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from gpuwise.catalog.costs import CostAssumptions
from gpuwise.estimate.cost.advise import price_options
from gpuwise.estimate.plan.search import Evaluated, Limits
from gpuwise.estimate.serve.metrics import ServeSummary, Slo, summary
from gpuwise.estimate.serve.simulate import Engine, simulate
from gpuwise.estimate.serve.steady_load import MAX_REQUESTS, MEASURED, MIN_REQUESTS, WARMUP
from gpuwise.estimate.serve.sweep import meets
from gpuwise.workload.requests import Lengths, Request, closed_loop_lengths

GROWTH = 8  # the most replicas tried, as a multiple of the search's
MOST_ADDED = 8  # and replicas added at least, before saying the fleet cannot meet the targets


@dataclass(frozen=True)
class LoadRun:
    """The chosen fleet at the load asked: how many replicas, each with how many clients (0:
    arrivals as given), the requests a second the fleet was sent, and whether it meets the
    targets (90% of requests within them, not saturated)."""

    kind: str  # rate | concurrency | trace
    replicas: int
    added: int  # replicas added to the search's fleet to meet the targets at the load
    tried_up_to: int  # the most replicas run
    clients_per_replica: int
    requests_per_s: float
    meets: bool
    run_requests: tuple[int, int]  # one replica's run: requests, of which the warm-up
    rechecked: int = 1  # configurations re-simulated at the load, cheapest first
    search_choice: str = ""  # the search's choice where it is not this one (it missed there)


def clients_rate(clients: int, output: int, ttft_s: float, tpot_s: float) -> float:
    """Requests a second `clients` send in a closed loop when each request takes
    `ttft_s` + (`output` - 1) x `tpot_s` (Little's law)."""
    return clients / max(1e-9, ttft_s + max(0, output - 1) * tpot_s)


def closed_loop_counts(clients: int) -> tuple[int, int]:
    """(requests in a closed-loop run of `clients`, of which the warm-up): steady_load's
    counts with the clients as the requests in flight."""
    warm = math.ceil(WARMUP * clients)
    count = max(MIN_REQUESTS, warm + math.ceil(MEASURED * clients))
    return min(MAX_REQUESTS, count), min(warm, MAX_REQUESTS // 3)


def closed_loop_run(engine: Engine, clients: int, lengths: Lengths, slo: Slo,
                    seed: int = 0) -> tuple[ServeSummary, float]:
    """One replica with `clients` in a closed loop, in steady state: its figures after the
    warm-up, and the requests a second its clients sent then."""
    count, warm = closed_loop_counts(clients)
    reqs = [Request(0.0, p, o) for p, o in closed_loop_lengths(count, lengths, seed)]
    trace = simulate(engine, reqs, clients)
    sent = sorted(s.req.arrival_s for s in trace.seqs)
    after = sent[warm] if 0 < warm < len(sent) else None
    rec = summary(trace, slo, after_s=after)
    start = after or 0.0
    rate = sum(1 for t in sent if t >= start) / max(1e-12, trace.end_s - start)
    return rec, rate


def trace_share_run(engine: Engine, reqs: list[Request], replicas: int,
                    slo: Slo) -> ServeSummary:
    """The first replica's share of a trace dealt round-robin in arrival order, as recorded
    (no warm-up left out)."""
    share = reqs[::replicas] if replicas > 1 else reqs
    return summary(simulate(engine, share), slo)


def until_met(run: Callable[[int], tuple[ServeSummary, float]], replicas: int, slo: Slo,
              most: int) -> tuple[int, ServeSummary, float, bool, int]:
    """The fewest replicas from `replicas` up to `most` whose `run` meets the targets (more
    replicas, fewer clients or requests each: doubled until one meets, then bisected): (those
    replicas, else `replicas`; that run; its rate; whether it meets them; the most run)."""
    first = run(replicas)
    if meets(first[0], slo):
        return replicas, first[0], first[1], True, replicas
    low, high, found = replicas, replicas, None  # low misses; found: the fewest that meet
    while found is None and high < most:
        high = min(most, 2 * high)
        got = run(high)
        if meets(got[0], slo):
            found = (high, got)
        else:
            low = high
    if found is None:
        return replicas, first[0], first[1], False, high
    tried = found[0]
    while found[0] - low > 1:
        mid = (low + found[0]) // 2
        got = run(mid)
        if meets(got[0], slo):
            found = (mid, got)
        else:
            low = mid
    r, (rec, rate) = found
    return r, rec, rate, True, tried


def most_replicas(replicas: int, clients: int | None = None) -> int:
    """The most replicas tried: `GROWTH` times the search's, `MOST_ADDED` more at least, and
    no more than one a client (more leave replicas idle)."""
    most = max(GROWTH * replicas, replicas + MOST_ADDED)
    return min(most, max(replicas, clients)) if clients else most


def regrown(e: Evaluated, replicas: int, rec: ServeSummary, ratio: float, slo: Slo,
            a: CostAssumptions, limits: Limits, max_wall_kw: float | None = None) -> Evaluated:
    """The configuration with `replicas` replicas, repriced as the search prices it (the same
    way to pay where it has it): each device busy the share `rec` (one replica's run) was,
    serving `ratio` times the tokens the search sized for (what clients sent over it); its
    p90s and attainment those of `rec`."""
    s = e.sizing
    usage = replace(s.usage, devices=s.devices_per_replica * replicas,
                    busy_hours=rec.busy_fraction * s.usage.held_hours,
                    tokens=s.usage.tokens * ratio, requests=s.usage.requests * ratio)
    ok = meets(rec, slo)
    sizing = replace(s, replicas=replicas, usage=usage, meets=ok,
                     misses=() if ok else ("the targets at the load",),
                     ttft_s=rec.ttft_s.p90, tpot_s=rec.tpot_s.p90,
                     tokens_per_s=rec.output_tokens_per_s, attainment=rec.slo_met_fraction,
                     run_requests=(rec.requests, rec.warmup_requests))
    options = price_options(sizing, a, max_wall_kw)
    if not options:
        return e
    same = [o for o in options if o.cost.mode == e.option.cost.mode]
    option = (same or sorted(options, key=lambda o: o.cost.usd_per_month))[0]
    return Evaluated(e.config, sizing, option, limits.allows(option.cost.usd_per_month,
                                                             sizing.devices))
