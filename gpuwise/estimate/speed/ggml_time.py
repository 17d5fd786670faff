"""llama.cpp's time model (docs/speed.md, "Runtimes"): token generation streams the weights
(in their ggml type) and the KV cache at the backend's achieved bandwidth; prompt processing
runs the type's matmul path at its own share of the matrix peak, one ubatch at a time; every
graph evaluation pays the host's fixed cost and every node the backend's cost per node."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.runtime_speed import GgmlBackend, GgmlLike, ggml_backend, ggml_like
from gpuwise.catalog.serving_runtimes import llama_cpp_runtime
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.memory.weights import weight_bytes
from gpuwise.estimate.speed.cache_share import CacheSpan
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.workload import Architecture, count_params
from gpuwise.workload.ops import experts_touched
from gpuwise.workload.plans import InferencePlan


@dataclass(frozen=True)
class GgmlRates:
    """What llama.cpp reaches on one device, for one ggml type and thread count."""

    weight_bytes_per_s: float  # token generation streaming the weights
    kv_bytes_per_s: float  # reading the f16 KV cache
    matmul_flops: float  # prompt processing's matmuls in this type
    attention_flops: float  # flash attention's matmuls (f16)
    layer_s: float  # per layer per graph evaluation: its nodes' launches or thread barriers
    token_s: float  # per graph evaluation (a token of tg, a ubatch of pp): the host's share
    layer_token_s: float  # per layer per prompt token: the norms, rope and softmax of pp
    source: str  # "spec" or "measured"
    # Measured decode steps (the probe's; 0.0: not measured, the rates above stand in):
    decode_attention_flops: float = 0.0  # one token's attention over its cached positions
    batch_attention_flops: float = 0.0  # the same, in a step of BATCH_SEQS tokens
    batch_matmul_flops: float = 0.0  # the matmuls of a step of BATCH_SEQS tokens
    # a query's attention passing over one masked cell (another sequence's, in a shared
    # cache) in a tile flash attention skips, per layer and head: reading its mask
    # (ggml-cpu ops.cpp flash_attn_ext_tiled; docs/serve.md, "A step's time")
    masked_head_s: float = 0.0
    # prompt processing at half a ubatch (HALF_UBATCH_TOKENS), where the probe timed it: its
    # matmul rate and per-layer, per-token cost (a CPU's rate a token is not highest at a
    # full ubatch)
    half_matmul_flops: float = 0.0
    half_layer_token_s: float = 0.0
    # The last-level cache (measure/llama_cpp/cache_sweep.py; 0.0: none seen, or not
    # measured): a step that reads up to cache_full_bytes in all streams them at
    # cache_bytes_per_s, from cache_none_bytes on at the rates above, a share of each between
    cache_bytes_per_s: float = 0.0
    cache_full_bytes: float = 0.0
    cache_none_bytes: float = 0.0
    # the routed experts' weights in token generation (MUL_MAT_ID; 0.0: weight_bytes_per_s)
    expert_bytes_per_s: float = 0.0


_FIELDS = {f.name for f in fields(GgmlRates)} - {"source"}
FA_TILE = 64  # ggml-cpu common.h GGML_FA_TILE_Q and GGML_FA_TILE_KV
BATCH_SEQS = 4  # the batch the probe times decode steps at (measure/llama_cpp/probe.py)
UBATCH_TOKENS = 512  # where prompt processing's matmul rate is measured (pp, one ubatch)
HALF_UBATCH_TOKENS = 256  # and half of it (half_matmul_flops)


def _log_between(n: float, points: tuple[tuple[float, float], ...]) -> float:
    """The value at n, linear in log2(n) between the (n, value) points; the ends beyond."""
    if n <= points[0][0]:
        return points[0][1]
    for (n0, v0), (n1, v1) in zip(points, points[1:], strict=False):
        if n <= n1:
            return v0 + (v1 - v0) * math.log2(n / n0) / math.log2(n1 / n0)
    return points[-1][1]


def matmul_seconds(g: GgmlRates, tokens: int, flops: float, single_s: float) -> float:
    """Seconds of the matmuls of a step of `tokens` tokens and `flops` FLOPs, where one token
    alone takes `single_s` (its weights' streaming time). Measured on a CPU (the probe's
    4-token step): ggml-cpu's repacked kernels run a gemm over each four tokens and a gemv for
    each token left over (ggml-cpu/repack.cpp forward_mul_mat: "more than three rows ... use
    gemm; otherwise, use gemv"), so a leftover token costs `single_s`, and the fours run at
    the four's rate, rising linear in log2(tokens) to prompt processing's at a 512-token
    ubatch. Not measured: prompt processing's rate (a GPU's small batches cost about one
    token's time)."""
    if not g.batch_matmul_flops:
        return flops / g.matmul_flops
    per_token = flops / tokens
    fours = tokens - tokens % BATCH_SEQS
    half = ((float(HALF_UBATCH_TOKENS), g.half_matmul_flops),) if g.half_matmul_flops else ()
    points = ((float(BATCH_SEQS), g.batch_matmul_flops), *half,
              (float(UBATCH_TOKENS), g.matmul_flops))
    gemm = fours * per_token / _log_between(float(fours), points) if fours else 0.0
    return gemm + tokens % BATCH_SEQS * single_s


def layer_token_s(g: GgmlRates, tokens: int) -> float:
    """The per-layer, per-token cost of a ubatch of `tokens` prompt tokens: the probe's at a
    full ubatch, or where it timed half of one, that at half and below, linear in log2 between."""
    if not g.half_layer_token_s:
        return g.layer_token_s
    points = ((float(HALF_UBATCH_TOKENS), g.half_layer_token_s), (float(UBATCH_TOKENS), g.layer_token_s))
    return _log_between(float(tokens), points)


def cache_share(g: GgmlRates, step_bytes: float) -> float:
    """The share of a step's reads the cache serves, the step reading `step_bytes` in all."""
    if not g.cache_bytes_per_s:
        return 0.0
    return CacheSpan(g.cache_full_bytes, g.cache_none_bytes).share(step_bytes)


def stream_seconds(g: GgmlRates, read: float, step_bytes: float, rate: float) -> float:
    """Seconds to stream `read` bytes at `rate` from memory, in a step that reads
    `step_bytes` in all: the cache's share of them at the cache's rate."""
    share = cache_share(g, step_bytes)
    cached = share / g.cache_bytes_per_s if share else 0.0
    return read * (cached + (1.0 - share) / rate)


def decode_attention_rate(g: GgmlRates, seqs: int) -> float:
    """FLOPs a second of decode attention (QK^T and PV over the cached positions) in a step
    of `seqs` decoding sequences; 0.0 where the probe did not measure it."""
    if not g.decode_attention_flops:
        return 0.0
    batch = g.batch_attention_flops or g.decode_attention_flops
    return _log_between(float(seqs), ((1.0, g.decode_attention_flops), (float(BATCH_SEQS), batch)))


def ggml_type(plan: InferencePlan) -> str:
    """The ggml type of the plan's weights: a GGUF file's own, else the one its format's
    matrices are stored in (formats.toml `ggml_type`: Q4_K for Q4_K_M and int4)."""
    stored = plan.stored_weights.ggml_type if plan.stored_weights else ""
    name = stored.lower() or plan.weight_format.ggml_type
    if not name:
        raise GpuwiseError(f"llama.cpp has no {plan.weights} weights",
                           "give --weights a GGUF type (q4_k_m, iq4_xs, q8_0, ...), mxfp4, "
                           "int4, int8, fp16 or bf16")
    return name


def _timed_as(backend: GgmlBackend, gtype: str) -> GgmlLike:
    """The calibrated type `gtype` is timed as, and its factors (itself, 1 and 1, where the
    backend has constants for it)."""
    if gtype in backend.memory:
        return GgmlLike(gtype, 1.0, 1.0)
    like = ggml_like().get(gtype)
    if like is None or like.like not in backend.memory:
        known = sorted({*backend.memory, *ggml_like()})
        raise GpuwiseError(f"no llama.cpp constants for ggml type {gtype}",
                           f"known: {', '.join(known)}")
    return like


def spec_ggml_rates(rates: DeviceRates, backend: GgmlBackend, gtype: str,
                    threads: int) -> GgmlRates:
    """The datasheet with the backend's shares; a CPU's `threads` share its bandwidth (each
    core streams `core_bandwidth_gbs`) and run its fp32 peak in proportion. A type without
    constants of its own runs at a calibrated type's, times its factors ([ggml.like])."""
    timed = _timed_as(backend, gtype)
    if timed.like != gtype:
        g = spec_ggml_rates(rates, backend, timed.like, threads)
        return _scaled(g, timed)
    bandwidth = rates.bandwidth_bytes_per_s
    if rates.kind == "cpu":
        cores = max(1, rates.compute_units)
        bandwidth = min(bandwidth, threads * backend.core_bandwidth_gbs * 1e9)
        peak = rates.peak("fp32") * min(threads, cores) / cores
    else:
        peak = rates.peak("fp16")

    def rate(total: float, share: dict[str, float], per_cycle: dict[str, float], t: str) -> float:
        """The share of `total`, or what the compute units reach a cycle where that is less."""
        cap = rates.unit_cycles_per_s * per_cycle.get(t, 0.0)
        return min(total * share[t], cap) if cap else total * share[t]

    b, f = backend.unit_bytes_per_cycle, backend.unit_flops_per_cycle
    matmul, f16 = rate(peak, backend.matmul, f, gtype), rate(peak, backend.matmul, f, "f16")
    d = backend.decode_shares
    weights = rate(bandwidth, backend.memory, b, gtype)
    return GgmlRates(weights, rate(bandwidth, backend.memory, b, "f16"),
                     matmul, f16 * d.get("prompt_attention", 1.0),
                     backend.nodes_per_layer * backend.kernel_s, backend.token_s, 0.0,
                     "spec", f16 * d.get("decode_attention", 0.0),
                     f16 * d.get("batch_attention", 0.0), matmul * d.get("batch_matmul", 0.0),
                     expert_bytes_per_s=weights * backend.expert_memory)


def weights_read(arch: Architecture, plan: InferencePlan, tokens: int = 1) -> float:
    """Bytes of weights a step of `tokens` tokens reads: all of them but the input
    embedding's other rows and, in a mixture of experts, the routed experts no token of the
    step reaches (`experts_touched`: k for one token, all of them for a large batch)."""
    counts = count_params(arch)
    if plan.stored_weights:
        total = float(plan.stored_weights.total_bytes)
        embedding = float(plan.stored_weights.embedding_bytes)
    else:
        total = weight_bytes(arch, plan.weight_format)
        embedding = total * counts.embedding / counts.total
    rest = total - embedding
    read = float(counts.active - counts.embedding)
    if arch.moe and counts.expert:
        moe = arch.moe
        read += counts.expert * (experts_touched(moe, tokens) - moe.experts_per_token) / moe.num_experts
    active = rest * read / max(1, counts.total - counts.embedding)
    return active + (embedding if arch.tie_embeddings else 0.0)


def routed_read(arch: Architecture, plan: InferencePlan, tokens: int = 1) -> float:
    """Of `weights_read`, the bytes of the routed experts the step's tokens reach (0.0 for a
    dense model): MUL_MAT_ID streams them at the backend's `expert_memory` share."""
    counts = count_params(arch)
    if not arch.moe or not counts.expert:
        return 0.0
    if plan.stored_weights:
        total = float(plan.stored_weights.total_bytes)
        rest = total - float(plan.stored_weights.embedding_bytes)
    else:
        total = weight_bytes(arch, plan.weight_format)
        rest = total - total * counts.embedding / counts.total
    touched = experts_touched(arch.moe, tokens) / arch.moe.num_experts
    return rest * counts.expert * touched / max(1, counts.total - counts.embedding)


def kv_bytes(arch: Architecture, plan: InferencePlan, context: float) -> float:
    kv_type = llama_cpp_runtime().kv_type if plan.kv_dtype is None else plan.kv_dtype
    per = llama_cpp_runtime().kv_type_bytes.get(kv_type, weight_format(kv_type).bytes_per_element)
    return arch.num_layers * arch.kv_cache_elements_per_token() * per * context * plan.batch


def matmul_flops(arch: Architecture, tokens: int) -> float:
    """FLOPs of every matmul for `tokens` tokens, the output head's included."""
    counts = count_params(arch)
    head = arch.vocab_size * arch.hidden_size if arch.tie_embeddings else 0
    return 2.0 * tokens * (counts.active - counts.embedding + head)


def prefill_flops(arch: Architecture, plan: InferencePlan) -> tuple[float, float]:
    """(matmul, causal attention) FLOPs of the prompt: logits of each sequence's last
    position only, as llama_decode computes them unless asked for all (`logits="all"`, as
    llama-cpp-python's server does: `logits_all`)."""
    tokens = plan.batch * plan.prompt_tokens
    head = 2.0 * plan.batch * (plan.prompt_tokens - 1) * arch.vocab_size * arch.hidden_size
    if plan.logits == "all":
        head = 0.0
    attention = 2.0 * arch.num_layers * arch.q_dim * plan.prompt_tokens**2 * plan.batch
    return matmul_flops(arch, tokens) - head, attention


def chunk_pairs(tokens: int, depth: int) -> float:
    """(query, key) pairs flash attention computes for one sequence's `tokens` new tokens
    after `depth` cached positions, its cells in position order. ggml-cpu's tiled path (64
    tokens or more: ops.cpp flash_attn_ext_tiled) computes whole tiles of FA_TILE queries by
    FA_TILE cells up to each query tile's last position and skips the masked ones beyond;
    the per-query path computes each query's own positions."""
    if tokens < FA_TILE:
        return tokens * (depth + tokens / 2)
    tiles = sum((depth + min(FA_TILE * (i + 1), tokens) - 1) // FA_TILE + 1
                for i in range(-(-tokens // FA_TILE)))
    return float(FA_TILE * FA_TILE * tiles)


def tiled_attention(kind: str, plan: InferencePlan) -> bool:
    """Whether llama.cpp's attention runs on ggml-cpu's tiled flash-attention path (a CPU,
    flash attention on), counted in tiles (chunk_pairs, estimate/serve/cells.py)."""
    return kind == "cpu" and plan.attention != "eager"


def ggml_rates(rates: DeviceRates, gtype: str, threads: int | None) -> GgmlRates:
    """This machine's llama.cpp measurements for the type and thread count where the probe
    took them (`gpuwise probe`), else the datasheet with the backend's shares."""
    threads = threads or max(1, rates.compute_units)
    backend = ggml_backend(rates.kind)
    timed = _timed_as(backend, gtype)
    measured = (rates.ggml_measured.get(f"{timed.like}/{threads}") if rates.kind == "cpu"
                else None)
    if measured:  # a probe from an older gpuwise may lack fields, or hold retired ones
        g = GgmlRates(**{k: v for k, v in measured.items() if k in _FIELDS}, source="measured")
        return g if timed.like == gtype else _scaled(g, timed)
    return spec_ggml_rates(rates, backend, gtype, threads)


def _scaled(g: GgmlRates, timed: GgmlLike) -> GgmlRates:
    """`g` (the rates of the type `timed` stands in for) at the type's own: the weights
    streamed at `memory` times the rate, its matmuls at `matmul` times theirs."""
    m = timed.matmul
    return replace(g, weight_bytes_per_s=g.weight_bytes_per_s * timed.memory,
                   expert_bytes_per_s=g.expert_bytes_per_s * timed.memory,
                   matmul_flops=g.matmul_flops * m, batch_matmul_flops=g.batch_matmul_flops * m,
                   half_matmul_flops=g.half_matmul_flops * m)
