"""llama.cpp's decode steps in a batch and at a depth (estimate/speed/ggml_time.py,
measure/llama_cpp/fit.py fit_decode): the probe's measured decode steps are reproduced by the
step model they were fitted to, and a CPU's small batches cost what they measured."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuwise.catalog.hardware import find_hardware
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.estimate.speed.ggml_step import GgmlStep
from gpuwise.estimate.speed.ggml_time import (
    GgmlRates,
    chunk_pairs,
    decode_attention_rate,
    matmul_flops,
    matmul_seconds,
    weights_read,
)
from gpuwise.measure.llama_cpp.fit import ModelTiming, fit_decode, llama_arch, timing_plans

ARCH = llama_arch(1280, 4, 10, 2, 3456, 32000)
RATES = {"weight_bytes_per_s": 30e9, "kv_bytes_per_s": 30e9, "matmul_flops": 300e9,
         "attention_flops": 300e9, "layer_s": 8e-6, "token_s": 0.0, "layer_token_s": 5e-6}


def _timing() -> ModelTiming:
    pp, tg = timing_plans("q4_0", 150_000_000, 23_000_000, 256, 32, 2)
    return ModelTiming(ARCH, pp, tg, 1.0, 0.004)


def test_fit_decode_recovers_the_rates_the_steps_were_made_with():
    att1, att4, mm4, depth = 12e9, 30e9, 60e9, 512
    fixed = ARCH.num_layers * RATES["layer_s"]
    per_position = 4.0 * ARCH.num_layers * ARCH.q_dim
    one = 0.004
    steps = {"d0/s1": one, f"d{depth}/s1": one + per_position * depth / att1,
             "d0/s4": fixed + matmul_flops(ARCH, 4) / mm4}
    steps[f"d{depth}/s4"] = steps["d0/s4"] + 4 * per_position * depth / att4
    got = fit_decode(_timing(), RATES, steps, depth, 4)
    assert got["decode_attention_flops"] == pytest.approx(att1)
    assert got["batch_attention_flops"] == pytest.approx(att4)
    assert got["batch_matmul_flops"] == pytest.approx(mm4)


def test_fit_decode_leaves_unresolved_rates_unmeasured():
    got = fit_decode(_timing(), RATES, {"d0/s1": 0.004, "d512/s1": 0.003}, 512, 4)
    assert got == {"decode_attention_flops": 0.0, "batch_attention_flops": 0.0,
                   "batch_matmul_flops": 0.0}


def _g(**kw: float) -> GgmlRates:
    return GgmlRates(**RATES, source="measured", **kw)


def test_a_cpu_batch_pays_each_token_below_four_then_speeds_up_to_prompt_processing():
    g, per_token, single = _g(batch_matmul_flops=60e9), 1e9, 0.04  # one token: 40 ms
    four = 4 * per_token / 60e9
    assert matmul_seconds(g, 1, per_token, single) == pytest.approx(single)
    assert matmul_seconds(g, 2, 2 * per_token, single) == pytest.approx(2 * single)  # 2 gemvs
    assert matmul_seconds(g, 3, 3 * per_token, single) == pytest.approx(3 * single)
    assert matmul_seconds(g, 4, 4 * per_token, single) == pytest.approx(four)  # one gemm
    assert matmul_seconds(g, 5, 5 * per_token, single) == pytest.approx(four + single)
    assert matmul_seconds(g, 512, 512 * per_token, single) == pytest.approx(512 * per_token / 300e9)
    rate_32 = 32 * per_token / matmul_seconds(g, 32, 32 * per_token, single)
    assert 60e9 < rate_32 < 300e9
    assert matmul_seconds(_g(), 4, 4 * per_token, single) == 4 * per_token / 300e9  # unmeasured


def test_decode_attention_is_unmeasured_unless_probed():
    assert decode_attention_rate(_g(), 4) == 0.0
    g = _g(decode_attention_flops=12e9, batch_attention_flops=30e9)
    assert decode_attention_rate(g, 1) == 12e9 and decode_attention_rate(g, 8) == 30e9


def _step(g: GgmlRates) -> GgmlStep:
    from gpuwise.workload.plans import InferencePlan, StoredWeights

    plan = InferencePlan(prompt_tokens=128, new_tokens=32, weights="fp16", runtime="llama.cpp",
                         threads=2, stored_weights=StoredWeights(150_000_000, 23_000_000,
                                                                 "Q4_0 (gguf)", "q4_0"))
    cpu = find_hardware("cpu-cloud-32vcpu")
    rates = replace(rates_from_spec(cpu), compute_units=2, source="measured",
                    ggml_measured={"q4_0/2": {k: getattr(g, k) for k in g.__dataclass_fields__
                                              if k != "source"}})
    return GgmlStep(ARCH, plan, rates)


def test_a_measured_cpu_batch_of_four_costs_what_the_probe_timed():
    mm4, att4 = 60e9, 30e9
    g = _g(batch_matmul_flops=mm4, decode_attention_flops=12e9, batch_attention_flops=att4)
    step = _step(g)
    one = sum(step.parts(1, 0, 0.0))
    four = sum(step.parts(4, 0, 4 * 300.0))
    fixed = ARCH.num_layers * RATES["layer_s"]
    expect = fixed + matmul_flops(ARCH, 4) / mm4 + 4 * 4.0 * ARCH.num_layers * ARCH.q_dim * 300 / att4
    assert four == pytest.approx(expect)
    assert one == pytest.approx(fixed + weights_read(ARCH, step.plan) / RATES["weight_bytes_per_s"])
    assert four > 2 * one  # unlike a GPU's, a CPU's decode batch is not nearly free


def test_prompt_attention_comes_from_a_chunk_at_depth_counted_in_tiles():
    from gpuwise.measure.llama_cpp.fit import fit_rates

    small = ModelTiming(llama_arch(384, 6, 6, 2, 1024, 32000),
                        *timing_plans("q4_0", 20_000_000, 7_000_000, 256, 32, 2), 0.05, 0.001)
    per_position = 4.0 * ARCH.num_layers * ARCH.q_dim
    # ggml-cpu's 64x64 tiles: 4 query tiles after 1 cached position compute 2+3+4+5 tiles,
    # after 1024 they compute 17+18+19+20 (the causal count would say 256 x 1024 pairs)
    tiles = (17 + 18 + 19 + 20) - (2 + 3 + 4 + 5)
    assert chunk_pairs(256, 1024) - chunk_pairs(256, 1) == 4096 * tiles
    steps = {"d0/s1": 0.004, "d1024/s1": 0.004 + per_position * 1024 / 30e9,
             "d0/s1/t256": 0.2, "d1024/s1/t256": 0.2 + per_position * 4096 * tiles / 90e9}
    big = replace(_timing(), decode_steps=steps)
    rates = fit_rates(small, big, 1024, 4, 256)
    assert rates["attention_flops"] == pytest.approx(90e9)
    assert rates["decode_attention_flops"] == pytest.approx(30e9)
    plain = fit_rates(small, replace(big, decode_steps={}))  # not timed: the matmul rate
    assert plain["attention_flops"] == plain["matmul_flops"]


def test_small_chunks_take_the_per_query_path_and_large_ones_whole_tiles():
    assert chunk_pairs(3, 509) == 3 * (509 + 1.5)
    assert chunk_pairs(64, 0) == 4096  # one tile, the causal half of it included
    assert chunk_pairs(512, 0) == 4096 * 36 > 512 * 256


def test_masked_cells_of_another_sequence_come_from_a_chunk_beside_them():
    from gpuwise.measure.llama_cpp.fit import _probe_chunk, fit_rates

    small = ModelTiming(llama_arch(384, 6, 6, 2, 1024, 32000),
                        *timing_plans("q4_0", 20_000_000, 7_000_000, 256, 32, 2), 0.05, 0.001)
    head_s, att = 2e-10, 90e9
    alone, beside = _probe_chunk(256, 0), _probe_chunk(256, 1024)
    # beside 1024 cells of another sequence: the span grows from 8 to 24 KV tiles; the chunk's
    # query tiles compute one tile more each (the one its first cells share with the other's)
    assert (beside.computed - alone.computed, beside.span) == (4 * 4096, 1536)
    per_pair = 4.0 * ARCH.num_layers * ARCH.q_dim
    extra = ((beside.computed - alone.computed) * per_pair / att
             + (beside.skipped - alone.skipped) * ARCH.num_layers * ARCH.num_heads * head_s)
    deep = 0.2 + per_pair * (chunk_pairs(256, 1024) - chunk_pairs(256, 1)) / att
    steps = {"d0/s1": 0.004, "d0/s1/t256": 0.2, "d1024/s1/t256": deep, "d0/s1/t256/o1024": 0.2 + extra}
    rates = fit_rates(small, replace(_timing(), decode_steps=steps), 1024, 4, 256)
    assert rates["masked_head_s"] == pytest.approx(head_s)
    del steps["d0/s1/t256/o1024"]  # not timed: not charged
    assert fit_rates(small, replace(_timing(), decode_steps=steps), 1024, 4, 256)["masked_head_s"] == 0.0


def test_a_prompt_beside_other_sequences_cells_pays_for_passing_over_them():
    step = _step(_g(masked_head_s=3e-10))
    alone = sum(step.parts(512, 512, 512.0, 1e9))
    beside = sum(step.parts(512, 512, 512.0, 1e9, masked=512 * 2000.0))
    assert beside - alone == pytest.approx(512 * 2000 * ARCH.num_layers * ARCH.num_heads * 3e-10)


def test_a_prompts_rate_and_per_token_cost_at_half_a_ubatch_come_from_its_own_timings():
    from gpuwise.estimate.speed.ggml_time import layer_token_s
    from gpuwise.measure.llama_cpp.fit import fit_rates

    small = ModelTiming(llama_arch(384, 6, 6, 2, 1024, 32000),
                        *timing_plans("q4_0", 20_000_000, 7_000_000, 512, 32, 2), 0.1, 0.001)
    big = _timing()
    plain = fit_rates(small, big)
    assert plain["half_matmul_flops"] == plain["half_layer_token_s"] == 0.0  # not timed
    # at 256 tokens, each model a bit more than half its 512-token time
    halves = fit_rates(replace(small, pp_half_s=0.06), replace(big, pp_half_s=0.55))
    assert halves["half_matmul_flops"] > 0 and halves["half_layer_token_s"] >= 0
    g = _g(half_layer_token_s=2e-6)  # RATES' cost at a full ubatch: 5e-6
    assert layer_token_s(g, 128) == layer_token_s(g, 256) == 2e-6  # at half a ubatch and below
    assert layer_token_s(g, 512) == 5e-6 and 2e-6 < layer_token_s(g, 362) < 5e-6
    assert layer_token_s(_g(), 128) == 5e-6  # an older probe: one cost
