"""Where a CPU's probed kernels make fp32 faster than half precision, train and infer say so."""

from dataclasses import replace

import pytest
from catalogue_archs import arch
from kernel_record import CPU, _record
from rich.console import Console

from gpuwise.app import infer as infer_app
from gpuwise.app import train as train_app
from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.catalog.thresholds import precision_thresholds
from gpuwise.estimate import InferencePlan, TrainingPlan
from gpuwise.estimate.speed.inference_time import estimate_inference_time
from gpuwise.estimate.speed.precision_advice import fp32_inference, fp32_training
from gpuwise.estimate.speed.probed_kernels import KernelRates
from gpuwise.estimate.speed.training_time import estimate_training_time
from gpuwise.report.estimate_views import infer_view, train_view

FASTER_BY = precision_thresholds().fp32_faster_by


def _rates(bf16_slower: float):
    """A probed CPU whose bf16 kernels take `bf16_slower` times their fp32 ones' seconds."""
    record = _record()
    fp32 = record["linear"]["fp32"]
    record["linear"]["bf16"] = {d: [[*p[:3], p[3] * bf16_slower] for p in pts]
                                for d, pts in fp32.items()}
    record["sdpa"]["bf16"] = {m: [[x, s * bf16_slower] for x, s in pts]
                              for m, pts in record["sdpa"]["fp32"].items()}
    record["elementwise"]["bf16"] = record["elementwise"]["fp32"]
    record["optimizer"]["bf16"] = record["optimizer"]["fp32"]
    return replace(CPU, kernels=KernelRates.from_record(record))


def _text(view) -> str:
    console = Console(width=400, record=True)
    console.print(view)
    return " ".join(console.export_text().split())


def test_fp32_is_named_only_where_the_probe_makes_it_faster():
    a, plan = arch("smollm2-135m"), TrainingPlan(batch=2, seq=256, dtype="bf16")
    slow, even = _rates(100.0), _rates(0.5)
    own = estimate_training_time(a, plan, slow)
    fp32 = fp32_training(a, plan, slow, own.step_s)
    assert fp32 is not None and fp32.step_s * FASTER_BY <= own.step_s
    assert fp32.step_s == estimate_training_time(a, replace(plan, dtype="fp32"), slow).step_s
    assert fp32_training(a, plan, even, estimate_training_time(a, plan, even).step_s) is None
    # fp32 asked for, or a GPU: nothing to name
    assert fp32_training(a, replace(plan, dtype="fp32"), slow, own.step_s) is None
    gpu = replace(slow, kind="gpu")
    assert fp32_training(a, plan, gpu, estimate_training_time(a, plan, gpu).step_s) is None
    infer = InferencePlan(batch=1, prompt_tokens=256, new_tokens=8, weights="bf16")
    assert fp32_inference(a, infer, slow, estimate_inference_time(a, infer, slow)) is not None
    assert fp32_inference(a, infer, even, estimate_inference_time(a, infer, even)) is None


def test_train_and_infer_print_the_fp32_line_and_json(monkeypatch):
    for app in (train_app, infer_app):
        monkeypatch.setattr(app, "rates_for", lambda hw: (_rates(100.0), "test rates"))
    model, hw = resolve_model("smollm2-135m"), find_hardware("h100")
    plan = TrainingPlan(batch=2, seq=256, dtype="mixed-bf16")
    obj, view = train_view(train_app.train(model, arch("smollm2-135m"), hw, plan))
    t = obj["time"]
    assert t["fp32_step_s"] is not None and t["fp32_step_s"] * FASTER_BY <= t["step_s"]
    text = _text(view)
    assert "fp32: faster here: step" in text and "in mixed-bf16" in text
    assert "without bf16 matrix instructions" in text
    infer = InferencePlan(batch=1, prompt_tokens=256, new_tokens=8, weights="bf16")
    obj, view = infer_view(infer_app.infer(model, arch("smollm2-135m"), hw, infer))
    assert obj["time"]["fp32_prefill_s"] < obj["time"]["prefill_s"]
    assert "weights in fp32: prefill" in _text(view)
    monkeypatch.setattr(train_app, "rates_for", lambda hw: (_rates(0.5), "test rates"))
    obj, view = train_view(train_app.train(model, arch("smollm2-135m"), hw, plan))
    assert obj["time"]["fp32_step_s"] is None and "fp32: faster" not in _text(view)


@pytest.mark.parametrize("weights", ["int8", "fp32"])
def test_weights_that_are_not_half_precision_get_no_fp32_line(weights):
    a, slow = arch("smollm2-135m"), _rates(100.0)
    plan = InferencePlan(batch=1, prompt_tokens=64, new_tokens=4, weights=weights)
    assert fp32_inference(a, plan, slow, estimate_inference_time(a, plan, slow)) is None
