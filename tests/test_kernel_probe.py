"""The kernel probe itself on this CPU (a tiny plan, points too slow to time, a probe that
fails, the first-touch warning), and what its slow first touch makes train and validate say."""

import importlib.util
from dataclasses import replace

import pytest
from catalogue_archs import arch
from kernel_record import CPU, KERNELS, _record

from gpuwise.catalog import find_hardware
from gpuwise.estimate import TrainingPlan
from gpuwise.estimate.speed.probed_kernels import KernelRates


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
                      cold_set_bytes=2**20, target_s=0.001)
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
                                               "batch_norm_train", "batch_norm_backward"}
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
                      nn_widths=(64,), cold_set_bytes=2**20, slow_call_s=1e-9)
    probe = _Kernels(torch, torch.device("cpu"), plan, None)
    out = probe.linear("fp32")
    assert [p[:3] for p in out["forward"]] == [[1, 64, 64]]  # only the first: nothing before it
    assert [p[:3] for p in out["backward"]] == [[16, 64, 64]]
    assert probe.skipped["linear.fp32.forward"][0] == 7 and probe.skipped["linear.fp32.backward"][0] == 3
    record = {"linear": {"fp32": out}, "skipped": {
        grid: {"points": n, "predicted_s": s, "limit_s": plan.slow_call_s}
        for grid, (n, s) in probe.skipped.items()}}
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
             "by_held": [[0, 1e9], [gib, 0.8e9], [2 * gib, 0.1e9], [6 * gib, 0.16e9]]}
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
            f"{t['step_s_slow_page_faults']:.2f} s") in text


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
