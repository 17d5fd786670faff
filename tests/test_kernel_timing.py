"""Estimates timed with probed kernels: `time_op` per operator, whole inference and
training estimates (dropout, the KV-cache copy, the embedding gradient) and first-touch costs."""

from dataclasses import replace

import pytest
from catalogue_archs import arch
from kernel_record import CPU, KERNELS, _record

from gpuwise.estimate import InferencePlan, TrainingPlan
from gpuwise.estimate.speed.inference_time import estimate_inference_time
from gpuwise.estimate.speed.probed_kernels import KernelRates
from gpuwise.estimate.speed.roofline import time_op
from gpuwise.estimate.speed.training_time import estimate_training_time
from gpuwise.workload.ops import Op
from gpuwise.workload.params import count_params, parameter_tensors


def test_a_traced_attention_backward_takes_the_probed_backward():
    rates = replace(CPU, kernels=KernelRates.from_record(
        {"sdpa": {"fp32": {"full_backward": [[128, 1.5e-4]]}}}))
    op = Op("_scaled_dot_product_flash_attention_for_cpu_backward", "attention", 1e9, 1e6,
            m=4 * 128, n=128, k=64, kernel="sdpa", heads=4, causal=False)
    assert time_op(op, rates, "fp32").seconds == pytest.approx(6e-4)


def test_time_op_uses_probed_kernels():
    rates = replace(CPU, kernels=KERNELS)
    mm = Op("mlp_in", "matmul", 2 * 16 * 512 * 2048, 1e6, 3, 16, 2048, 512, 5e5)
    assert time_op(mm, rates, "fp32").seconds == pytest.approx(3 * 2 * 16 * 512 * 2048 / 16e9)
    act = Op("activation", "elementwise", 1e6, 2e6 * 4, 2, kernel="silu")
    assert time_op(act, rates, "fp32").seconds == pytest.approx(2 * 8e6 / 20e9)
    big = Op("mlp_in", "matmul", 2 * 256 * 512 * 2048, 1e6, 1, 256, 2048, 512, 5e5)
    fwd = time_op(big, rates, "fp32").seconds
    assert time_op(big, rates, "fp32", "backward", 2.0).seconds == pytest.approx(2.5 * fwd)
    # checkpointing: the backward plus one recomputed forward
    assert time_op(big, rates, "fp32", "backward", 3.0).seconds == pytest.approx(3.5 * fwd)
    # no probe: the roofline, scaled
    plain = time_op(big, CPU, "fp32", "backward", 2.0)
    assert not plain.measured and plain.seconds == pytest.approx(
        2 * time_op(big, CPU, "fp32").seconds
    )


def test_estimates_use_the_kernels_and_stay_positive():
    gpt2 = arch("gpt2")
    rates = replace(CPU, kernels=KERNELS)
    plan = InferencePlan(batch=1, prompt_tokens=256, new_tokens=16, weights="fp32")
    with_kernels = estimate_inference_time(gpt2, plan, rates)
    assert any(t.measured for t in with_kernels.prefill.ops)
    train = estimate_training_time(gpt2, TrainingPlan(batch=1, seq=256, dtype="fp32"), rates)
    assert train.backward.seconds > train.forward.seconds > 0


def test_parameter_tensors_add_up_to_the_parameter_count():
    for name in ("gpt2", "qwen2.5-0.5b", "mixtral-8x7b", "llama-3.1-8b", "pythia-70m"):
        a = arch(name)
        assert sum(n * k for n, k in parameter_tensors(a)) == pytest.approx(
            count_params(a).total, rel=1e-3
        )


def test_dropout_is_drawn_in_forward_and_applied_both_ways():
    rates = replace(CPU, kernels=KERNELS)
    plan = TrainingPlan(batch=1, seq=128, dtype="fp32", optimizer="adamw")
    gpt2 = estimate_training_time(arch("gpt2"), plan, rates)  # resid_pdrop 0.1
    names = lambda phase: {t.op.name for t in phase.ops}  # noqa: E731
    assert {"dropout_mask", "dropout"} <= names(gpt2.forward)
    assert "dropout" in names(gpt2.backward) and "dropout_mask" not in names(gpt2.backward)
    llama = estimate_training_time(arch("llama-3.1-8b"), plan, rates)  # no dropout
    assert not {"dropout_mask", "dropout"} & names(llama.forward)
    # GPT-2's attention dropout sends a CPU's SDPA down the math path: eager attention, whose
    # probabilities are dropped too; a GPU keeps the fused kernel
    assert {"attention_dropout_mask", "attention_dropout"} <= names(gpt2.forward)
    assert all(t.op.kernel != "sdpa" for t in gpt2.forward.ops)
    gpu = estimate_training_time(arch("gpt2"), plan, replace(rates, kind="gpu"))
    assert "attention_dropout" not in names(gpu.forward)
    assert any(t.op.kernel == "sdpa" for t in gpu.forward.ops)


def test_fresh_tensors_past_the_mmap_threshold_pay_first_touch():
    record = _record() | {"fresh": {"bytes_per_s": 5e9, "threshold": 32 * 2**20}}
    rates = replace(CPU, kernels=KernelRates.from_record(record))
    big, small = 64 * 2**20, 16 * 2**20
    op = Op("x", "elementwise", 1.0, 1e6, fresh=((big, 2), (small, 3)),
            fresh_backward=((big, 1),))
    plain = replace(op, fresh=(), fresh_backward=())
    assert time_op(op, rates, "fp32").seconds - time_op(plain, rates, "fp32").seconds == (
        pytest.approx(2 * big / 5e9))
    back = time_op(op, rates, "fp32", "backward", 2.0).seconds
    assert back - time_op(plain, rates, "fp32", "backward", 2.0).seconds == pytest.approx(big / 5e9)
    # without a probed first-touch rate (a GPU, an old profile) nothing is added
    assert time_op(op, replace(CPU, kernels=KERNELS), "fp32").seconds == time_op(
        plain, replace(CPU, kernels=KERNELS), "fp32").seconds


def test_transformers_decode_copies_its_cache_and_training_builds_the_embedding_gradient():
    rates = replace(CPU, kernels=KERNELS)
    a = arch("smollm2-135m")
    plan = InferencePlan(batch=2, prompt_tokens=500, new_tokens=1, weights="fp32")
    decode = estimate_inference_time(a, plan, rates).decode
    append = next(t.op for t in decode.ops if t.op.name == "kv_append")
    cache = 2 * a.num_kv_heads * a.head_dim * 4 * 2 * 501  # K and V, both sequences, 501 pos
    assert append.bytes == pytest.approx(2 * cache) and append.count == a.num_layers
    compiled = estimate_inference_time(a, plan, rates, runtime="compiled").decode
    assert "kv_append" not in {t.op.name for t in compiled.ops}
    train = estimate_training_time(a, TrainingPlan(batch=1, seq=128, dtype="fp32"), rates)
    grad = next(t.op for t in train.backward.ops if t.op.name == "embedding_grad")
    table = a.vocab_size * a.hidden_size * 4
    assert a.tie_embeddings and grad.fresh == ((table, 2),)  # zero-filled, then summed
    assert "embedding_grad" not in {t.op.name for t in train.forward.ops}


def test_a_matmul_narrower_than_the_grid_slows_as_the_size_curve_says():
    curve = {"fp32": ((1e6, 1e9), (1e10, 1e11))}  # FLOP/s rising with size
    rates = replace(CPU, kernels=KERNELS, matmul_curves=curve)
    wide = Op("mm", "matmul", 2 * 256 * 512 * 512, 1.0, m=256, n=512, k=512)
    narrow = replace(wide, flops=2 * 256 * 256 * 512, n=256)
    # the grid (narrowest width 512) alone: same rate, half the FLOPs, half the time
    plain = replace(CPU, kernels=KERNELS)
    assert time_op(narrow, plain, "fp32").seconds == pytest.approx(
        time_op(wide, plain, "fp32").seconds / 2)
    ratio = rates.matmul_rate(256, 512, wide.flops, "fp32") / rates.matmul_rate(
        256, 256, narrow.flops, "fp32")
    assert ratio > 1
    assert time_op(narrow, rates, "fp32").seconds == pytest.approx(
        time_op(narrow, plain, "fp32").seconds * ratio)
    assert time_op(wide, rates, "fp32").seconds == time_op(wide, plain, "fp32").seconds
