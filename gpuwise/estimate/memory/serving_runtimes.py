"""Memory under serving runtimes that allocate up front: llama.cpp and vLLM (SGLang's own
rules are in sglang_memory.py).

llama.cpp's rules (per backend: the CPU's resident set, or the device's buffers) are in
llama_cpp_memory.py; `estimate_llama_cpp` is re-exported here. vLLM takes
gpu_memory_utilization of the device, and whatever the weights, the profiled activation peak,
CUDA graphs and non-torch memory leave becomes a pool of 16-token KV blocks.
Sources and a check against a logged run: docs/checkpoints.md.
"""

from __future__ import annotations

import math
from dataclasses import replace

from gpuwise.catalog.cuda_allocator import cuda_allocator
from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.schedulers import SchedulerDefaults, scheduler_defaults
from gpuwise.catalog.serving_runtimes import vllm_runtime
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.memory.activations import prefill_transient
from gpuwise.estimate.memory.breakdown import MemoryEstimate, make_estimate
from gpuwise.estimate.memory.llama_cpp_memory import (
    estimate_llama_cpp as estimate_llama_cpp,
)
from gpuwise.estimate.memory.llama_cpp_memory import (
    llama_cpp_kv_cells as llama_cpp_kv_cells,
)
from gpuwise.estimate.memory.llama_cpp_memory import weights_and_embedding
from gpuwise.estimate.memory.weights import device_weight_bytes, expert_parallel_notes
from gpuwise.units import format_tokens
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan


def pooled_bytes_per_position(arch: Architecture, plan: InferencePlan,
                              windowed_share: float) -> float:
    """Bytes a position of a paged pool holds when its sliding-window and chunked layers keep
    `windowed_share` of a token for each full-attention layer's (vLLM's hybrid manager: 0, only
    their window; SGLang's hybrid SWA pool: swa_full_tokens_ratio). A model of windowed layers
    alone, or none, holds every layer's."""
    every = plan.kv_bytes_per_position(arch)
    windowed = arch.windowed_layers
    full = arch.num_layers - windowed
    if not windowed or not full:
        return every
    return every * (full + windowed_share * windowed) / arch.num_layers


def window_bytes(arch: Architecture, plan: InferencePlan) -> float:
    """What one sequence's windowed layers hold beyond the pooled positions: their window."""
    windowed = arch.windowed_layers
    if not windowed or windowed == arch.num_layers:
        return 0.0
    per_layer = plan.kv_bytes_per_position(arch) / arch.num_layers
    return per_layer * windowed * (arch.sliding_window or 0)


def _hybrid(arch: Architecture) -> str:
    """' (full-attention layers; ...)' where windowed layers keep only their window."""
    windowed = arch.windowed_layers
    if not windowed or windowed == arch.num_layers:
        return ""
    return (f" of its {arch.num_layers - windowed} full-attention layers (the other {windowed} "
            f"keep their last {arch.sliding_window:,} positions)")


def vllm_kv_bytes_per_token(arch: Architecture, plan: InferencePlan) -> float:
    """Bytes of keys and values a position holds in vLLM's pool (the full-attention layers'
    alone where the model also has windowed ones: the hybrid KV cache manager)."""
    return pooled_bytes_per_position(arch, plan, vllm_runtime().windowed_token_share)


def vllm_scheduler(hw: Hardware) -> SchedulerDefaults:
    """vLLM's scheduler defaults on `hw` (larger on H100-class devices): its profile run's
    sizes as well as its limits."""
    return scheduler_defaults("vllm").on(hw.memory_bytes, hw.id)


def vllm_pool(arch: Architecture, plan: InferencePlan, hw: Hardware, tp: int = 1,
              cudagraphs_in_budget: bool = True) -> tuple[int, float, float, float]:
    """vLLM's (budget, weights, profiled activation peak, KV pool) in bytes on one GPU of
    `tp` that split the weights (tensor parallel).

    The profile run (gpu_worker.determine_available_memory) runs a dummy batch of
    max_num_batched_tokens through the model and the sampler for max_num_seqs sequences;
    its torch peak is the activation figure. CUDA graphs are captured after the KV cache is
    allocated; since vLLM 0.21 their memory is estimated in the profiling
    (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, on by default, vllm-project/vllm PR #30515)
    and taken from the budget; before (`cudagraphs_in_budget=False`) they came out of the
    (1 - gpu_memory_utilization) left over."""
    if hw.kind == "cpu":
        raise GpuwiseError("the vLLM memory model is for GPUs",
                           "on a CPU use --runtime llama.cpp or transformers")
    rt = vllm_runtime()
    util = plan.gpu_memory_utilization or rt.gpu_memory_utilization
    budget = math.ceil(hw.memory_bytes * util)
    weights = device_weight_bytes(arch, plan, weights_and_embedding(arch, plan)[0], tp)
    compute = plan.compute_format.bytes_per_element
    sched = vllm_scheduler(hw)
    acts = prefill_transient(arch, 1, sched.max_batched_tokens, compute, "flash")
    # The dummy sampler run over max_num_seqs sequences (matches the logged 1.19-1.24 GiB
    # peak of Llama-3.1-8B on an H100, docs/checkpoints.md).
    acts += sched.max_seqs * arch.vocab_size * rt.sampler_bytes_per_logit
    graphs = rt.cuda_graph_bytes if cudagraphs_in_budget else 0
    fixed = weights + acts + graphs + rt.non_torch_bytes
    return budget, weights, acts, max(0.0, budget - fixed)


def estimate_vllm(arch: Architecture, plan: InferencePlan, hw: Hardware) -> MemoryEstimate:
    """vLLM's budget on one GPU (of the plan's `tp`): weights, profiled peak, graphs, and
    the KV pool they leave.

    The total is the whole budget (vLLM pre-allocates it) unless the plan needs more KV
    blocks than the pool holds; then the total grows past the budget and does not fit.
    """
    rt = vllm_runtime()
    tp = plan.tp  # each device holds 1/tp of the weights and of every block's heads
    budget, weights, acts, pool = vllm_pool(arch, plan, hw, tp)
    _, _, source = weights_and_embedding(arch, plan)
    util = plan.gpu_memory_utilization or rt.gpu_memory_utilization
    block_bytes = rt.block_size * vllm_kv_bytes_per_token(arch, plan) / tp
    blocks = int(pool // block_bytes)
    max_len = plan.context_alloc or arch.max_position or plan.context_tokens
    per_seq = math.ceil(plan.context_tokens / rt.block_size)
    seqs = vllm_scheduler(hw).max_seqs  # the most it runs at once, by device
    # each sequence's windowed layers keep their window beside (the hybrid KV cache manager)
    window = math.ceil(window_bytes(arch, plan) / tp / block_bytes)
    # Fitting means every sequence of the batch resident at once, as for the other runtimes.
    needed = max(math.ceil(max_len / rt.block_size) + window, plan.batch * (per_seq + window))
    kv = max(pool, needed * block_bytes)
    parts = {"weights": weights, "kv_cache": kv, "activations": acts,
             "cuda_graphs": float(rt.cuda_graph_bytes),
             "overhead": float(rt.non_torch_bytes + rt.cuda_context_bytes)}
    capacity = budget + rt.cuda_context_bytes
    notes = [f"weights {source}",
             f"gpu_memory_utilization {util:g}: budget {budget / 2**30:.2f} GiB of "
             f"{hw.memory_bytes / 2**30:.2f} GiB; the KV pool is what is left of it",
             f"KV pool {blocks:,} blocks of {rt.block_size} tokens = "
             f"{format_tokens(blocks * rt.block_size)} tokens{_hybrid(arch)}: room for "
             f"{blocks // per_seq if per_seq else 0:,} sequences of "
             f"{format_tokens(plan.context_tokens)} tokens (vLLM runs at most "
             f"{seqs} at once)", *expert_parallel_notes(arch, plan, tp)]
    longest = min(blocks * rt.block_size, arch.max_position or blocks * rt.block_size)
    if blocks * rt.block_size < max_len:
        whose = "--ctx" if plan.context_alloc else "its default, the model's"
        notes.append(f"vLLM refuses to start: max_model_len {max_len:,} ({whose}) needs "
                     f"more KV than the pool's {blocks * rt.block_size:,} tokens; "
                     + (f"--ctx {longest} starts it (as --max-model-len auto would)"
                        if longest else "no context fits"))
    else:
        notes.append(f"headroom: the KV pool beyond one max_model_len ({max_len:,}) sequence; "
                     "vLLM takes its whole budget up front")
    return up_front_estimate(parts, capacity, rt.name, notes, (plan.batch, seqs),
                             pool - needed * block_bytes, budget)


def up_front_estimate(parts: dict[str, float], capacity: int, runtime: str, notes: list[str],
                      batch_and_limit: tuple[int, int], spare: float,
                      budget: float) -> MemoryEstimate:
    """The estimate of a runtime that takes its budget up front (vLLM, SGLang): the headroom
    is inside its pool, `spare` (the pool beyond what the plan needs), "tight" below a share
    of the budget; a batch beyond the running limit is said to wait."""
    batch, limit = batch_and_limit
    if batch > limit:
        notes = [*notes, f"at most {limit} sequences run at once; the rest wait"]
    est = make_estimate(parts, capacity, runtime, "serving", {"serving": sum(parts.values())},
                        tuple(notes))
    return replace(est, spare_bytes=int(spare),
                   margin_bytes=int(cuda_allocator().tight_fraction * budget))
