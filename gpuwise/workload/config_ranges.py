"""A config.json checked against the ranges real models have (catalog/data/config_ranges.toml)
before its fields are read, and what was read checked for facts that must hold together (a
token cannot use more experts than there are), so nonsense is one clear line, never an answer.
"""

from __future__ import annotations

from typing import Any

from gpuwise.catalog.config_ranges import ConfigRange, config_ranges
from gpuwise.errors import GpuwiseError
from gpuwise.files import shown

HINT = "fix the config file (gpuwise's ranges: catalog/data/config_ranges.toml)"

# config.json key -> the range it must lie in, for every family.
COMMON_KEYS = {
    "hidden_size": "hidden_size", "n_embd": "hidden_size", "d_model": "hidden_size",
    "num_hidden_layers": "num_layers", "n_layer": "num_layers",
    "num_attention_heads": "num_heads", "n_head": "num_heads",
    "num_key_value_heads": "num_heads", "num_kv_heads": "num_heads",
    "head_dim": "head_dim",
    "intermediate_size": "intermediate_size", "n_inner": "intermediate_size",
    "ffn_hidden_size": "intermediate_size",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "max_position", "n_positions": "max_position",
    "sliding_window": "sliding_window", "max_window_layers": "layer_count",
    "partial_rotary_factor": "rotary_fraction", "rotary_pct": "rotary_fraction",
    "rope_theta": "rope_theta",
    "attention_dropout": "dropout", "hidden_dropout": "dropout", "attn_pdrop": "dropout",
    "resid_pdrop": "dropout",
}
_DEEPSEEK = {
    "n_routed_experts": "experts", "num_experts_per_tok": "experts",
    "moe_intermediate_size": "intermediate_size", "n_shared_experts": "shared_experts",
    "moe_layer_freq": "layer_step", "first_k_dense_replace": "layer_count",
    "q_lora_rank": "latent_rank", "kv_lora_rank": "latent_rank",
    "qk_nope_head_dim": "head_dim", "qk_rope_head_dim": "head_dim", "v_head_dim": "head_dim",
}
# The keys only some families read (MoE and MLA), checked only there.
FAMILY_KEYS = {
    "mixtral": {"num_local_experts": "experts", "num_experts_per_tok": "experts"},
    "qwen2_moe": {"num_experts": "experts", "num_experts_per_tok": "experts",
                  "moe_intermediate_size": "intermediate_size",
                  "shared_expert_intermediate_size": "intermediate_size",
                  "decoder_sparse_step": "layer_step"},
    "deepseek_v2": _DEEPSEEK, "deepseek_v3": _DEEPSEEK,
    "phimoe": {"num_local_experts": "experts", "num_experts_per_tok": "experts"},
    "gpt_oss": {"num_local_experts": "experts", "num_experts_per_tok": "experts",
                "experts_per_token": "experts"},
    "llama4_text": {"num_local_experts": "experts", "num_experts_per_tok": "experts",
                    "intermediate_size_mlp": "intermediate_size",
                    "interleave_moe_layer_step": "layer_step",
                    "attention_chunk_size": "sliding_window",
                    "no_rope_layer_interval": "layer_step"},
    "gemma3_text": {"sliding_window_pattern": "layer_step", "_sliding_window_pattern": "layer_step"},
    "smollm3": {"no_rope_layer_interval": "layer_step"},
}
FAMILY_KEYS["qwen3_moe"] = {"num_local_experts": "experts",
                            **{k: v for k, v in FAMILY_KEYS["qwen2_moe"].items()
                               if k != "shared_expert_intermediate_size"}}
FAMILY_KEYS["qwen2_moe"]["num_local_experts"] = "experts"
# Keys whose 0 means "none" in real configs (Qwen2-MoE test configs write sliding_window 0).
ZERO_IS_NONE = ("sliding_window", "shared_expert_intermediate_size")
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
LIST_KEYS = ("layer_types", "mlp_only_layers", "moe_layers", "no_rope_layers")
STRING_KEYS = ("hidden_act", "hidden_activation", "activation_function")


def _shown(value: object) -> str:
    """A config value as a message shows it (a huge one cut short)."""
    return shown(repr(value) if isinstance(value, str) else str(value), 40)


def _refuse(key: str, value: object, rng: ConfigRange) -> GpuwiseError:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and (isinstance(value, int) or not rng.integer):
        what = f"is outside {rng.text()}"
    else:
        what = f"must be {'an integer' if rng.integer else 'a number'} in {rng.text()}"
    return GpuwiseError(f"config.json: {key} {_shown(value)} {what} ({rng.real})", HINT)


def check_config(cfg: dict[str, Any], model_type: str) -> None:
    """Every numeric field the family's reader takes, in its range (None: absent)."""
    ranges = config_ranges()
    keys = {**COMMON_KEYS, **FAMILY_KEYS.get(model_type, {})}
    for key, range_name in keys.items():
        value = cfg.get(key)
        if value is None or (key in ZERO_IS_NONE and value == 0):
            continue
        if not ranges[range_name].holds(value):
            raise _refuse(key, value, ranges[range_name])
    for names, kind, what in ((LIST_KEYS, list, "a list"), (STRING_KEYS, str, "a string"),
                              (("rope_parameters",), dict, "an object")):
        for key in names:
            if cfg.get(key) is not None and not isinstance(cfg[key], kind):
                raise GpuwiseError(f"config.json: {key} must be {what}, got {_shown(cfg[key])}",
                                   HINT)
    rope = cfg.get("rope_parameters")
    if rope:
        for key, range_name in (("partial_rotary_factor", "rotary_fraction"),
                                ("rope_theta", "rope_theta")):
            value = rope.get(key)
            if value is not None and not ranges[range_name].holds(value):
                raise _refuse(f"rope_parameters.{key}", value, ranges[range_name])


def check_read(fields: dict[str, Any], cfg: dict[str, Any]) -> None:
    """What the reader made of the config: derived sizes in range, and facts that must hold
    together (active experts at most the experts, sliding layers at most the layers)."""
    ranges = config_ranges()
    if not ranges["head_dim"].holds(fields["head_dim"]):
        raise GpuwiseError(
            f"config.json: hidden_size {_shown(fields['hidden_size'])} over "
            f"{fields['num_heads']} attention heads leaves head_dim {_shown(fields['head_dim'])}, "
            f"outside {ranges['head_dim'].text()} ({ranges['head_dim'].real})", HINT)
    for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                 "vocab_size"):
        rng = ranges["num_heads" if name == "num_kv_heads" else name]
        if not rng.holds(fields[name]):
            raise _refuse(name, fields[name], rng)
    heads, kv = fields["num_heads"], fields["num_kv_heads"]
    if heads % kv:
        raise GpuwiseError(f"num_attention_heads ({heads}) is not a multiple of "
                           f"num_key_value_heads ({kv})", "fix the config file")
    if fields["sliding_layers"] > fields["num_layers"]:
        raise GpuwiseError(f"config.json: layer_types names {fields['sliding_layers']} sliding "
                           f"layers of {fields['num_layers']}", HINT)
    moe = fields.get("moe")
    if moe is not None:
        key = next((k for k in EXPERT_KEYS if cfg.get(k) is not None), "num_experts")
        if not ranges["experts"].holds(moe.num_experts):
            raise _refuse(key, moe.num_experts, ranges["experts"])
        if moe.experts_per_token > moe.num_experts:
            raise GpuwiseError(
                f"config.json: num_experts_per_tok {moe.experts_per_token} is more than the "
                f"{moe.num_experts} experts ({key}): a token cannot use more experts than "
                "there are", HINT)
