"""What a simulated serving run measured (docs/serve.md, "What it reports"): latency
percentiles, throughput, goodput under the latency targets, whether the load was past what
the replica sustains, and energy from the device's power model."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from gpuwise.estimate.serve.engine import Seq
from gpuwise.estimate.serve.simulate import Trace

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None

    def met(self, ttft: float, tpot: float) -> bool:
        return ((self.ttft_s is None or ttft <= self.ttft_s)
                and (self.tpot_s is None or tpot <= self.tpot_s))


@dataclass(frozen=True)
class Power:
    """Watts of the replica's devices (catalog/data/costs.toml): compute-bound work at
    `busy_w`, memory-bound work and the host's share between steps at `memory_w` (None:
    `busy_w`), time with no step to run at `idle_w`."""

    busy_w: float
    idle_w: float
    memory_w: float | None = None


@dataclass(frozen=True)
class Percentiles:
    """One latency over the run's requests, in seconds: the mean and p50/p90/p99 (None where
    there are no values)."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None


@dataclass(frozen=True)
class Energy:
    """Joules over the run (`energy`), and the power model that charged them."""

    joules: float
    per_1000_requests_j: float
    per_million_tokens_j: float
    per_output_token_j: float
    average_w: float
    busy_w: float
    memory_w: float
    idle_w: float
    compute_bound_share: float  # of the busy time


@dataclass(frozen=True)
class SteadyState:
    """The run's steady state (`steady_state`); joules a token at the busy power where a
    power is given (None: none was)."""

    seconds: float
    output_tokens_per_s: float
    average_batch: float
    whole_run: bool
    per_output_token_j: float | None = None


@dataclass(frozen=True)
class ServeSummary:
    """The run's figures in seconds, tokens and requests (`gpuwise serve --json` gives them
    under these names: report/serve_view.py)."""

    requests: int
    duration_s: float
    ttft_s: Percentiles
    tpot_s: Percentiles
    itl_s: Percentiles
    e2e_s: Percentiles
    output_tokens_per_s: float
    requests_per_s: float
    goodput_requests_per_s: float
    slo_met_fraction: float
    preemptions: int
    kv_peak_fraction: float
    busy_fraction: float
    steps: int
    saturated: bool
    kv_timeline: tuple[tuple[float, float], ...]  # (seconds, share of the KV cache in use)
    energy: Energy | None  # None: no power model
    steady_state: SteadyState
    # the first requests left out of the latencies and the targets' attainment: the warm-up
    # of a run meant to show the steady state (estimate/serve/steady_load.py)
    warmup_requests: int = 0


def nearest_rank(xs: list[float], p: int) -> float:
    """The p-th percentile of sorted `xs` by the nearest rank."""
    return xs[min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))]


def distribution(values: list[float]) -> Percentiles:
    """The mean and p50/p90/p99 by the nearest rank (None where there are no values)."""
    if not values:
        return Percentiles(None, None, None, None)
    xs = sorted(values)
    p50, p90, p99 = (nearest_rank(xs, p) for p in PERCENTILES)
    return Percentiles(sum(values) / len(values), p50, p90, p99)


def saturated(trace: Trace) -> bool:
    """Past what the replica sustains: when the last request arrived, a tenth of all the
    requests (at least 2) were still waiting to start. A closed loop never is: its clients
    wait for their answers."""
    return trace.queue_at_last_arrival >= max(2, len(trace.seqs) // 10)


def summary(trace: Trace, slo: Slo, power: Power | None = None,
            after_s: float | None = None) -> ServeSummary:
    """The run's figures in seconds, tokens and requests, as `gpuwise serve --json` gives them;
    the latencies and the targets' attainment of the requests that arrived at `after_s` or
    later where it is given (the rest: a warm-up)."""
    seqs = trace.seqs
    start = min(s.req.arrival_s for s in seqs)
    counted = [s for s in seqs if after_s is None or s.req.arrival_s >= after_s] or seqs
    warmup = len(seqs) - len(counted)
    seqs = counted
    ttft = [s.first_token_s - s.req.arrival_s for s in seqs]
    e2e = [s.done_s - s.req.arrival_s for s in seqs]
    tpot = [(s.done_s - s.first_token_s) / (s.req.output - 1) for s in seqs if s.req.output > 1]
    window = max(trace.end_s - start, 1e-12)
    out_tokens = sum(s.req.output for s in trace.seqs)
    good = sum(slo.met(t, (s.done_s - s.first_token_s) / max(1, s.req.output - 1))
               for t, s in zip(ttft, seqs, strict=True))
    p50, p90, p99 = (trace.itl.percentile(p) for p in PERCENTILES)
    steady, spent = steady_state(trace), None
    if power is not None:
        spent = energy(trace, window, len(trace.seqs), out_tokens, power)
        busy_w = busy_joules(trace, power) / max(trace.busy_s, 1e-12)
        steady = replace(steady, per_output_token_j=busy_w / max(steady.output_tokens_per_s, 1e-12))
    return ServeSummary(
        requests=len(trace.seqs), duration_s=window, ttft_s=distribution(ttft),
        tpot_s=distribution(tpot), itl_s=Percentiles(trace.itl.mean(), p50, p90, p99),
        e2e_s=distribution(e2e), output_tokens_per_s=out_tokens / window,
        requests_per_s=len(trace.seqs) / window,
        goodput_requests_per_s=good * len(trace.seqs) / len(seqs) / window,
        slo_met_fraction=good / len(seqs), preemptions=trace.preemptions,
        kv_peak_fraction=trace.kv_peak_fraction,
        busy_fraction=min(1.0, trace.busy_s / window),
        steps=trace.steps, saturated=saturated(trace),
        kv_timeline=tuple((round(t, 4), round(f, 4)) for t, f in trace.kv_timeline),
        energy=spent, steady_state=steady, warmup_requests=warmup)


def scaled(rec: ServeSummary, replicas: int) -> ServeSummary:
    """One replica's figures as the fleet's: throughputs and the energy's joules times the
    replicas (a new value; `rec` is left as it is)."""
    if replicas == 1:
        return rec
    spent = None if rec.energy is None else replace(rec.energy, joules=rec.energy.joules * replicas)
    return replace(rec, output_tokens_per_s=rec.output_tokens_per_s * replicas,
                   requests_per_s=rec.requests_per_s * replicas,
                   goodput_requests_per_s=rec.goodput_requests_per_s * replicas,
                   energy=spent)


def most_running(trace: Trace) -> int:
    """The most sequences that were generating at once (first token to last)."""
    events = sorted([(s.first_token_s, 1) for s in trace.seqs]
                    + [(s.done_s, -1) for s in trace.seqs])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return max(1, peak)


def _made(seq: Seq, t: float) -> float:
    """Output tokens `seq` had made by time t (linear from its first token to its last)."""
    first, done, n = seq.first_token_s, seq.done_s, seq.req.output
    if first < 0 or t < first:
        return 0.0
    if t >= done or done <= first:
        return float(n)
    return 1 + (n - 1) * (t - first) / (done - first)


def steady_state(trace: Trace) -> SteadyState:
    """The run's steady state, as load benchmarks that send everything at once measure it
    (ML.ENERGY): from the batch full (the first token of the request that filled the largest
    batch) to the queue empty (the last first token); the whole run where that leaves under a
    tenth of it. Output tokens a second, the average batch and the window's length; joules a
    token at the engine's busy power where a power is given (`summary`)."""
    firsts = sorted(s.first_token_s for s in trace.seqs)
    t0, t1 = firsts[min(most_running(trace), len(firsts)) - 1], firsts[-1]
    whole = t1 - t0 < 0.1 * trace.end_s
    if whole:
        t0, t1 = 0.0, trace.end_s
    span = max(t1 - t0, 1e-12)
    tokens = sum(_made(s, t1) - _made(s, t0) for s in trace.seqs)
    overlap = sum(max(0.0, min(s.done_s, t1) - max(s.first_token_s, t0)) for s in trace.seqs)
    return SteadyState(span, tokens / span, overlap / span, whole)


def busy_joules(trace: Trace, power: Power) -> float:
    """Joules while the engine works: each step's compute-bound time at the busy power, the
    rest of it (memory-bound time and the host's share between steps) at the memory power.
    A gap of a few milliseconds between steps does not let the device leave its active
    performance state (it drops to P5/P8 only after a delay: NVIDIA developer forum, "Avoiding
    performance mode slowdown"), and the memory power is itself a measured serving draw,
    gaps included (catalog/data/costs.toml, memory_power_fraction)."""
    memory_w = power.busy_w if power.memory_w is None else power.memory_w
    return trace.compute_s * power.busy_w + (trace.busy_s - trace.compute_s) * memory_w


def energy(trace: Trace, window_s: float, requests: int, tokens: int, power: Power) -> Energy:
    """Joules over the run: the busy time as `busy_joules` charges it, the time with no step
    to run at the idle power."""
    memory_w = power.busy_w if power.memory_w is None else power.memory_w
    idle_s = max(0.0, window_s - trace.busy_s)
    joules = busy_joules(trace, power) + idle_s * power.idle_w
    return Energy(joules=joules, per_1000_requests_j=1000 * joules / requests,
                  per_million_tokens_j=1e6 * joules / tokens, per_output_token_j=joules / tokens,
                  average_w=joules / window_s, busy_w=power.busy_w, memory_w=memory_w,
                  idle_w=power.idle_w,
                  compute_bound_share=trace.compute_s / max(trace.busy_s, 1e-12))
