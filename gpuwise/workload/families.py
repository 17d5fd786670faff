"""A Hugging Face config.json turned into an Architecture: per-family readers, each turning one
config layout into Architecture fields, and `from_config`, which picks the reader and checks
what it read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuwise.errors import GpuwiseError
from gpuwise.files import shown
from gpuwise.workload.arch import MLA, Architecture, MoE
from gpuwise.workload.config_ranges import check_config, check_read

Fields = dict[str, Any]

# Families whose layout gpuwise knows exactly (parameter count tested against transformers).
# A vision-language config (llama4, gemma3, mistral3) is read for its language model, the
# text_config, whose model_type is one of these (llama4_text, gemma3_text, mistral).
SUPPORTED_TYPES = (
    "gpt2", "gpt_neox", "gpt_bigcode", "llama", "mistral", "qwen2", "gemma", "gemma2",
    "phi", "phi3", "falcon", "mixtral", "qwen2_moe", "deepseek_v2", "deepseek_v3",
    "qwen3", "qwen3_moe", "gpt_oss", "llama4_text", "gemma3_text", "phimoe", "olmo2", "olmo3",
    "glm4", "granite", "smollm3",
)
MULTIMODAL_TYPES = ("llama4", "gemma3", "mistral3")

# What transformers' config class assumes where a family's config.json leaves a field out
# (transformers 5.x, models/<family>/configuration_<family>.py): the hub's Gemma 3 configs
# name only what differs from Gemma3TextConfig (google/gemma-3-4b-it: hidden_size,
# intermediate_size, num_hidden_layers, sliding_window), and several families' head_dim is not
# hidden_size / heads.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": dict(vocab_size=262_208, hidden_size=2304, intermediate_size=9216,
                        num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                        head_dim=256, max_position_embeddings=131_072,
                        tie_word_embeddings=True, sliding_window=4096,
                        hidden_activation="gelu_pytorch_tanh"),
    "llama4_text": dict(vocab_size=202_048, hidden_size=5120, intermediate_size=8192,
                        intermediate_size_mlp=16_384, num_hidden_layers=48,
                        num_attention_heads=40, num_key_value_heads=8, head_dim=128,
                        max_position_embeddings=131_072, num_local_experts=16,
                        num_experts_per_tok=1, attention_chunk_size=8192),
    "gpt_oss": dict(head_dim=64, sliding_window=128, attention_bias=True),
    "qwen3": dict(head_dim=128),
    "glm4": dict(head_dim=128, attention_bias=True),
    "olmo3": dict(sliding_window=4096),
    "smollm3": dict(tie_word_embeddings=True),
}


def _get(cfg: dict[str, Any], *keys: str, default: Any = None, required: bool = True) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    if default is None and required:
        raise GpuwiseError(
            f"config.json is missing {keys[0]!r}"
            + (f" (or {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else ""),
            "pass a complete Hugging Face config.json for a decoder-only model",
        )
    return default


def _rope_fraction(cfg: dict[str, Any], default: float = 1.0) -> float:
    rope = cfg.get("rope_parameters") or {}
    for value in (cfg.get("partial_rotary_factor"), rope.get("partial_rotary_factor"),
                  cfg.get("rotary_pct")):
        if value is not None:
            return float(value)
    return default


def _sliding(cfg: dict[str, Any], num_layers: int) -> tuple[int | None, int]:
    """The sliding window and how many layers use it (transformers' layer_types logic)."""
    window = cfg.get("sliding_window")
    if not window:
        return None, 0
    if cfg.get("use_sliding_window") is False:
        return None, 0
    layer_types = cfg.get("layer_types")
    if layer_types:
        return window, sum(1 for t in layer_types if t == "sliding_attention")
    model_type = cfg.get("model_type")
    if model_type in ("gemma2", "gpt_oss"):
        return window, (num_layers + 1) // 2  # even-indexed layers slide
    if model_type in ("gemma3_text", "olmo3"):  # 5 (Gemma 3) or 3 (OLMo 3) sliding, 1 global
        pattern = 4 if model_type == "olmo3" else (
            cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
        return window, sum(1 for i in range(num_layers) if (i + 1) % pattern)
    if model_type == "smollm3":  # the layers without RoPE slide
        return window, sum(1 for rope in _rope_layers(cfg, num_layers) if not rope)
    if model_type in ("qwen2", "qwen3", "qwen3_moe"):
        max_window_layers = cfg.get("max_window_layers", num_layers)
        return window, max(0, num_layers - max_window_layers)
    return window, num_layers


def _rope_layers(cfg: dict[str, Any], num_layers: int) -> list[int]:
    """SmolLM3's and Llama 4's `no_rope_layers`: 1 where a layer applies RoPE (every
    `no_rope_layer_interval`-th layer, 4 by default, does not)."""
    given = cfg.get("no_rope_layers")
    if given:
        return [int(bool(r)) for r in given]
    interval = cfg.get("no_rope_layer_interval") or 4
    return [int((i + 1) % interval != 0) for i in range(num_layers)]


def _decoder(cfg: dict[str, Any], **overrides: Any) -> Fields:
    """The common Llama-style layout; families override what differs."""

    def pick(key: str, *names: str, **kw: Any) -> Any:
        return overrides[key] if key in overrides else _get(cfg, *names, **kw)

    d = pick("hidden_size", "hidden_size", "n_embd", "d_model")
    heads = pick("num_heads", "num_attention_heads", "n_head")
    layers = pick("num_layers", "num_hidden_layers", "n_layer")
    kv = pick("num_kv_heads", "num_key_value_heads", default=heads, required=False)
    head_dim = cfg.get("head_dim") or (d // heads if isinstance(d, int) and heads else 0)
    window, sliding_layers = _sliding(cfg, layers if isinstance(layers, int) else 0)
    fields: Fields = dict(
        hidden_size=d, num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
        intermediate_size=pick("intermediate_size", "intermediate_size", "n_inner"),
        vocab_size=_get(cfg, "vocab_size"),
        max_position=_get(cfg, "max_position_embeddings", "n_positions", default=0,
                          required=False),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        gated_mlp=True, activation=cfg.get("hidden_act") or "silu",
        norm="rms", norm_bias=False,
        qkv_bias=bool(cfg.get("attention_bias", False)),
        o_bias=bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)), lm_head_bias=False,
        parallel_residual=False, position="rope", rotary_dim=0,
        sliding_window=window, sliding_layers=sliding_layers,
        attention_dropout=float(cfg.get("attention_dropout") or 0.0),
        hidden_dropout=float(cfg.get("hidden_dropout") or cfg.get("resid_pdrop") or 0.0),
    )
    fields.update(overrides)
    if "rotary_dim" not in overrides:
        rope = fields["position"] == "rope"
        fields["rotary_dim"] = int(fields["head_dim"] * _rope_fraction(cfg)) if rope else 0
    return fields


def _gpt2(cfg: dict[str, Any]) -> Fields:
    d = _get(cfg, "n_embd", "hidden_size")
    heads = _get(cfg, "n_head", "num_attention_heads")
    multi_query = bool(cfg.get("multi_query", False))
    return _decoder(
        cfg,
        intermediate_size=cfg.get("n_inner") or 4 * d,
        num_kv_heads=1 if multi_query else heads,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        gated_mlp=False, activation=cfg.get("activation_function") or "gelu_new",
        norm="layer", norm_bias=True, qkv_bias=True, o_bias=True, mlp_bias=True,
        position="learned",
        attention_dropout=float(cfg.get("attn_pdrop") or 0.0),
        hidden_dropout=float(cfg.get("resid_pdrop") or 0.0),
        conv1d=cfg.get("model_type", "gpt2") == "gpt2",
    )


def _gpt_neox(cfg: dict[str, Any]) -> Fields:
    return _decoder(
        cfg, gated_mlp=False, activation=cfg.get("hidden_act") or "gelu", norm="layer",
        norm_bias=True, qkv_bias=bool(cfg.get("attention_bias", True)),
        o_bias=bool(cfg.get("attention_bias", True)), mlp_bias=True,
        parallel_residual=bool(cfg.get("use_parallel_residual", True)),
    )


def _qwen2(cfg: dict[str, Any]) -> Fields:
    return _decoder(cfg, qkv_bias=True, o_bias=False)


def _gemma2(cfg: dict[str, Any]) -> Fields:
    model_type = cfg.get("model_type")
    return _decoder(
        cfg, tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        activation=cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh",
        norms_per_layer=4 if model_type in ("gemma2", "gemma3_text") else 2,
        qk_norm=model_type == "gemma3_text",
    )


def _qwen3(cfg: dict[str, Any]) -> Fields:
    return _decoder(cfg, qk_norm=True)


def _olmo2(cfg: dict[str, Any]) -> Fields:
    """OLMo 2 and 3: norms after attention and after the MLP (no input norm), and q/k norms
    over all heads' width."""
    return _decoder(cfg, qk_norm=True, qk_norm_all_heads=True)


def _glm4(cfg: dict[str, Any]) -> Fields:
    """GLM-4: biased q/k/v (not o), a norm before and after attention and the MLP, half the
    head rotated."""
    bias = bool(cfg.get("attention_bias", True))
    return _decoder(cfg, qkv_bias=bias, o_bias=False, norms_per_layer=4,
                    rotary_dim=int(_get(cfg, "head_dim") * _rope_fraction(cfg, 0.5)))


def _phi(cfg: dict[str, Any]) -> Fields:
    return _decoder(
        cfg, gated_mlp=False, activation=cfg.get("hidden_act") or "gelu_new", norm="layer",
        norm_bias=True, qkv_bias=True, o_bias=True, mlp_bias=True, lm_head_bias=True,
        parallel_residual=True, norms_per_layer=1,
        qk_norm=bool(cfg.get("qk_layernorm", False)),
    )


def _falcon(cfg: dict[str, Any]) -> Fields:
    heads = _get(cfg, "num_attention_heads", "n_head")
    d = _get(cfg, "hidden_size")
    new_arch = bool(cfg.get("new_decoder_architecture", False))
    if new_arch:
        kv = cfg.get("num_kv_heads") or heads
    else:
        kv = 1 if cfg.get("multi_query", True) else heads
    parallel = bool(cfg.get("parallel_attn", True))
    bias = bool(cfg.get("bias", False))
    return _decoder(
        cfg, num_kv_heads=kv, intermediate_size=cfg.get("ffn_hidden_size") or 4 * d,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", True)), gated_mlp=False,
        activation="gelu", norm="layer", norm_bias=True, qkv_bias=bias, o_bias=bias,
        mlp_bias=bias, parallel_residual=parallel or new_arch,
        norms_per_layer=2 if new_arch or not parallel else 1,
        position="learned" if cfg.get("alibi") else "rope",
        hidden_dropout=float(cfg.get("hidden_dropout") or 0.0),
    )


def _mixtral(cfg: dict[str, Any]) -> Fields:
    return _decoder(cfg, moe=_mixtral_moe(cfg))


def _mixtral_moe(cfg: dict[str, Any]) -> MoE:
    return MoE(num_experts=_get(cfg, "num_local_experts"),
               experts_per_token=_get(cfg, "num_experts_per_tok"),
               expert_intermediate=_get(cfg, "intermediate_size"),
               layers=_get(cfg, "num_hidden_layers"))


def _qwen2_moe(cfg: dict[str, Any]) -> Fields:
    """Qwen2-MoE and Qwen3-MoE: every `decoder_sparse_step`-th layer not in `mlp_only_layers`
    is sparse (the others a dense MLP of `intermediate_size`); Qwen3 has no shared expert, no
    q/k/v bias and q/k norms."""
    layers = _get(cfg, "num_hidden_layers")
    step = cfg.get("decoder_sparse_step", 1) or 1
    dense_only = set(cfg.get("mlp_only_layers") or [])
    experts = _get(cfg, "num_experts", "num_local_experts")  # transformers 5 writes the latter
    sparse = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
    moe = MoE(num_experts=experts,
              experts_per_token=_get(cfg, "num_experts_per_tok"),
              expert_intermediate=_get(cfg, "moe_intermediate_size"), layers=sparse,
              shared_experts=1 if cfg.get("shared_expert_intermediate_size") else 0,
              shared_intermediate=cfg.get("shared_expert_intermediate_size") or 0,
              shared_gate=bool(cfg.get("shared_expert_intermediate_size")))
    if cfg.get("model_type") == "qwen3_moe":
        return _decoder(cfg, moe=moe, qk_norm=True)
    return _decoder(cfg, qkv_bias=bool(cfg.get("qkv_bias", True)), o_bias=False, moe=moe)


def _gpt_oss(cfg: dict[str, Any]) -> Fields:
    """gpt-oss: every layer sparse, routed experts (`intermediate_size` wide) and the router
    with biases, biased attention with a learned sink a head, sliding (128) and full layers
    alternating."""
    moe = MoE(num_experts=_get(cfg, "num_local_experts"),
              experts_per_token=_get(cfg, "num_experts_per_tok", "experts_per_token"),
              expert_intermediate=_get(cfg, "intermediate_size"),
              layers=_get(cfg, "num_hidden_layers"), router_bias=True, expert_bias=True)
    bias = bool(cfg.get("attention_bias", True))
    return _decoder(cfg, moe=moe, qkv_bias=bias, o_bias=bias, attention_sinks=True)


def _llama4(cfg: dict[str, Any]) -> Fields:
    """Llama 4's language model: the layers in `moe_layers` (every
    `interleave_moe_layer_step`-th) route each token to experts `intermediate_size` wide beside
    one shared expert as wide, the others are a dense MLP of `intermediate_size_mlp`; the
    layers with RoPE (3 of 4) attend within chunks of `attention_chunk_size`. Its q/k norm has
    no weights."""
    layers = _get(cfg, "num_hidden_layers")
    moe_layers = cfg.get("moe_layers")
    if moe_layers is None:
        step = cfg.get("interleave_moe_layer_step") or 1
        moe_layers = range(step - 1, layers, step)
    sparse = len({i for i in moe_layers if isinstance(i, int) and 0 <= i < layers})
    inner = _get(cfg, "intermediate_size")
    moe = MoE(num_experts=_get(cfg, "num_local_experts"),
              experts_per_token=_get(cfg, "num_experts_per_tok"), expert_intermediate=inner,
              layers=sparse, shared_experts=1, shared_intermediate=inner)
    chunk = cfg.get("attention_chunk_size")
    if cfg.get("layer_types"):
        chunked = sum(1 for t in cfg["layer_types"] if t == "chunked_attention")
    else:
        chunked = sum(_rope_layers(cfg, layers)) if chunk else 0
    bias = bool(cfg.get("attention_bias", False))
    return _decoder(cfg, intermediate_size=_get(cfg, "intermediate_size_mlp"), moe=moe,
                    qkv_bias=bias, o_bias=bias, sliding_window=chunk if chunked else None,
                    sliding_layers=chunked if chunk else 0,
                    attention_chunk=chunk if chunked else None)


def _phimoe(cfg: dict[str, Any]) -> Fields:
    """Phi-3.5-MoE: Mixtral's experts with Phi's LayerNorms (with biases), optional attention
    and LM-head biases."""
    bias = bool(cfg.get("attention_bias", False))
    return _decoder(cfg, norm="layer", norm_bias=True, qkv_bias=bias, o_bias=bias,
                    lm_head_bias=bool(cfg.get("lm_head_bias", False)), moe=_mixtral_moe(cfg))


def _deepseek(cfg: dict[str, Any]) -> Fields:
    layers = _get(cfg, "num_hidden_layers")
    first_dense = cfg.get("first_k_dense_replace", 0) or 0
    freq = cfg.get("moe_layer_freq", 1) or 1
    experts = cfg.get("n_routed_experts")
    sparse = 0
    if experts:
        sparse = sum(1 for i in range(layers) if i >= first_dense and i % freq == 0)
    moe_i = _get(cfg, "moe_intermediate_size")
    shared = cfg.get("n_shared_experts") or 0
    moe = MoE(num_experts=experts or 0, experts_per_token=_get(cfg, "num_experts_per_tok"),
              expert_intermediate=moe_i, layers=sparse, shared_experts=shared,
              shared_intermediate=moe_i * shared,
              ) if experts else None
    mla = MLA(q_lora_rank=cfg.get("q_lora_rank"), kv_lora_rank=_get(cfg, "kv_lora_rank"),
              qk_nope_head_dim=_get(cfg, "qk_nope_head_dim"),
              qk_rope_head_dim=_get(cfg, "qk_rope_head_dim"),
              v_head_dim=_get(cfg, "v_head_dim"))
    heads = _get(cfg, "num_attention_heads")
    return _decoder(cfg, num_kv_heads=heads, head_dim=mla.v_head_dim, moe=moe, mla=mla,
                    rotary_dim=mla.qk_rope_head_dim)


READERS: dict[str, Callable[[dict[str, Any]], Fields]] = {
    "gpt2": _gpt2, "gpt_bigcode": _gpt2, "gpt_neox": _gpt_neox,
    "llama": _decoder, "mistral": _decoder, "qwen2": _qwen2,
    "gemma": _gemma2, "gemma2": _gemma2, "phi": _phi, "phi3": _decoder,
    "falcon": _falcon, "mixtral": _mixtral, "qwen2_moe": _qwen2_moe,
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
    "qwen3": _qwen3, "qwen3_moe": _qwen2_moe, "gpt_oss": _gpt_oss, "llama4_text": _llama4,
    "gemma3_text": _gemma2, "phimoe": _phimoe, "olmo2": _olmo2, "olmo3": _olmo2,
    "glm4": _glm4, "granite": _decoder, "smollm3": _decoder,
}


def from_config(cfg: dict[str, Any], name: str = "") -> Architecture:
    """Normalise a Hugging Face config dict into an Architecture."""
    if not isinstance(cfg, dict):
        raise GpuwiseError("config.json is not a JSON object", "pass a Hugging Face config.json")
    multimodal = ""
    if "text_config" in cfg and "hidden_size" not in cfg:
        if not isinstance(cfg["text_config"], dict):
            raise GpuwiseError("config.json: text_config is not a JSON object",
                               "pass a Hugging Face config.json")
        outer = cfg.get("model_type")
        multimodal = outer if isinstance(outer, str) else ""
        cfg = {**cfg["text_config"], "architectures": cfg.get("architectures"),
               **({"_name_or_path": cfg["_name_or_path"]} if cfg.get("_name_or_path") else {})}
        if "model_type" not in cfg and multimodal == "mistral3":
            cfg["model_type"] = "mistral"  # Mistral3Config's text_config defaults to Mistral
    model_type = _get(cfg, "model_type")
    if model_type not in SUPPORTED_TYPES:
        raise GpuwiseError(
            f"model_type {shown(repr(model_type))} is not a family gpuwise knows",
            f"supported: {', '.join(SUPPORTED_TYPES + MULTIMODAL_TYPES)}",
        )
    cfg = {**FAMILY_DEFAULTS.get(model_type, {}), **cfg}
    check_config(cfg, model_type)
    fields = READERS[model_type](cfg)
    check_read(fields, cfg)
    return Architecture(name=name or cfg.get("_name_or_path", "") or model_type,
                        model_type=model_type, config=cfg,
                        multimodal=multimodal if multimodal != model_type else "", **fields)
