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
SUPPORTED_TYPES = (
    "gpt2", "gpt_neox", "gpt_bigcode", "llama", "mistral", "qwen2", "gemma", "gemma2",
    "phi", "phi3", "falcon", "mixtral", "qwen2_moe", "deepseek_v2", "deepseek_v3",
)


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
    if cfg.get("model_type") == "gemma2":
        return window, (num_layers + 1) // 2  # even-indexed layers slide
    if cfg.get("model_type") == "qwen2":
        max_window_layers = cfg.get("max_window_layers", num_layers)
        return window, max(0, num_layers - max_window_layers)
    return window, num_layers


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
    return _decoder(
        cfg, tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        activation=cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh",
        norms_per_layer=4 if cfg.get("model_type") == "gemma2" else 2,
    )


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
    layers = _get(cfg, "num_hidden_layers")
    moe = MoE(num_experts=_get(cfg, "num_local_experts"),
              experts_per_token=_get(cfg, "num_experts_per_tok"),
              expert_intermediate=_get(cfg, "intermediate_size"), layers=layers)
    return _decoder(cfg, moe=moe)


def _qwen2_moe(cfg: dict[str, Any]) -> Fields:
    layers = _get(cfg, "num_hidden_layers")
    step = cfg.get("decoder_sparse_step", 1) or 1
    dense_only = set(cfg.get("mlp_only_layers") or [])
    sparse = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
    moe = MoE(num_experts=_get(cfg, "num_experts"),
              experts_per_token=_get(cfg, "num_experts_per_tok"),
              expert_intermediate=_get(cfg, "moe_intermediate_size"), layers=sparse,
              shared_experts=1 if cfg.get("shared_expert_intermediate_size") else 0,
              shared_intermediate=cfg.get("shared_expert_intermediate_size") or 0,
              shared_gate=bool(cfg.get("shared_expert_intermediate_size")))
    return _decoder(cfg, qkv_bias=bool(cfg.get("qkv_bias", True)), o_bias=False, moe=moe)


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
}


def from_config(cfg: dict[str, Any], name: str = "") -> Architecture:
    """Normalise a Hugging Face config dict into an Architecture."""
    if not isinstance(cfg, dict):
        raise GpuwiseError("config.json is not a JSON object", "pass a Hugging Face config.json")
    if "text_config" in cfg and "hidden_size" not in cfg:
        if not isinstance(cfg["text_config"], dict):
            raise GpuwiseError("config.json: text_config is not a JSON object",
                               "pass a Hugging Face config.json")
        cfg = {**cfg["text_config"], "architectures": cfg.get("architectures")}
    model_type = _get(cfg, "model_type")
    if model_type not in SUPPORTED_TYPES:
        raise GpuwiseError(
            f"model_type {shown(repr(model_type))} is not a family gpuwise knows",
            f"supported: {', '.join(SUPPORTED_TYPES)}",
        )
    check_config(cfg, model_type)
    fields = READERS[model_type](cfg)
    check_read(fields, cfg)
    return Architecture(name=name or cfg.get("_name_or_path", "") or model_type,
                        model_type=model_type, config=cfg, **fields)
