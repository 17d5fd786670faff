"""`gpuwise serve`: a model served under load, simulated step by step with the runtime's
scheduler and time model (docs/serve.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from gpuwise.app.infer import offload_host
from gpuwise.catalog.costs import load_costs
from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.models import ResolvedModel
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.runtimes import runtime_unit
from gpuwise.estimate.serve.metrics import Power, ServeSummary, Slo, scaled, summary
from gpuwise.estimate.serve.replica import NoLoad, ReplicaOptions, build_engine, no_load
from gpuwise.estimate.serve.simulate import simulate
from gpuwise.estimate.serve.sweep import Sweep, for_replicas, sweep
from gpuwise.files import read_text
from gpuwise.measure.probe.rates_source import rates_for
from gpuwise.workload import Architecture
from gpuwise.workload.limits import check_count, check_number
from gpuwise.workload.plans import InferencePlan
from gpuwise.workload.requests import (
    Lengths,
    Request,
    closed_loop_lengths,
    parse_trace,
    poisson_requests,
)

__all__ = ["Load", "ReplicaOptions", "ServeAnswer", "Slo", "serve"]  # what cli/ may build
Progress = Callable[[str, float], None]
TRACE_MAX_BYTES = 1 << 30  # a million-request trace is ~100 MB


@dataclass(frozen=True)
class Load:
    """The request stream: a Poisson `rate` a second, `concurrency` clients in a closed loop,
    or a `trace` file; `requests` of them (or those arriving within `duration_s`)."""

    lengths: Lengths
    rate: float | None = None
    concurrency: int | None = None
    trace: Path | None = None
    requests: int = 1000
    duration_s: float | None = None
    seed: int = 0
    warmup: int = 0  # requests at the start left out of the latencies (a run's warm-up)


@dataclass(frozen=True)
class ServeAnswer:
    model: ResolvedModel
    arch: Architecture
    hardware: Hardware
    plan: InferencePlan
    opts: ReplicaOptions
    load: Load
    slo: Slo
    replicas: int
    rates_source: str
    no_load: NoLoad  # one request alone
    result: ServeSummary  # the fleet's: throughputs and joules times the replicas
    kv_cache_tokens: int  # one replica's
    sweep: Sweep | None = None  # the knee the fleet's


def _check_load(load: Load, slo: Slo, gpus: int, tp: int, shared_prefix: int = 0) -> None:
    given = [x for x in (load.rate, load.concurrency, load.trace) if x is not None]
    if len(given) != 1 and not (len(given) == 2 and load.rate is None):
        raise GpuwiseError("give one of --rate, --concurrency or --trace (or --concurrency "
                           "with --trace: clients that send the trace's requests in turn)",
                           "--rate for arrivals at random, --concurrency for clients that wait")
    if load.trace is None and "trace" in (load.lengths.prompt_dist, load.lengths.output_dist):
        raise GpuwiseError("a length distribution 'trace' needs --trace",
                           "fixed, uniform or normal around --prompt and --new-tokens")
    if load.concurrency is not None:
        check_count(load.concurrency, "--concurrency", 1 << 16)
    if shared_prefix:
        check_count(shared_prefix, "--shared-prefix", load.lengths.prompt, low=0,
                    hint="the shared part of a prompt is at most --prompt tokens")
    if load.duration_s is not None:
        check_number(load.duration_s, "--duration", 1e7)
    if load.warmup:
        check_count(load.warmup, "--warmup", max(0, load.requests - 1), low=0,
                    hint="the warm-up leaves at least one of --requests to measure")
    for name, value in (("--ttft-ms", slo.ttft_s), ("--tpot-ms", slo.tpot_s)):
        if value is not None:
            check_number(value * 1e3, name, 1e9)
    if gpus % tp:
        raise GpuwiseError(f"--gpus {gpus} is not a multiple of --tp {tp}",
                           "each replica runs on --tp devices")


def requests_for(load: Load, replicas: int) -> tuple[list[Request], int]:
    """One replica's requests and clients (0: open loop): the stream split evenly."""
    lengths = load.lengths
    if load.trace is not None:
        text = read_text(load.trace, "--trace", TRACE_MAX_BYTES, "JSON lines of requests")
        reqs = parse_trace(text, lengths, load.seed)
        reqs = reqs[::replicas] if replicas > 1 else reqs
        if load.concurrency is None:
            return reqs, 0
        # clients send the trace's requests in its order, each when its last is answered
        return [Request(0.0, r.prompt, r.output) for r in reqs], max(1, load.concurrency // replicas)
    if load.concurrency is not None:
        clients = max(1, load.concurrency // replicas)
        return [Request(0.0, p, o) for p, o in closed_loop_lengths(load.requests, lengths,
                                                                   load.seed)], clients
    rate = (load.rate if load.rate is not None else 0.0) / replicas
    count = load.requests
    if load.duration_s is not None:
        count = max(1, round(rate * load.duration_s))
    return poisson_requests(rate, count, lengths, load.seed), 0


def serve(model: ResolvedModel, arch: Architecture, hw: Hardware, plan: InferencePlan,
          opts: ReplicaOptions, load: Load, slo: Slo, gpus: int = 1, do_sweep: bool = False,
          progress: Progress | None = None) -> ServeAnswer:
    _check_load(load, slo, gpus, opts.tp, opts.shared_prefix)
    rates, how = rates_for(hw)
    if rates is None:
        raise GpuwiseError(f"no speed figures for {hw.name}: {how}",
                           "run `gpuwise probe` here, or pick catalogue hardware")
    run = runtime_unit(plan.runtime).as_run(arch, replace(plan, tp=opts.tp), hw)
    engine = build_engine(arch, plan, hw, rates, opts, offload_host(run, hw))  # -ngl as infer
    replicas = max(1, gpus // opts.tp)
    reqs, clients = requests_for(load, replicas)
    prompt = round(sum(r.prompt for r in reqs) / len(reqs))
    output = round(sum(r.output for r in reqs) / len(reqs))
    alone = no_load(engine, prompt, output)
    _check_slo(slo, alone)
    costs = load_costs()
    tdp = hw.tdp_w * opts.tp
    power = Power(tdp * costs.busy_power_fraction, tdp * costs.idle_power_fraction,
                  tdp * costs.memory_power_fraction) if tdp > 0 else None
    if progress:
        progress("simulating", 0.0)
    after = reqs[load.warmup].arrival_s if 0 < load.warmup < len(reqs) else None
    result = scaled(summary(simulate(engine, reqs, clients), slo, power, after), replicas)
    swept = None
    if do_sweep:
        one = sweep(engine, load.lengths, min(load.requests, 2000), slo, load.seed, progress)
        swept = for_replicas(one, replicas)
    return ServeAnswer(model, arch, hw, plan, opts, load, slo, replicas, how, alone, result,
                       engine.kv_blocks * engine.block_tokens, swept)


def _check_slo(slo: Slo, alone: NoLoad) -> None:
    """A target below what one request alone takes can never be met: say so, with the figure."""
    for name, target, seconds in (("--ttft-ms", slo.ttft_s, alone.ttft_s),
                                  ("--tpot-ms", slo.tpot_s, alone.tpot_s)):
        if target is not None and target < seconds:
            raise GpuwiseError(f"{name} {target * 1e3:g} can never be met: one request alone "
                               f"takes {seconds * 1e3:.3g} ms", "raise the target, or serve on "
                               "faster hardware or a faster runtime")

