"""How fast a model generates: prefill and decode-step time from the roofline model."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.runtime_speed import runtime_speed
from gpuwise.catalog.time_intervals import TimeInterval, time_interval
from gpuwise.estimate.memory.weights import mean_weight_bytes
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.ggml_time import ggml_phases, ggml_type
from gpuwise.estimate.speed.page_faults import replay
from gpuwise.estimate.speed.roofline import (
    PhaseTime,
    dispatch_overhead,
    fresh_bytes_per_s,
    op_count_mode,
    phase_time,
    with_faults,
    with_logits_step,
    with_row,
)
from gpuwise.estimate.speed.runtime_time import kernel_for, runtime_rates
from gpuwise.workload import Architecture, count_params
from gpuwise.workload.ops import Op, Shape, forward_ops, kv_append_ops, tensor_parallel_share
from gpuwise.workload.plans import InferencePlan
from gpuwise.workload.prefill_heap import prefill_heap_events

RUNTIME = "Hugging Face transformers (PyTorch eager)"
# The replay runs a prefill of 4 and of 8 layers and extends the difference to the model's
# depth (layers repeat: within 4% of the whole model's replay on every time-suite case, at
# 3 ms against 10-15 ms for 24-32 layers).
SAMPLED_LAYERS = (4, 8)


@dataclass(frozen=True)
class InferenceTime:
    prefill: PhaseTime
    decode: PhaseTime  # one step at the mid-point of generation
    batch: int
    new_tokens: int
    source: str
    runtime: str = RUNTIME
    runtime_id: str = "transformers"
    kernel: str = ""  # the weight-only kernel, or the ggml type under llama.cpp
    # What a measured estimate had to go without: a part of the probe it needs that this
    # machine's profile lacks, one line each (empty: nothing, or datasheet rates throughout)
    missing: tuple[str, ...] = ()

    @property
    def prefill_s(self) -> float:
        return self.prefill.seconds

    @property
    def decode_s_per_token(self) -> float:
        return self.decode.seconds

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second across the batch, in the decode phase."""
        return self.batch / self.decode.seconds

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.new_tokens * self.decode_s_per_token

    def interval(self, phase: str) -> TimeInterval | None:
        """The 80% interval of this runtime's validation for "prefill" or "decode"."""
        return time_interval(self.runtime_id, phase, self.source)


def plan_shape(plan: InferencePlan, arch: Architecture, tokens: int, context: int,
           logits: int) -> Shape:  # fmt: skip
    fmt = plan.weight_format
    compute = weight_format(fmt.compute_dtype).bytes_per_element
    kv = weight_format(plan.kv_dtype or fmt.compute_dtype).bytes_per_element
    per_weight = (plan.stored_weights.total_bytes / count_params(arch).total
                  if plan.stored_weights else mean_weight_bytes(arch, fmt.id))  # fmt: skip
    return Shape(plan.batch, tokens, context, compute, per_weight, kv, plan.attention, logits)


@lru_cache(maxsize=4096)
def inference_ops(arch: Architecture, shape: Shape, fused: bool, tp: int) -> tuple[Op, ...]:
    """The ops of one inference pass on one of `tp` devices; cached, as a sweep asks for the
    same model and shape on every device."""
    ops = forward_ops(arch, shape)
    if fused:
        # Compiled and serving runtimes fuse norms, rotary, activations and residuals into
        # neighbouring kernels, and write the cache in place: what remains is the matmul
        # and attention traffic.
        ops = [op for op in ops if op.kind in ("matmul", "attention", "embedding")]
    else:
        ops += kv_append_ops(arch, shape)
    return tuple(tensor_parallel_share(op, tp) for op in ops)


@lru_cache(maxsize=256)
def prefill_fault_bytes(arch: Architecture, shape: Shape) -> int:
    """Bytes a CPU prefill under transformers faults in afresh: its tensors replayed
    through glibc's allocator (`page_faults.replay`), in steady state. A decode step's
    tensors are a few rows each and fault nothing (measured: 0 within +-20 MB)."""
    lo, hi = SAMPLED_LAYERS
    if arch.num_layers <= hi:
        return _replayed_faults(arch, shape)
    few, more = (_replayed_faults(replace(arch, num_layers=n), shape) for n in (lo, hi))
    return max(0, round(more + (arch.num_layers - hi) * (more - few) / (hi - lo)))


def _replayed_faults(arch: Architecture, shape: Shape) -> int:
    # Two passes: the thresholds settle in the first (3 and 4 passes gave the same bytes on
    # every time-suite case).
    return replay(prefill_heap_events(arch, shape), passes=2).get("forward", 0)


def tp_allreduce_s(arch: Architecture, shape: Shape, rates: DeviceRates, tp: int) -> float:
    """Two all-reduces of the hidden state per layer under tensor parallelism."""
    if tp <= 1:
        return 0.0
    size = shape.rows * arch.hidden_size * shape.compute_bytes * 2 * (tp - 1) / tp
    bw = rates.interconnect_bytes_per_s or rates.memory_bytes_per_s
    return 2 * arch.num_layers * (rates.collective_latency_s + size / bw)


def estimate_inference_time(arch: Architecture, plan: InferencePlan, rates: DeviceRates,
                            runtime: str | None = None, tp: int = 1,
                            host: DeviceRates | None = None) -> InferenceTime:  # fmt: skip
    """Time to first token (prefill) and per output token (decode) under the plan's runtime
    (or `runtime`): transformers' generate(), torch.compile, vLLM, SGLang or llama.cpp
    (whose layers past `plan.gpu_layers` run on `host`)."""
    rt = runtime_speed(runtime or plan.runtime)
    rt.check_device(rates.kind, rates.name)
    if rt.model == "ggml":
        prefill, decode, g = ggml_phases(arch, plan, rates, plan.threads, host)
        missing: tuple[str, ...] = ()
        if rates.source == "measured" and g.source != "measured":
            missing = (f"llama.cpp was not probed here for {ggml_type(plan)} on "
                       f"{plan.threads or rates.compute_units} thread(s): its rates are the "
                       "datasheet's shares (`gpuwise probe --runtime llama.cpp` measures them)",)  # fmt: skip
        return InferenceTime(prefill, decode, plan.batch, plan.new_tokens, g.source, rt.name,
                             rt.id, ggml_type(plan), missing)  # fmt: skip
    kernel = kernel_for(rt, plan.weights, rates.kind, plan.quant_kernel)
    rates = runtime_rates(rates, rt, kernel)
    fmt = plan.weight_format
    dtype = fmt.compute_dtype
    mode = op_count_mode(dtype)
    logits = plan.prompt_tokens if plan.logits == "all" else 1
    eager = rt.dispatch == "eager"
    phases = []
    for name, tokens, context, count_key in (
        ("prefill", plan.prompt_tokens, plan.prompt_tokens, "inference"),
        ("decode", 1, plan.prompt_tokens + max(0, plan.new_tokens - 1) // 2 + 1, "decode"),
    ):
        shape = plan_shape(plan, arch, tokens, context, logits if name == "prefill" else 1)
        overhead = dispatch_overhead(arch, mode, plan.attention, count_key, rates) if eager else 0
        phase = phase_time(name, inference_ops(arch, shape, rt.fused, tp), rates, dtype,
                           overhead, tp_allreduce_s(arch, shape, rates, tp))  # fmt: skip
        fresh = fresh_bytes_per_s(rates) if eager and name == "prefill" else 0.0
        if fresh:
            phase = with_faults(phase, prefill_fault_bytes(arch, shape), fresh)
        if eager and name == "decode":
            phase = with_logits_step(phase, arch, plan.batch, rates)
        if rt.step_s.get(count_key):
            phase = with_row(phase, Op("runtime step", "runtime", 0.0, 0.0), rt.step_s[count_key])
        phases.append(phase)
    return InferenceTime(phases[0], phases[1], plan.batch, plan.new_tokens, rates.source,
                         rt.name, rt.id, kernel.id if kernel else "", eager_parts_missing(rates, eager))  # fmt: skip


def eager_parts_missing(rates: DeviceRates, eager: bool) -> tuple[str, ...]:
    """The line saying a measured eager estimate goes without the runtime's own costs: a
    quick probe measures none, and the bare op's cost that stands in is a fraction of
    transformers' (decode runs fast by half or more on a CPU)."""
    if not eager or rates.source != "measured" or rates.runtime_op_s:
        return ()
    return ("the probe measured no eager runtime costs (a quick probe does not): each op is "
            "charged the bare op's dispatch, not transformers', so this time is low "
            "(`gpuwise probe` without --quick measures them)",)  # fmt: skip
