"""The latency-throughput curve and the highest request rate that meets the latency targets
(docs/serve.md, "The knee"): the same requests (lengths and seed) at rising Poisson rates."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from gpuwise.estimate.serve.metrics import ServeSummary, Slo, summary
from gpuwise.estimate.serve.replica import rate_ceiling
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


def for_replicas(swept: Sweep, replicas: int) -> Sweep:
    """One replica's sweep as the fleet's: the knee times the replicas (a new value)."""
    knee = swept.max_rate_meeting_slo
    return replace(swept, max_rate_meeting_slo=knee * replicas) if knee else swept
