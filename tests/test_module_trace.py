"""gpuwise.from_module and `gpuwise module`: tracing on meta against hand-computed FLOPs,
parameters and saved activations; no allocation for a 7B-shaped model; the CLI contract;
one real run against the estimate."""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import module_zoo  # noqa: E402  (tests/ is on sys.path under pytest)
from heap_walk import held_at_end, most_held  # noqa: E402
from test_cli import run  # noqa: E402  (the CLI runner: exit code, stdout, stderr)

from gpuwise.app.module import from_module  # noqa: E402
from gpuwise.catalog.hardware import find_hardware  # noqa: E402
from gpuwise.measure.module.trace import trace_module  # noqa: E402

B, W, DEPTH = 8, 64, 3  # linear_stack: 3 Linear(64, 64) with ReLU between
MM_FLOPS = 2 * B * W * W
PARAMS = DEPTH * (W * W + W)
ACT = B * W * 4  # one fp32 activation of the stack


def test_linear_stack_inference_counts():
    t = trace_module(module_zoo.linear_stack(W, DEPTH), (B, W))
    assert t.param_count == PARAMS and t.param_bytes == PARAMS * 4
    assert t.input_bytes == ACT and t.output_bytes == ACT
    assert t.flops("forward") == DEPTH * MM_FLOPS + 2 * B * W  # + one per ReLU output
    matmuls = [op for op in t.ops if op.kind == "matmul"]
    assert [(op.m, op.n, op.k) for op in matmuls] == [(B, W, W)] * DEPTH
    # addmm reads bias, input and weight and writes its output
    assert matmuls[0].bytes == (W + B * W + W * W + B * W) * 4
    assert matmuls[0].weight_bytes == (W * W + W) * 4
    assert t.saved_bytes == 0 and not t.phase_ops("backward")


def test_linear_stack_training_saved_and_backward():
    t = trace_module(module_zoo.linear_stack(W, DEPTH), (B, W), training=True, optimizer="sgd")
    # Saved for backward: the two ReLU outputs (the second and third Linear's inputs are the
    # same storages); the model's own input is not counted, nor are the weights.
    assert t.saved_bytes == 2 * ACT
    # Backward: weight gradients of 3 layers, input gradients of the last 2 (the input needs none)
    backward_mm = [op for op in t.phase_ops("backward") if op.kind == "matmul"]
    assert sum(op.flops for op in backward_mm) == 5 * MM_FLOPS
    assert t.trainable_count == PARAMS and t.largest_trainable == W * W
    assert t.optimizer_ops["kernels"] > 0
    # At the end of backward every gradient is alive: the peak holds them all.
    assert t.peak.gradient_bytes == PARAMS * 4


def test_estimates_reuse_the_training_model():
    model = module_zoo.linear_stack(W, DEPTH)
    cpu = find_hardware("h100")
    for optimizer, states in (("adamw", 2), ("sgd", 1)):
        est = from_module(model, (B, W), training=True, optimizer=optimizer, on=cpu)
        mem = est.memory
        assert sum(mem.breakdown.values()) == mem.total_bytes
        assert mem.breakdown["weights"] == PARAMS * 4
        assert mem.breakdown["optimizer"] == states * PARAMS * 4
        assert est.time is not None and est.time.backward is not None
        assert est.time.backward.flops == pytest.approx(est.traced.flops("backward"))
    infer = from_module(model, torch.zeros(B, W), on=cpu)
    assert infer.time is not None and infer.time.backward is None
    assert infer.memory.total_bytes < mem.total_bytes


def test_tied_weights_and_dtype():
    emb = torch.nn.Embedding(100, 32)
    head = torch.nn.Linear(32, 100, bias=False)
    head.weight = emb.weight
    model = torch.nn.Sequential(emb, head)
    t = trace_module(model, torch.zeros(2, 5, dtype=torch.long), dtype="bf16", training=True)
    assert t.param_count == 100 * 32 and t.param_bytes == 100 * 32 * 2
    assert t.dtype == "bf16" and t.input_bytes == 2 * 5 * 8  # integer ids are not cast


def test_real_module_untouched():
    model = module_zoo.linear_stack(W, DEPTH)
    before = [(p.device.type, p.data_ptr(), p.detach().clone()) for p in model.parameters()]
    model.eval()
    trace_module(model, (B, W), training=True)
    assert not model.training  # train/eval flags restored
    for (dev, ptr, value), p in zip(before, model.parameters(), strict=True):
        assert p.device.type == dev and p.data_ptr() == ptr and torch.equal(p, value)
        assert p.grad is None


def test_attention_runs_the_cpu_kernel():
    vit = module_zoo.ViT(image=32, patch=8, dim=64, depth=1, heads=4, classes=10)
    names = {op.name for op in trace_module(vit, (2, 3, 32, 32)).ops}
    assert "_scaled_dot_product_flash_attention_for_cpu" in names
    assert "_safe_softmax" not in names  # no materialised score matrix, as on a CPU


class SevenB(torch.nn.Module):
    """32 Llama-7B-shaped layers (q, k, v, o 4096x4096; MLP 4096x11008 x3): 6.5B params."""

    def __init__(self) -> None:
        super().__init__()
        lin = torch.nn.Linear
        self.layers = torch.nn.ModuleList(
            torch.nn.ModuleList([lin(4096, 4096 * 3, bias=False), lin(4096, 4096, bias=False),
                                 lin(4096, 11008 * 2, bias=False), lin(11008, 4096, bias=False)])
            for _ in range(32)
        )

    def forward(self, x):
        for qkv, o, up, down in self.layers:
            x = x + o(qkv(x)[..., :4096])
            g, u = up(x).chunk(2, dim=-1)
            x = x + down(torch.nn.functional.silu(g) * u)
        return x


def test_seven_billion_traced_without_memory():
    with torch.device("meta"):
        model = SevenB()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    t = trace_module(model, (1, 2048, 4096), training=True, dtype="bf16")
    seconds = time.perf_counter() - start
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    per_layer = 4096 * 4096 * 4 + 3 * 4096 * 11008
    assert t.param_count == 32 * per_layer
    assert t.param_bytes == 2 * 32 * per_layer  # 13 GB of bf16 weights, none allocated
    assert t.flops("forward") >= 2 * 2048 * 32 * per_layer
    assert t.peak.total_bytes > t.param_bytes  # gradients + activations
    assert grown < 300 * 2**20, f"tracing grew the resident set by {grown / 2**20:.0f} MiB"
    assert seconds < 20


# ---------------------------------------------------------------- the command


def test_cli_json(capsys):
    code, out, err = run(["module", "module_zoo:linear_stack", "--input", "8x64", "--train",
                          "--optimizer", "sgd", "--on", "h100", "--json", "--ops"], capsys)
    assert code == 0, err
    obj = json.loads(out)
    assert obj["module"]["params"] == PARAMS
    assert obj["module"]["saved_for_backward_bytes"] == 2 * ACT
    assert obj["memory"]["breakdown"]["optimizer"] == PARAMS * 4
    assert sum(obj["memory"]["breakdown"].values()) == obj["memory"]["total_bytes"]
    assert obj["time"]["source_kind"] == "estimated" and obj["time"]["backward_s"] > 0
    assert {"forward", "backward"} <= set(obj["ops"])


def test_cli_factory_with_example_inputs_and_batch(capsys):
    code, out, err = run(["module", "module_zoo:bert_small", "--batch", "2", "--on", "h100",
                          "--json"], capsys)
    assert code == 0, err
    obj = json.loads(out)
    assert obj["plan"]["inputs"] == ["input_ids=2x128:int64"]
    assert obj["module"]["input_bytes"] == 2 * 128 * 8


def test_cli_table(capsys):
    code, out, _ = run(["module", "module_zoo:resnet18", "--input", "1x3x64x64"], capsys)
    assert code == 0
    assert "weights" in out and "estimated" in out and "resnet18" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no_such_pkg.mod:build", "--input", "1x3"], "cannot import 'no_such_pkg.mod'"),
        (["module_zoo", "--input", "1x3"], "is not of the form"),
        (["module_zoo:nope", "--input", "1x3"], "has no attribute 'nope'"),
        (["module_zoo:not_a_module", "--input", "1x3"], "expected a torch.nn.Module"),
        (["module_zoo:linear_stack", "--input", "8xA"], "is not a shape"),
        (["module_zoo:linear_stack", "--input", "8x0"], "dimension below 1"),
        (["module_zoo:linear_stack", "--input", "8x64:complex"], "unknown input dtype"),
        (["module_zoo:linear_stack"], "no example inputs"),
        (["module_zoo:linear_stack", "--input", "8x63"], "on the meta device failed"),
        (["module_zoo:linear_stack", "--input", "8x64", "--dtype", "fp12"], "unknown dtype"),
        (["module_zoo:linear_stack", "--input", "8x64", "--train", "--optimizer", "lion"],
         "unknown optimizer"),
    ],
)
def test_cli_bad_input(capsys, args, message):
    code, out, err = run(["module", *args], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: ") and message in lines[0], err
    assert all(line.startswith(("error: ", "hint: ")) for line in lines)  # no traceback


# ---------------------------------------------------------------- against a real run


@pytest.mark.slow
def test_real_training_memory_matches():
    from gpuwise.measure.runs.module_run import measure_module_memory

    tests = str(Path(__file__).parent)
    spec = [((32, 3, 64, 64), None)]
    measured = measure_module_memory("module_zoo:small_cnn", spec, training=True,
                                     sys_path=(tests,))
    est = from_module(module_zoo.small_cnn(), (32, 3, 64, 64), training=True, on="local")
    error = est.memory.model_bytes / measured.model_bytes - 1
    assert abs(error) < 0.05, (est.memory.breakdown, measured)


def test_traced_elementwise_ops_take_the_probed_kernels():
    from gpuwise.estimate.traced_module import to_ops

    t = trace_module(module_zoo.vit_small(), (1, 3, 224, 224), training=True, optimizer="sgd")
    forward = {op.name: op for op in to_ops(t.phase_ops("forward"))}
    # F.gelu's default is the exact (erf) GELU: another kernel than the tanh approximation
    assert forward["gelu"].kernel == "gelu_erf" and forward["add"].kernel == "binary"
    assert not forward["gelu"].streamed  # inference-style unless asked
    backward = {op.name: op for op in to_ops(t.phase_ops("backward"))}
    assert backward["gelu_backward"].kernel == "gelu_erf_backward"
    streamed = to_ops(t.phase_ops("backward"), streamed=True)
    assert all(op.streamed for op in streamed if op.kind == "elementwise")
    assert not any(op.streamed for op in streamed if op.kind != "elementwise")


def test_a_tanh_gelu_takes_the_tanh_kernel_forward_and_backward():
    from gpuwise.estimate.traced_module import to_ops

    class TanhMlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(64, 64)

        def forward(self, x):
            return torch.nn.functional.gelu(self.fc(x), approximate="tanh")

    t = trace_module(TanhMlp(), (8, 64), training=True, optimizer="sgd")
    kernels = {op.name: op.kernel for phase in ("forward", "backward")
               for op in to_ops(t.phase_ops(phase))}
    assert kernels["gelu"] == "gelu" and kernels["gelu_backward"] == "gelu_backward"


def test_a_cnn_pools_and_normalises_at_the_probed_rates():
    from gpuwise.estimate.traced_module import to_ops

    t = trace_module(module_zoo.resnet18(), (2, 3, 64, 64))
    kernels = {op.name: op.kernel for op in to_ops(t.phase_ops("forward"))}
    assert kernels["max_pool2d_with_indices"] == "pool"
    assert kernels["native_batch_norm"] == "batch_norm"  # inference: scale and shift
    t = trace_module(module_zoo.resnet18(), (2, 3, 64, 64), training=True, optimizer="sgd")
    ops = [op for phase in ("forward", "backward") for op in to_ops(t.phase_ops(phase))]
    kernels = {op.name: op.kernel for op in ops if op.kind != "conv"}
    assert kernels["native_batch_norm"] == "batch_norm_train"
    assert kernels["native_batch_norm_backward"] == "batch_norm_backward"
    assert kernels["max_pool2d_with_indices_backward"] == "pool_backward"
    # convolutions by window and stride, forward and backward: the stem, ResNet's
    # downsampling 3x3 and 1x1 ones, and the rest
    windows = {(op.name, op.kernel): op.count for op in ops if op.kind == "conv"}
    assert {w for _, w in windows} == {"7x7/s2", "3x3/s2", "1x1/s2", "3x3/s1"}
    assert windows["convolution_backward", "7x7/s2"] == 1  # no input gradient: one GEMM
    depthwise = torch.nn.Conv2d(8, 8, 5, stride=2, padding=2, groups=8)
    t = trace_module(depthwise, (1, 8, 16, 16))
    assert [op.variant for op in t.ops if op.name == "convolution"] == ["5x5/s2/g"]


def test_dropout_masks_count_the_mask_written_as_the_probe_does():
    from gpuwise.estimate.traced_module import to_ops

    model, example = module_zoo.bert_small()
    t = trace_module(model, example, training=True, optimizer="sgd")
    traced = [op for op in t.phase_ops("forward") if op.name == "bernoulli_"]
    masks = [op for op in to_ops(t.phase_ops("forward")) if op.name == "bernoulli_"]
    assert traced and masks and all(op.kernel == "bernoulli" for op in masks)
    # bernoulli_ draws into its tensor without reading it: fp32 elements x 4 bytes, once
    assert {op.bytes for op in masks} == {op.flops * 4 for op in traced}


def test_the_optimizer_step_takes_the_probed_curve_over_the_traced_tensors():
    from dataclasses import replace

    from gpuwise.estimate.speed.device_rates import rates_from_spec
    from gpuwise.estimate.speed.probed_kernels import KernelRates
    from gpuwise.estimate.traced_module import estimate_module_time

    t = trace_module(module_zoo.linear_stack(W, DEPTH), (B, W), training=True)
    assert t.trainable_tensors == ((W, DEPTH), (W * W, DEPTH))  # biases, weights
    spec = rates_from_spec(find_hardware("h100"))
    curve = [[64, 4e-8], [4096, 2e-9]]  # seconds per element: the small one's fixed cost
    probed = replace(
        spec, kernels=KernelRates.from_record({"optimizer": {"fp32": {"adamw": curve}}})
    )
    step = estimate_module_time(t, probed).optimizer
    assert step is not None and step.seconds == pytest.approx(
        DEPTH * (W * 4e-8 + W * W * 2e-9))
    # a probe without this optimizer falls back to the passes over the states
    sgd = estimate_module_time(trace_module(module_zoo.linear_stack(W, DEPTH), (B, W),
                                            training=True, optimizer="sgd"), probed, "sgd")
    unprobed = estimate_module_time(t, spec).optimizer
    assert sgd.optimizer is not None and unprobed is not None
    assert sgd.optimizer.seconds != step.seconds and unprobed.seconds != step.seconds


def test_the_allocators_page_faults_are_replayed_and_charged_at_the_first_touch_rate():
    from dataclasses import replace

    from gpuwise.estimate.speed.device_rates import rates_from_spec
    from gpuwise.estimate.speed.probed_kernels import KernelRates
    from gpuwise.estimate.traced_module import estimate_module_time, heap_faults

    t = trace_module(module_zoo.linear_stack(512, 4), (256, 512), training=True)
    faults = heap_faults(t)
    assert t.heap and faults  # 512 KiB activations: mapped, then trimmed from the heap
    spec = replace(rates_from_spec(find_hardware("h100")), kind="cpu")
    fresh = replace(spec, kernels=KernelRates.from_record({"fresh": {"bytes_per_s": 2e9}}))
    timed = estimate_module_time(t, fresh)
    for phase in (timed.forward, timed.backward, timed.optimizer):
        assert phase is not None
        charged = [o for o in phase.ops if o.op.kind == "faults"]
        nbytes = faults.get(phase.name, 0)
        assert [o.seconds for o in charged] == ([pytest.approx(nbytes / 2e9)] if nbytes else [])
    without = estimate_module_time(t, replace(fresh, kernels=KernelRates.from_record({})))
    assert timed.seconds == pytest.approx(without.seconds + sum(faults.values()) / 2e9)


def test_the_optimizer_steps_the_tensors_in_model_order_with_each_temporarys_lifetime():
    """torch.optim's loop keeps AdamW's `denom` (and Adafactor's squared gradient and update)
    in a local until the next tensor's replaces it. Measured on the module suite's 4-layer
    BERT with AdamW: 16.4 MB faulted per optimizer step, 16.4 MB replayed (8.2 before)."""
    from gpuwise.estimate.traced_module import _step_events

    t = trace_module(module_zoo.linear_stack(512, 4), (64, 512), training=True)
    assert t.trainable_order == (512 * 512, 512) * 4  # weight, bias per layer, as listed

    def most_live(optimizer: str) -> int:
        temporaries = [e for e in _step_events(t, optimizer) if not e.kept]
        assert not held_at_end(temporaries)
        return most_held(temporaries)

    assert most_live("adamw") == 3  # the last denom, this root and denom
    assert most_live("adafactor") == 4  # the last grad_sqr and update, this grad_sqr, its square
    assert most_live("sgd") == 0


def test_attention_takes_the_probed_curve_of_its_kind_both_ways():
    from gpuwise.estimate.traced_module import to_ops

    t = trace_module(module_zoo.vit_small(), (1, 3, 224, 224), training=True, optimizer="sgd")
    forward = [op for op in to_ops(t.phase_ops("forward")) if op.kind == "attention"]
    backward = [op for op in to_ops(t.phase_ops("backward")) if op.kind == "attention"]
    for ops in (forward, backward):  # non-causal, batch 1 x 6 heads, 197 positions
        assert ops and all(op.kernel == "sdpa" and not op.causal and op.heads == 6
                           and op.m == 6 * 197 and op.n == 197 for op in ops)


def test_a_cpu_addmm_writes_its_output_once_more_for_the_bias():
    from gpuwise.estimate.traced_module import to_ops

    t = trace_module(module_zoo.linear_stack(W, DEPTH), (B, W))
    fills = [op for op in to_ops(t.phase_ops("forward")) if op.name == "addmm bias fill"]
    assert [(op.bytes, op.count) for op in fills] == [(B * W * 4, DEPTH)]
    assert not [op for op in to_ops(t.phase_ops("forward"), cpu=False) if "fill" in op.name]
