"""Architecture facts of a decoder-only transformer, normalised across families (read from a
Hugging Face config.json by `families.from_config`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    router_bias: bool = False  # deepseek_v3 e_score_correction_bias; gpt_oss's router bias
    expert_bias: bool = False  # gpt_oss: every expert's gate/up and down projections have biases


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
    # Layers whose cache keeps only the last `sliding_window` positions: sliding-window layers,
    # or chunked-attention layers (Llama 4, `attention_chunk` set), whose cache transformers
    # keeps as it keeps a sliding one ("from a cache point of view, sliding and chunked are the
    # same", cache_utils.py), so the KV cache rules need not tell them apart.
    sliding_window: int | None = None
    sliding_layers: int = 0
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    moe: MoE | None = None
    mla: MLA | None = None
    norms_per_layer: int = 2
    qk_norm: bool = False  # a norm with weights on the queries and on the keys
    qk_norm_all_heads: bool = False  # OLMo-2: over all heads' width; else one head's (Qwen3)
    attention_sinks: bool = False  # gpt_oss: one learned sink logit a head, every layer
    # Llama 4: the `sliding_layers` attend within chunks of this many positions (None: no
    # chunked attention; the sliding layers, if any, slide).
    attention_chunk: int | None = None
    # A vision-language config's model_type (llama4, gemma3, mistral3) when this is its language
    # model: the vision tower and projector are not counted nor estimated.
    multimodal: str = ""
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
    def windowed_layers(self) -> int:
        """How many layers keep only a window of positions (sliding or chunked attention)."""
        return self.sliding_layers if self.sliding_window else 0

    @property
    def chunked_layers(self) -> int:
        """How many layers attend within chunks of `attention_chunk` positions (Llama 4)."""
        return self.sliding_layers if self.attention_chunk else 0

    @property
    def attention_kind(self) -> str:
        if self.mla:
            return "MLA"
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"
