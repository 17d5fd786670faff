"""How fast a model trains: the training step's forward, backward, optimizer step and
collectives from the roofline model."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from gpuwise.catalog.efficiency import time_model_rules
from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.runtime_speed import runtime_speed
from gpuwise.catalog.time_intervals import TimeInterval, time_interval
from gpuwise.estimate.memory.training import lora_dims, lora_params
from gpuwise.estimate.memory.weights import mean_weight_bytes
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.estimate.speed.host_traffic import HostTraffic, host_bytes, host_traffic, steps_on_host
from gpuwise.estimate.speed.inference_time import RUNTIME
from gpuwise.estimate.speed.optimizer_step import optimizer_phase
from gpuwise.estimate.speed.page_faults import replay
from gpuwise.estimate.speed.roofline import (
    PhaseTime,
    dispatch_cost,
    dispatch_overhead,
    fresh_bytes_per_s,
    op_count_mode,
    phase_time,
    with_faults,
    with_row,
    with_slow_faults,
    without_faults,
)
from gpuwise.workload import Architecture, count_params
from gpuwise.workload.lora_ops import lora_ops
from gpuwise.workload.ops import (
    Op,
    Shape,
    embedding_grad_ops,
    forward_ops,
    kv_append_ops,
    loss_ops,
    tensor_parallel_share,
)
from gpuwise.workload.params import parameter_tensors
from gpuwise.workload.plans import TrainingPlan
from gpuwise.workload.training_heap import training_heap_events


@dataclass(frozen=True)
class TrainingTime:
    forward: PhaseTime
    backward: PhaseTime
    optimizer: PhaseTime
    comm_s: float
    tokens: int  # tokens per step on all devices
    model_flops: float  # 6 N T + attention, per step on all devices
    peak_flops: float  # all devices
    source: str
    runtime: str = RUNTIME
    runtime_id: str = "transformers"
    host: HostTraffic = HostTraffic()  # offload's copies, a host optimizer step, paging

    @property
    def step_s(self) -> float:
        return (self.forward.seconds + self.backward.seconds + self.optimizer.seconds
                + self.comm_s + self.host.seconds)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_s

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: useful FLOPs per second over the dense peak."""
        return self.model_flops / self.step_s / self.peak_flops

    @property
    def bound(self) -> str:
        return self.backward.bound

    def seconds_for(self, tokens: float) -> float:
        return tokens / self.tokens_per_s

    def interval(self) -> TimeInterval | None:
        """The 80% interval of this runtime's validation for a training step."""
        return time_interval(self.runtime_id, "step", self.source)


@lru_cache(maxsize=64)
def training_fault_bytes(arch: Architecture, shape: Shape, param_bytes: float, optimizer: str,
                         checkpointing: bool) -> dict[str, int]:
    """Bytes a CPU training step under transformers faults in afresh, by phase: the whole
    step's tensors replayed through glibc's allocator (`workload.training_heap`). The whole
    model: the optimizer's faults depend on where the backward left the heap, and do not
    grow with depth in step (sampled layers were 20-25% off)."""
    events = training_heap_events(arch, shape, param_bytes, optimizer, checkpointing)
    return replay(events, passes=2)


def _with_step_faults(arch: Architecture, plan: TrainingPlan, shape: Shape, bwd: PhaseTime,
                      optimizer: PhaseTime, rates: DeviceRates,
                      ) -> tuple[PhaseTime, PhaseTime]:
    """The backward and the optimizer step on a probed CPU, plus the pages the allocator
    gives them afresh: gradients and AdamW's temporaries of a layer's weights' size, where
    the step's largest transient tensors set glibc's thresholds (Qwen2.5-0.5B at batch 1:
    its 8.7 MB MLP gradients, 650 MB and 834 MB measured per step). The forward's replayed
    faults are not charged: the replay puts them at 2-5x those measured (Qwen2.5 262 MB
    against 0-23, GPT-2 1,220 against 0-305), the heap the previous step leaves serving
    more of them than it models."""
    fresh = fresh_bytes_per_s(rates) if plan.finetune == "full" and plan.tp == 1 else 0.0
    if not fresh:
        return bwd, optimizer
    faults = training_fault_bytes(arch, shape, shape.weight_bytes, plan.optimizer,
                                  plan.checkpointing)
    return (with_faults(bwd, faults.get("backward", 0), fresh),
            with_faults(optimizer, faults.get("optimizer", 0), fresh))


def _dropout_ops(arch: Architecture, shape: Shape) -> tuple[list[Op], list[Op]]:
    """Dropout in training: hidden states (after the embedding, the attention output and the
    MLP) and attention probabilities (an eager or math-path attention's scores): (drawing
    the masks, a Bernoulli RNG kernel; applying them, a product)."""
    draws, applies = [], []
    c = shape.compute_bytes
    scores = shape.batch * arch.num_heads * shape.tokens * shape.context
    for name, p, elements, count in (
        ("dropout", arch.hidden_dropout, shape.rows * arch.hidden_size, 2 * arch.num_layers + 1),
        ("attention_dropout", arch.attention_dropout if shape.attention == "eager" else 0.0,
         scores, arch.num_layers),
    ):
        if p <= 0:
            continue
        draws.append(Op(f"{name}_mask", "elementwise", elements, elements * c, count,
                        kernel="bernoulli"))
        applies.append(Op(name, "elementwise", elements, 3 * elements * c, count, kernel="binary"))
    return draws, applies


def _training_attention(arch: Architecture, plan: TrainingPlan, rates: DeviceRates) -> str:
    """The attention path a training step takes: PyTorch's CPU SDPA has no fused kernel with
    dropout, so attention dropout sends it down the math path (eager-like matmuls and
    softmax)."""
    if plan.attention == "sdpa" and arch.attention_dropout > 0 and rates.kind == "cpu":
        return "eager"
    return plan.attention


def _activations_streamed(ops: list[Op]) -> list[Op]:
    """In training, elementwise ops read tensors saved across the whole forward pass: they
    stream from memory rather than from a cache, so a cache-sized probed rate is capped."""
    return [replace(op, streamed=True) if op.kind in ("elementwise", "norm", "logits") else op
            for op in ops]


def _collectives(arch: Architecture, plan: TrainingPlan, rates: DeviceRates,
                 grad_bytes: float, weight_bytes_total: float) -> float:
    """Ring collectives, not overlapped with compute: TP all-reduces of activations in
    forward and backward; data-parallel gradient all-reduce (or reduce-scatter + gather)."""
    bw = rates.interconnect_bytes_per_s
    if plan.gpus <= 1 or not bw:
        return 0.0
    c = weight_format(plan.compute_dtype).bytes_per_element
    seconds = 0.0
    if plan.tp > 1:
        per = plan.batch * plan.seq * arch.hidden_size * c
        seconds += 4 * arch.num_layers * 2 * (plan.tp - 1) / plan.tp * per / bw
    dp = plan.data_parallel
    if dp > 1:
        seconds += 2 * (dp - 1) / dp * grad_bytes / plan.tp / bw
        if plan.zero >= 3:  # weights gathered for forward and again for backward
            seconds += 2 * (dp - 1) / dp * weight_bytes_total / plan.tp / bw
    return seconds


def matmul_params(arch: Architecture) -> int:
    """The parameters every token multiplies by (MFU's N): the active ones less the input
    embeddings (a lookup, no FLOPs), with the head counted once where it is tied to them.
    Counting an untied input embedding put a small model's MFU past 100% (Pythia-70M's is
    25.8M of its 70.4M parameters)."""
    counts = count_params(arch)
    head = arch.vocab_size * arch.hidden_size if arch.tie_embeddings else 0
    return counts.active - counts.embedding + head


def estimate_training_time(arch: Architecture, plan: TrainingPlan, rates: DeviceRates, *,
                           paged_on_host_bytes: float = 0.0) -> TrainingTime:
    """One optimizer step: forward, backward (~2x forward), recompute, optimizer, comms,
    under the plan's runtime: transformers (eager) or torch.compile (fused, no dispatch),
    and what host memory costs it (host_traffic.py): `paged_on_host_bytes`, the paged
    optimizer states the device has no room for (MemoryEstimate.paged_on_host_bytes)."""
    rt = runtime_speed(plan.runtime)
    rt.check_device(rates.kind, rates.name)
    dtype = plan.compute_dtype
    mode = op_count_mode(plan.dtype)
    c = weight_format(dtype).bytes_per_element
    # QLoRA: bitsandbytes dequantises each nf4 weight to the compute dtype before its matmul,
    # which then reads the 16-bit copy (the dequantisation is its own op, `_dequantised`)
    w = c if plan.finetune == "qlora" else (4.0 if plan.mixed else c)
    attention = _training_attention(arch, plan, rates)
    shape = Shape(plan.batch, plan.seq, plan.seq, c, w, c, attention, plan.seq)
    ops = [tensor_parallel_share(op, plan.tp)
           for op in forward_ops(arch, shape) + loss_ops(arch, shape)]
    masks, applied = _dropout_ops(arch, shape)
    ops = _activations_streamed(ops + applied)  # masks applied in forward and backward
    forward_only = masks + kv_append_ops(arch, shape)  # masks drawn, the cache appended
    if rt.fused:
        ops, forward_only, masks = _fused(ops), [], []
    fwd, bwd = _forward_backward(arch, plan, ops, forward_only, masks, shape, rates, mode)
    if rt.step_s.get("training"):
        fwd = with_row(fwd, Op("runtime step", "runtime", 0.0, 0.0), rt.step_s["training"])
    counts = count_params(arch)
    trainable = counts.total if plan.finetune == "full" else lora_params(arch, plan)
    whole = plan.finetune == "full" and plan.tp == 1  # the probe stepped whole tensors
    optimizer = optimizer_phase(plan, trainable / plan.tp,
                                parameter_tensors(arch) if whole else None, rates)
    bwd, optimizer = _with_step_faults(arch, plan, shape, bwd, optimizer, rates)
    if steps_on_host(plan):  # the host's cores step the states (host_traffic.py)
        optimizer = PhaseTime("optimizer", 0.0, 0.0, 0.0)
    moved = host_bytes(arch, plan, paged_on_host_bytes)
    host = host_traffic(moved, plan, rates, fwd.seconds, bwd.seconds)
    grad_bytes = trainable * (4.0 if plan.mixed and not plan.zero else c)
    comm = _collectives(arch, plan, rates, grad_bytes, counts.total * c)
    tokens = plan.batch * plan.seq * plan.data_parallel
    attn = 6 * arch.num_layers * plan.seq * arch.q_dim  # causal attention FLOPs per token x 2
    # a frozen base computes no weight gradients: forward and input gradients, 4 N T
    per_param = 6 if plan.finetune == "full" else 4
    model_flops = tokens * (per_param * matmul_params(arch) + attn)
    peak = rates.peak(dtype) * plan.gpus
    return TrainingTime(fwd, bwd, optimizer, comm, tokens, model_flops, peak, rates.source,
                        rt.name, rt.id, host)


def _fused(ops: list[Op]) -> list[Op]:
    """A compiled step's ops: Inductor fuses norms, activations, dropout and residuals into
    their neighbours, and the cross-entropy's four fp32 passes over the logits into one."""
    kept = [op for op in ops if op.kind in ("matmul", "attention", "embedding")]
    return kept + [replace(op, bytes=op.bytes / 4) for op in ops if op.name == "loss"]


def _forward_backward(arch: Architecture, plan: TrainingPlan, ops: list[Op],
                      forward_only: list[Op], masks: list[Op], shape: Shape,
                      rates: DeviceRates, mode: str) -> tuple[PhaseTime, PhaseTime]:
    """The forward and the backward (the forward again first under checkpointing), each with
    its share of the step's dispatch (catalog/data/efficiency.toml, `time_model`)."""
    rules = time_model_rules()
    dtype = plan.compute_dtype
    eager = runtime_speed(plan.runtime).dispatch == "eager"
    overhead = dispatch_overhead(arch, mode, shape.attention, "training", rates) if eager else 0
    per_forward = rules.backward_dispatch_per_forward
    forward_overhead = overhead / (1 + per_forward)
    backward_overhead = per_forward * overhead / (1 + per_forward)
    fwd = phase_time("forward", ops + forward_only, rates, dtype, forward_overhead)
    # Backward computes two matmuls per forward one; frozen LoRA bases skip the weight grad.
    full = plan.finetune == "full"
    back_scale = rules.backward_scale if full else rules.frozen_base_backward_scale
    direction = "backward" if full else "forward"
    if plan.checkpointing:  # the layers' forward again, under the backward's dispatch
        recompute = phase_time("recompute", ops, rates, dtype, forward_overhead)
        bwd = phase_time("backward", ops, rates, dtype, backward_overhead + recompute.overhead_s,
                         scale=back_scale + 1.0, direction=direction)
        bwd = _plus(bwd, phase_time("recompute", masks, rates, dtype, 0.0))  # masks again
    else:
        bwd = phase_time("backward", ops, rates, dtype, backward_overhead, scale=back_scale,
                         direction=direction)
    if full:
        bwd = _plus(bwd, phase_time("backward", embedding_grad_ops(arch, shape), rates, dtype, 0.0))
    if plan.finetune in ("lora", "qlora"):
        fwd, bwd = _with_adapters(arch, plan, fwd, bwd, rates)
    if plan.finetune == "qlora":
        fwd, bwd = _dequantised(arch, plan, fwd, bwd, rates)
    return fwd, bwd


def _dequantised(arch: Architecture, plan: TrainingPlan, fwd: PhaseTime, bwd: PhaseTime,
                 rates: DeviceRates) -> tuple[PhaseTime, PhaseTime]:
    """QLoRA's dequantisation: every nf4 weight read and written out in the compute dtype
    before each matmul that uses it: once in the forward, once in the backward (the input
    gradient needs the weight again), and once more in a checkpointed backward's recompute."""
    c = weight_format(plan.compute_dtype).bytes_per_element
    weights = matmul_params(arch) - (arch.vocab_size * arch.hidden_size)  # the head stays 16-bit
    per_pass = weights * (mean_weight_bytes(arch, "nf4") + c) / plan.tp
    op = Op("dequantise nf4", "elementwise", 0.0, per_pass, count=1)
    passes = 2 if plan.checkpointing else 1
    more_fwd = phase_time("forward", [op], rates, plan.compute_dtype, 0.0)
    more_bwd = phase_time("backward", [replace(op, count=passes)], rates, plan.compute_dtype, 0.0)
    return _plus(fwd, more_fwd), _plus(bwd, more_bwd)


def _with_adapters(arch: Architecture, plan: TrainingPlan, fwd: PhaseTime, bwd: PhaseTime,
                   rates: DeviceRates) -> tuple[PhaseTime, PhaseTime]:
    """The forward and backward with peft's LoRA branches (fp32 adapters on a 16-bit base:
    casts too), their kernels dispatched at the runtime's cost; a checkpointed step runs
    the branches' forward again in its backward."""
    c = weight_format(plan.compute_dtype).bytes_per_element
    forward, backward = lora_ops(lora_dims(arch, plan), plan.lora_rank, plan.batch * plan.seq,
                                 arch.num_layers, c, max(4.0, c))
    if plan.checkpointing:
        backward = forward + backward

    def phase(name: str, ops: list[Op]) -> PhaseTime:
        kernels = sum(op.count for op in ops)
        overhead = dispatch_cost(kernels, 0, rates, "training", per_step=False)
        return phase_time(name, ops, rates, plan.compute_dtype, overhead)

    return _plus(fwd, phase("forward", forward)), _plus(bwd, phase("backward", backward))


def _plus(phase: PhaseTime, more: PhaseTime) -> PhaseTime:
    """`phase` with the operations of `more`, and any dispatch overhead of its own, added."""
    return replace(phase, seconds=phase.seconds + more.seconds, ops_s=phase.ops_s + more.ops_s,
                   overhead_s=phase.overhead_s + more.overhead_s,
                   flops=phase.flops + more.flops, bytes=phase.bytes + more.bytes,
                   ops=phase.ops + more.ops)


def slow_faults_step_s(arch: Architecture, plan: TrainingPlan, rates: DeviceRates, *,
                       paged_on_host_bytes: float = 0.0) -> float | None:
    """The step with its page faults at the slowest first touch the probe saw with memory
    in use (a VM whose host backs its memory lazily): the top of the range a step runs in
    there, as the host moves (docs/speed.md, "Page faults on a CPU"). None where the probe
    saw no such slowing, or off a CPU."""
    slow = with_slow_faults(rates)
    if slow is None:
        return None
    return estimate_training_time(arch, plan, slow, paged_on_host_bytes=paged_on_host_bytes).step_s


def step_fault_s(arch: Architecture, plan: TrainingPlan, rates: DeviceRates,
                 step: TrainingTime | None = None, *, paged_on_host_bytes: float = 0.0) -> float:
    """Seconds of the training step that are page faults at the probed first-touch rate:
    memory the host allocator gives back and maps again every step (0 off a probed CPU)."""
    paged = paged_on_host_bytes
    step = step or estimate_training_time(arch, plan, rates, paged_on_host_bytes=paged)
    free = estimate_training_time(arch, plan, without_faults(rates), paged_on_host_bytes=paged)
    return step.step_s - free.step_s
