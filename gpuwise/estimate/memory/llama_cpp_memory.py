"""llama.cpp's memory by backend, from its source (llama-cpp-python 0.3.36's llama.cpp).

Everything is allocated when the model is loaded and the context created; nothing grows while
generating. On a CPU what the process holds is its resident set, and llama.cpp's rules are:

- weights: the GGUF is mapped with MAP_POPULATE (src/llama-mmap.cpp, `prefetch` with no lazy
  tensors), so every tensor page is resident once loaded; after loading, the file before the
  first and after the last tensor that stays mapped is unmapped
  (`llama_model_loader::load_all_data`): a repacked tensor at either end leaves;
- repacked weights: matrices of the types the CPU's SIMD path repacks (llama_cpp_repack.py)
  are copied into an anonymous extra buffer (`CPU_REPACK`, `AMX`) while their mapped pages
  stay resident: these bytes count twice;
- KV cache: n_ctx cells, cleared (`ggml_backend_buffer_clear`) so all resident;
- compute buffer: reserved for a worst-case graph (llama_cpp_graph.py), but a posix_memalign'd
  block is resident only where written: the pages the run's micro-batches write at the
  reserved offsets, plus the CPU backend's work buffer (the largest activation converted to
  the weights' dot-product type);
- output buffer: n_vocab floats per sequence, cleared;
- runtime state: the vocabulary's tables, the graph metadata, and (measured) the code and
  small state llama.cpp pages in; with llama-cpp-python's `Llama`, its batch and token arrays.

On a GPU with every layer offloaded the device holds the weights (less the input embedding,
kept on the host), the KV cache and the whole reserved compute buffer (cudaMalloc'd).
"""

from __future__ import annotations

from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.serving_runtimes import LlamaCppRuntime, llama_cpp_runtime
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.memory.breakdown import MemoryEstimate, make_estimate
from gpuwise.estimate.memory.llama_cpp_experts import cpu_moe_layers, expert_layer_bytes
from gpuwise.estimate.memory.llama_cpp_graph import GraphDims, compute_buffer
from gpuwise.estimate.memory.llama_cpp_repack import cpu_features, weight_copies
from gpuwise.estimate.memory.weights import weight_bytes
from gpuwise.workload import Architecture
from gpuwise.workload.plans import InferencePlan

MIB = 1 << 20


def _padded(n: int, pad: int) -> int:
    return -(-n // pad) * pad


def weights_and_embedding(arch: Architecture, plan: InferencePlan) -> tuple[float, float, str]:
    """(all weight bytes, the input embedding's share, where the figure comes from)."""
    if plan.stored_weights:
        sw = plan.stored_weights
        return sw.total_bytes, sw.embedding_bytes, "checkpoint (exact bytes)"
    fmt = plan.weight_format
    # token_embd in its GGUF type (Q4_K in a Q4_K_M file), else in the compute dtype
    per = fmt.embd_bits / 8 if fmt.gguf else weight_format(fmt.compute_dtype).bytes_per_element
    embedding = arch.vocab_size * arch.hidden_size * per
    return weight_bytes(arch, fmt), embedding, f"estimated ({fmt.id})"


# --- KV cache, micro-batches and the compute buffer ---------------------------------------


def _kv_bytes_per_element(name: str | None) -> tuple[float, str]:
    rt = llama_cpp_runtime()
    key = (name or rt.kv_type).lower()
    key = {"fp16": "f16", "fp32": "f32", "float16": "f16", "float32": "f32"}.get(key, key)
    if key not in rt.kv_type_bytes:
        raise GpuwiseError(f"llama.cpp has no KV cache type {name!r}",
                           f"choose one of: {', '.join(rt.kv_type_bytes)}")
    return rt.kv_type_bytes[key], key


def llama_cpp_kv_cells(arch: Architecture, plan: InferencePlan) -> int:
    """n_ctx as llama.cpp allocates it: the asked or trained context, at least every
    sequence's tokens (one shared cache holds them all), padded to 256."""
    rt = llama_cpp_runtime()
    asked = plan.context_alloc or arch.max_position or plan.context_tokens
    return _padded(max(asked, plan.batch * plan.context_tokens), rt.ctx_pad)


def _swa_cells(arch: Architecture, n_ctx: int) -> int:
    rt = llama_cpp_runtime()
    if not arch.sliding_layers:
        return 0
    return min(n_ctx, _padded((arch.sliding_window or 0) + rt.n_ubatch, rt.ctx_pad))


def graph_dims(arch: Architecture) -> GraphDims:
    """The sizes llama.cpp's graph of this model depends on (MoE: the routed width)."""
    ffn = arch.intermediate_size
    if arch.moe:
        ffn = arch.moe.expert_intermediate * arch.moe.experts_per_token
    return GraphDims(arch.hidden_size, arch.num_layers, arch.num_heads, arch.num_kv_heads,
                     arch.head_dim, ffn, arch.vocab_size, arch.gated_mlp, arch.qkv_bias,
                     arch.norm == "layer", arch.model_type.startswith("gemma"),
                     arch.sliding_layers)


def micro_batches(plan: InferencePlan, n_ctx: int) -> tuple[tuple[int, int, int], ...]:
    """(tokens, cache cells in view, outputs) of each graph the plan runs: the prompts in
    micro-batches of n_ubatch (one output each), then one token a step. The cells in view are
    those used so far padded to 256 (`llama_kv_cache::get_n_kv`)."""
    rt = llama_cpp_runtime()
    seqs = plan.batch
    prompt = seqs * plan.prompt_tokens
    runs: set[tuple[int, int, int]] = set()
    full, last = divmod(prompt, rt.n_ubatch)
    if full:  # the last full micro-batch sees the most cells of the full ones
        runs.add((rt.n_ubatch, min(n_ctx, max(256, _padded(full * rt.n_ubatch, 256))), 1))
    if last:
        runs.add((last, min(n_ctx, max(256, _padded(prompt, 256))), 1))
    if plan.new_tokens > 1:
        used = prompt + seqs * (plan.new_tokens - 1)
        runs.add((seqs, min(n_ctx, max(256, _padded(used, 256))), seqs))
    # Every tensor grows with tokens, cells and outputs and keeps its reserved offset, so a
    # run no larger than another in all three writes no page the other does not.
    kept = {r for r in runs
            if not any(o != r and all(a >= b for a, b in zip(o, r, strict=True)) for o in runs)}
    return tuple(sorted(kept))


def work_bytes(arch: Architecture, plan: InferencePlan, runs: tuple[tuple[int, int, int], ...],
               flash: bool, kv_el: float) -> float:
    """The CPU backend's work buffer as written (ggml_graph_plan / ggml_compute_forward_mul_mat):
    each matmul converts its activations to the weights' dot-product type before it runs, so
    what is written is the largest conversion: the prompt's MLP input (ffn wide), or without
    flash attention the softmaxed scores the f16 V cache multiplies (n_kv x tokens x heads)."""
    rt = llama_cpp_runtime()
    main = (plan.stored_weights.ggml_type if plan.stored_weights and
            plan.stored_weights.ggml_type else "")
    mix = rt.ftype_mix.get(plan.weight_format.id)
    key = (main or (mix[0] if mix else "f16")).lower()
    per = rt.vec_dot_bytes.get(key, 2.0)
    width = max(arch.hidden_size, graph_dims(arch).ffn)
    out = 0.0
    for tokens, n_kv, _ in runs:
        out = max(out, tokens * width * per)
        if not flash and kv_el == 2.0:
            out = max(out, n_kv * tokens * arch.num_heads * 2.0)
    return out


def _graph_nodes(arch: Architecture) -> int:
    """llama_context::graph_max_nodes: max(1024, 8 x the model's tensors)."""
    rt = llama_cpp_runtime()
    per_layer = 9 + (3 if arch.qkv_bias else 0)
    tensors = arch.num_layers * per_layer + 3
    return max(rt.graph_min_nodes, rt.graph_nodes_per_tensor * tensors)


def runtime_state(arch: Architecture, n_ctx: int, rt: LlamaCppRuntime) -> dict[str, float]:
    """Host state beyond the buffers, by source: the vocabulary's tables (llama-vocab.cpp),
    the graph metadata (two llm_graph_result of graph_max_nodes), llama-cpp-python's batch
    (a seq_id array of n_ctx ids for each of n_batch tokens) and token arrays, and the code
    and small state the run pages in (measured)."""
    batch = min(n_ctx, rt.python_n_batch)
    return {
        "vocabulary": arch.vocab_size * rt.vocab_bytes_per_token,
        "graph metadata": rt.graph_meta_copies * rt.graph_meta_bytes_per_node * _graph_nodes(arch),
        "llama-cpp-python": batch * min(4 * n_ctx, rt.page_bytes)
        + arch.vocab_size * rt.python_bytes_per_token,
        "code and fixed state": float(rt.cpu_fixed_bytes),
    }


# --- The estimate ---------------------------------------------------------------------------


def _offloaded_share(arch: Architecture, plan: InferencePlan, hw: Hardware) -> float:
    """The share of the layers on the device (llama.cpp -ngl; all of them by default)."""
    if hw.kind == "cpu" or plan.gpu_layers is None:
        return 1.0
    return min(plan.gpu_layers, arch.num_layers) / arch.num_layers


def estimate_llama_cpp(arch: Architecture, plan: InferencePlan, hw: Hardware) -> MemoryEstimate:
    """Memory of llama.cpp with every layer offloaded to `hw`, or the resident set of a
    CPU-only process at its peak."""
    rt = llama_cpp_runtime()
    kv_el, kv_name = _kv_bytes_per_element(plan.kv_dtype)
    n_ctx = llama_cpp_kv_cells(arch, plan)
    swa_cells = _swa_cells(arch, n_ctx)
    full = arch.num_layers - arch.sliding_layers
    kv = arch.kv_cache_elements_per_token() * kv_el * (full * n_ctx + arch.sliding_layers * swa_cells)
    weights, embedding, source = weights_and_embedding(arch, plan)
    flash = rt.flash_attention and plan.attention != "eager"
    on_gpu = hw.kind != "cpu"
    runs = () if on_gpu else micro_batches(plan, n_ctx)
    reserved, touched = compute_buffer(graph_dims(arch), n_ctx, rt.n_ubatch, flash, runs,
                                       swa_cells, rt.legacy_graph,
                                       rt.gpu_alignment if on_gpu else rt.cpu_alignment)
    notes = [f"weights {source}",
             f"KV cache {kv_name} for n_ctx {n_ctx:,} (allocated up front, padded to "
             f"{rt.ctx_pad}; --ctx sets it)"]
    if on_gpu:
        parts, more = _gpu_parts(arch, plan, hw, weights, embedding, kv, reserved)
        notes += [f"compute buffer reserved for a {min(n_ctx, rt.n_ubatch)}-token micro-batch "
                  f"over the whole cache, flash attention {'on' if flash else 'off'}", *more]
        phases = {"load": sum(parts.values())}
    else:
        parts, phases, more = _cpu_parts(arch, plan, hw, weights, kv,
                                         (reserved, touched, runs, flash, kv_el, n_ctx))
        notes += more
    if plan.batch > 1:
        notes.append(f"{plan.batch} sequences share the one cache (llama-server -np "
                     f"{plan.batch} -c {n_ctx})")
    peak = max(phases, key=lambda k: phases[k])
    return make_estimate(parts, hw.memory_bytes, rt.name, peak, phases, tuple(notes))


def _gpu_parts(arch: Architecture, plan: InferencePlan, hw: Hardware, weights: float,
               embedding: float, kv: float, reserved: int) -> tuple[dict[str, float], list[str]]:
    rt = llama_cpp_runtime()
    notes: list[str] = []
    if not arch.tie_embeddings:
        weights -= embedding  # token_embd stays in host memory (llama.cpp's input layer)
        notes.append(f"token embeddings ({embedding / MIB:,.0f} MiB) stay in host memory")
    share = _offloaded_share(arch, plan, hw)
    kv *= share  # each layer's cache lives with the layer
    on_host = weights * (1 - share)
    weights -= on_host
    if share < 1:
        notes.append(f"--gpu-layers {plan.gpu_layers}: {arch.num_layers - (plan.gpu_layers or 0)} "
                     f"of {arch.num_layers} layers, {on_host / 2**30:,.2f} GiB of weights and "
                     "their KV cache, stay in host memory")
    moved = cpu_moe_layers(arch, plan, round(share * arch.num_layers))
    if moved:
        experts = moved * expert_layer_bytes(arch, plan)
        weights -= experts
        notes.append(f"--n-cpu-moe {plan.cpu_moe_layers}: the routed experts of {moved} layers, "
                     f"{experts / 2**30:,.2f} GiB, stay in host memory (the CPU runs them)")
    # The output buffer is pinned host memory when offloaded: not on the device.
    parts = {"weights": weights, "kv_cache": kv, "compute_buffer": float(reserved),
             "overhead": float(rt.baseline_bytes_cuda)}
    return parts, notes


def _cpu_parts(arch: Architecture, plan: InferencePlan, hw: Hardware, weights: float, kv: float,
               run: tuple[int, int, tuple[tuple[int, int, int], ...], bool, float, int]
               ) -> tuple[dict[str, float], dict[str, float], list[str]]:
    """The resident set at its peak: the end of loading (every mapped page and every copy),
    or the run (the file outside the mapped tensors unmapped, the context's buffers in)."""
    rt = llama_cpp_runtime()
    reserved, touched, runs, flash, kv_el, n_ctx = run
    features = cpu_features(hw)
    extra, unmapped = weight_copies(arch, plan, features)
    work = work_bytes(arch, plan, runs, flash, kv_el)
    state = runtime_state(arch, n_ctx, rt)
    overhead = float(rt.baseline_bytes_cpu)
    at_load = weights + sum(extra.values()) + state["vocabulary"] + state["code and fixed state"]
    parts = {"weights": weights - unmapped, "repacked_weights": sum(extra.values()),
             "kv_cache": kv, "compute_buffer": touched + work,
             "logits": arch.vocab_size * 4.0 * plan.batch,  # the output buffer, cleared
             "runtime_state": sum(state.values()), "overhead": overhead}
    phases = {"load": at_load + overhead, "generate": sum(parts.values())}
    if phases["load"] > phases["generate"]:
        parts = {"weights": weights, "repacked_weights": sum(extra.values()),
                 "runtime_state": at_load - weights - sum(extra.values()), "overhead": overhead}
    notes = ["weights memory-mapped and all resident (mmap with MAP_POPULATE)"]
    if extra:
        what = ", ".join(f"{k} {v / MIB:,.1f} MiB" for k, v in extra.items())
        notes.append(f"repacked for {'/'.join(sorted(features)).upper()} into extra buffers "
                     f"({what}): their mapped pages stay resident too"
                     + (f", but for {unmapped / MIB:,.1f} MiB at the file's ends, unmapped "
                        "after loading" if unmapped else ""))
    notes.append(f"compute buffer: {reserved / MIB:,.1f} MiB reserved, {touched / MIB:,.1f} MiB "
                 f"of it written by the run's micro-batches, {work / MIB:,.1f} MiB of "
                 f"converted activations; flash attention {'on' if flash else 'off'}")
    notes.append("runtime state: " + ", ".join(f"{k} {v / MIB:,.1f} MiB"
                                                for k, v in state.items()))
    return parts, phases, notes
