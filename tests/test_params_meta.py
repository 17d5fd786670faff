"""Exact parameter counts against the real model built by transformers on the meta device."""

import pytest

from gpuwise.catalog.models import load_models
from gpuwise.workload import count_params, from_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.torch


def _real_count(config: dict) -> int:
    """transformers' count of the model a config builds; for a vision-language config (llama4,
    gemma3, mistral3), of its language model (text_config), which is what gpuwise counts."""
    if "text_config" in config and "hidden_size" not in config:
        config = config["text_config"]
    cfg = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k != "auto_map"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("entry", load_models(), ids=lambda e: e.id)
def test_catalogue_param_count_is_exact(entry):
    config = entry.load_config()
    assert count_params(from_config(config)).total == _real_count(config)


@pytest.mark.parametrize(
    "entry", [e for e in load_models() if e.published_params], ids=lambda e: e.id
)
def test_catalogue_matches_published_count(entry):
    assert count_params(from_config(entry.load_config())).total == entry.published_params


SMALL = dict(
    hidden_size=64,
    intermediate_size=176,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    vocab_size=97,
)
VARIANTS = {
    "llama-bias": dict(SMALL, model_type="llama", attention_bias=True, mlp_bias=True),
    "llama-untied-headdim": dict(SMALL, model_type="llama", head_dim=24, tie_word_embeddings=False),
    "mistral-mqa": dict(SMALL, model_type="mistral", num_key_value_heads=1),
    "gemma2": dict(SMALL, model_type="gemma2", head_dim=32),
    "phi-partial": dict(SMALL, model_type="phi", num_key_value_heads=4, partial_rotary_factor=0.4),
    "neox-serial": dict(
        SMALL,
        model_type="gpt_neox",
        num_key_value_heads=4,
        use_parallel_residual=False,
        tie_word_embeddings=True,
    ),
    "falcon-new-arch": dict(
        hidden_size=64,
        num_attention_heads=8,
        num_kv_heads=2,
        num_hidden_layers=2,
        vocab_size=97,
        new_decoder_architecture=True,
        model_type="falcon",
    ),
    "falcon-serial-bias": dict(
        hidden_size=64,
        num_attention_heads=4,
        num_hidden_layers=2,
        vocab_size=97,
        parallel_attn=False,
        bias=True,
        model_type="falcon",
    ),
    "bigcode-mha": dict(
        n_embd=64,
        n_layer=2,
        n_head=4,
        vocab_size=97,
        n_positions=32,
        multi_query=False,
        model_type="gpt_bigcode",
    ),
    "qwen2-moe-sparse-step": dict(
        SMALL,
        model_type="qwen2_moe",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=48,
        shared_expert_intermediate_size=96,
        decoder_sparse_step=2,
    ),
    "deepseek-v3-qlora": dict(
        SMALL,
        model_type="deepseek_v3",
        num_key_value_heads=4,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=48,
        n_shared_experts=1,
        first_k_dense_replace=1,
        kv_lora_rank=32,
        q_lora_rank=24,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_group=2,
        topk_group=1,
    ),
    "qwen3-untied": dict(SMALL, model_type="qwen3", head_dim=24, tie_word_embeddings=False),
    "qwen3-moe-dense-layers": dict(
        SMALL,
        model_type="qwen3_moe",
        num_hidden_layers=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=48,
        decoder_sparse_step=2,
        mlp_only_layers=[3],
    ),
    "gpt-oss": dict(
        SMALL,
        model_type="gpt_oss",
        num_hidden_layers=3,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=8,
    ),
    "llama4-interleaved": dict(
        SMALL,
        model_type="llama4_text",
        num_hidden_layers=4,
        head_dim=16,
        intermediate_size_mlp=96,
        num_local_experts=4,
        num_experts_per_tok=1,
        interleave_moe_layer_step=2,
        attention_chunk_size=16,
    ),
    "llama4-moe-layers-bias": dict(
        SMALL,
        model_type="llama4_text",
        num_hidden_layers=3,
        head_dim=16,
        intermediate_size_mlp=96,
        num_local_experts=3,
        moe_layers=[0, 2],
        attention_bias=True,
    ),
    "gemma3-text": dict(SMALL, model_type="gemma3_text", head_dim=32, num_hidden_layers=7),
    "phimoe-bias": dict(
        SMALL,
        model_type="phimoe",
        num_local_experts=4,
        num_experts_per_tok=2,
        attention_bias=True,
        lm_head_bias=True,
    ),
    "olmo2-gqa": dict(SMALL, model_type="olmo2"),
    "olmo3": dict(SMALL, model_type="olmo3", num_hidden_layers=5, sliding_window=8),
    "glm4": dict(SMALL, model_type="glm4", head_dim=16, pad_token_id=0),
    "granite-bias": dict(SMALL, model_type="granite", attention_bias=True, mlp_bias=True),
    "smollm3-sliding": dict(SMALL, model_type="smollm3", use_sliding_window=True,
                            sliding_window=8, num_hidden_layers=4, pad_token_id=0),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_layout_variants_are_exact(name):
    config = transformers.AutoConfig.for_model(**VARIANTS[name]).to_dict()
    assert count_params(from_config(config)).total == _real_count(config)


def test_moe_active_params_mixtral():
    entry = next(e for e in load_models() if e.id == "mixtral-8x7b")
    counts = count_params(from_config(entry.load_config()))
    # Mixtral 8x7B: 46.7B total, about 12.9B active per token (2 of 8 experts).
    assert counts.total == 46_702_792_704
    assert 12.8e9 < counts.active < 13.0e9
