"""Disaggregated prefill and decode (docs/plan.md, "Disaggregated serving"): a pool of replicas
that only prefill and a pool that only decode, each request's KV cache sent from the first to
the second over the link between them (vLLM's NixlConnector, SGLang's PD mode, NVIDIA
Dynamo). Decode steps then never wait behind a prompt's chunk, at the cost of the transfer
and of two pools sized apart.

Each pool is sized as advise sizes a replica (serving_sim.py `fewest_replicas`) against its
share of the targets: the decode pool meets the time per output token, and takes each request
in and samples its first token within a quarter of the time to first token the transfer
leaves; the prefill pool meets the rest. So a request within both pools' shares is within the
targets, and each pool meets its share for 90% of its requests (`attainment` is the lower of
the two)."""

from __future__ import annotations

from dataclasses import astuple, dataclass, replace

from gpuwise.errors import GpuwiseError
from gpuwise.estimate.cost.prices import Usage
from gpuwise.estimate.cost.serving_sim import (
    Prepared,
    fewest_replicas,
    prepare_serving,
    replicas_floor,
    runs_key,
)
from gpuwise.estimate.cost.sizing import Candidate, Sizing
from gpuwise.estimate.serve.metrics import Percentiles, ServeSummary, Slo
from gpuwise.estimate.serve.replica import ReplicaOptions, no_load_latency
from gpuwise.estimate.serve.simulate import Engine, StepParts
from gpuwise.estimate.serve.steady_load import steady_run
from gpuwise.estimate.serve.sweep import ATTAINMENT, knee
from gpuwise.workload import Architecture
from gpuwise.workload.deployments import ServeLoad
from gpuwise.workload.plans import InferencePlan
from gpuwise.workload.requests import Lengths

NODE_DEVICES = 8  # devices one node links (an HGX board's NVLink domain)
# Between nodes each GPU has its own RDMA NIC: ConnectX-7 at 400 Gb/s on DGX/HGX H100, H200
# and B200 (NVIDIA DGX H100/H200 datasheets), 50 GB/s one way.
NIC_BYTES_PER_S = 50e9
NIC_LATENCY_S = 20e-6  # an RDMA read's setup (NIXL), per transfer
ADMISSION_BUDGET = 1 << 24  # the decode pool takes whole prompts' caches in a step
# of the time to first token after the transfer, the decode pool's to take a request in (its
# queue for a free batch place and KV blocks) and sample its first token; the prefill's the
# rest (its queue and the prompt's compute, the larger part)
DECODE_SHARE = 0.25


@dataclass(frozen=True)
class DecodeOnly:
    """A decode replica's step: the prompts its requests bring are already computed (their
    KV cache arrives from the prefill pool); each costs one token, the last, which it runs
    to sample the first token."""

    parts: StepParts

    def __call__(self, tokens: int, prompt: int, kv_read: float, flops: float,
                 masked: float = 0.0) -> tuple[float, float, float]:
        return self.parts(tokens - prompt + (1 if prompt else 0), 0, kv_read, 0.0, 0.0)


@dataclass(frozen=True)
class Pools:
    """One disaggregated configuration ready to size: the prefill and decode engines (the
    same width and weights), the transfer of a request's cache, and the pools' floors."""

    plan: InferencePlan
    prefill: Engine
    decode: Engine
    transfer_s: float
    prefill_floor: int
    decode_floor: int

    @property
    def prepared(self) -> Prepared:
        """The fewest devices both pools need, as a floor (option_search.py's bound)."""
        return Prepared(self.plan, self.prefill, self.prefill_floor + self.decode_floor)


def prepare_pools(arch: Architecture, load: ServeLoad, cand: Candidate, weights: str,
                  runtime: str, deployment: InferencePlan, knobs: ReplicaOptions) -> Pools | str:
    """The two pools' engines from the aggregated replica's (serving_sim.py), or why there are
    none."""
    prep = prepare_serving(arch, load, cand, weights, runtime, deployment, knobs)
    if isinstance(prep, str):
        return prep
    assert cand.rates is not None
    prefill = prep.engine
    decode = replace(prefill, step_parts=DecodeOnly(prefill.step_parts),
                     limits=replace(prefill.limits, max_batched_tokens=ADMISSION_BUDGET))
    tp = prep.plan.tp
    cache = load.prompt_tokens * prep.plan.kv_bytes_per_position(arch) / tp  # each device's
    floor_p = replicas_floor(prefill, replace(load, output_tokens=1), cand)
    floor_d = replicas_floor(decode, load, cand)
    link, latency = ((cand.rates.interconnect_bytes_per_s, cand.rates.collective_latency_s)
                     if tp * (floor_p + floor_d) <= NODE_DEVICES and
                     cand.rates.interconnect_bytes_per_s else (NIC_BYTES_PER_S, NIC_LATENCY_S))
    return Pools(prep.plan, prefill, decode, latency + cache / link, floor_p, floor_d)


def shares(pools: Pools, load: ServeLoad) -> tuple[Slo, Slo] | str:
    """(the prefill pool's targets, the decode pool's). Of the time to first token left after
    the transfer, the decode pool has DECODE_SHARE (at least one target step) to take the
    request in and sample its first token, the prefill pool the rest. A string where the
    transfer leaves the prefill nothing."""
    tpot = None if load.tpot_ms is None else load.tpot_ms / 1e3
    if load.ttft_ms is None:
        return Slo(None, None), Slo(None, tpot)
    left = load.ttft_ms / 1e3 - pools.transfer_s
    step = tpot or no_load_latency(pools.decode, load.prompt_tokens, load.output_tokens)[1]
    admit = max(step, DECODE_SHARE * left)
    if left - admit <= 0:
        return (f"the cache's transfer ({pools.transfer_s * 1e3:.1f} ms) and a decode step leave "
                f"no time to first token for the prefill")
    return Slo(left - admit, None), Slo(admit, tpot)


def size_pools(arch: Architecture, load: ServeLoad, cand: Candidate,
               pools: Pools) -> Sizing | str:
    """Each pool's fewest replicas meeting its share of the targets at the load over the
    headroom asked for; then both at the load itself. A string says why there is none."""
    split = shares(pools, load)
    if isinstance(split, str):
        return split
    slo_p, slo_d = split
    need = load.arrivals_per_s / load.max_utilisation
    len_p = Lengths(load.prompt_tokens, 1)
    len_d = Lengths(load.prompt_tokens, load.output_tokens)
    key = runs_key(arch, cand, pools.plan, pools.prefill)
    try:
        n_p = fewest_replicas(pools.prefill, (*key, "prefill", len_p, slo_p), need, len_p,
                              slo_p, no_load_latency(pools.prefill, load.prompt_tokens, 1))
        n_d = fewest_replicas(pools.decode, (*key, "decode", len_d, slo_d), need, len_d, slo_d,
                              no_load_latency(pools.decode, load.prompt_tokens,
                                              load.output_tokens))
    except GpuwiseError as exc:
        return str(exc)
    misses = [] if n_p and n_d else ["no rate meets the targets"]
    n_p, n_d = n_p or pools.prefill_floor * 5, n_d or pools.decode_floor * 5
    at_p, at_d = at_load(pools, load, n_p, n_d)
    return _sizing(load, cand, pools, (n_p, n_d), (at_p, at_d), misses)


def at_load(pools: Pools, load: ServeLoad, n_p: int, n_d: int) -> tuple[ServeSummary,
                                                                         ServeSummary]:
    """Each pool at the load itself, each replica its share, in steady state."""
    split = shares(pools, load)
    slo_p, slo_d = split if not isinstance(split, str) else (Slo(None, None), Slo(None, None))
    rate = load.arrivals_per_s
    return (steady_run(pools.prefill, rate / n_p, Lengths(load.prompt_tokens, 1), slo_p),
            steady_run(pools.decode, rate / n_d,
                       Lengths(load.prompt_tokens, load.output_tokens), slo_d))


def _sizing(load: ServeLoad, cand: Candidate, pools: Pools, counts: tuple[int, int],
            runs: tuple[ServeSummary, ServeSummary], misses: list[str]) -> Sizing:
    (n_p, n_d), (at_p, at_d) = counts, runs
    tp = pools.plan.tp
    busy = (n_p * at_p.busy_fraction + n_d * at_d.busy_fraction) / (n_p + n_d)
    usage = Usage(tp * (n_p + n_d), busy * load.service_hours_per_month,
                  load.service_hours_per_month, load.tokens_per_month, load.requests_per_month)
    rec = joined(pools, at_p, at_d)
    ttft, attainment = rec.ttft_s.p90 or 0.0, rec.slo_met_fraction
    targets = {"ms/tok": (at_d.tpot_s.p90 or 0.0, load.tpot_ms), "TTFT": (ttft, load.ttft_ms)}
    misses = misses or [k for k, (v, t) in targets.items() if t and v * 1e3 > t]
    if not misses and (attainment < ATTAINMENT or rec.saturated):
        misses = ["the targets at the load"]
    meets = not misses
    ratio = max([0.0, *(v * 1e3 / t for v, t in targets.values() if t)])
    tpot = at_d.tpot_s.p50 or 0.0
    batch = max(1, round(at_d.output_tokens_per_s * tpot))
    name = f"{pools.plan.weights} ({pools.plan.runtime})"
    return Sizing(cand, name, tp, n_p + n_d, batch, usage, meets, tuple(misses), ratio,
                  ttft, at_d.tpot_s.p90, at_d.output_tokens_per_s * n_d / (n_p + n_d),
                  attainment=attainment, run_requests=(at_d.requests, at_d.warmup_requests),
                  prefill_replicas=n_p)


def joined(pools: Pools, prefill: ServeSummary, decode: ServeSummary) -> ServeSummary:
    """The two pools' runs as one request sees them: each percentile of the time to first
    token the prefill's, the transfer and the decode pool's first step added (as where the
    parts vary together: at most that where they do not); the rest the decode pool's, the
    share within the targets the lower pool's."""
    def added(a: Percentiles, b: Percentiles) -> Percentiles:
        parts = [(x + pools.transfer_s + y) if x is not None and y is not None else None
                 for x, y in zip(astuple(a), astuple(b), strict=True)]
        return Percentiles(*parts)

    return replace(decode, ttft_s=added(prefill.ttft_s, decode.ttft_s),
                   slo_met_fraction=min(prefill.slo_met_fraction, decode.slo_met_fraction),
                   saturated=prefill.saturated or decode.saturated)


def pools_knee(pools: Pools, load: ServeLoad, count: int) -> tuple[float, float] | None:
    """(output tokens a second a device, tokens a second a user) at the pools' knees: each
    pool at the highest rate meeting its share of the targets, the devices in the ratio of
    the two rates (as many prefill as decode replicas' worth of the load each needs). None
    where a pool meets no rate."""
    split = shares(pools, load)
    if isinstance(split, str):
        return None
    slo_p, slo_d = split
    rate_p = knee(pools.prefill, Lengths(load.prompt_tokens, 1), count, slo_p).max_rate_meeting_slo
    swept = knee(pools.decode, Lengths(load.prompt_tokens, load.output_tokens), count, slo_d)
    rate_d = swept.max_rate_meeting_slo
    at = [pt for pt in swept.curve if pt.rate == rate_d]
    if not rate_p or not rate_d or not at or not at[0].summary.tpot_s.p90:
        return None
    devices_per_request = pools.plan.tp * (1 / rate_p + 1 / rate_d)
    return load.output_tokens / devices_per_request, 1.0 / at[0].summary.tpot_s.p90
