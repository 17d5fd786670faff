"""The latency-throughput curve and the highest request rate that meets the latency targets
(docs/serve.md, "The knee"): the same requests (lengths and seed) at rising Poisson rates."""

from __future__ import annotations

from collections.abc import Callable

from gpuwise.estimate.serve.metrics import Slo, summary
from gpuwise.estimate.serve.replica import rate_ceiling
from gpuwise.estimate.serve.simulate import Engine, simulate
from gpuwise.workload.requests import Lengths, Request, poisson_requests

ATTAINMENT = 0.9  # the share of requests that must meet the targets (DistServe's "SLO attainment")
CURVE_POINTS = 8
BISECTIONS = 6


def meets(rec: dict, slo: Slo) -> bool:
    return not rec["saturated"] and rec["slo_met_fraction"] >= ATTAINMENT


def sweep(engine: Engine, lengths: Lengths, count: int, slo: Slo, seed: int = 0,
          progress: Callable[[str, float], None] | None = None, points: int = CURVE_POINTS,
          bisections: int = BISECTIONS) -> dict:  # fmt: skip
    """The curve over rates up to 1.5x the replica's ceiling, and the knee found between the
    last rate that met the targets and the first that did not."""
    top = 1.5 * rate_ceiling(engine, lengths.prompt, lengths.output)
    rates = [top * (i + 1) / points for i in range(points)]
    steps = len(rates) + bisections

    def run(rate: float, i: int) -> dict:
        if progress:
            progress(f"rate {rate:.3g}/s", i / steps)
        reqs: list[Request] = poisson_requests(rate, count, lengths, seed)
        return {"rate": rate, **summary(simulate(engine, reqs), slo)}

    curve = [run(r, i) for i, r in enumerate(rates)]
    ok = [p["rate"] for p in curve if meets(p, slo)]
    low = max(ok, default=0.0)
    high = min((p["rate"] for p in curve if p["rate"] > low and not meets(p, slo)), default=None)
    for i in range(bisections if high is not None else 0):
        mid = (low + high) / 2  # type: ignore[operator]
        point = run(mid, len(rates) + i)
        low, high = (mid, high) if meets(point, slo) else (low, mid)
    for point in curve:
        point.pop("kv_timeline", None)
    return {"curve": curve, "max_rate_meeting_slo": low or None, "attainment": ATTAINMENT,
            "rate_ceiling": top / 1.5}  # fmt: skip
