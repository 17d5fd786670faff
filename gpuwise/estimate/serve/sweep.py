"""The latency-throughput curve and the highest request rate that meets the latency targets
(docs/serve.md, "The knee"): the same requests (lengths and seed) at rising Poisson rates."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from gpuwise.estimate.serve.metrics import ServeSummary, Slo, summary
from gpuwise.estimate.serve.replica import no_load_latency, rate_ceiling
from gpuwise.estimate.serve.simulate import Engine, simulate
from gpuwise.workload.requests import Lengths, Request, poisson_requests

ATTAINMENT = 0.9  # the share of requests that must meet the targets (DistServe's "SLO attainment")
CURVE_POINTS = 8
BISECTIONS = 6


@dataclass(frozen=True)
class SweepPoint:
    """One offered rate of the curve and what the run at it measured (its KV timeline left
    out: the curve is drawn from the rest)."""

    rate: float
    summary: ServeSummary


@dataclass(frozen=True)
class Sweep:
    """The curve over rising rates, the knee (the highest rate meeting the targets for
    `attainment` of requests; None: none of the rates tried) and the replica's ceiling."""

    curve: tuple[SweepPoint, ...]
    max_rate_meeting_slo: float | None
    attainment: float
    rate_ceiling: float


def meets(rec: ServeSummary, slo: Slo) -> bool:
    return not rec.saturated and rec.slo_met_fraction >= ATTAINMENT


def sweep(engine: Engine, lengths: Lengths, count: int, slo: Slo, seed: int = 0,
          progress: Callable[[str, float], None] | None = None, points: int = CURVE_POINTS,
          bisections: int = BISECTIONS) -> Sweep:
    """The curve over rates up to 1.5x the replica's ceiling, and the knee found between the
    last rate that met the targets and the first that did not."""
    top = 1.5 * rate_ceiling(engine, lengths.prompt, lengths.output)
    rates = [top * (i + 1) / points for i in range(points)]
    steps = len(rates) + bisections

    def run(rate: float, i: int) -> SweepPoint:
        if progress:
            progress(f"rate {rate:.3g}/s", i / steps)
        reqs: list[Request] = poisson_requests(rate, count, lengths, seed)
        return SweepPoint(rate, replace(summary(simulate(engine, reqs), slo), kv_timeline=()))

    curve = [run(r, i) for i, r in enumerate(rates)]
    ok = [p.rate for p in curve if meets(p.summary, slo)]
    low = max(ok, default=0.0)
    high = min((p.rate for p in curve if p.rate > low and not meets(p.summary, slo)), default=None)
    for i in range(bisections if high is not None else 0):
        mid = (low + high) / 2  # type: ignore[operator]
        point = run(mid, len(rates) + i)
        low, high = (mid, high) if meets(point.summary, slo) else (low, mid)
    return Sweep(tuple(curve), low or None, ATTAINMENT, top / 1.5)


KNEE_PRECISION = 0.02  # of the knee (of a tenth of the ceiling, at least): `knee`'s bracket
KNEE_RUNS = 10  # and the most runs it takes


def knee(engine: Engine, lengths: Lengths, count: int, slo: Slo, seed: int = 0) -> Sweep:
    """The highest rate meeting the targets, as `sweep` finds it, in fewer runs and none past
    the ceiling (where the queue grows without end): a bracket from none to 1.5x the
    ceiling, narrowed at the rate where the worst p90 over its target crosses 1 between
    the bracket's ends (regula falsi), halving where that is not known or lands badly, until
    it is `KNEE_PRECISION` of the knee wide. Its curve: the runs it took, by rate."""
    ceiling = rate_ceiling(engine, lengths.prompt, lengths.output)
    runs: list[SweepPoint] = []
    alone = no_load_latency(engine, lengths.prompt, lengths.output)
    lo = (0.0, _over_ratios(alone, slo))  # (rate, the worst p90 over its target, less 1)
    hi = (1.5 * ceiling, math.inf)
    if lo[1] > 0 and lengths.prompt_dist == lengths.output_dist == "fixed":
        # a request alone misses a target, and every request is alike: no rate meets them
        return Sweep((), None, ATTAINMENT, ceiling)
    rate, side = 0.5 * ceiling, 0
    while hi[0] - lo[0] > KNEE_PRECISION * max(lo[0], 0.1 * ceiling) and len(runs) < KNEE_RUNS:
        reqs = poisson_requests(rate, count, lengths, seed)
        point = SweepPoint(rate, replace(summary(simulate(engine, reqs), slo), kv_timeline=()))
        runs.append(point)
        over = _over(point.summary, slo)
        if meets(point.summary, slo):
            lo, side = (rate, min(over, 0.0)), side + 1 if side > 0 else 1
        else:
            hi, side = (rate, max(over, 0.0)), side - 1 if side < 0 else -1
        rate = _next_rate(lo, hi, side)
    return Sweep(tuple(sorted(runs, key=lambda p: p.rate)), lo[0] or None, ATTAINMENT, ceiling)


def _over(rec: ServeSummary, slo: Slo) -> float:
    """The worst p90 over its target, less 1 (inf: saturated; nan: no target)."""
    return math.inf if rec.saturated else _over_ratios((rec.ttft_s.p90, rec.tpot_s.p90), slo)


def _over_ratios(p90s: tuple[float | None, float | None], slo: Slo) -> float:
    ratios = [p90 / target for p90, target in zip(p90s, (slo.ttft_s, slo.tpot_s), strict=True)
              if target and p90 is not None]
    return max(ratios) - 1 if ratios else math.nan


def _next_rate(lo: tuple[float, float], hi: tuple[float, float], side: int) -> float:
    """Where the line between the bracket's ends crosses 0; the middle where either end's
    value is not finite, or where the same end moved twice in a row (`side`: how many times
    the low end moved in a row, negative: the high end), as the line then keeps landing
    beside that end (a flat or noisy stretch of the curve)."""
    (r0, f0), (r1, f1) = lo, hi
    if abs(side) >= 2 or not (math.isfinite(f0) and math.isfinite(f1)) or f1 <= f0:
        return (r0 + r1) / 2
    rate = r0 + (r1 - r0) * -f0 / (f1 - f0)
    span = r1 - r0  # never within 5% of the bracket of an end: a step there narrows it little
    return min(max(rate, r0 + 0.05 * span), r1 - 0.05 * span)


def for_replicas(swept: Sweep, replicas: int) -> Sweep:
    """One replica's sweep as the fleet's: the knee times the replicas (a new value)."""
    knee = swept.max_rate_meeting_slo
    return replace(swept, max_rate_meeting_slo=knee * replicas) if knee else swept
