"""`gpuwise plan`'s load (docs/plan.md, "The load"): one of --rate, --requests-per-day,
--concurrency or --trace, turned into the rate the search sizes at; and the chosen fleet
re-simulated at clients or a trace (estimate/plan/closed_loop.py)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuwise.app.serve import Load, requests_for
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.plan.closed_loop import (
    LoadRun,
    clients_rate,
    closed_loop_counts,
    closed_loop_run,
    most_replicas,
    regrown,
    trace_share_run,
    until_met,
)
from gpuwise.estimate.plan.search import Evaluated, Problem, Searched
from gpuwise.estimate.plan.space import Config
from gpuwise.estimate.serve.metrics import ServeSummary, Slo
from gpuwise.estimate.serve.simulate import Engine
from gpuwise.units import parse_fraction
from gpuwise.workload.deployments import ServeLoad
from gpuwise.workload.limits import check_count
from gpuwise.workload.requests import Lengths, Request

MAX_CLIENTS = 1 << 16  # as serve's --concurrency
LOADS = "--rate, --requests-per-day, --concurrency or --trace"
RECHECK = 16  # configurations re-simulated at clients or a trace, at most


@dataclass(frozen=True)
class AskedLoad:
    """The load as asked, and the rate the search sizes at (`load`)."""

    kind: str  # rate | concurrency | trace
    load: ServeLoad
    how: str  # how the search's rate was found, in words
    concurrency: int | None = None
    trace: Path | None = None
    requests: tuple[Request, ...] = ()  # the trace's
    span_s: float = 0.0  # the trace's first arrival to its last


def asked_load(kw: dict[str, Any]) -> AskedLoad:
    """The one load given: a rate (a second or a day), clients, or a trace."""
    given = [k for k in ("request_rate", "requests_per_day", "concurrency", "trace")
             if kw.get(k) is not None]
    if len(given) != 1:
        raise GpuwiseError(f"give the load once: one of {LOADS}",
                           "e.g. --rate 5 (requests a second) or --concurrency 32 (clients)")
    ttft, tpot = kw.get("ttft_ms"), kw.get("latency_ms")
    share = parse_fraction(kw.get("utilisation") or "60%", "utilisation")

    def at(per_s: float, prompt: int, output: int) -> ServeLoad:
        return ServeLoad(per_s * 86400, prompt, output, tpot, ttft, share)

    kind = given[0]
    if kind == "requests_per_day":
        return AskedLoad("rate", at(kw["requests_per_day"] / 86400, kw["prompt"], kw["output"]),
                         "requests a day, spread over the day")
    if kind == "request_rate":
        return AskedLoad("rate", at(kw["request_rate"], kw["prompt"], kw["output"]),
                         "Poisson arrivals")
    if kind == "concurrency":
        return _clients(kw, at)
    return _trace(kw["trace"], at)


def _clients(kw: dict[str, Any], at: Callable[[float, int, int], ServeLoad]) -> AskedLoad:
    n: int = kw["concurrency"]
    check_count(n, "--concurrency", MAX_CLIENTS)
    tpot, ttft = kw.get("latency_ms"), kw.get("ttft_ms")
    if tpot is None:
        raise GpuwiseError("--concurrency needs --tpot-ms: the clients' rate is N over the time "
                           "a request takes at the targets", "e.g. --concurrency 32 --tpot-ms 50")
    rate = clients_rate(n, kw["output"], (ttft or 0.0) / 1e3, tpot / 1e3)
    first = f"{ttft:g} ms" if ttft is not None else "0 (no --ttft-ms: the first token at once)"
    how = (f"{n} / ({first} + {kw['output'] - 1} x {tpot:g} ms), the rate they send when each "
           "request takes what the targets allow (Little's law)")
    return AskedLoad("concurrency", at(rate, kw["prompt"], kw["output"]), how, concurrency=n)


def _trace(path: Path, at: Callable[[float, int, int], ServeLoad]) -> AskedLoad:
    recorded = Lengths(1, 1, "trace", "trace")
    reqs, _ = requests_for(Load(recorded, trace=path), 1)  # serve's reader, its errors
    span = reqs[-1].arrival_s - reqs[0].arrival_s
    if len(reqs) < 2 or not span > 0:
        raise GpuwiseError(f"the trace's {len(reqs)} request(s) span no time: its rate is not "
                           "defined", "a trace of two arrivals or more, at different times")
    rate = (len(reqs) - 1) / span
    prompt = max(1, round(sum(r.prompt for r in reqs) / len(reqs)))
    output = max(1, round(sum(r.output for r in reqs) / len(reqs)))
    how = (f"{len(reqs):,} requests over {span:,.1f} s, one every {span / (len(reqs) - 1):.3g} "
           "s; lengths its means")
    return AskedLoad("trace", at(rate, prompt, output), how, trace=path,
                     requests=tuple(reqs), span_s=span)


def at_asked_load(asked: AskedLoad, p: Problem, found: Searched,
                  engine_for: Callable[[Evaluated], Engine | None]
                  ) -> tuple[Searched, ServeSummary | None, LoadRun | None] | None:
    """The search's record with its cheapest configurations re-simulated at the clients or
    the trace asked, each grown until it meets the targets there (repriced where it grew, or
    marked as missing them): cheapest first, until the cheapest that meets them has been
    re-simulated (a fleet only grows, so its search price bounds it), at most `RECHECK`.
    Then the choice's run (one replica's) and what was run (None where it was not run: past
    `RECHECK`, or no engine). None for a rate."""
    if asked.kind == "rate":
        return None
    done: dict[Config, tuple[ServeSummary, LoadRun]] = {}
    out = replace(found, evaluated=list(found.evaluated))
    while (best := out.best) is not None and best.config not in done and len(done) < RECHECK:
        got = _resimulated(asked, p, best, engine_for(best))
        if got is None:  # no engine: left as the search sized it
            break
        fleet, rec, run = got
        done[best.config] = (rec, replace(run, rechecked=len(done) + 1))
        out.evaluated = [fleet if e.config == best.config else e for e in out.evaluated]
    best = out.best
    if best is None or best.config not in done:
        return out, None, None
    rec, run = done[best.config]
    return out, rec, replace(run, rechecked=len(done), search_choice=(
        "" if found.best is None or found.best.config == best.config else found.best.config.label))


def _resimulated(asked: AskedLoad, p: Problem, e: Evaluated, engine: Engine | None
                 ) -> tuple[Evaluated, ServeSummary, LoadRun] | None:
    """One configuration's fleet at the clients or the trace, grown until it meets the
    targets there: the fleet (repriced where it grew; missing the targets where it never
    met them), one replica's run, and what was run."""
    if engine is None:
        return None
    slo = Slo(None if p.load.ttft_ms is None else p.load.ttft_ms / 1e3,
              None if p.load.tpot_ms is None else p.load.tpot_ms / 1e3)
    start = e.sizing.replicas
    if asked.concurrency is not None:
        n = asked.concurrency
        lengths = Lengths(p.load.prompt_tokens, p.load.output_tokens)

        def run(r: int) -> tuple[ServeSummary, float]:
            each = math.ceil(n / r)
            rec, rate = closed_loop_run(engine, each, lengths, slo)
            return rec, rate * n / each  # the N clients' rate, each sending as one here

        most = most_replicas(start, n)
    else:
        reqs = list(asked.requests)
        rate = p.load.arrivals_per_s

        def run(r: int) -> tuple[ServeSummary, float]:
            return trace_share_run(engine, reqs, r, slo), rate

        most = most_replicas(start)
    replicas, rec, sent, ok, tried = until_met(run, start, slo, most)
    ratio = sent / p.load.arrivals_per_s
    fleet = e if replicas == start and ok else regrown(e, replicas, rec, ratio, slo,
                                                       p.assumptions, p.limits, p.max_wall_kw)
    clients = math.ceil(asked.concurrency / replicas) if asked.concurrency else 0
    counts = closed_loop_counts(clients) if clients else (rec.requests, 0)
    return fleet, rec, LoadRun(asked.kind, replicas, replicas - start, tried, clients, sent, ok,
                               counts)
