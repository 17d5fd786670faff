"""Exact parameter counts from architecture facts (tested against transformers on meta)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from gpuwise.workload.arch import Architecture


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts by where they live. `linear` is what weight quantisation applies to."""

    embedding: int  # token (+ learned position) embeddings
    lm_head: int  # 0 when tied to the embedding
    attention: int  # all layers, weights and biases
    mlp: int  # all layers: dense MLPs, experts, shared experts, routers
    norms: int  # all layers plus the final norm
    linear: int  # matrix weights of attention and MLP layers (quantisable)
    active: int  # parameters used per token (MoE: only the routed experts)
    expert: int  # routed-expert parameters (0 for dense models)

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.attention + self.mlp + self.norms


def _norm(arch: Architecture, width: int) -> int:
    return width * (2 if arch.norm_bias else 1)


def _attention(arch: Architecture) -> tuple[int, int]:
    """(all attention parameters, matrix weights alone) for one layer."""
    d = arch.hidden_size
    if arch.mla:
        m, h = arch.mla, arch.num_heads
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            q = d * m.q_lora_rank + m.q_lora_rank * h * qk
            q_norm = m.q_lora_rank
        else:
            q, q_norm = d * h * qk, 0
        kv_a = d * (m.kv_lora_rank + m.qk_rope_head_dim)
        kv_b = m.kv_lora_rank * h * (m.qk_nope_head_dim + m.v_head_dim)
        o = h * m.v_head_dim * d
        weights = q + kv_a + kv_b + o
        return weights + q_norm + m.kv_lora_rank, weights
    q, kv = arch.q_dim, arch.kv_dim
    weights = d * (q + 2 * kv) + q * d
    biases = (q + 2 * kv if arch.qkv_bias else 0) + (d if arch.o_bias else 0)
    qk_norm = 0
    if arch.qk_norm:  # OLMo-2's norms span every head; Qwen3's and Gemma 3's one head
        qk_norm = (_norm(arch, q) + _norm(arch, kv) if arch.qk_norm_all_heads
                   else 2 * _norm(arch, arch.head_dim))
    sinks = arch.num_heads if arch.attention_sinks else 0
    return weights + biases + qk_norm + sinks, weights


def _mlp(arch: Architecture, inner: int, gated: bool | None = None,
         bias: bool | None = None) -> tuple[int, int]:
    """(parameters, matrix weights) of one MLP with the given inner width."""
    d = arch.hidden_size
    gated = arch.gated_mlp if gated is None else gated
    bias = arch.mlp_bias if bias is None else bias
    weights = (3 if gated else 2) * d * inner
    biases = ((2 * inner if gated else inner) + d) if bias else 0
    return weights + biases, weights


@cache
def count_params(arch: Architecture) -> ParamCounts:
    """Count every parameter of the model that transformers builds from this config."""
    d, v, layers = arch.hidden_size, arch.vocab_size, arch.num_layers
    embedding = v * d + (arch.max_position * d if arch.position == "learned" else 0)
    lm_head = 0 if arch.tie_embeddings else v * d + (v if arch.lm_head_bias else 0)
    attn, attn_w = _attention(arch)
    norms = layers * arch.norms_per_layer * _norm(arch, d) + _norm(arch, d)

    dense_mlp, dense_w = _mlp(arch, arch.intermediate_size)
    moe = arch.moe
    sparse_layers = moe.layers if moe else 0
    mlp = (layers - sparse_layers) * dense_mlp
    linear = layers * attn_w + (layers - sparse_layers) * dense_w
    expert_total = expert_unused = 0
    if moe:
        one_expert, expert_w = _mlp(arch, moe.expert_intermediate, gated=True,
                                    bias=moe.expert_bias)
        shared, shared_w = _mlp(arch, moe.shared_intermediate, gated=True) if (
            moe.shared_experts) else (0, 0)
        router = d * moe.num_experts + (moe.num_experts if moe.router_bias else 0)
        per_layer = moe.num_experts * one_expert + shared + router + (d if moe.shared_gate else 0)
        mlp += sparse_layers * per_layer
        linear += sparse_layers * (moe.num_experts * expert_w + shared_w)
        expert_total = sparse_layers * moe.num_experts * one_expert
        expert_unused = sparse_layers * (moe.num_experts - moe.experts_per_token) * one_expert
    total = embedding + lm_head + layers * attn + mlp + norms
    return ParamCounts(
        embedding=embedding, lm_head=lm_head, attention=layers * attn, mlp=mlp, norms=norms,
        linear=linear, active=total - expert_unused, expert=expert_total,
    )


@cache
def parameter_tensors(arch: Architecture) -> tuple[tuple[int, int], ...]:
    """(elements, how many) of the model's parameter tensors: what an optimizer loops over.
    Matrices by their shapes; what remains (norms, biases) as hidden-sized vectors."""
    c, d, layers = count_params(arch), arch.hidden_size, arch.num_layers
    sizes: list[tuple[int, int]] = [(arch.vocab_size * d, 1 if arch.tie_embeddings else 2)]
    if arch.position == "learned":
        sizes.append((arch.max_position * d, 1))
    if arch.mla:
        sizes.append((_attention(arch)[1] // 4, 4 * layers))
    else:
        sizes += [(d * arch.q_dim, 2 * layers), (d * arch.kv_dim, 2 * layers)]
    moe = arch.moe
    dense = layers - (moe.layers if moe else 0)
    sizes.append((d * arch.intermediate_size, (3 if arch.gated_mlp else 2) * dense))
    if moe:
        sizes.append((d * moe.expert_intermediate, 3 * moe.num_experts * moe.layers))
        if moe.shared_experts:
            sizes.append((d * moe.shared_intermediate, 3 * moe.layers))
    rest = c.total - sum(n * k for n, k in sizes)
    if rest > 0:
        sizes.append((d, max(1, rest // d)))
    return tuple((n, k) for n, k in sizes if n > 0 and k > 0)
