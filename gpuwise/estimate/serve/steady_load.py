"""A replica at a steady Poisson rate, as it runs for hours (docs/cost.md, "How an option is
sized"): a run long enough that the batch and the queue reach the sizes they keep, the
warm-up left out of its latencies.

A replica meeting the targets holds rate x (TTFT + output x TPOT) requests at once (Little's
law), each bounded by its target (or, without one, by four times a request's own latency).
The run is `WARMUP` of those in-flight counts of requests to fill the batch, which its
figures leave out, then `MEASURED` more, at least `MIN_REQUESTS` in all. A short run at a
rate the replica cannot sustain looks fine: 200 requests at 1.5x an H100's ceiling all run
at once in vLLM's batch of 1,024, and the queue that would grow never forms.
"""

from __future__ import annotations

import math

from gpuwise.estimate.serve.metrics import ServeSummary, Slo, summary
from gpuwise.estimate.serve.replica import no_load_latency
from gpuwise.estimate.serve.simulate import Engine, simulate
from gpuwise.workload.requests import Lengths, poisson_requests

MIN_REQUESTS = 200
WARMUP = 1.0  # in-flight counts of requests that fill the batch before the figures count
MEASURED = 2.0  # in-flight counts of requests measured after it
MAX_REQUESTS = 6000
UNTARGETED = 4.0  # without a target, a request's own latency times this bounds its wait


def steady_counts(engine: Engine, rate: float, lengths: Lengths, slo: Slo) -> tuple[int, int]:
    """(requests in the run, of which the warm-up) for `rate`."""
    ttft0, tpot0 = no_load_latency(engine, lengths.prompt, lengths.output)
    ttft = slo.ttft_s if slo.ttft_s else UNTARGETED * ttft0
    tpot = slo.tpot_s if slo.tpot_s else UNTARGETED * tpot0
    in_flight = rate * (ttft + lengths.output * tpot)
    warm = math.ceil(WARMUP * in_flight)
    count = max(MIN_REQUESTS, warm + math.ceil(MEASURED * in_flight))
    return min(MAX_REQUESTS, count), min(warm, MAX_REQUESTS // 3)


def steady_run(engine: Engine, rate: float, lengths: Lengths, slo: Slo,
               seed: int = 0) -> ServeSummary:
    """The replica's figures at `rate` once its batch is full: the run's requests after the
    warm-up (`ServeSummary.warmup_requests` says how many it left out)."""
    count, warm = steady_counts(engine, rate, lengths, slo)
    reqs = poisson_requests(rate, count, lengths, seed)
    return summary(simulate(engine, reqs), slo, after_s=reqs[warm].arrival_s if warm else None)
