"""Estimates for a traced PyTorch module: the same memory breakdown and roofline time model as
the built-in families, from what the trace recorded (gpuwise.workload.traced).

Memory: weights (parameters and buffers), inputs, optimizer states, and the tensors the pass
creates at its highest point, split into saved activations, parameter gradients and the rest
(workspace). Training takes the larger of the forward/backward peak and the optimizer step
(all gradients, states and the step's scratch, as in `estimate.memory.training`).

Time: every traced aten op becomes an `Op` with its FLOPs and bytes, timed as the built-in
families' ops are (`speed.roofline.time_op`: the probe's kernels at their shape where it
measured them, else the roofline), plus the eager runtime's dispatch cost per op; backward uses
the traced backward ops (not a multiple of forward); the optimizer step its memory traffic
(`speed.optimizer_step.optimizer_phase`) plus the dispatch cost of the ops it was counted to run.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, replace

from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.optimizers import optimizer_spec
from gpuwise.catalog.runtimes import runtime
from gpuwise.estimate.memory.breakdown import MemoryEstimate, make_estimate
from gpuwise.estimate.memory.training import ParamBytes, step_temporary
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.optimizer_step import optimizer_phase
from gpuwise.estimate.speed.page_faults import replay
from gpuwise.estimate.speed.roofline import (
    PhaseTime,
    dispatch_cost,
    fresh_bytes_per_s,
    phase_time,
    with_faults,
)
from gpuwise.workload.ops import Op
from gpuwise.workload.plans import TrainingPlan
from gpuwise.workload.traced import HeapEvent, TracedModule, TracedOp
from gpuwise.workload.training_heap import step_events

RUNTIME = "PyTorch eager (traced module)"


@dataclass(frozen=True)
class ModuleTime:
    """Forward (inference) or a training step: forward, backward and optimizer phases."""

    forward: PhaseTime
    backward: PhaseTime | None
    optimizer: PhaseTime | None
    source: str
    runtime: str = RUNTIME

    @property
    def seconds(self) -> float:
        """Forward latency, or the training step."""
        return sum(p.seconds for p in (self.forward, self.backward, self.optimizer) if p)


def _plan(traced: TracedModule, optimizer: str) -> TrainingPlan:
    return TrainingPlan(batch=1, seq=1, dtype=traced.dtype, optimizer=optimizer)


def _state_bytes(traced: TracedModule, optimizer: str) -> tuple[float, float]:
    """(optimizer state bytes, bytes per state element): Adafactor keeps fp32 factored rows
    and columns; the others their full states (`states_per_param`, catalog/data/
    optimizers.toml) in the parameters' dtype."""
    per = traced.param_bytes / max(1, traced.param_count)
    spec = optimizer_spec(optimizer)
    if spec.factored:
        return traced.factored_state_count * 4.0, 4.0
    return traced.trainable_count * spec.states_per_param * per, per


def estimate_module_memory(traced: TracedModule, hw: Hardware,
                           optimizer: str = "adamw") -> MemoryEstimate:
    """Peak memory of the traced pass (a no-grad forward, or a training step) on `hw`."""
    rt = runtime(hw.kind)
    weights = float(traced.param_bytes + traced.buffer_bytes)
    at_rest = {"weights": weights, "inputs": float(traced.input_bytes)}
    peak = traced.peak
    notes = [f"traced on meta: {len(traced.ops)} aten ops; saved for backward "
             f"{traced.saved_bytes:,} bytes" if traced.training else
             f"traced on meta: {len(traced.ops)} aten ops (no-grad forward)"]
    notes += list(traced.notes)
    if not traced.training:
        parts = {**at_rest, "activations": float(peak.total_bytes)}
        phase, phases = "forward", {"forward": sum(parts.values())}
    else:
        states, per_state = _state_bytes(traced, optimizer)
        per = traced.param_bytes / max(1, traced.param_count)
        grads = traced.trainable_count * per
        pb = ParamBytes(weights, grads, states, traced.trainable_count, traced.largest_trainable)
        step_temp = step_temporary(_plan(traced, optimizer), pb, rt.optimizer_foreach, per_state)
        base = weights + traced.input_bytes + states
        phases = {"forward/backward": base + peak.total_bytes,
                  "optimizer step": base + grads + step_temp}
        phase = max(phases, key=lambda k: phases[k])
        if phase == "optimizer step":
            parts = {**at_rest, "gradients": grads, "optimizer": states, "activations": 0.0,
                     "workspace": step_temp}
        else:
            parts = {**at_rest, "gradients": float(peak.gradient_bytes), "optimizer": states,
                     "activations": float(peak.saved_bytes),
                     "workspace": float(peak.other_bytes)}
    dynamic = sum(v for k, v in parts.items() if k not in ("weights", "optimizer", "inputs"))
    overhead = rt.baseline_bytes + rt.allocator_fraction * dynamic
    parts["overhead"] = overhead
    total_phases = {k: v + overhead for k, v in phases.items()}
    notes.append(f"runtime overhead: the {rt.id} baseline ({rt.baseline_source.split(':')[0]}); "
                 "a process without transformers holds less")
    return make_estimate(parts, hw.memory_bytes, f"{RUNTIME} on {hw.kind.upper()}", phase,
                         total_phases, tuple(notes))


# Traced aten elementwise ops the probe timed a kernel for, by aten name.
# GELU: the exact (erf) one, F.gelu's default, and its tanh approximation are two kernels;
# batch norm in training (statistics first) and in inference are two, and each backward is
# its own. A kernel an older profile lacks is timed at the memory bandwidth.
ELEMENTWISE_KERNELS = {"gelu": "gelu_erf", "gelu:tanh": "gelu",
                       "gelu_backward": "gelu_erf_backward", "gelu_backward:tanh": "gelu_backward",
                       "silu": "silu", "mul": "binary", "add": "binary",
                       "sub": "binary", "div": "div", "sqrt": "sqrt", "cat": "cat",
                       "bernoulli": "bernoulli", "native_dropout": "bernoulli",
                       "max_pool2d_with_indices": "pool",
                       "max_pool2d_with_indices_backward": "pool_backward",
                       "native_batch_norm": "batch_norm",
                       "native_batch_norm:train": "batch_norm_train",
                       "_native_batch_norm_legit_no_training": "batch_norm",
                       "native_batch_norm_backward": "batch_norm_backward"}


def _op(t: TracedOp, cpu: bool, streamed: bool = False) -> Op:
    """The Op of one traced op (a convolution backward: one Op per GEMM it runs).

    Elementwise ops the probe timed (GELU, SiLU, products and sums, division, square root,
    concatenation, dropout masks, max-pooling, batch norm) take its kernel rates, measured
    on activation-sized tensors; `streamed` (a training step, whose saved tensors are read
    back from memory) caps them at the memory bandwidth; the rest move their bytes at the
    memory bandwidth.
    Attention takes the probe's SDPA curve of its kind and direction (causal, or the
    non-causal one: the causal curve at ViT's non-causal shape, 24 x 197 x 197 x 64,
    predicted 6.0 ms for a kernel measured at 2.5 ms; a non-causal backward, unprobed
    before 2026-12-03 18:00, was timed at the matmul rate: ViT's six at 11.5 ms against
    17.4 in `torch.profiler`); a shape or direction the probe did not time takes its FLOPs
    at the matmul rate. On a CPU all read fp32's figures: the flash kernel accumulates in
    fp32, and bf16 ran no faster here.
    """
    if t.kind == "attention":
        dtype = "fp32" if cpu else t.dtype
        return Op(t.name, t.kind, t.flops, t.bytes, 1, t.m, t.n, t.k, t.weight_bytes, "sdpa",
                  dtype, t.heads, causal=t.causal)
    gemms = 1
    if t.name == "convolution_backward" and t.m and t.n and t.k:
        # One op, up to two GEMMs (input and weight gradients) of the forward's size.
        gemms = max(1, round(t.flops / (2.0 * t.m * t.n * t.k)))
    # Convolutions take the probe's convolution curve of their window and stride (by FLOPs)
    # where it ran, else the roofline on the matmul size curve: the linear grid does not
    # cover oneDNN's kernels.
    kind = "conv" if t.name.startswith("convolution") else t.kind
    key = t.name.rstrip("_") + (f":{t.variant}" if t.variant else "")
    kernel = ELEMENTWISE_KERNELS.get(key, "") if kind == "elementwise" else ""
    kernel = t.variant if kind == "conv" else kernel
    return Op(t.name, kind, t.flops / gemms, t.bytes / gemms, gemms, t.m, t.n, t.k,
              t.weight_bytes / gemms, kernel, t.dtype,
              streamed=streamed and kind == "elementwise")


def to_ops(traced_ops: tuple[TracedOp, ...], cpu: bool = True,
           streamed: bool = False) -> list[Op]:
    """Ops of the non-view traced ops, identical ones merged into one with a count."""
    merged: Counter[Op] = Counter()
    for t in traced_ops:
        if t.kind == "view":
            continue
        op = _op(t, cpu, streamed)
        merged[replace(op, count=1)] += op.count
        if cpu and t.name == "addmm":
            merged[_bias_fill(t)] += 1
    return [replace(op, count=count) for op, count in merged.items()]


ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp64": 8}


def _bias_fill(t: TracedOp) -> Op:
    """A CPU addmm first fills its output with the broadcast bias, then runs the GEMM on
    top (`copy_` under `addmm` in torch.profiler: 24 calls, 2.8-3.3 ms of a 4-layer BERT's
    forward): one write of the output at the memory bandwidth, which the probe's bias-free
    linear does not time (its first touch is the allocator replay's)."""
    out = t.m * t.n * ELEMENT_BYTES.get(t.dtype, 4)
    return Op("addmm bias fill", "elementwise", 0.0, float(out), dtype=t.dtype)


def heap_faults(traced: TracedModule, optimizer: str = "adamw") -> dict[str, int]:
    """Bytes the host allocator faults in per pass, by phase, in steady state: the traced
    pass, and a training step's optimizer states and temporaries, replayed through glibc's
    rules (`speed.page_faults.replay`)."""
    return replay([*traced.heap, *_step_events(traced, optimizer)],
                  freed_before=(traced.cast_bytes,) if traced.cast_bytes else ())


def _step_events(traced: TracedModule, optimizer: str) -> list[HeapEvent]:
    """The optimizer step's states and temporaries, over the trainable tensors in the order
    the model lists them (by size where the trace predates that order)."""
    if not traced.training:
        return []
    per = traced.param_bytes / max(1, traced.param_count)
    order = traced.trainable_order or tuple(
        n for n, count in traced.trainable_tensors for _ in range(count))
    return step_events([int(n * per) for n in order], optimizer,
                       itertools.count(-1 - 2**40, -1))  # below the trace's keys


def _phase(name: str, ops: tuple[TracedOp, ...], rates: DeviceRates, dtype: str,
           cost_phase: str, streamed: bool = False) -> PhaseTime:
    """The phase's ops on the roofline, plus the dispatch cost of every traced op: the
    probe's bare per-op time (a tiny add), not the transformers runtime's per-op cost, which
    is measured through generate() and a Llama's modules and which the traced ops (every aten
    op, counted one by one) would count twice."""
    views = sum(1 for t in ops if t.kind == "view")
    overhead = dispatch_cost(len(ops) - views, views, rates, cost_phase, per_step=False,
                             runtime=False)
    return phase_time(name, to_ops(ops, rates.kind == "cpu", streamed), rates, dtype, overhead)


def estimate_module_time(traced: TracedModule, rates: DeviceRates,
                         optimizer: str = "adamw") -> ModuleTime:
    """Forward latency (inference) or the training step from the traced ops."""
    dtype = traced.dtype
    cost_phase = "training" if traced.training else "inference"
    training = traced.training
    fresh = fresh_bytes_per_s(rates)
    faults = heap_faults(traced, optimizer) if fresh else {}
    forward = _phase("forward", traced.phase_ops("forward"), rates, dtype, cost_phase, training)
    forward = with_faults(forward, faults.get("forward", 0), fresh)
    if not training:
        return ModuleTime(forward, None, None, rates.source)
    backward = _phase("backward", traced.phase_ops("backward"), rates, dtype, cost_phase, True)
    backward = with_faults(backward, faults.get("backward", 0), fresh)
    counts = traced.optimizer_ops
    # torch.optim dispatches its ops straight from Python: the bare per-op cost applies
    # (where the step was not probed; a probed step includes it).
    step_overhead = (counts.get("kernels", 0) * rates.op_overhead_s
                     + counts.get("views", 0) * rates.view_overhead_s)
    step = optimizer_phase(_plan(traced, optimizer), traced.trainable_count,
                           traced.trainable_tensors, rates, step_overhead)
    step = with_faults(step, faults.get("optimizer", 0), fresh)
    return ModuleTime(forward, backward, step, rates.source)
