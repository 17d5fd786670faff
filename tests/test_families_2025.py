"""The families of 2025 (Qwen3, Qwen3-MoE, gpt-oss, Llama 4, Gemma 3, Mistral Small 3.1, Phi-4,
OLMo 2, DeepSeek-V3/R1): what each reader makes of its config, the KV cache its sliding or
chunked layers keep, and the parameters a token uses. Parameter totals against transformers:
tests/test_params_meta.py (every catalogue entry and a small config of each family)."""

from __future__ import annotations

import pytest
from catalogue_archs import arch

from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.errors import GpuwiseError
from gpuwise.estimate import InferencePlan, estimate_inference, kv_cache_bytes
from gpuwise.workload import count_params, from_config
from gpuwise.workload.ops import Shape, forward_ops

BF16 = 2.0


def _kv(name: str, tokens: int, batch: int = 1) -> float:
    return kv_cache_bytes(arch(name), batch, tokens, BF16)


def _per_layer_position(name: str) -> float:
    return arch(name).kv_cache_elements_per_token() * BF16


# --- the KV cache of sliding and chunked layers ---------------------------------------------


def test_gpt_oss_sliding_layers_keep_128_positions():
    a = arch("gpt-oss-20b")
    assert (a.sliding_window, a.sliding_layers, a.num_layers) == (128, 12, 24)
    assert a.attention_chunk is None and a.chunked_layers == 0
    per = _per_layer_position("gpt-oss-20b")
    assert per == 2 * 8 * 64 * BF16
    # 12 full layers hold every position, 12 sliding ones 128: at 32k about half a dense cache
    assert _kv("gpt-oss-20b", 32_768) == per * (12 * 32_768 + 12 * 128)
    assert _kv("gpt-oss-20b", 100) == per * 24 * 100  # within the window every layer holds all
    assert _kv("gpt-oss-120b", 8192, batch=3) == 3 * per * (18 * 8192 + 18 * 128)


def test_gemma3_five_sliding_layers_to_one_global():
    a = arch("gemma-3-27b")
    assert (a.num_layers, a.sliding_layers, a.sliding_window) == (62, 52, 1024)
    per = _per_layer_position("gemma-3-27b")
    assert per == 2 * 16 * 128 * BF16
    assert _kv("gemma-3-27b", 8192) == per * (10 * 8192 + 52 * 1024)
    one = arch("gemma-3-1b")
    assert (one.num_layers, one.sliding_layers, one.sliding_window) == (26, 22, 512)
    assert _kv("gemma-3-1b", 4096) == _per_layer_position("gemma-3-1b") * (4 * 4096 + 22 * 512)


def test_gemma3_layer_types_and_the_pattern_agree():
    """The hub's raw configs give sliding_window_pattern 6; transformers' re-serialised ones list
    layer_types (layer i slides unless (i + 1) % 6 == 0): both read the same."""
    text = dict(arch("gemma-3-12b").config)
    pattern = from_config(text)
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(48)]
    listed = from_config({**text, "sliding_window_pattern": None, "layer_types": types})
    assert pattern.sliding_layers == listed.sliding_layers == 40
    assert from_config({**text, "sliding_window_pattern": 2}).sliding_layers == 24


def test_llama4_chunked_layers_keep_at_most_the_chunk():
    for name, experts, moe_layers in (("llama-4-scout", 16, 48), ("llama-4-maverick", 128, 24)):
        a = arch(name)
        assert a.multimodal == "llama4" and a.model_type == "llama4_text"
        # every 4th layer is NoPE and attends to everything; the other 36 within 8,192-chunks
        assert (a.attention_chunk, a.chunked_layers, a.sliding_window) == (8192, 36, 8192)
        assert a.moe is not None and (a.moe.num_experts, a.moe.layers) == (experts, moe_layers)
        per = _per_layer_position(name)
        assert _kv(name, 100_000) == per * (12 * 100_000 + 36 * 8192)
        assert _kv(name, 5000) == per * 48 * 5000
    # no chunk size: every layer attends to every position
    text = {**arch("llama-4-scout").config, "attention_chunk_size": None}
    assert from_config(text).sliding_layers == 0


def test_transformers_memory_keeps_only_the_windows():
    """The estimate users get: at a 32k context gpt-oss's cache is the full layers' and the
    windows', not 24 layers of 32k."""
    a, h100 = arch("gpt-oss-20b"), find_hardware("h100-sxm")
    plan = InferencePlan(batch=1, prompt_tokens=32_000, new_tokens=1, weights="bf16")
    est = estimate_inference(a, plan, h100)
    assert est.breakdown["kv_cache"] == kv_cache_bytes(a, 1, 32_000, BF16)
    assert est.breakdown["kv_cache"] < 0.51 * 24 * 32_000 * _per_layer_position("gpt-oss-20b")
    assert any("12 sliding-window layers keep 128" in n for n in est.notes)


# --- parameters a token uses ----------------------------------------------------------------


def _expert(d: int, inner: int, bias: bool = False) -> int:
    return 3 * d * inner + ((2 * inner + d) if bias else 0)


def test_qwen3_moe_active_parameters():
    c = count_params(arch("qwen3-30b-a3b"))
    assert c.total == 30_532_122_624
    # 48 sparse layers each leave 128 - 8 experts unused
    assert c.active == c.total - 48 * 120 * _expert(2048, 768)
    assert c.expert == 48 * 128 * _expert(2048, 768)
    assert 3.3e9 < c.active < 3.4e9  # model card: 3.3B activated
    big = count_params(arch("qwen3-235b-a22b"))
    assert big.active == big.total - 94 * 120 * _expert(4096, 1536)
    assert 22.0e9 < big.active < 22.3e9  # model card: 22B activated


def test_qwen3_moe_dense_layers_by_step_and_list():
    text = dict(arch("qwen3-30b-a3b").config)
    assert from_config(text).moe.layers == 48
    assert from_config({**text, "decoder_sparse_step": 2}).moe.layers == 24
    stepped = from_config({**text, "decoder_sparse_step": 2, "mlp_only_layers": [1, 3, 4]})
    assert stepped.moe.layers == 22  # layers 1 and 3 were sparse; 4 never was
    dense = count_params(stepped).total - count_params(from_config(text)).total
    moe_layer = 128 * _expert(2048, 768) + 2048 * 128
    assert dense == 26 * (_expert(2048, 6144) - moe_layer)


def test_llama4_active_parameters_count_the_shared_and_dense_layers():
    scout = count_params(arch("llama-4-scout"))
    assert scout.total == 107_769_861_120
    assert scout.active == scout.total - 48 * 15 * _expert(5120, 8192)
    assert 17.0e9 < scout.active < 17.3e9  # model card: 17B activated
    maverick = count_params(arch("llama-4-maverick"))
    assert maverick.total == 400_711_848_960
    assert maverick.active == maverick.total - 24 * 127 * _expert(5120, 8192)
    assert 17.0e9 < maverick.active < 17.3e9  # model card: 17B activated, 400B total


def test_gpt_oss_active_parameters_match_the_model_card():
    """OpenAI's active counts leave the input embedding out (a lookup, no matmul)."""
    for name, low, high in (("gpt-oss-20b", 3.6e9, 3.62e9), ("gpt-oss-120b", 5.1e9, 5.14e9)):
        a = arch(name)
        c = count_params(a)
        assert low < c.active - a.vocab_size * a.hidden_size < high
        assert a.moe is not None and a.moe.router_bias and a.moe.expert_bias
        assert c.active == c.total - a.num_layers * (a.moe.num_experts - 4) * _expert(
            2880, 2880, bias=True)


def test_deepseek_v3_and_r1_are_one_architecture_of_671b():
    v3, r1 = count_params(arch("deepseek-v3")), count_params(arch("deepseek-r1"))
    assert v3 == r1 and v3.total == 671_026_404_352  # model card: 671B, the MTP layer aside
    assert 37.0e9 < v3.active < 38.0e9  # model card: 37B activated


# --- what the readers make of the rest --------------------------------------------------------


def test_qk_norms_per_head_or_across_heads():
    q3, olmo = arch("qwen3-8b"), arch("olmo-2-7b")
    assert q3.qk_norm and not q3.qk_norm_all_heads
    assert olmo.qk_norm and olmo.qk_norm_all_heads
    without = count_params(from_config({**q3.config, "model_type": "llama"})).total
    assert count_params(q3).total - without == 36 * 2 * 128  # one head's width, q and k
    o = count_params(olmo).attention - 32 * 4 * 4096 * 4096
    assert o == 32 * (4096 + 4096)  # all heads' width, q and k


def test_the_vision_tower_is_said_not_counted():
    for name, outer in (("gemma-3-4b", "gemma3"), ("mistral-small-3.1", "mistral3"),
                        ("llama-4-scout", "llama4")):
        assert arch(name).multimodal == outer
    for name in ("gemma-3-1b", "qwen3-8b", "phi-4"):
        assert arch(name).multimodal == ""


def test_a_hub_gemma3_text_config_takes_transformers_defaults():
    """google/gemma-3-4b-it's text_config names four fields; the rest are Gemma3TextConfig's."""
    sparse = {"model_type": "gemma3", "text_config": {
        "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
        "num_hidden_layers": 34, "sliding_window": 1024}}
    a = from_config(sparse)
    assert (a.num_heads, a.num_kv_heads, a.head_dim, a.vocab_size) == (8, 4, 256, 262_208)
    assert a.tie_embeddings and a.sliding_layers == 29
    assert count_params(a) == count_params(arch("gemma-3-4b"))


def test_phi4_reads_as_phi3():
    a = arch("phi-4")
    assert a.model_type == "phi3" and (a.num_heads, a.num_kv_heads, a.head_dim) == (40, 10, 128)
    assert count_params(a).total == 14_659_507_200


def test_moe_layers_and_qk_norms_reach_the_op_list():
    maverick = arch("llama-4-maverick")
    ops = forward_ops(maverick, Shape(batch=1, tokens=1, context=64, compute_bytes=2,
                                      weight_bytes=2, kv_bytes=2))
    router = next(op for op in ops if op.name == "router")
    dense = [op for op in ops if op.name == "mlp_in" and op.n == 2 * 16_384]
    assert router.count == 24 and len(dense) == 1 and dense[0].count == 24
    assert not any(op.name == "qk_norm" for op in ops)  # Llama 4's q/k norm has no weights
    q3 = forward_ops(arch("qwen3-8b"), Shape(1, 1, 64, 2, 2, 2))
    qk = [op for op in q3 if op.name == "qk_norm"]
    assert len(qk) == 1 and qk[0].count == 36
    assert not any(op.name == "qk_norm" for op in forward_ops(arch("llama-3.1-8b"),
                                                                 Shape(1, 1, 64, 2, 2, 2)))


@pytest.mark.parametrize("key, value", [("attention_chunk_size", -1),
                                        ("interleave_moe_layer_step", 0),
                                        ("num_local_experts", 10**9)])
def test_nonsense_in_a_llama4_config_is_refused(key, value):
    text = {**arch("llama-4-scout").config, key: value}
    with pytest.raises(GpuwiseError, match=key):
        from_config(text)


def test_paged_pools_keep_windowed_layers_to_their_window():
    """vLLM's hybrid KV cache manager gives gpt-oss's 12 sliding layers only their last 128
    positions, so its pool holds twice the positions of one that keeps every layer's; SGLang's
    hybrid SWA pool keeps 0.8 of a token on those layers for each full layer's token."""
    from gpuwise.estimate.memory.serving_runtimes import vllm_pool
    from gpuwise.estimate.memory.sglang_memory import sglang_budget
    from gpuwise.estimate.runtimes import runtime_unit

    arch = from_config(resolve_model("gpt-oss-20b").config)
    hw = find_hardware("h100")
    assert arch.sliding_layers == 12 and arch.num_layers == 24
    every = InferencePlan(runtime="vllm").kv_bytes_per_position(arch)
    plan = InferencePlan(runtime="vllm")
    pool = vllm_pool(arch, plan, hw)[3]
    assert runtime_unit("vllm").kv_positions(arch, plan, hw, 1, 256) == int(pool // (every / 2))
    splan = InferencePlan(runtime="sglang")
    spool = sglang_budget(arch, splan, hw, 1).pool
    assert runtime_unit("sglang").kv_positions(arch, splan, hw, 1, 256) == int(
        spool // (every * (12 + 0.8 * 12) / 24))


@pytest.mark.parametrize("arch_name,model_type", [("qwen3", "qwen3"), ("qwen3moe", "qwen3_moe"),
                                                  ("gemma3", "gemma3_text")])
def test_a_gguf_file_of_a_new_family_reads_as_its_family(tmp_path, arch_name, model_type):
    """A GGUF file (llama.cpp's `{arch}.*` keys, as convert_hf_to_gguf.py writes them) of
    Qwen3, Qwen3-MoE or Gemma 3 gives that family's Architecture, its experts included."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    from gpuwise.catalog.checkpoints import read_checkpoint

    path = tmp_path / f"{arch_name}.gguf"
    w = gguf.GGUFWriter(str(path), arch_name)
    for key, value in (("block_count", 2), ("context_length", 4096), ("embedding_length", 64),
                       ("feed_forward_length", 128), ("attention.head_count", 4),
                       ("attention.head_count_kv", 2), ("attention.key_length", 16)):
        w.add_uint32(f"{arch_name}.{key}", value)
    if arch_name == "qwen3moe":
        w.add_uint32("qwen3moe.expert_count", 8)
        w.add_uint32("qwen3moe.expert_used_count", 2)
        w.add_uint32("qwen3moe.expert_feed_forward_length", 32)
    if arch_name == "gemma3":
        w.add_uint32("gemma3.attention.sliding_window", 512)
    w.add_tensor("token_embd.weight", np.zeros((96, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    arch = from_config(read_checkpoint(path).config)
    assert arch.model_type == model_type and arch.num_layers == 2 and arch.head_dim == 16
    if model_type == "qwen3_moe":
        assert arch.moe is not None and arch.moe.num_experts == 8
        assert arch.moe.experts_per_token == 2 and arch.moe.expert_intermediate == 32
    if model_type == "gemma3_text":
        assert arch.sliding_window == 512 and arch.sliding_layers == 2  # layers 1-5 of 6 slide
