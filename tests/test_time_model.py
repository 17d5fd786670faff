"""The time model: invariants, hand-checked rooflines, and published measurements."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from catalogue_archs import arch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.estimate import InferencePlan, TrainingPlan
from gpuwise.estimate.speed.device_rates import rates_from_measurements, rates_from_spec
from gpuwise.estimate.speed.inference_time import estimate_inference_time
from gpuwise.estimate.speed.training_time import estimate_training_time
from gpuwise.workload import from_config
from gpuwise.workload.ops import Shape, forward_ops

MODELS = [
    "gpt2",
    "llama-3.1-8b",
    "qwen2.5-0.5b",
    "mixtral-8x7b",
    "gemma-2-2b",
    "phi-2",
    "falcon-7b",
    "pythia-70m",
]
ARCH = {m: arch(m) for m in MODELS}
H100 = rates_from_spec(find_hardware("h100-sxm"))
PUBLISHED = Path(__file__).resolve().parents[2] / "shared" / "validation" / "published.json"


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(MODELS),
    st.integers(1, 32),
    st.integers(1, 4096),
    st.integers(2, 512),
    st.sampled_from(["bf16", "int8", "int4"]),
    st.sampled_from(["sdpa", "eager"]),
)
def test_inference_time_grows_with_work(name, batch, prompt, new, weights, attention):
    arch = ARCH[name]
    plan = InferencePlan(
        batch=batch, prompt_tokens=prompt, new_tokens=new, weights=weights, attention=attention
    )
    t = estimate_inference_time(arch, plan, H100)
    assert t.prefill_s > 0 and t.decode_s_per_token > 0
    longer = estimate_inference_time(arch, replace(plan, prompt_tokens=prompt + 512), H100)
    assert longer.prefill_s >= t.prefill_s * (1 - 1e-9)
    assert longer.decode_s_per_token >= t.decode_s_per_token * (1 - 1e-9)
    bigger = estimate_inference_time(arch, replace(plan, batch=batch * 2), H100)
    assert bigger.tokens_per_s >= t.tokens_per_s * 0.99  # batching never loses throughput


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(MODELS),
    st.integers(1, 16),
    st.integers(64, 4096),
    st.sampled_from(["bf16", "mixed-bf16", "fp32"]),
    st.booleans(),
)
def test_training_time_is_sane(name, batch, seq, dtype, ckpt):
    plan = TrainingPlan(batch=batch, seq=seq, dtype=dtype, checkpointing=ckpt)
    t = estimate_training_time(ARCH[name], plan, H100)
    assert 0 < t.mfu < 1
    # MFU counts useful FLOPs: never more than the step's own matmuls and attention do.
    assert t.model_flops <= (t.forward.flops + t.backward.flops) * 1.001
    assert t.step_s == pytest.approx(
        t.forward.seconds + t.backward.seconds + t.optimizer.seconds + t.comm_s
    )
    if ckpt:
        plain = estimate_training_time(ARCH[name], replace(plan, checkpointing=False), H100)
        assert t.step_s > plain.step_s


def test_decode_is_memory_bound_and_prefill_compute_bound_on_a_gpu():
    arch = ARCH["llama-3.1-8b"]
    t = estimate_inference_time(
        arch, InferencePlan(batch=1, prompt_tokens=4096), H100, runtime="compiled"
    )
    assert t.decode.bound == "memory"
    assert t.prefill.bound == "compute"


def test_decode_roofline_by_hand():
    # Compiled runtime, batch 1: 16.06 GB of bf16 weights at 3.35 TB/s x 0.85, plus the cache.
    arch = ARCH["llama-3.1-8b"]
    t = estimate_inference_time(
        arch, InferencePlan(prompt_tokens=16, new_tokens=2), H100, runtime="compiled"
    )
    weights_s = 2 * 8_030_261_248 / (3350e9 * 0.85)
    assert t.decode_s_per_token == pytest.approx(weights_s, rel=0.08)


def test_eager_gqa_attention_moves_more_bytes_than_sdpa():
    arch = ARCH["llama-3.1-8b"]

    def attn_bytes(attention):
        shape = Shape(1, 1, 8192, 2, 2, 2, attention)
        return sum(
            op.bytes * op.count
            for op in forward_ops(arch, shape)
            if op.name in ("attention", "repeat_kv")
        )

    assert attn_bytes("eager") > 3 * attn_bytes("sdpa")


@pytest.mark.parametrize(("name", "kernel"), [("pythia-70m", "gelu_erf"), ("falcon-7b", "gelu_erf"),
                                              ("gemma-2-2b", "gelu"), ("llama-3.1-8b", "silu")])
def test_the_mlp_activation_takes_the_kernel_transformers_runs(name, kernel):
    # "gelu" is the exact (erf) GELU, four times faster than the tanh approximation on a CPU
    ops = {op.name: op for op in forward_ops(ARCH[name], Shape(1, 16, 16, 4, 4, 4))}
    assert ops["activation"].kernel == kernel


def test_gpt2s_python_gelu_is_products_and_a_tanh():
    """NewGELUActivation runs eight kernels; its tanh, not its products, takes most of it."""
    ops = {op.name: op for op in forward_ops(ARCH["gpt2"], Shape(2, 256, 256, 4, 4, 4))}
    products, tanh = ops["activation"], ops["activation tanh"]
    assert products.kernel == "binary" and tanh.kernel == "tanh"
    assert tanh.bytes == 2 * 2 * 256 * 3072 * 4 and products.bytes == 8 * tanh.bytes


def test_measured_rates_replace_the_datasheet():
    hw = find_hardware("h100-sxm")
    curve = {"bf16": ((1e6, 1e12), (1e9, 5e14), (1e12, 6e14))}
    rates = rates_from_measurements(hw, 2.5e12, curve, 5e-6, 2e-6)
    t = estimate_inference_time(ARCH["llama-3.1-8b"], InferencePlan(), rates)
    assert t.source == "measured"
    assert estimate_inference_time(ARCH["llama-3.1-8b"], InferencePlan(), H100).source == "spec"


def test_generate_pays_its_logits_step_per_vocabulary_entry_and_sequence():
    hw = find_hardware("h100-sxm")
    curve = {"bf16": ((1e6, 1e12), (1e9, 5e14), (1e12, 6e14))}
    runtime = {"decode_op_s": 2e-5, "decode_vocab_s": 30e-9}
    with_step = rates_from_measurements(hw, 2.5e12, curve, 5e-6, 2e-6, runtime=runtime)
    without = replace(with_step, runtime_vocab_s=0.0)
    gpt2 = ARCH["gpt2"]
    for batch in (1, 4):
        plan = InferencePlan(batch=batch, prompt_tokens=64, new_tokens=8)
        step = estimate_inference_time(gpt2, plan, with_step).decode
        bare = estimate_inference_time(gpt2, plan, without).decode
        assert step.seconds - bare.seconds == pytest.approx(30e-9 * gpt2.vocab_size * batch)
        assert [t.op.name for t in step.ops][-1] == "logits step"
        assert "logits step" not in [t.op.name for t in bare.ops]
    compiled = estimate_inference_time(gpt2, InferencePlan(), with_step, runtime="compiled")
    assert "logits step" not in [t.op.name for t in compiled.decode.ops]  # generate() only


def test_the_runtime_cost_per_op_is_taken_with_the_caches_cold():
    hw = find_hardware("h100-sxm")
    curve = {"bf16": ((1e6, 1e12), (1e9, 5e14), (1e12, 6e14))}
    hot = {"decode_op_s": 1e-5, "training_op_s": 2e-5, "decode_step_s": 1e-3}
    cold = rates_from_measurements(hw, 2.5e12, curve, 5e-6, 2e-6,
                                   runtime={**hot, "cold_op_factor": 1.5})
    assert cold.op_cost("decode") == pytest.approx((1.5e-5, 1e-3))  # the step's own: as measured
    assert cold.op_cost("training")[0] == pytest.approx(3e-5)
    as_hot = rates_from_measurements(hw, 2.5e12, curve, 5e-6, 2e-6, runtime=hot)
    assert as_hot.op_cost("decode") == pytest.approx((1e-5, 1e-3))  # older profiles: no factor


@pytest.mark.skipif(not PUBLISHED.exists(), reason="published measurements not beside the repo")
def test_published_gpt_fast_decode_within_25_percent():
    data = json.loads(PUBLISHED.read_text())
    entry = next(e for e in data["decode"] if e["model"] == "Llama-3-8B")
    rates = rates_from_spec(find_hardware("a100-sxm-80gb"))
    plan = InferencePlan(prompt_tokens=5, new_tokens=200)
    t = estimate_inference_time(
        from_config(resolve_model("llama-3.1-8b").config), plan, rates, runtime="compiled"
    )
    assert t.tokens_per_s == pytest.approx(entry["tokens_per_s"], rel=0.25)
