"""Inference memory: weights, KV cache, prefill activations, logits and runtime overhead."""

from __future__ import annotations

from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.runtimes import runtime
from gpuwise.estimate.memory.activations import prefill_transient
from gpuwise.estimate.memory.breakdown import MemoryEstimate, make_estimate
from gpuwise.estimate.memory.cuda_rows import inference_gpu_rows
from gpuwise.estimate.memory.host_allocator import host_allocator_row
from gpuwise.estimate.memory.quant_workspace import fused_cache_positions, fused_qkv_copy_bytes
from gpuwise.estimate.memory.weights import weight_bytes
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan


def kv_cache_bytes(arch: Architecture, batch: int, tokens: int, kv_bytes: float) -> float:
    """A transformers DynamicCache holding `tokens` positions (sliding layers keep a window)."""
    per_token = arch.kv_cache_elements_per_token() * kv_bytes * batch
    full_layers = arch.num_layers - arch.sliding_layers
    window = min(tokens, arch.sliding_window or tokens)
    return per_token * (full_layers * tokens + arch.sliding_layers * window)


def _logits_bytes(arch: Architecture, plan: InferencePlan, compute: float) -> float:
    """generate() computes logits for the last position only and copies them to fp32."""
    positions = plan.prompt_tokens if plan.logits == "all" else 1
    return plan.batch * arch.vocab_size * (positions * compute + 2 * 4)


def transformers_memory(arch: Architecture, plan: InferencePlan, hw: Hardware, *,
                        held_slack: float | None = None,
                        without_slack: bool = False) -> MemoryEstimate:
    """Peak memory of `generate()` under Hugging Face transformers on `hw` (the serving
    runtimes' own rules: estimate/runtimes/). `held_slack`: the host allocator's slack from an
    earlier replay, held while a search narrows (fits.py). `without_slack`: the allocators'
    slack taken as none, no replay run: a lower bound of the total, which a search uses to
    rule a plan out before it replays it (fits.py)."""
    fmt = plan.weight_format
    compute = weight_format(fmt.compute_dtype).bytes_per_element
    kv_fmt = weight_format(plan.kv_dtype or fmt.compute_dtype)
    rt = runtime(hw.kind)
    weights = plan.stored_weights.total_bytes if plan.stored_weights else weight_bytes(arch, fmt)
    # The last generated token is never fed back, so the cache ends one short of the context.
    kv_end_tokens = plan.prompt_tokens + max(0, plan.new_tokens - 1)
    kv_prompt = kv_cache_bytes(arch, plan.batch, plan.prompt_tokens, kv_fmt.bytes_per_element)
    kv_end = kv_cache_bytes(arch, plan.batch, kv_end_tokens, kv_fmt.bytes_per_element)
    if plan.fuse_layers:  # AutoAWQ's fused cache: allocated whole at load, rolled when full
        window = fused_cache_positions(arch, plan)
        kv_prompt = kv_end = kv_cache_bytes(arch, plan.batch, window, kv_fmt.bytes_per_element)
    logits = _logits_bytes(arch, plan, compute)
    prefill = prefill_transient(arch, plan.batch, plan.prompt_tokens, compute, plan.attention)
    # Each decode step concatenates one layer's cache into a new tensor: briefly two copies.
    decode = kv_end / arch.num_layers if plan.new_tokens > 1 else 0.0
    phases = {"prefill": weights + kv_prompt + prefill + logits,
              "decode": weights + kv_end + decode + logits}
    load_copy = fused_qkv_copy_bytes(arch, plan) if plan.fuse_layers else 0.0
    if load_copy:
        phases["load"] = weights + kv_end + load_copy
    phase = max(phases, key=lambda k: phases[k])
    kv, acts = (kv_prompt, prefill) if phase == "prefill" else (kv_end, decode)
    if phase == "load":
        acts, logits = 0.0, 0.0
    dynamic = kv + acts + logits
    overhead = rt.baseline_bytes + rt.allocator_fraction * dynamic
    parts = {"weights": weights, "kv_cache": kv, "activations": acts, "logits": logits,
             "overhead": overhead}
    notes = [f"{arch.attention_kind} attention, KV cache in {kv_fmt.id}"]
    if plan.fuse_layers:
        notes.append(f"AutoAWQ fused layers: a KV cache of {window:,} positions allocated at "
                     f"load; fusing holds a second copy of q, k and v "
                     f"({load_copy / 2**30:.2f} GiB) until the last layer is fused")
    if phase == "load":
        parts["workspace"] = load_copy
    if fmt.quantised:
        notes.append(f"{fmt.id} applies to the attention and MLP matrices; embeddings, norms "
                     f"and the LM head stay in {fmt.compute_dtype}")
    if arch.sliding_layers and plan.context_tokens > (arch.sliding_window or 0):
        notes.append(f"{arch.sliding_layers} sliding-window layers keep {arch.sliding_window} "
                     "positions")
    if arch.max_position and plan.context_tokens > arch.max_position:
        notes.append(f"prompt + new tokens ({plan.context_tokens:,}) pass the model's "
                     f"{arch.max_position:,} positions: transformers fails or degrades past "
                     "them (GPT-2's learned positions stop a CUDA run on a device-side "
                     "assert); shorten the prompt or generate fewer tokens")
    held = 0.0 if without_slack else held_slack
    kept = host_allocator_row(arch, plan, hw, parts, notes, held)
    # CUDA allocator, context, ...
    kept += inference_gpu_rows(arch, plan, hw, parts, notes, in_forward=phase != "load",
                               replayed=not without_slack)
    total_phases = {k: v + overhead + kept for k, v in phases.items()}
    return make_estimate(parts, hw.memory_bytes, rt.name, phase, total_phases, tuple(notes),
                         host=hw.kind == "cpu")
