"""llama.cpp's rates on this machine from llama-bench style timings of two probe models
(docs/speed.md, "llama.cpp on this CPU"): the constants of estimate/speed/ggml_time.py's model,
solved from the models' bytes, FLOPs and layers.

Token generation takes read / bandwidth + layers x layer_s a token: two models whose bytes per
layer differ give the bandwidth and the cost per layer. Prompt processing takes matmul FLOPs /
rate + layers x (layer_s + tokens x layer_token_s): with layer_s from tg, the two give the
matmul rate and the per-token work of the layer's other nodes (norms, rope, softmax).

Decode steps at a depth and a batch (llama-batched-bench style, on the larger model) give
what a decode step's attention and a small batch's matmuls cost (`fit_decode`): one token at
depth D against the same at depth 0 gives decode attention's rate, 4 sequences at depth 0
against the model's own weights the matmul rate of a 4-token batch, and 4 at depth D against
4 at depth 0 the attention rate in a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpuwise.estimate.serve.cells import SharedCells, Ubatch
from gpuwise.estimate.speed.cache_share import CacheSpan
from gpuwise.estimate.speed.ggml_time import (
    HALF_UBATCH_TOKENS,
    chunk_pairs,
    kv_bytes,
    matmul_flops,
    prefill_flops,
    weights_read,
)
from gpuwise.workload import Architecture, from_config
from gpuwise.workload.plans import InferencePlan, StoredWeights

# A cache may stream at most this many times faster than memory in a fit (a larger ratio is
# a stalled timing, not a cache)
MAX_CACHE_SPEEDUP = 16.0
CACHE_FIELDS = ("cache_bytes_per_s", "cache_full_bytes", "cache_none_bytes")

# The GGUF file's main type for each quantisation llama_model_quantize writes.
GGML_TYPE = {"f16": "f16", "q8_0": "q8_0", "q4_0": "q4_0", "q4_k_m": "q4_k"}


@dataclass(frozen=True)
class ModelTiming:
    """One model's pp and tg at one thread count, with what the model moves and computes."""

    arch: Architecture
    plan_pp: InferencePlan
    plan_tg: InferencePlan
    pp_s: float  # the whole prompt
    tg_s: float  # one generated token
    decode_steps: dict[str, float] = field(default_factory=dict)  # fit_decode's timings
    pp_half_s: float = 0.0  # a prompt of HALF_UBATCH_TOKENS (0.0: not timed)


def llama_arch(hidden: int, layers: int, heads: int, kv_heads: int, ffn: int,
               vocab: int) -> Architecture:
    """The Architecture of a llama GGUF of these sizes (untied head, no biases)."""
    return from_config({"model_type": "llama", "hidden_size": hidden,
                        "num_hidden_layers": layers, "num_attention_heads": heads,
                        "num_key_value_heads": kv_heads, "intermediate_size": ffn,
                        "vocab_size": vocab, "max_position_embeddings": 4096,
                        "tie_word_embeddings": False, "name": f"h{hidden}-l{layers}"})


def timing_plans(qtype: str, total: int, embedding: int, n_prompt: int, n_gen: int,
                 threads: int) -> tuple[InferencePlan, InferencePlan]:
    """llama-bench's pp (a prompt, no generation) and tg (n_gen tokens from an empty cache;
    the plan's one-token prompt stands for the empty cache) as plans over the file's bytes."""
    stored = StoredWeights(total, embedding, qtype.upper(), GGML_TYPE[qtype])
    pp = InferencePlan(prompt_tokens=n_prompt, new_tokens=0, weights="fp16", stored_weights=stored,
                       runtime="llama.cpp", threads=threads)
    tg = InferencePlan(prompt_tokens=1, new_tokens=n_gen, weights="fp16", stored_weights=stored,
                       runtime="llama.cpp", threads=threads)
    return pp, tg


def _solve(a: tuple[float, float, float], b: tuple[float, float, float]) -> tuple[float, float]:
    """x, y with a[0] x + a[1] y = a[2] and b likewise; where that gives a negative y, y = 0
    and x from the equation with the larger first coefficient."""
    det = a[0] * b[1] - a[1] * b[0]
    if det:
        x = (a[2] * b[1] - a[1] * b[2]) / det
        y = (a[0] * b[2] - a[2] * b[0]) / det
        if x > 0 and y >= 0:
            return x, y
    big = max(a, b, key=lambda e: e[0])
    return big[2] / big[0], 0.0


def _tg_equation(m: ModelTiming) -> tuple[float, float, float]:
    """(bytes a generated token reads, layers, its seconds)."""
    kv = kv_bytes(m.arch, m.plan_tg, m.plan_tg.new_tokens / 2)
    return weights_read(m.arch, m.plan_tg) + kv, float(m.arch.num_layers), m.tg_s


def _det3(m: list[list[float]]) -> float:
    return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))


def fit_cache(models: tuple[ModelTiming, ...], span: CacheSpan,
              two: tuple[float, float] | None = None) -> dict[str, float]:
    """Memory's and the cache's seconds a byte and the cost per layer from three models' tg,
    each token reading W bytes, a share s of them from the cache (span.share(W)): W (1 - s)
    x + W s y + layers z = seconds. Where the two big models run from memory alone, their own
    fit `two` (x, z) stands and y comes from the small one alone: a small model's few layers
    leave z to the noise of its timing. Where the cache holds a share of a big one too, the
    three are solved together. {} where they do not resolve a cache faster than memory (no
    span, or a small model no faster than memory's rate allows)."""
    if len(models) != 3 or not span.full:
        return {}
    rows = []
    for m in models:
        w, layers, seconds = _tg_equation(m)
        share = span.share(w)
        rows.append(([w * (1 - share), w * share, layers], seconds))
    x, y, z = 0.0, 0.0, -1.0
    if two and not (rows[0][0][1] or rows[1][0][1]):
        (x, z), (row, seconds) = two, rows[2]
        y = (seconds - row[0] * x - row[2] * z) / row[1] if row[1] else 0.0
    elif det := _det3([r for r, _ in rows]):
        x, y, z = (_det3([[*r[:i], t, *r[i + 1:]] for r, t in rows]) / det for i in range(3))
    if not _cache_faster(x, y, z):
        return {}
    return {"weight_bytes_per_s": 1 / x, "kv_bytes_per_s": 1 / x, "layer_s": z,
            "cache_bytes_per_s": 1 / y, "cache_full_bytes": span.full,
            "cache_none_bytes": span.none}


def _cache_faster(x: float, y: float, z: float) -> bool:
    """Seconds a byte from memory (x) and from the cache (y) and a layer's (z) that are a
    cache: positive, the cache faster, by no more than MAX_CACHE_SPEEDUP."""
    return x > 0 and 0 < y < x and z >= 0 and x / y <= MAX_CACHE_SPEEDUP


def fit_rates(a: ModelTiming, b: ModelTiming, depth: int = 0, seqs: int = 0,
              chunk: int = 0, small: ModelTiming | None = None,
              span: CacheSpan | None = None) -> dict[str, float]:
    """GgmlRates' fields (but `source`) from two models' timings at one type and thread count;
    with `depth`, also the decode fields from the steps of whichever model has them
    (fit_decode), and prompt attention charged at the rate a `chunk`-token prompt chunk at
    that depth shows. Without them the KV
    cache and flash attention are charged at the weights' rates: at a probe's short contexts
    they are a few percent of the time. With a `small` model's timing (one that runs from the
    cache) and the cache's `span`, also the cache's rate (fit_cache)."""
    per_byte, layer_s = _solve(_tg_equation(a), _tg_equation(b))
    cache = fit_cache((a, b, small), span, (per_byte, layer_s)) if small and span else {}
    if cache:
        per_byte, layer_s = 1 / cache["weight_bytes_per_s"], cache["layer_s"]
    stepped = a if a.decode_steps else b  # the model whose decode steps the probe timed
    decode = fit_decode(stepped, {"layer_s": layer_s, "token_s": 0.0}, stepped.decode_steps,
                        depth, seqs)
    attention = _prompt_attention(stepped, depth, chunk)
    eqs = [_pp_equation(m, m.plan_pp, m.pp_s, layer_s, attention) for m in (a, b)]
    per_flop, layer_token_s = _solve(eqs[0], eqs[1])
    decode["masked_head_s"] = _masked_head_s(stepped, depth, chunk, attention)
    decode.update(_half_rates(a, b, layer_s, attention))
    # the probe times no mixture of experts: routed experts stream as the dense weights do,
    # the CPU backend's share (runtime_speed.toml [ggml.cpu] expert_memory 1.0)
    return {"weight_bytes_per_s": 1 / per_byte, "kv_bytes_per_s": 1 / per_byte,
            "expert_bytes_per_s": 1 / per_byte,
            "matmul_flops": 1 / per_flop, "attention_flops": attention or 1 / per_flop,
            "layer_s": layer_s, "token_s": 0.0, "layer_token_s": layer_token_s, **decode,
            **{k: cache.get(k, 0.0) for k in CACHE_FIELDS}}


def _pp_equation(m: ModelTiming, plan: InferencePlan, seconds: float, layer_s: float,
                 attention: float) -> tuple[float, float, float]:
    """(matmul FLOPs, layer-tokens, seconds left for them) of a prompt: the layers' fixed
    cost and flash attention (in tiles, at its own rate where measured) taken off."""
    n, layers = plan.prompt_tokens, m.arch.num_layers
    mm, att = prefill_flops(m.arch, plan)
    if attention:
        att_s = chunk_pairs(n, 0) * 4.0 * layers * m.arch.q_dim / attention
        return mm, float(layers * n), seconds - layers * layer_s - att_s
    return mm + att, float(layers * n), seconds - layers * layer_s


def _half_rates(a: ModelTiming, b: ModelTiming, layer_s: float,
                attention: float) -> dict[str, float]:
    """The matmul rate and per-layer, per-token cost at half a ubatch, from both models'
    prompts of that size as at a full one (0.0 each: not timed)."""
    if not (a.pp_half_s and b.pp_half_s):
        return {"half_matmul_flops": 0.0, "half_layer_token_s": 0.0}
    eqs = [_pp_equation(m, replace(m.plan_pp, prompt_tokens=HALF_UBATCH_TOKENS), m.pp_half_s,
                        layer_s, attention) for m in (a, b)]
    per_flop, per_token = _solve(eqs[0], eqs[1])
    return {"half_matmul_flops": 1 / per_flop, "half_layer_token_s": per_token}


def _prompt_attention(m: ModelTiming, depth: int, chunk: int) -> float:
    """Prompt attention's FLOPs a second: a `chunk`-token prompt chunk at `depth` cached
    positions against the same at none (0.0: not timed, or not resolved)."""
    near = m.decode_steps.get(f"d0/s1/t{chunk}")
    deep = m.decode_steps.get(f"d{depth}/s1/t{chunk}")
    if not (depth and chunk and near and deep and deep > near):
        return 0.0
    pairs = chunk_pairs(chunk, depth) - chunk_pairs(chunk, 1)  # a sequence holds 1 cell at "d0"
    return 4.0 * m.arch.num_layers * m.arch.q_dim * pairs / (deep - near)


def _masked_head_s(m: ModelTiming, depth: int, chunk: int, attention: float) -> float:
    """Seconds a query's attention takes per layer and head over one masked cell in a tile
    flash attention skips: a `chunk`-token chunk with `depth` cells of another sequence in
    the cache against the same alone, less the tiles the other cells make it compute at the
    attention rate (0.0: not timed, or not resolved)."""
    alone = m.decode_steps.get(f"d0/s1/t{chunk}")
    beside = m.decode_steps.get(f"d0/s1/t{chunk}/o{depth}")
    if not (depth and chunk and alone and beside and attention):
        return 0.0
    a, b = _probe_chunk(chunk, 0), _probe_chunk(chunk, depth)
    computed = (b.computed - a.computed) * 4.0 * m.arch.num_layers * m.arch.q_dim / attention
    seconds = beside - alone - computed
    heads = m.arch.num_layers * m.arch.num_heads
    return seconds / ((b.skipped - a.skipped) * heads) if seconds > 0 else 0.0


def _probe_chunk(chunk: int, other: int) -> Ubatch:
    """The probe's timed chunk as placed (decode_child: one cell of its sequence, `other`
    cells of another, then the chunk) in a cache of the size the probe's context has."""
    cells = SharedCells(1 + chunk + other + 256, tiled=True)
    cells.take([(0, 1)])
    if other:
        cells.take([(1, other)])
    return cells.take([(0, chunk)])[-1]


def fit_decode(m: ModelTiming, rates: dict[str, float], steps: dict[str, float],
               depth: int, seqs: int) -> dict[str, float]:
    """GgmlRates' decode fields from decode steps of the model `m` (keys "d{depth}/s{seqs}",
    seconds a step, fit_decode's cases): 0.0 for a rate the timings do not resolve (a
    difference that is not positive)."""
    arch = m.arch
    per_position = 4.0 * arch.num_layers * arch.q_dim  # QK^T and PV of one cached position
    one, deep = steps.get("d0/s1"), steps.get(f"d{depth}/s1")
    batch, batch_deep = steps.get(f"d0/s{seqs}"), steps.get(f"d{depth}/s{seqs}")
    out = {"decode_attention_flops": 0.0, "batch_attention_flops": 0.0,
           "batch_matmul_flops": 0.0}
    if not depth:
        return out
    if one and deep and deep > one:
        out["decode_attention_flops"] = per_position * depth / (deep - one)
    fixed = arch.num_layers * rates["layer_s"] + rates["token_s"]
    if one and batch and batch > fixed:
        out["batch_matmul_flops"] = matmul_flops(arch, seqs) / (batch - fixed)
    if batch and batch_deep and batch_deep > batch:
        out["batch_attention_flops"] = seqs * per_position * depth / (batch_deep - batch)
    return out
