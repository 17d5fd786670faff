"""Kernels timed at model shapes: how estimates read the probe's grids, and the probe itself."""

import importlib.util
from dataclasses import replace

import pytest
from catalogue_archs import arch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwise.catalog import find_hardware
from gpuwise.estimate import InferencePlan, TrainingPlan
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.estimate.speed.inference_time import estimate_inference_time
from gpuwise.estimate.speed.probed_kernels import KernelRates
from gpuwise.estimate.speed.roofline import time_op
from gpuwise.estimate.speed.training_time import estimate_training_time
from gpuwise.workload.ops import Op
from gpuwise.workload.params import count_params, parameter_tensors

ROWS, WIDTHS = (1, 16, 256), (512, 2048)


def _rate(m: int) -> float:
    """A made-up machine: 1 GFLOP/s per row up to 100 GFLOP/s."""
    return min(100e9, 1e9 * m)


def _record(backward_factor: float = 2.5) -> dict:
    fwd = [[m, k, n, 2 * m * k * n / _rate(m)] for m in ROWS for k in WIDTHS for n in WIDTHS]
    bwd = [[m, k, n, backward_factor * 2 * m * k * n / _rate(m)] for m in (256,)
           for k in WIDTHS for n in WIDTHS]  # fmt: skip
    return {
        "linear": {"fp32": {"forward": fwd, "backward": bwd}},
        "sdpa": {"fp32": {"decode": [[128, 1e-5], [512, 4e-5]],
                          "prefill": [[64, 1e-5], [256, 1.6e-4]],
                          "backward": [[64, 3e-5], [256, 4.8e-4]]}},
        "elementwise": {"fp32": {"binary": 40e9, "silu": 20e9, "gelu": 10e9}},
        "optimizer": {"fp32": {"adamw": [[2**20, 1e-9], [2**24, 4e-9]]}},
    }  # fmt: skip


KERNELS = KernelRates.from_record(_record())
CPU = replace(rates_from_spec(find_hardware("h100-sxm")), kind="cpu", kernel_latency_s=0.0)


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
                                           if p[:3] != [256, 2048, 512]]  # fmt: skip
    holed = KernelRates.from_record(record)
    assert holed.linear_s(256, 2048, 512, "fp32") == pytest.approx(2 * 256 * 2048 * 512 / _rate(256))
    record["linear"]["fp32"]["forward"] = [[1, 512, 512, 2 * 512 * 512 / 1e9],
                                           [1, 2048, 2048, 2 * 2048 * 2048 / 4e9]]  # fmt: skip
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
                                                      "prefill": [[128, 1e-5], [512, 1.6e-4]]}}})  # fmt: skip
    assert full.sdpa_s(4, 128, 128, 64, "fp32", causal=False) == pytest.approx(4 * 5e-5)
    assert full.sdpa_s(1, 256, 256, 64, "fp32", causal=False) == pytest.approx(2e-4)  # q x kv
    assert full.sdpa_s(4, 128, 128, 64, "fp32") == pytest.approx(4 * 1e-5)  # causal: prefill
    # a profile without the non-causal backward: None (the matmul rate), never the causal one
    assert full.sdpa_s(4, 128, 128, 64, "fp32", backward=True, causal=False) is None
    assert KERNELS.sdpa_s(4, 128, 128, 64, "fp32", causal=False) is None  # not probed
    assert KERNELS.sdpa_s(4, 1, 128, 64, "fp32", causal=False) == pytest.approx(4 * 1e-5)
    both = KernelRates.from_record({"sdpa": {"fp32": {"full": [[128, 5e-5]],
                                                      "full_backward": [[128, 1.5e-4]],
                                                      "backward": [[128, 9e-5]]}}})  # fmt: skip
    assert both.sdpa_s(4, 128, 128, 64, "fp32", backward=True, causal=False) == pytest.approx(6e-4)
    assert both.sdpa_s(4, 128, 128, 64, "fp32", backward=True) == pytest.approx(3.6e-4)


def test_a_traced_attention_backward_takes_the_probed_backward():
    rates = replace(CPU, kernels=KernelRates.from_record(
        {"sdpa": {"fp32": {"full_backward": [[128, 1.5e-4]]}}}))  # fmt: skip
    op = Op("_scaled_dot_product_flash_attention_for_cpu_backward", "attention", 1e9, 1e6,
            m=4 * 128, n=128, k=64, kernel="sdpa", heads=4, causal=False)  # fmt: skip
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


@pytest.mark.torch
def test_the_kernel_probe_measures_a_tiny_plan():
    pytest.importorskip("torch")
    from gpuwise.measure.probe.kernels import KernelPlan, measure_kernels

    plan = KernelPlan(dtypes=("fp32",), rows=(1, 8), widths=(64, 128), backward_rows=(16,),
                      sdpa_decode_kv=(32,), sdpa_prefill_q=(32,), sdpa_backward_q=(32,),
                      sdpa_full_q=(32,), elementwise_elements=4096, optimizer_elements=(1024, 4096),
                      nn_rows=(1, 2), nn_widths=(64,), fresh_bytes=2**20, fresh_held=(2**24,),
                      conv_shapes=((8, 8),), conv_batch=1,
                      conv_variants=(("1x1/s2", 4, 8, 8), ("7x7/s2", 3, 8, 16),
                                     ("4x4/s4", 3, 8, 16)),
                      cold_set_bytes=2**20, target_s=0.001)  # fmt: skip
    seen = []
    out = measure_kernels(plan, lambda label, done: seen.append(done))
    assert not out["missing"]
    assert (
        len(out["linear"]["fp32"]["forward"]) == 8 and len(out["linear"]["fp32"]["backward"]) == 4
    )
    assert all(s > 0 for *_, s in out["linear"]["fp32"]["forward"])
    assert len(out["linear"]["fp32"]["forward_nn"]) == 2
    conv = out["conv"]["fp32"]
    assert [p[:3] for p in conv["backward"]] == [[64, 72, 8]] and conv["backward"][0][3] == 2
    assert [p[:3] for p in conv["forward:1x1/s2"]] == [[16, 4, 8]]  # 4 x 4 positions
    # the stem's input is the network's own: its backward is the weight gradient alone
    assert [p[:3] for p in conv["backward:7x7/s2"]] == [[64, 147, 8]]
    assert conv["backward:7x7/s2"][0][3] == 1
    assert [p[:3] for p in conv["forward:4x4/s4"]] == [[16, 48, 8]]  # patches: no padding
    assert set(out["elementwise"]["fp32"]) == {"binary", "silu", "gelu", "gelu_erf",
                                               "gelu_backward", "gelu_erf_backward", "div",
                                               "sqrt", "tanh", "bernoulli", "cat", "pool",
                                               "pool_backward", "batch_norm",
                                               "batch_norm_train", "batch_norm_backward"}  # fmt: skip
    assert out["fresh"]["bytes_per_s"] > 0 and out["fresh"]["threshold"] == 32 * 2**20
    assert [n for n, _ in out["fresh"]["by_held"]] == [0, 2**24]  # in a small process, then held
    assert all(rate > 0 for _, rate in out["fresh"]["by_held"])
    assert [n for n, _ in out["optimizer"]["fp32"]["adamw"]] == [1024, 4096]
    assert [n for n, _ in out["optimizer"]["fp32"]["sgd"]] == [1024, 4096]
    if importlib.util.find_spec("transformers"):  # Adafactor is transformers'
        assert [n for n, _ in out["optimizer"]["fp32"]["adafactor"]] == [1024, 4096]
    assert seen == sorted(seen) and seen[-1] == 1.0
    rates = KernelRates.from_record(out)
    assert rates.linear_s(4, 100, 100, "fp32") > 0 and rates.sdpa_s(4, 1, 64, 64, "fp32") > 0
    assert rates.sdpa_s(4, 64, 64, 64, "fp32", backward=True) > 0
    assert rates.sdpa_s(4, 64, 64, 64, "fp32", causal=False) > 0
    assert rates.sdpa_s(4, 64, 64, 64, "fp32", backward=True, causal=False) > 0


@pytest.mark.torch
def test_the_kernel_probe_leaves_out_points_too_slow_to_time():
    """A point predicted (at the rate of the one before) to take over `slow_call_s` is not
    timed: the grid's count and the slowest prediction are kept, the probe notes them, and
    estimates read the nearest measured point (bf16 x @ W on an AVX2-only CPU ran at
    0.15 GFLOP/s: 57 s a call at 256 x 4096 x 4096)."""
    torch = pytest.importorskip("torch")
    from gpuwise.measure.probe.kernels import KernelPlan, _Kernels, kernel_notes

    plan = KernelPlan(rows=(1, 64), widths=(64, 256), backward_rows=(16,), nn_rows=(1,),
                      nn_widths=(64,), cold_set_bytes=2**20, slow_call_s=1e-9)  # fmt: skip
    probe = _Kernels(torch, torch.device("cpu"), plan, None)
    out = probe.linear("fp32")
    assert [p[:3] for p in out["forward"]] == [[1, 64, 64]]  # only the first: nothing before it
    assert [p[:3] for p in out["backward"]] == [[16, 64, 64]]
    assert probe.skipped["linear.fp32.forward"][0] == 7 and probe.skipped["linear.fp32.backward"][0] == 3
    record = {"linear": {"fp32": out}, "skipped": {
        grid: {"points": n, "predicted_s": s, "limit_s": plan.slow_call_s}
        for grid, (n, s) in probe.skipped.items()}}  # fmt: skip
    notes = kernel_notes(record)
    assert len(notes) == 2 and notes[0].startswith("fp32 linear forward: 7 points not measured")
    rates = KernelRates.from_record(record)
    (m, k, n, seconds), = out["forward"]
    assert rates.linear_s(64, 256, 256, "fp32") == pytest.approx(seconds * 64 * 16)


def test_a_kernel_probe_that_fails_is_missing_with_its_reason(monkeypatch):
    pytest.importorskip("torch")
    from gpuwise.measure.probe import NullBackend, ProbePlan, probe_with
    from gpuwise.measure.probe import kernels as kernel_probe
    from gpuwise.measure.probe.machine import _with_kernels

    def broken(*args, **kwargs):
        raise RuntimeError("no SDPA here")

    monkeypatch.setattr(kernel_probe, "measure_kernels", broken)
    plan = ProbePlan.for_mode(True, 2**20)
    profile = probe_with(NullBackend(), plan, fingerprint="test")
    after = _with_kernels(profile, None)
    assert after.kernels is None and "no SDPA here" in after.missing["kernels"]


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
        replace(CPU, kernels=kernels)).decode.ops}  # fmt: skip
    assert ops["mlp_in"].layout == "nn" and ops["lm_head"].layout == ""
    assert not arch("llama-3.1-8b").conv1d and not arch("starcoderbase-1b").conv1d


def test_fresh_tensors_past_the_mmap_threshold_pay_first_touch():
    record = _record() | {"fresh": {"bytes_per_s": 5e9, "threshold": 32 * 2**20}}
    rates = replace(CPU, kernels=KernelRates.from_record(record))
    big, small = 64 * 2**20, 16 * 2**20
    op = Op("x", "elementwise", 1.0, 1e6, fresh=((big, 2), (small, 3)),
            fresh_backward=((big, 1),))  # fmt: skip
    plain = replace(op, fresh=(), fresh_backward=())
    assert time_op(op, rates, "fp32").seconds - time_op(plain, rates, "fp32").seconds == (
        pytest.approx(2 * big / 5e9))
    back = time_op(op, rates, "fp32", "backward", 2.0).seconds
    assert back - time_op(plain, rates, "fp32", "backward", 2.0).seconds == pytest.approx(big / 5e9)
    # without a probed first-touch rate (a GPU, an old profile) nothing is added
    assert time_op(op, replace(CPU, kernels=KERNELS), "fp32").seconds == time_op(
        plain, replace(CPU, kernels=KERNELS), "fp32").seconds


def test_a_profile_without_tanh_times_it_as_the_tanh_gelu():
    k = KernelRates.from_record(_record())
    assert k.elementwise_rate("tanh", "fp32") == 10e9  # the record's "gelu", not its 40e9 mul
    probed = _record()
    probed["elementwise"]["fp32"]["tanh"] = 7e9
    assert KernelRates.from_record(probed).elementwise_rate("tanh", "fp32") == 7e9


def test_the_probe_warns_when_first_touch_slows_with_memory_in_use():
    from gpuwise.measure.probe.kernels import first_touch_note

    gib = 2**30
    slow = {"bytes_per_s": 5.0e9, "by_held": [[0, 5.0e9], [gib, 0.75e9], [6 * gib, 4.5e9]]}
    (note,) = first_touch_note(slow)
    assert "0.75 GB/s with 1 GiB in use, against 5.0 in a small process" in note
    flat = {"bytes_per_s": 5.0e9, "by_held": [[0, 5.0e9], [gib, 4.0e9]]}
    assert first_touch_note(flat) == () and first_touch_note({"bytes_per_s": 5e9}) == ()


def test_train_says_what_the_steps_page_faults_cost_and_how_to_keep_the_memory(monkeypatch):
    from rich.console import Console

    from gpuwise.app import train as train_app
    from gpuwise.catalog import resolve_model
    from gpuwise.measure.runs.module_run import NO_FAULTS_ENV
    from gpuwise.report.estimate_views import train_view

    record = _record() | {"fresh": {"bytes_per_s": 1e9, "threshold": 32 * 2**20}}
    probed = replace(CPU, kernels=KernelRates.from_record(record))
    plan = TrainingPlan(batch=2, seq=256, dtype="fp32", optimizer="adamw")
    model = resolve_model("gpt2")
    for rates, tipped in ((probed, True), (replace(CPU, kernels=KERNELS), False)):
        monkeypatch.setattr(train_app, "rates_for", lambda hw, r=rates: (r, "test rates"))
        obj, view = train_view(train_app.train(model, arch("gpt2"), find_hardware("h100"), plan))
        faults = obj["time"]["page_faults_s"]
        assert (faults > 0.05 * obj["time"]["step_s"]) is tipped
        if tipped:
            console = Console(width=400, record=True)
            console.print(view)
            text = console.export_text()
            assert f"{faults:.2f} s of the step" in text
            assert all(f"{k}={v}" in text for k, v in NO_FAULTS_ENV.items())
        else:
            assert faults == 0.0
        assert obj["time"]["step_s_slow_page_faults"] is None  # the probe saw no slowing


def test_train_gives_the_step_at_the_slow_first_touch_the_probe_saw(monkeypatch):
    from rich.console import Console

    from gpuwise.app import train as train_app
    from gpuwise.catalog import resolve_model
    from gpuwise.estimate.speed.probed_kernels import slow_first_touch_reading
    from gpuwise.report.estimate_views import train_view

    gib = 2**30
    fresh = {"bytes_per_s": 1e9, "threshold": 32 * 2**20,
             "by_held": [[0, 1e9], [gib, 0.8e9], [2 * gib, 0.1e9], [6 * gib, 0.16e9]]}  # fmt: skip
    assert slow_first_touch_reading(fresh) == (2 * gib, 0.1e9)
    assert slow_first_touch_reading(fresh | {"by_held": [[0, 1e9], [gib, 0.52e9]]}) == (0, 0.0)
    probed = replace(CPU, kernels=KernelRates.from_record(_record() | {"fresh": fresh}))
    monkeypatch.setattr(train_app, "rates_for", lambda hw: (probed, "test rates"))
    plan = TrainingPlan(batch=2, seq=256, dtype="fp32", optimizer="adamw")
    answer = train_app.train(resolve_model("gpt2"), arch("gpt2"), find_hardware("h100"), plan)
    obj, view = train_view(answer)
    t = obj["time"]
    # Every fault charged scales with the first-touch rate: 10x slower, 10x the seconds.
    assert t["step_s_slow_page_faults"] - t["step_s"] == pytest.approx(9 * t["page_faults_s"])
    console = Console(width=400, record=True)
    console.print(view)
    text = " ".join(console.export_text().split())  # the line wraps in the panel
    assert (f"0.10 GB/s the probe also saw with memory in use, the step takes up to "
            f"{t['step_s_slow_page_faults']:.2f} s") in text  # fmt: skip


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


def test_convolutions_take_the_rate_of_the_nearest_probed_shape():
    record = _record() | {"conv": {"fp32": {
        "forward": [[100, 576, 64, 1e-3], [25, 1152, 128, 0.5e-3]],
        "backward": [[100, 576, 64, 3e-3], [25, 1152, 128, 1e-3]]}}}  # fmt: skip
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
        "backward:7x7/s2": [[100, 147, 64, 1, 2e-3]]}}}  # fmt: skip
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
              kernel="7x7/s2")  # fmt: skip
    assert time_op(stem, rates, "fp32").seconds == pytest.approx(2e-3)


def test_validate_sets_a_training_step_against_both_ends_of_its_range(monkeypatch):
    from rich.console import Console

    from gpuwise.app import validate as validation
    from gpuwise.catalog import resolve_model
    from gpuwise.measure.runs import time_run as timerun
    from gpuwise.report.validate_view import validate_view

    gib = 2**30
    fresh = {"bytes_per_s": 1e9, "threshold": 32 * 2**20, "by_held": [[0, 1e9], [gib, 0.1e9]]}
    probed = replace(CPU, kernels=KernelRates.from_record(_record() | {"fresh": fresh}))
    monkeypatch.setattr(validation, "rates_for", lambda hw: (probed, "test rates"))
    monkeypatch.setattr(validation, "machine_vs_probe", lambda: {})
    ran = timerun.MeasuredTime(None, None, 5.0, 5, "cpu", 2, "2.13.0", "test")
    monkeypatch.setattr(timerun, "time_training", lambda config, **kw: ran)
    plan = TrainingPlan(batch=2, seq=256, dtype="fp32", optimizer="adamw")
    model = resolve_model("gpt2")
    result = validation.validate(model.config, arch("gpt2"), plan, quiet=True, memory=False)
    obj, view = validate_view(model, arch("gpt2"), plan, result, memory=False, timing=True)
    step = obj["time"]["step_s"]
    assert step["estimated"] < step["estimated_slow_faults"]
    assert step["error"] == pytest.approx(step["estimated"] / 5.0 - 1)
    console = Console(width=400, record=True)
    console.print(view)
    text = console.export_text()
    assert "step s, faults at the probe's slow first touch" in text
    assert f"{100 * (step['estimated_slow_faults'] / 5.0 - 1):+.1f}%" in text
