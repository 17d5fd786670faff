"""One serving replica as the simulation sees it (docs/serve.md, "Schedulers"): the runtime's
scheduler limits, the KV cache its memory leaves, and its step time."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.hardware import Hardware
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.runtimes import runtime_unit
from gpuwise.estimate.serve.pipeline import StagedStep, in_flight_seqs
from gpuwise.estimate.serve.schedulers import Limits
from gpuwise.estimate.serve.simulate import Engine
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.ggml_time import chunk_pairs, tiled_attention
from gpuwise.estimate.speed.step import decode_context
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan


@dataclass(frozen=True)
class ReplicaOptions:
    """What the user may set of the runtime's scheduler (None: its default)."""

    tp: int = 1
    max_seqs: int | None = None  # vLLM max_num_seqs, llama.cpp --parallel, a static batch
    max_batched_tokens: int | None = None  # vLLM max_num_batched_tokens, llama.cpp n_batch
    shared_prefix: int = 0  # prompt tokens every request begins with (a system prompt)
    prefix_cache: bool | None = None  # None: the runtime's default
    # the next step picked while the current one runs (SGLang's overlap scheduler; off:
    # --disable-overlap-schedule, or SGLang before v0.4); None: the runtime's default
    overlap: bool | None = None
    pp: int = 1  # pipeline stages, each of `tp` devices (the engine is one in-flight batch's)


def build_engine(arch: Architecture, plan: InferencePlan, hw: Hardware, rates: DeviceRates,
                 opts: ReplicaOptions, host: DeviceRates | None = None) -> Engine:
    """The replica's engine; its steps timed by the plan's one step model (infer's), the
    layers llama.cpp keeps off the GPU (`plan.gpu_layers`) on `host`. With `opts.pp` stages,
    the engine of one of the pp batches in flight (pipeline.py)."""
    unit = runtime_unit(plan.runtime)
    width = opts.tp * opts.pp  # the devices that hold the weights and the KV cache
    # the replica's devices: its memory and steps are theirs; the context (llama.cpp: and
    # layers) the runtime picks where the plan leaves it
    plan = unit.as_run(arch, replace(plan, tp=width), hw)
    sched = unit.scheduler_for(arch, plan, hw)
    limits = Limits(opts.max_batched_tokens or sched.max_batched_tokens,
                    in_flight_seqs(opts.max_seqs or sched.max_seqs, opts.pp),
                    sched.reserve_output,
                    sched.overlap if opts.overlap is None else opts.overlap)
    positions = unit.kv_positions(arch, plan, hw, width, limits.max_seqs * opts.pp) // opts.pp
    if positions <= 0:
        raise GpuwiseError(f"the weights leave no memory for a KV cache on {width} x {hw.name}",
                           "more devices (--tp), lower-precision weights or a smaller model")
    block = sched.block_tokens
    plan = replace(plan, tp=opts.tp)  # a step runs on one stage's devices
    step = unit.step(arch, plan, rates, opts.tp, host)
    parts = step.parts if opts.pp == 1 else StagedStep(
        step.parts, arch, rates, weight_format(plan.weight_format.compute_dtype).bytes_per_element,
        opts.pp)
    pair_flops = 4.0 * arch.num_layers * arch.q_dim  # QK^T and PV, a multiply-add each
    max_len = min(x for x in (plan.context_alloc, arch.max_position, 1 << 40) if x)
    return Engine(sched.policy, limits, positions // block, block,
                  parts, pair_flops, max_len, sched.token_host_s, sched.request_host_s,
                  opts.shared_prefix,
                  sched.prefix_cache if opts.prefix_cache is None else opts.prefix_cache,
                  sched.shared_cells,
                  sched.shared_cells and tiled_attention(rates.kind, plan))


def no_load_latency(engine: Engine, prompt: int, output: int) -> tuple[float, float]:
    """(TTFT, TPOT) of one request alone: its prompt in chunks, then one token a step."""
    budget, done, ttft = engine.limits.max_batched_tokens, 0, 0.0
    while done < prompt:
        n = min(budget, prompt - done)
        pairs = chunk_pairs(n, done) if engine.tiled_attention else n * (done + n / 2)
        ttft += engine.step_seconds(n, n, done + n, pairs * engine.attention_flops_per_pair)
        done += n
    tpot = no_load_step(engine, prompt, output) + engine.token_host_s if output > 1 else 0.0
    return ttft + engine.request_host_s + engine.token_host_s, tpot


@dataclass(frozen=True)
class NoLoad:
    """One request alone: its time to first token and per output token, the latter the
    decode step (infer's decode, to the bit) plus the server's host work a streamed token."""

    ttft_s: float
    tpot_s: float
    decode_step_s: float
    token_host_s: float


def no_load(engine: Engine, prompt: int, output: int) -> NoLoad:
    ttft, tpot = no_load_latency(engine, prompt, output)
    return NoLoad(ttft, tpot, no_load_step(engine, prompt, output), engine.token_host_s)


def no_load_step(engine: Engine, prompt: int, output: int) -> float:
    """A decode step of one request alone at its mean context: `infer`'s decode time for the
    same plan, to the bit (the same step model, asked the same step)."""
    return engine.step_seconds(1, 0, decode_context(prompt, output), 0.0)


def rate_ceiling(engine: Engine, prompt: int, output: int, cache_bound: bool = False) -> float:
    """Requests a second the replica cannot exceed: at its fullest batch, each request costs
    its prompt and its share of the decode steps. `cache_bound`: the batch no larger than the
    KV pool holds sequences of the prompt's length (the least each holds once admitted) -
    a tighter ceiling where the pool, not the scheduler, bounds the batch."""
    seqs = max(1, engine.limits.max_seqs)
    if cache_bound:
        seqs = max(1, min(seqs, engine.kv_blocks * engine.block_tokens // (prompt + 1)))
    mid = prompt + output / 2
    decode = engine.step_seconds(seqs, 0, seqs * mid, 0.0) / seqs
    prefill = engine.step_seconds(prompt, prompt, prompt, prompt * prompt / 2 *
                                  engine.attention_flops_per_pair)
    return 1.0 / max(1e-12, prefill + output * decode) if math.isfinite(decode) else 0.0
