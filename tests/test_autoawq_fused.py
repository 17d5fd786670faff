"""AutoAWQ's own loader with fused layers (`InferencePlan.fuse_layers`, quant_workspace.py):
the KV cache is allocated whole at load for max_seq_len positions, and fusing holds a second
copy of every layer's q, k and v until the last layer is fused. Each test fails if the rule
were missing or wrong."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.estimate.memory.quant_workspace import fused_cache_positions, fused_qkv_copy_bytes
from gpuwise.estimate.runtimes import estimate_inference
from gpuwise.workload import from_config
from gpuwise.workload.plans import InferencePlan

RTX4090 = find_hardware("rtx-4090")
LLAMA8 = from_config(resolve_model("llama-3.1-8b").config)
SHORT = InferencePlan(batch=1, prompt_tokens=64, new_tokens=64, weights="int4",
                      quant_kernel="awq-gemm", context_alloc=64, fuse_layers=True)


def _qkv_int4_bytes() -> float:
    # AWQ GEMM: 4-bit weights, an fp16 scale and a 4-bit zero per 128 inputs (2.5 bytes).
    params = LLAMA8.hidden_size * (LLAMA8.q_dim + 2 * LLAMA8.kv_dim)
    return LLAMA8.num_layers * params * (0.5 + 2.5 / 128)


def _cache_bytes(batch: int, positions: int) -> float:
    return LLAMA8.num_layers * 2 * LLAMA8.kv_dim * positions * batch * 2  # fp16 keys, values


def test_fusing_holds_a_second_copy_of_q_k_v_at_load():
    assert fused_qkv_copy_bytes(LLAMA8, SHORT) == pytest.approx(_qkv_int4_bytes())
    fused = estimate_inference(LLAMA8, SHORT, RTX4090)
    plain = estimate_inference(LLAMA8, replace(SHORT, fuse_layers=False), RTX4090)
    assert fused.peak_phase == "load"
    assert fused.breakdown["workspace"] == pytest.approx(_qkv_int4_bytes(), abs=1)
    # Short prompts: the load's copy is the process's peak, far above generate()'s.
    weights = fused.breakdown["weights"]
    assert fused.allocated_bytes >= weights + _qkv_int4_bytes()
    assert fused.allocated_bytes - plain.allocated_bytes > 0.9 * _qkv_int4_bytes()


def test_fused_cache_is_allocated_whole_and_never_grows():
    long = replace(SHORT, prompt_tokens=2048, new_tokens=2048, context_alloc=2048)
    fused = estimate_inference(LLAMA8, long, RTX4090)
    assert fused.breakdown["kv_cache"] == pytest.approx(_cache_bytes(1, 2048), abs=1)
    # transformers' DynamicCache would hold prompt + new - 1 positions at the end instead.
    plain = estimate_inference(LLAMA8, replace(long, fuse_layers=False), RTX4090)
    assert plain.breakdown["kv_cache"] > 1.9 * _cache_bytes(1, 2048)
    # The window, not the tokens generated, sizes it: a 64-position cache at load.
    short = estimate_inference(LLAMA8, replace(SHORT, batch=8), RTX4090)
    assert short.breakdown["kv_cache"] == pytest.approx(_cache_bytes(8, 64), abs=1)


def test_fused_cache_defaults_to_the_models_positions():
    plan = replace(SHORT, context_alloc=None)
    assert fused_cache_positions(LLAMA8, plan) == LLAMA8.max_position
    no_limit = replace(LLAMA8, max_position=None)
    assert fused_cache_positions(no_limit, plan) == 2048  # AutoAWQ's fallback
