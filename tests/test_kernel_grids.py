"""How probed kernel timings are read: linear grids (interpolation, holes, beyond the
grid, the Conv1D layout), SDPA curves, convolution shapes and windows, optimizer tensor sizes
and elementwise fallbacks."""

from dataclasses import replace

import pytest
from catalogue_archs import arch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_record import CPU, KERNELS, ROWS, WIDTHS, _rate, _record

from gpuwise.estimate import InferencePlan, TrainingPlan
from gpuwise.estimate.speed.inference_time import estimate_inference_time
from gpuwise.estimate.speed.probed_kernels import KernelRates
from gpuwise.estimate.speed.roofline import time_op
from gpuwise.estimate.speed.training_time import estimate_training_time
from gpuwise.workload.ops import Op
from gpuwise.workload.params import parameter_tensors


def test_grid_points_come_back_exactly():
    for m in ROWS:
        for k in WIDTHS:
            for n in WIDTHS:
                assert KERNELS.linear_s(m, k, n, "fp32") == pytest.approx(2 * m * k * n / _rate(m))


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 4096), st.integers(64, 16384), st.integers(64, 16384))
def test_interpolated_rate_stays_within_the_measured_range(m, k, n):
    seconds = KERNELS.linear_s(m, k, n, "fp32")
    rate = 2 * m * k * n / seconds
    assert 1e9 * (1 - 1e-9) <= rate <= 100e9 * (1 + 1e-9)
    # Between two measured row counts the rate lies between theirs (the widths don't matter
    # on this made-up machine).
    below = max(r for r in ROWS if r <= m)
    above = min((r for r in ROWS if r >= m), default=ROWS[-1])
    assert _rate(below) * 0.999 <= rate <= _rate(above) * 1.001


def test_beyond_the_grid_time_scales_with_work():
    big = KERNELS.linear_s(4096, 8192, 8192, "fp32")
    edge = KERNELS.linear_s(256, 2048, 2048, "fp32")
    assert big == pytest.approx(edge * (4096 * 8192 * 8192) / (256 * 2048 * 2048))


def test_backward_reads_its_own_grid_and_a_missing_dtype_gives_none():
    fwd = KERNELS.linear_s(256, 512, 2048, "fp32")
    assert KERNELS.linear_s(256, 512, 2048, "fp32", "backward") == pytest.approx(2.5 * fwd)
    assert KERNELS.linear_s(256, 512, 2048, "bf16") is None


def test_a_hole_in_the_grid_takes_the_nearest_measured_rate():
    """The probe leaves out points too slow to time: their corner takes the rate of the
    measured point nearest in log space (here the same rows and input width, output 2048)."""
    record = _record()
    record["linear"]["fp32"]["forward"] = [p for p in record["linear"]["fp32"]["forward"]
                                           if p[:3] != [256, 2048, 512]]
    holed = KernelRates.from_record(record)
    assert holed.linear_s(256, 2048, 512, "fp32") == pytest.approx(2 * 256 * 2048 * 512 / _rate(256))
    record["linear"]["fp32"]["forward"] = [[1, 512, 512, 2 * 512 * 512 / 1e9],
                                           [1, 2048, 2048, 2 * 2048 * 2048 / 4e9]]
    nearest = KernelRates.from_record(record)
    assert nearest.linear_s(1, 2048, 512, "fp32") in (pytest.approx(2 * 2048 * 512 / 1e9),
                                                      pytest.approx(2 * 2048 * 512 / 4e9))
    assert nearest.linear_s(1, 4096, 4096, "fp32") == pytest.approx(2 * 4096 * 4096 / 4e9)


def test_sdpa_decode_is_linear_in_keys_and_prefill_quadratic_beyond_the_grid():
    assert KERNELS.sdpa_s(8, 1, 128, 64, "fp32") == pytest.approx(8e-5)
    assert KERNELS.sdpa_s(8, 1, 1024, 64, "fp32") == pytest.approx(8 * 4e-5 * 2)
    assert KERNELS.sdpa_s(1, 512, 512, 64, "fp32") == pytest.approx(1.6e-4 * 4)
    assert KERNELS.sdpa_s(1, 64, 64, 128, "fp32") == pytest.approx(2e-5)  # head dim 128
    assert KERNELS.sdpa_s(2, 128, 128, 64, "fp32", backward=True) == pytest.approx(2 * 1.2e-4)
    # log-log between points: 128 and 512 keys give 1e-5 and 4e-5, so 256 gives 2e-5.
    assert KERNELS.sdpa_s(1, 1, 256, 64, "fp32") == pytest.approx(2e-5)


def test_non_causal_attention_reads_its_own_curve_and_never_the_causal_one():
    full = KernelRates.from_record({"sdpa": {"fp32": {"full": [[128, 5e-5], [512, 8e-4]],
                                                      "prefill": [[128, 1e-5], [512, 1.6e-4]]}}})
    assert full.sdpa_s(4, 128, 128, 64, "fp32", causal=False) == pytest.approx(4 * 5e-5)
    assert full.sdpa_s(1, 256, 256, 64, "fp32", causal=False) == pytest.approx(2e-4)  # q x kv
    assert full.sdpa_s(4, 128, 128, 64, "fp32") == pytest.approx(4 * 1e-5)  # causal: prefill
    # a profile without the non-causal backward: None (the matmul rate), never the causal one
    assert full.sdpa_s(4, 128, 128, 64, "fp32", backward=True, causal=False) is None
    assert KERNELS.sdpa_s(4, 128, 128, 64, "fp32", causal=False) is None  # not probed
    assert KERNELS.sdpa_s(4, 1, 128, 64, "fp32", causal=False) == pytest.approx(4 * 1e-5)
    both = KernelRates.from_record({"sdpa": {"fp32": {"full": [[128, 5e-5]],
                                                      "full_backward": [[128, 1.5e-4]],
                                                      "backward": [[128, 9e-5]]}}})
    assert both.sdpa_s(4, 128, 128, 64, "fp32", backward=True, causal=False) == pytest.approx(6e-4)
    assert both.sdpa_s(4, 128, 128, 64, "fp32", backward=True) == pytest.approx(3.6e-4)


def test_optimizer_time_sums_its_tensors_at_their_sizes():
    small, big = KERNELS.optimizer_s("adamw", ((2**20, 3),), "fp32"), 3 * 2**20 * 1e-9
    assert small == pytest.approx(big)
    # log-log between 2^20 (1 ns) and 2^24 (4 ns): 2^22 costs 2 ns an element
    assert KERNELS.optimizer_s("adamw", ((2**22, 1),), "fp32") == pytest.approx(2**22 * 2e-9)
    assert KERNELS.optimizer_s("adamw", ((2**30, 1),), "fp32") == pytest.approx(2**30 * 4e-9)
    assert KERNELS.optimizer_s("sgd", ((2**20, 1),), "fp32") is None
    rates = replace(CPU, kernels=KERNELS)
    gpt2 = arch("gpt2")
    plan = TrainingPlan(batch=1, seq=128, dtype="fp32", optimizer="adamw")
    step = estimate_training_time(gpt2, plan, rates).optimizer
    assert step.ops[0].measured and step.seconds == pytest.approx(
        KERNELS.optimizer_s("adamw", parameter_tensors(gpt2), "fp32")
    )
    # SGD's step was not probed: its passes at the elementwise rate, capped by memory
    sgd = estimate_training_time(gpt2, replace(plan, optimizer="sgd"), rates).optimizer
    rate = min(40e9, rates.memory_bytes_per_s)
    assert sgd.seconds == pytest.approx(sgd.ops[0].op.bytes / rate)


def test_small_optimizer_tensors_cost_the_smallest_probed_step():
    # below 2^20 elements a tensor costs what a 2^20-element one did, per tensor
    assert KERNELS.optimizer_s("adamw", ((576, 10),), "fp32") == pytest.approx(10 * 2**20 * 1e-9)


def test_conv1d_layout_reads_its_own_grid_at_few_rows():
    record = _record()
    nn = [[m, k, n, 3 * s] for m, k, n, s in record["linear"]["fp32"]["forward"] if m <= 16]
    record["linear"]["fp32"]["forward_nn"] = nn
    kernels = KernelRates.from_record(record)
    linear = kernels.linear_s(16, 512, 512, "fp32")
    assert kernels.linear_s(16, 512, 512, "fp32", layout="nn") == pytest.approx(3 * linear)
    # beyond the rows it covers, and in backward, both layouts read F.linear's grid
    assert kernels.linear_s(256, 512, 512, "fp32", layout="nn") == kernels.linear_s(
        256, 512, 512, "fp32")
    assert kernels.linear_s(256, 512, 512, "fp32", "backward", "nn") == kernels.linear_s(
        256, 512, 512, "fp32", "backward")
    # GPT-2's layers are Conv1D, its head F.linear; Llama's are all F.linear
    ops = {t.op.name: t.op for t in estimate_inference_time(
        arch("gpt2"), InferencePlan(batch=1, prompt_tokens=16, new_tokens=4, weights="fp32"),
        replace(CPU, kernels=kernels)).decode.ops}
    assert ops["mlp_in"].layout == "nn" and ops["lm_head"].layout == ""
    assert not arch("llama-3.1-8b").conv1d and not arch("starcoderbase-1b").conv1d


def test_a_profile_without_tanh_times_it_as_the_tanh_gelu():
    k = KernelRates.from_record(_record())
    assert k.elementwise_rate("tanh", "fp32") == 10e9  # the record's "gelu", not its 40e9 mul
    probed = _record()
    probed["elementwise"]["fp32"]["tanh"] = 7e9
    assert KernelRates.from_record(probed).elementwise_rate("tanh", "fp32") == 7e9


def test_convolutions_take_the_rate_of_the_nearest_probed_shape():
    record = _record() | {"conv": {"fp32": {
        "forward": [[100, 576, 64, 1e-3], [25, 1152, 128, 0.5e-3]],
        "backward": [[100, 576, 64, 3e-3], [25, 1152, 128, 1e-3]]}}}
    kernels = KernelRates.from_record(record)
    assert kernels.conv_s(100, 576, 64, "fp32") == pytest.approx(1e-3)
    # equal FLOPs, another shape: that shape's rate
    assert kernels.conv_s(25, 1152, 128, "fp32") == pytest.approx(0.5e-3)
    # twice the rows at the first shape's channels: its rate, twice the time
    assert kernels.conv_s(200, 576, 64, "fp32") == pytest.approx(2e-3)
    assert kernels.conv_s(100, 576, 64, "bf16") is None
    rates = replace(CPU, kernels=kernels)
    fwd = Op("convolution", "conv", 2 * 100 * 576 * 64, 1.0, m=100, n=64, k=576)
    assert time_op(fwd, rates, "fp32").seconds == pytest.approx(1e-3)
    # a traced backward is one Op per GEMM (two per call): half the probed backward each
    bwd = replace(fwd, name="convolution_backward", count=2)
    assert time_op(bwd, rates, "fp32").seconds == pytest.approx(3e-3)


def test_convolutions_of_another_window_take_their_own_curve():
    record = _record() | {"conv": {"fp32": {
        "forward": [[100, 576, 64, 1e-3]], "backward": [[100, 576, 64, 2, 3e-3]],
        "forward:1x1/s2": [[100, 64, 128, 0.5e-3]],
        "backward:7x7/s2": [[100, 147, 64, 1, 2e-3]]}}}
    kernels = KernelRates.from_record(record)
    assert kernels.conv_s(100, 64, 128, "fp32", "forward", "1x1/s2") == pytest.approx(0.5e-3)
    # a window not probed: the 3x3 stride-1 curve's rate (its FLOPs are 2/9 of the point's)
    at_3x3 = kernels.conv_s(100, 64, 128, "fp32", "forward", "5x5/s1")
    assert at_3x3 == kernels.conv_s(100, 64, 128, "fp32") == pytest.approx(1e-3 * 2 / 9)
    backward = kernels.conv_s(100, 64, 128, "fp32", "backward", "1x1/s2")
    assert backward == pytest.approx(1.5e-3 * 2 / 9)  # one of the point's two GEMMs
    # a point that ran one GEMM (the stem's weight gradient) is that GEMM's time
    assert kernels.conv_s(100, 147, 64, "fp32", "backward", "7x7/s2") == pytest.approx(2e-3)
    rates = replace(CPU, kernels=kernels)
    stem = Op("convolution_backward", "conv", 2 * 100 * 147 * 64, 1.0, m=100, n=64, k=147,
              kernel="7x7/s2")
    assert time_op(stem, rates, "fp32").seconds == pytest.approx(2e-3)
