"""SGLang's memory (docs/memory.md, "vLLM and SGLang"): a static share of the device,
mem_fraction_static, holds the weights and a token-granular KV pool; activations and CUDA
graphs live in the rest.

Where the user gives no --mem-fraction-static (gpuwise: --gpu-memory-utilization), SGLang
computes it from the device's memory and tensor-parallel size (server_args.py
ServerArgs._handle_gpu_memory_settings); the pool is what is free after the weights load less
(1 - mem_fraction_static) of what was free before they did (model_runner.py
profile_max_num_token). Constants: catalog/data/runtimes.toml and schedulers.toml [sglang].
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwise.catalog.cuda_allocator import cuda_allocator
from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.schedulers import MemoryTier, SchedulerDefaults, scheduler_defaults
from gpuwise.catalog.serving_runtimes import sglang_runtime
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.memory.breakdown import MemoryEstimate
from gpuwise.estimate.memory.llama_cpp_memory import weights_and_embedding
from gpuwise.estimate.memory.serving_runtimes import pooled_bytes_per_position, up_front_estimate
from gpuwise.estimate.memory.weights import device_weight_bytes, expert_parallel_notes
from gpuwise.units import format_tokens
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan

MIB = 2**20


def sglang_tier(hw: Hardware) -> MemoryTier:
    """SGLang's chunked prefill and CUDA graphs' batch on `hw`, by its memory."""
    tier = scheduler_defaults("sglang").tier(hw.memory_bytes)
    if tier is None:
        raise GpuwiseError("catalog/data/schedulers.toml [sglang] has no memory tier for "
                           f"{hw.name}", "its last tier must reach every device (below_gib = inf)")
    return tier


def reserved_mib(hw: Hardware, tp: int) -> float:
    """What SGLang keeps out of its static budget on one device of `tp` for activations and
    CUDA graphs, in MiB (server_args.py reserved_mem)."""
    rt, tier = sglang_runtime(), sglang_tier(hw)
    reserved = (rt.reserved_mib
                + max(tier.max_batched_tokens, rt.reserved_least_chunk_tokens)
                * rt.reserved_mib_per_chunk_token
                + tier.graph_batch(tp) * rt.reserved_mib_per_graph_batch
                + tp / 8 * rt.reserved_mib_per_8_devices)  # one pipeline stage
    if hw.memory_bytes > rt.reserved_floor_above_gib * 2**30:
        reserved = max(reserved, rt.reserved_floor_mib)
    return reserved


def mem_fraction_static(hw: Hardware, tp: int) -> float:
    """SGLang's default mem_fraction_static on one device of `tp` such as `hw`."""
    gpu_mem = hw.memory_bytes / MIB
    return round((gpu_mem - reserved_mib(hw, tp)) / gpu_mem, sglang_runtime().fraction_digits)


@dataclass(frozen=True)
class SglangBudget:
    """One device's memory under SGLang, in bytes."""

    fraction: float  # mem_fraction_static
    given: bool  # by the user (--gpu-memory-utilization), else SGLang's default
    context: int  # used before the weights load (the CUDA context)
    free: int  # free before the weights load: the device less the context
    budget: float  # mem_fraction_static of `free`
    weights: float
    pool: float  # the KV pool: the budget less the weights

    @property
    def reserve(self) -> float:
        """What the budget leaves of the free memory: activations and CUDA graphs."""
        return self.free - self.budget


def sglang_budget(arch: Architecture, plan: InferencePlan, hw: Hardware,
                  tp: int = 1) -> SglangBudget:
    """SGLang's static budget, weights and KV pool on one device of `tp`."""
    if hw.kind == "cpu":
        raise GpuwiseError("the SGLang memory model is for GPUs",
                           "on a CPU use --runtime llama.cpp or transformers")
    given = plan.gpu_memory_utilization
    fraction = given or mem_fraction_static(hw, tp)
    context = cuda_allocator().cuda_context_bytes
    free = hw.memory_bytes - context
    weights = device_weight_bytes(arch, plan, weights_and_embedding(arch, plan)[0], tp)
    return SglangBudget(fraction, given is not None, context, free, fraction * free, weights,
                        max(0.0, fraction * free - weights))


def _cell(arch: Architecture, plan: InferencePlan) -> float:
    """Bytes a token holds in SGLang's pool: its windowed layers' in the hybrid SWA pool of
    swa_full_tokens_ratio times the full layers' tokens."""
    return pooled_bytes_per_position(arch, plan, sglang_runtime().windowed_token_share)


def sglang_cache_tokens(arch: Architecture, plan: InferencePlan, hw: Hardware, tp: int) -> int:
    """max_total_num_tokens: the tokens the pool of one device of `tp` holds (each device
    holds 1/tp of every token's heads)."""
    cell = _cell(arch, plan) / tp
    return int(sglang_budget(arch, plan, hw, tp).pool // cell)


def _context(arch: Architecture, plan: InferencePlan) -> int:
    """SGLang's context_len: --context-length (gpuwise --ctx), else the model's."""
    return plan.context_alloc or arch.max_position or plan.context_tokens


def sglang_scheduler(arch: Architecture, plan: InferencePlan, hw: Hardware,
                     tp: int) -> SchedulerDefaults:
    """SGLang's scheduler on `hw`: its chunked prefill by the device's memory and its
    max_running_requests by the pool and the context."""
    sched = scheduler_defaults("sglang").on(hw.memory_bytes, hw.id)
    return sched.with_cache(sglang_cache_tokens(arch, plan, hw, tp), _context(arch, plan))


def _fraction_note(b: SglangBudget, hw: Hardware, tp: int) -> str:
    if b.given:
        whence = "from --gpu-memory-utilization (SGLang's --mem-fraction-static)"
    else:
        tier = sglang_tier(hw)
        whence = (f"SGLang's default on a {hw.memory_bytes / MIB:,.0f} MiB device at tp {tp} "
                  f"(server_args.py: {reserved_mib(hw, tp):,.0f} MiB kept for activations and "
                  f"CUDA graphs at chunked_prefill_size {tier.max_batched_tokens}, "
                  f"cuda_graph_max_bs {tier.graph_batch(tp)})")
    return (f"mem_fraction_static {b.fraction:g}, {whence}: weights and KV pool "
            f"{b.budget / 2**30:.2f} GiB of the {b.free / 2**30:.2f} GiB free after the CUDA "
            "context; activations and CUDA graphs in the rest")


def estimate_sglang(arch: Architecture, plan: InferencePlan, hw: Hardware) -> MemoryEstimate:
    """SGLang on one GPU (of the plan's `tp`): the CUDA context, the weights, the KV pool they
    leave of the static budget, and the reserve outside it for activations and CUDA graphs.

    The total is the whole device (SGLang takes the pool up front) unless the plan needs more
    KV than the pool holds; then it grows past the device and does not fit."""
    tp = plan.tp
    b = sglang_budget(arch, plan, hw, tp)
    cell = _cell(arch, plan) / tp
    tokens = int(b.pool // cell)
    context = _context(arch, plan)
    seqs = sglang_scheduler(arch, plan, hw, tp).max_seqs
    # Fitting means every sequence of the batch resident at once, and one of the whole context
    needed = max(context, plan.batch * plan.context_tokens)
    graphs = min(b.reserve, sglang_tier(hw).graph_batch(tp)
                 * sglang_runtime().reserved_mib_per_graph_batch * MIB)
    parts = {"weights": b.weights, "kv_cache": max(b.pool, needed * cell),
             "activations": b.reserve - graphs, "cuda_graphs": graphs,
             "overhead": float(b.context)}
    _, _, source = weights_and_embedding(arch, plan)
    per_seq = plan.context_tokens
    notes = [f"weights {source}", _fraction_note(b, hw, tp),
             f"KV pool {format_tokens(tokens)} tokens (max_total_num_tokens): room for "
             f"{tokens // per_seq:,} sequences of {format_tokens(per_seq)} tokens (SGLang runs at "
             f"most {seqs} at once: max_running_requests)", *expert_parallel_notes(arch, plan, tp)]
    if tokens <= 0:
        notes.append("SGLang refuses to start: the weights leave no KV pool in the budget "
                     "('Not enough memory. Please try to increase --mem-fraction-static.')")
    elif tokens < context:
        longest = min(tokens, arch.max_position or tokens)
        whose = "--ctx" if plan.context_alloc else "its default, the model's"
        notes.append(f"a request of the whole context_length {context:,} ({whose}) does not fit "
                     f"the pool's {tokens:,} tokens: SGLang starts, but caps a request's input "
                     f"at {tokens - 1:,} tokens; --ctx {longest} (its --context-length) holds a "
                     "whole one")
    else:
        notes.append(f"headroom: the KV pool beyond one context_length ({context:,}) sequence; "
                     "SGLang takes mem_fraction_static up front")
    return up_front_estimate(parts, hw.memory_bytes, sglang_runtime().name, notes,
                             (plan.batch, seqs), b.pool - needed * cell, b.budget)

