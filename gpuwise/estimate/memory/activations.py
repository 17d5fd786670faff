"""Activation memory: what autograd saves for backward (training) and the transient peak of a
forward pass without grad (inference prefill). Training terms come from measured per-family
profiles of the transformers runtime (catalog/data/activation_profiles.json); under
torch.compile a decoder layer saves what AOTAutograd's min-cut partitioner keeps
(catalog/data/stacks.toml [compiled_layer]) where its rules cover the family."""

from __future__ import annotations

from typing import Any

from gpuwise.catalog.runtimes import activation_profile, compiled_layer_profile
from gpuwise.workload import Architecture, count_params


def term_units(arch: Architecture, batch: int, seq: int, tp: int = 1) -> dict[str, float]:
    """Element counts of each profile term for this model and shape, split over `tp` ranks."""
    b, s = batch, seq
    h = arch.num_heads / tp
    kv = max(1.0, arch.num_kv_heads / tp)
    hd = arch.head_dim
    inner = arch.intermediate_size / tp
    if arch.moe:
        moe = arch.moe
        # Routed tokens pass through k experts each; the shared experts see every token.
        inner = (moe.experts_per_token * moe.expert_intermediate + moe.shared_intermediate) / tp
    q = arch.q_dim / tp
    return {
        "bsqkv": b * s * (q + 2 * kv * hd), "bsd": b * s * arch.hidden_size,
        "bsq": b * s * q, "bskv": b * s * kv * hd, "bsi": b * s * inner,
        "bhss": b * h * s * s, "bkss": b * kv * s * s, "bhs": b * h * s, "bs": b * s,
        "bsv": b * s * arch.vocab_size / tp, "bsh": b * s * hd,
        "bshr": b * s * h * arch.rotary_dim, "bskr": b * s * kv * arch.rotary_dim,
        "bsr": b * s * arch.rotary_dim,
    }


def _apply(coefs: dict[str, float], units: dict[str, float], cast_params: float,
           only: str | None = None) -> float:
    total = 0.0
    for term, coef in coefs.items():
        if term == "weight_cast":
            total += coef * cast_params
        elif term in units and (only is None or (term == only)):
            total += coef * units[term]
    return total


def _compiled_layer(arch: Architecture, mode: str, attention: str,
                    dropout: bool) -> dict[str, float] | None:
    """A dense layer's saved bytes per term under torch.compile, or None where the
    partitioner's rules are not derived (MoE routing: the layer is not one graph)."""
    if arch.moe:
        return None
    return compiled_layer_profile(arch.model_type, mode, attention, dropout)


def saved_for_backward(arch: Architecture, batch: int, seq: int, mode: str, attention: str,
                       checkpointing: bool, tp: int = 1,
                       compiled: bool = False) -> dict[str, Any]:
    """Bytes autograd holds at the end of the forward pass, by part.

    Returns layers (all decoder layers), recompute (one layer rebuilt during backward under
    checkpointing), logits (the b x s x vocab tensors) and other (embeddings, final norm, loss),
    with the attention implementation the profile used and whether the compiled layer applied.
    `compiled` (torch.compile of each decoder layer, as torchtune and torchtitan do): a layer
    saves what the min-cut partitioner keeps, and a checkpointed layer's backward
    materialises the same set (its recomputed pointwise ops are fused into the backward's
    kernels); the embeddings, final norm and loss keep the eager profile.
    """
    dropout = arch.attention_dropout > 0 or arch.hidden_dropout > 0
    prof, used = activation_profile(arch.model_type, mode, attention, checkpointing, dropout)
    layer = _compiled_layer(arch, mode, used, dropout) if compiled else None
    units = term_units(arch, batch, seq, tp)
    counts = count_params(arch)
    layer_linear = counts.linear / arch.num_layers / tp
    head = (counts.lm_head or counts.embedding) / tp
    saves = layer if layer is not None and not checkpointing else prof["per_layer"]
    per_layer = _apply(saves, units, layer_linear)
    model = prof["model"]
    logits = _apply(model, units, 0.0, only="bsv")
    other = _apply({k: v for k, v in model.items() if k != "bsv"}, units, head)
    recompute = 0.0
    if checkpointing:
        full, _ = activation_profile(arch.model_type, mode, attention, False, dropout)
        recompute = _apply(layer if layer is not None else full["per_layer"], units,
                           layer_linear)
    return {"layers": per_layer * arch.num_layers, "recompute": recompute, "logits": logits,
            "other": other, "attention": used, "compiled_layer": layer is not None}


def prefill_transient(arch: Architecture, batch: int, tokens: int, compute_bytes: float,
                      attention: str) -> float:
    """Peak bytes of temporaries inside one decoder layer during a no-grad forward pass.

    Alive together: the residual stream and its normalised copy, plus the larger of the
    attention block (q, rotated q and k, the attention output, and under eager attention the
    score matrix with its fp32 softmax) and the MLP block (gate, up and their product, or the
    plain MLP's inner activation and its nonlinearity).
    """
    bs = batch * tokens
    c = compute_bytes
    stream = 2 * bs * arch.hidden_size * c
    attn = bs * (3 * arch.q_dim + 2 * arch.kv_dim) * c
    if attention == "eager":
        scores = batch * arch.num_heads * tokens * tokens
        attn += scores * (2 * c + 4)
    inner = arch.intermediate_size
    if arch.moe:
        inner = max(arch.moe.expert_intermediate, arch.moe.shared_intermediate)
    mlp = bs * inner * c * (3 if arch.gated_mlp or arch.moe else 2)
    norm_upcast = 2 * bs * arch.hidden_size * 4 if c < 4 else 0
    return stream + max(attn, mlp, norm_upcast)


def saved_with_policy(arch: Architecture, batch: int, seq: int, mode: str, attention: str,
                      checkpointing: bool, policy: str, tp: int = 1,
                      compiled: bool = False) -> dict[str, Any]:
    """`saved_for_backward` under a checkpointing policy: "full" (every layer keeps only its
    input), a number N (every Nth layer checkpointed, the rest save everything: torchtune's
    and torchtitan's selective layer policy), or "op" (torchtitan's selective op policy,
    catalog/data/stacks.toml [selective_ac_op]: each layer keeps its input, the attention's
    output and logsumexp, and the output of every second matmul: q, v, the MLP's first
    projection (w1) and its output (w2); the rest is recomputed). Compiled, the policy's
    tags decide what is saved (torch/_functorch/partitioners.py must_recompute: a
    PREFER_RECOMPUTE op is never saved, MUST_SAVE always), as in eager."""
    args = (arch, batch, seq, mode, attention)
    if not checkpointing or policy == "full":
        return saved_for_backward(*args, checkpointing, tp, compiled)
    full = saved_for_backward(*args, False, tp, compiled)
    kept = saved_for_backward(*args, True, tp, compiled)
    per_full = full["layers"] / arch.num_layers
    per_input = kept["layers"] / arch.num_layers
    if policy == "op":
        u = term_units(arch, batch, seq, tp)
        c = 4.0 if mode == "fp32" else 2.0
        # Of wq, wk, wv, wo, w1, w3, w2 the 1st, 3rd, 5th and 7th outputs are kept.
        saved_mm = u["bsq"] + u["bskv"] + u["bsi"] + u["bsd"]
        per = per_input + c * (saved_mm + u["bsq"]) + 4 * u["bhs"]
        return {**kept, "layers": per * arch.num_layers}
    checkpointed = arch.num_layers // int(policy)
    layers = per_input * checkpointed + per_full * (arch.num_layers - checkpointed)
    recompute = kept["recompute"] if checkpointed else 0.0
    return {**kept, "layers": layers, "recompute": recompute}
