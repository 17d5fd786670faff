"""Memory under serving runtimes that allocate up front: llama.cpp and vLLM.

llama.cpp creates its KV cache for n_ctx cells (padded to 256) and reserves a compute buffer
for a worst-case micro-batch when the context is created; nothing grows during generation.
vLLM takes gpu_memory_utilization of the device, and whatever the weights, the profiled
activation peak, CUDA graphs and non-torch memory leave becomes a pool of 16-token KV blocks.
Sources and a check against a logged run: docs/checkpoints.md.
"""

from __future__ import annotations

import math

from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.serving_runtimes import llama_cpp_runtime, vllm_runtime
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.memory.activations import prefill_transient
from gpuwise.estimate.memory.breakdown import MemoryEstimate, make_estimate
from gpuwise.estimate.memory.weights import weight_bytes
from gpuwise.units import format_tokens
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan


def _weights(arch: Architecture, plan: InferencePlan) -> tuple[float, float, str]:
    """(all weight bytes, the input embedding's share, where the figure comes from)."""
    if plan.stored_weights:
        sw = plan.stored_weights
        return sw.total_bytes, sw.embedding_bytes, "checkpoint (exact bytes)"
    fmt = weight_format(plan.weights)
    embedding = (
        arch.vocab_size * arch.hidden_size * weight_format(fmt.compute_dtype).bytes_per_element
    )
    return weight_bytes(arch, fmt), embedding, f"estimated ({fmt.id})"


def _padded(n: int, pad: int) -> int:
    return -(-n // pad) * pad


def _llama_kv_bytes_per_element(name: str | None) -> tuple[float, str]:
    rt = llama_cpp_runtime()
    key = (name or rt.kv_type).lower()
    key = {"fp16": "f16", "fp32": "f32", "float16": "f16", "float32": "f32"}.get(key, key)
    if key not in rt.kv_type_bytes:
        raise GpuwiseError(f"llama.cpp has no KV cache type {name!r}",
                           f"choose one of: {', '.join(rt.kv_type_bytes)}")  # fmt: skip
    return rt.kv_type_bytes[key], key


def llama_cpp_kv_cells(arch: Architecture, plan: InferencePlan) -> int:
    """n_ctx as llama.cpp allocates it: the asked or trained context, at least every
    sequence's tokens (one shared cache holds them all), padded to 256."""
    rt = llama_cpp_runtime()
    asked = plan.context_alloc or arch.max_position or plan.context_tokens
    return _padded(max(asked, plan.batch * plan.context_tokens), rt.ctx_pad)


def _offloaded_share(arch: Architecture, plan: InferencePlan, hw: Hardware) -> float:
    """The share of the layers on the device (llama.cpp -ngl; all of them by default)."""
    if hw.kind == "cpu" or plan.gpu_layers is None:
        return 1.0
    return min(plan.gpu_layers, arch.num_layers) / arch.num_layers


def estimate_llama_cpp(arch: Architecture, plan: InferencePlan, hw: Hardware) -> MemoryEstimate:
    """Memory of llama.cpp with every layer offloaded to `hw` (or all in RAM on a CPU)."""
    rt = llama_cpp_runtime()
    kv_el, kv_name = _llama_kv_bytes_per_element(plan.kv_dtype)
    n_ctx = llama_cpp_kv_cells(arch, plan)
    full = arch.num_layers - arch.sliding_layers
    swa_cells = min(n_ctx, _padded((arch.sliding_window or 0) + rt.n_ubatch, rt.ctx_pad))
    kv = (
        arch.kv_cache_elements_per_token()
        * kv_el
        * (full * n_ctx + arch.sliding_layers * swa_cells)
    )
    weights, embedding, source = _weights(arch, plan)
    on_gpu = hw.kind != "cpu"
    if on_gpu and not arch.tie_embeddings:
        weights -= embedding  # token_embd stays in host memory (llama.cpp's input layer)
    share = _offloaded_share(arch, plan, hw)
    kv *= share  # each layer's cache lives with the layer
    on_host = weights * (1 - share)
    weights -= on_host
    flash = rt.flash_attention and plan.attention != "eager"
    ub = min(n_ctx, rt.n_ubatch)
    stream = 4 * arch.hidden_size * ub * 4  # f32 hidden states alive around each op
    if flash:
        attention = n_ctx * ub * 2 + stream  # f16 mask; scores never materialised
    else:
        attention = n_ctx * ub * arch.num_heads * 4 + n_ctx * ub * 4 + stream  # f32 KQ + mask
    ffn = 2 * (arch.moe.expert_intermediate if arch.moe else arch.intermediate_size) * ub * 4
    output = arch.vocab_size * ub * 4 + arch.hidden_size * ub * 4  # logits of the micro-batch
    compute = max(attention, ffn + stream, output)
    overhead = rt.baseline_bytes_cuda if on_gpu else rt.baseline_bytes_cpu
    # The output buffer (fp32 logits of one position per sequence) is pinned host memory
    # when offloaded, so it counts only where everything lives in RAM.
    logits = 0.0 if on_gpu else arch.vocab_size * 4 * plan.batch
    parts = {"weights": weights, "kv_cache": kv, "activations": compute, "logits": logits,
             "overhead": overhead}  # fmt: skip
    notes = [f"weights {source}",
             f"KV cache {kv_name} for n_ctx {n_ctx:,} (allocated up front, padded to "
             f"{rt.ctx_pad}; --ctx sets it)",
             f"compute buffer for a {ub}-token micro-batch, flash attention "
             f"{'on' if flash else 'off'}"]  # fmt: skip
    if on_gpu and not arch.tie_embeddings:
        notes.append(f"token embeddings ({embedding / 2**20:,.0f} MiB) stay in host memory")
    if share < 1:
        notes.append(f"--gpu-layers {plan.gpu_layers}: {arch.num_layers - (plan.gpu_layers or 0)} "
                     f"of {arch.num_layers} layers, {on_host / 2**30:,.2f} GiB of weights and "
                     "their KV cache, stay in host memory")  # fmt: skip
    if plan.batch > 1:
        notes.append(f"{plan.batch} sequences share the one cache (llama-server -np "
                     f"{plan.batch} -c {n_ctx})")  # fmt: skip
    total = sum(parts.values())
    return make_estimate(parts, hw.memory_bytes, rt.name, "load", {"load": total}, tuple(notes))


def vllm_kv_bytes_per_token(arch: Architecture, plan: InferencePlan) -> float:
    fmt = weight_format(plan.weights)
    kv = weight_format(plan.kv_dtype or fmt.compute_dtype).bytes_per_element
    return arch.num_layers * arch.kv_cache_elements_per_token() * kv


def vllm_pool(arch: Architecture, plan: InferencePlan, hw: Hardware,
              tp: int = 1) -> tuple[int, float, float, float]:  # fmt: skip
    """vLLM's (budget, weights, profiled activation peak, KV pool) in bytes on one GPU of
    `tp` that split the weights (tensor parallel)."""
    if hw.kind == "cpu":
        raise GpuwiseError("the vLLM memory model is for GPUs",
                           "on a CPU use --runtime llama.cpp or transformers")  # fmt: skip
    rt = vllm_runtime()
    util = plan.gpu_memory_utilization or rt.gpu_memory_utilization
    budget = math.ceil(hw.memory_bytes * util)
    weights, _, _ = _weights(arch, plan)
    weights /= tp
    compute = weight_format(weight_format(plan.weights).compute_dtype).bytes_per_element
    acts = prefill_transient(arch, 1, rt.max_num_batched_tokens, compute, "flash")
    # The dummy sampler run: logits for max_num_seqs sequences, upcast to fp32, with fp32
    # probabilities and log-probabilities beside them (matches the logged 1.19-1.24 GiB peak
    # of Llama-3.1-8B at 8192 batched tokens, docs/checkpoints.md).
    acts += rt.max_num_seqs * arch.vocab_size * (compute + 3 * 4)
    fixed = weights + acts + rt.cuda_graph_bytes + rt.non_torch_bytes
    return budget, weights, acts, max(0.0, budget - fixed)


def estimate_vllm(arch: Architecture, plan: InferencePlan, hw: Hardware) -> MemoryEstimate:
    """vLLM's budget on one GPU: weights, profiled peak, graphs, and the KV pool they leave.

    The total is the whole budget (vLLM pre-allocates it) unless the plan needs more KV
    blocks than the pool holds; then the total grows past the budget and does not fit.
    """
    rt = vllm_runtime()
    budget, weights, acts, pool = vllm_pool(arch, plan, hw)
    _, _, source = _weights(arch, plan)
    util = plan.gpu_memory_utilization or rt.gpu_memory_utilization
    block_bytes = rt.block_size * vllm_kv_bytes_per_token(arch, plan)
    blocks = int(pool // block_bytes)
    max_len = plan.context_alloc or arch.max_position or plan.context_tokens
    per_seq = math.ceil(plan.context_tokens / rt.block_size)
    # Fitting means every sequence of the batch resident at once, as for the other runtimes.
    needed = max(math.ceil(max_len / rt.block_size), plan.batch * per_seq)
    kv = max(pool, needed * block_bytes)
    parts = {"weights": weights, "kv_cache": kv, "activations": acts,
             "cuda_graphs": float(rt.cuda_graph_bytes),
             "overhead": float(rt.non_torch_bytes + rt.cuda_context_bytes)}  # fmt: skip
    capacity = budget + rt.cuda_context_bytes
    notes = [f"weights {source}",
             f"gpu_memory_utilization {util:g}: budget {budget / 2**30:.2f} GiB of "
             f"{hw.memory_bytes / 2**30:.2f} GiB; the KV pool is what is left of it",
             f"KV pool {blocks:,} blocks of {rt.block_size} tokens = "
             f"{format_tokens(blocks * rt.block_size)} tokens: room for "
             f"{blocks // per_seq if per_seq else 0:,} sequences of "
             f"{format_tokens(plan.context_tokens)} tokens (vLLM runs at most "
             f"{rt.max_num_seqs} at once)"]  # fmt: skip
    if blocks * rt.block_size < max_len:
        notes.append(f"vLLM refuses to start: max_model_len {format_tokens(max_len)} needs more "
                     f"KV than the pool holds (pass --ctx to lower it)")  # fmt: skip
    if plan.batch > rt.max_num_seqs:
        notes.append(f"at most {rt.max_num_seqs} sequences run at once; the rest wait")
    total = sum(parts.values())
    return make_estimate(parts, capacity, rt.name, "serving", {"serving": total}, tuple(notes))
