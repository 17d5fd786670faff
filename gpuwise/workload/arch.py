"""Architecture facts read from a Hugging Face config.json, normalised across families."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuwise.errors import GpuwiseError

# Families whose layout gpuwise knows exactly (parameter count tested against transformers).
SUPPORTED_TYPES = (
    "gpt2", "gpt_neox", "gpt_bigcode", "llama", "mistral", "qwen2", "gemma", "gemma2",
    "phi", "phi3", "falcon", "mixtral", "qwen2_moe", "deepseek_v2", "deepseek_v3",
)  # fmt: skip


@dataclass(frozen=True)
class MoE:
    """Mixture-of-experts facts; `layers` is how many decoder layers are sparse."""

    num_experts: int
    experts_per_token: int
    expert_intermediate: int
    layers: int
    shared_experts: int = 0
    shared_intermediate: int = 0
    shared_gate: bool = False  # qwen2_moe gates the shared expert with a d x 1 linear
    router_bias: bool = False  # deepseek_v3 e_score_correction_bias


@dataclass(frozen=True)
class MLA:
    """DeepSeek multi-head latent attention dimensions."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class Architecture:
    """The facts of a decoder-only transformer that decide its size and memory."""

    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position: int
    tie_embeddings: bool
    gated_mlp: bool
    activation: str
    norm: str  # "rms" or "layer"
    norm_bias: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    lm_head_bias: bool
    parallel_residual: bool
    position: str  # "rope" or "learned"
    rotary_dim: int
    sliding_window: int | None = None
    sliding_layers: int = 0
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    moe: MoE | None = None
    mla: MLA | None = None
    norms_per_layer: int = 2
    qk_norm: bool = False
    conv1d: bool = False  # GPT-2's Conv1D: layer weights stored (in, out), run as x @ W
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def q_dim(self) -> int:
        if self.mla:
            return self.num_heads * (self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim)
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection output per token."""
        return self.num_kv_heads * self.head_dim

    def kv_cache_elements_per_token(self, layer_kind: str = "all") -> int:
        """Key + value elements stored per token per layer by a transformers cache."""
        if self.mla:
            m = self.mla
            return self.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
        return 2 * self.num_kv_heads * self.head_dim

    @property
    def attention_kind(self) -> str:
        if self.mla:
            return "MLA"
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"


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


def _positive(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise GpuwiseError(
            f"config.json field {name!r} must be a positive integer, got {value!r}",
            "fix the config file",
        )
    return value


def from_config(cfg: dict[str, Any], name: str = "") -> Architecture:
    """Normalise a Hugging Face config dict into an Architecture."""
    if not isinstance(cfg, dict):
        raise GpuwiseError("config.json is not a JSON object", "pass a Hugging Face config.json")
    if "text_config" in cfg and "hidden_size" not in cfg:
        cfg = {**cfg["text_config"], "architectures": cfg.get("architectures")}
    model_type = _get(cfg, "model_type")
    if model_type not in SUPPORTED_TYPES:
        raise GpuwiseError(
            f"model_type {model_type!r} is not a family gpuwise knows",
            f"supported: {', '.join(SUPPORTED_TYPES)}",
        )
    from gpuwise.workload import families

    fields = families.read(model_type, cfg)
    for key in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                "intermediate_size", "vocab_size"):  # fmt: skip
        _positive(key, fields[key])
    if fields["num_heads"] % fields["num_kv_heads"]:
        raise GpuwiseError(
            f"num_attention_heads ({fields['num_heads']}) is not a multiple of "
            f"num_key_value_heads ({fields['num_kv_heads']})",
            "fix the config file",
        )
    return Architecture(name=name or cfg.get("_name_or_path", "") or model_type,
                        model_type=model_type, config=cfg, **fields)  # fmt: skip
