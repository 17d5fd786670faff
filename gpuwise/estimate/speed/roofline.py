"""The roofline time model: each operation takes max(compute time, memory time), and an eager
runtime adds a fixed cost for every operation it dispatches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from gpuwise.catalog.efficiency import time_model_rules
from gpuwise.catalog.runtimes import op_counts
from gpuwise.estimate.speed.device_rates import DeviceRates
from gpuwise.workload import Architecture
from gpuwise.workload.ops import Op


class OpTime(NamedTuple):  # a named tuple: built 4x faster than a frozen dataclass
    """One operation's time on a device, and what bounds it. `repeat` runs of the bounding
    time, plus `extra_s` (a forward recomputed under checkpointing), per count."""

    op: Op
    compute_s: float
    memory_s: float
    repeat: float = 1.0
    extra_s: float = 0.0
    measured: bool = False  # timed from the probe's kernel at this shape

    @property
    def seconds(self) -> float:
        return self.op.count * (self.repeat * max(self.compute_s, self.memory_s) + self.extra_s)

    @property
    def bound(self) -> str:
        """Compute-bound where its arithmetic takes longer than its bytes; a tie (llama.cpp's
        weights streamed and multiplied in one pass) is memory-bound."""
        return "compute" if self.compute_s > self.memory_s else "memory"


@dataclass(frozen=True)
class PhaseTime:
    """A phase (prefill, one decode step, a training step) as a sum of operations."""

    name: str
    seconds: float
    ops_s: float  # roofline time of the operations
    overhead_s: float  # fixed per-op dispatch / launch cost
    comm_s: float = 0.0  # collective communication (several devices)
    flops: float = 0.0
    bytes: float = 0.0
    ops: tuple[OpTime, ...] = field(default=(), repr=False)

    @property
    def bound(self) -> str:
        if self.overhead_s > self.ops_s:
            return "overhead"
        compute = sum(t.op.count * t.compute_s for t in self.ops if t.bound == "compute")
        memory = sum(t.op.count * t.memory_s for t in self.ops if t.bound == "memory")
        return "compute" if compute >= memory else "memory"


def time_op(op: Op, rates: DeviceRates, dtype: str, direction: str = "forward",
            scale: float = 1.0) -> OpTime:
    """The op's time: the probe's kernel timing at its shape where there is one, else the
    roofline. `scale` multiplies the work (backward ~2x forward); with `direction`
    "backward", a matmul whose backward was probed takes that time, plus a forward per
    unit of `scale` above 2 (recomputation)."""
    dtype = op.dtype or dtype
    if rates.kernels is None:  # datasheet rates (a sweep times thousands of phases)
        return _roofline(op, rates, dtype, scale)
    if rates.runtime_kernels and op.kind in ("matmul", "attention"):
        return _roofline(op, rates, dtype, scale)  # the probe timed plain PyTorch kernels
    timed = _time_work(op, rates, dtype, direction, scale)
    faults = _fresh_s(op.fresh_backward if direction == "backward" else op.fresh, rates)
    return timed._replace(extra_s=timed.extra_s + faults) if faults else timed


def _time_work(op: Op, rates: DeviceRates, dtype: str, direction: str, scale: float) -> OpTime:
    measured = _probed_s(op, rates, dtype, "forward")
    if direction == "backward" and op.kind in ("matmul", "attention") and measured is not None:
        backward = _probed_s(op, rates, dtype, "backward")
        if backward is not None:
            return _measured(op, rates, dtype, backward, 1.0, (scale - 2.0) * measured)
    if measured is not None:
        return _measured(op, rates, dtype, measured, scale)
    return _roofline(op, rates, dtype, scale)


def _fresh_s(fresh: tuple[tuple[float, float], ...], rates: DeviceRates) -> float:
    """Seconds to fault in the pages of output tensors the host allocator maps afresh
    (those past its mmap threshold), at the probed first-touch rate; 0 where not probed."""
    k = rates.kernels
    if not fresh or k is None or not k.fresh_bytes_per_s:
        return 0.0
    return sum(size * n for size, n in fresh if size >= k.fresh_threshold) / k.fresh_bytes_per_s


def _probed_s(op: Op, rates: DeviceRates, dtype: str, direction: str) -> float | None:
    k = rates.kernels
    if k is None:
        return None
    if op.kind == "conv":  # one Op per GEMM: a backward runs one per gradient it computes
        direction = "backward" if op.name == "convolution_backward" else "forward"
        return k.conv_s(op.m, op.k, op.n, dtype, direction, op.kernel)
    if op.kind == "matmul":  # each GEMM the runtime runs (q, k and v apart), at its shape
        total = 0.0
        for part in [replace(op, n=n, splits=()) for n in op.splits] or [op]:
            seconds = k.linear_s(part.m, part.k, part.n, dtype, direction, part.layout)
            if not seconds:
                return None
            total += _narrower_than_grid(seconds, part, rates, dtype)
        return total
    if op.kernel == "sdpa" and op.heads:  # a traced backward op is timed as itself
        queries = max(1, op.m // op.heads)
        backward = direction == "backward" or op.name.endswith("_backward")
        return k.sdpa_s(op.heads, queries, op.n, op.k, dtype, backward, op.causal)
    if op.kernel and op.kind != "embedding":
        rate = k.elementwise_rate(op.kernel, dtype)
        if rate and op.streamed:
            rate = min(rate, rates.memory_bytes_per_s)
        return op.bytes / rate if rate else None
    return None


def _narrower_than_grid(seconds: float, op: Op, rates: DeviceRates, dtype: str) -> float:
    """A matmul narrower than the grid's narrowest width (a BERT-small's 256) reads the
    grid at that width; the square-size curve says how much slower the narrower one runs."""
    low = rates.kernels.linear_min_width(dtype) if rates.kernels else 0
    if not low or (op.k >= low and op.n >= low) or not rates.matmul_curves:
        return seconds
    k, n = max(op.k, low), max(op.n, low)
    edge = rates.matmul_rate(op.m, n, 2.0 * op.m * k * n, dtype)
    here = rates.matmul_rate(op.m, op.n, 2.0 * op.m * op.k * op.n, dtype)
    return seconds * edge / here if here > 0 else seconds


def _measured(op: Op, rates: DeviceRates, dtype: str, seconds: float, repeat: float,
              extra_s: float = 0.0) -> OpTime:
    """A probed time, labelled compute- or memory-bound by where the roofline puts it."""
    roof = _roofline(op, rates, dtype, 1.0)
    if roof.bound == "compute":
        return OpTime(op, seconds, min(roof.memory_s, seconds), repeat, extra_s, True)
    return OpTime(op, min(roof.compute_s, seconds), seconds, repeat, extra_s, True)


def _roofline(op: Op, rates: DeviceRates, dtype: str, repeat: float) -> OpTime:
    if op.kind in ("matmul", "conv"):  # a convolution is an implicit GEMM of the same shape
        peak = rates.weight_dtype if rates.weight_dtype and op.weight_bytes else dtype
        rate = rates.matmul_rate(op.m, op.n, op.flops, peak)
        if op.m >= rates.min_rows:  # a GEMV (decode) streams weights: the share is of a GEMM
            rate *= rates.matmul_share
        compute = op.flops / rate
        gemv = rates.gemv_rate(op.weight_bytes, dtype) if op.m < rates.min_rows else None
        stream = (gemv or rates.memory_bytes_per_s) * rates.weight_stream_share
        if op.weight_bytes and (gemv or rates.weight_stream_share != 1.0):
            rest = op.bytes - op.weight_bytes
            memory = op.weight_bytes / stream + rest / rates.memory_bytes_per_s
            return OpTime(op, compute, memory, repeat)
    elif op.kind == "attention":
        # Attention is blocked matmul work over (query rows x key columns) per head.
        compute = op.flops / rates.matmul_rate(op.m, op.n, op.flops, dtype)
        memory = op.bytes / (rates.memory_bytes_per_s * rates.attention_memory_share)
        return OpTime(op, compute, memory, repeat)
    else:
        compute = op.flops / rates.vector_flops
    return OpTime(op, compute, op.bytes / rates.memory_bytes_per_s, repeat)


def op_count_mode(dtype: str) -> str:
    """The measured op counts (catalog/data/op_counts.json) a run in `dtype` dispatches."""
    return "fp32" if dtype == "fp32" else ("mixed-bf16" if dtype.startswith("mixed") else "bf16")


def dispatch_overhead(arch: Architecture, mode: str, attention: str, phase: str,
                      rates: DeviceRates, layers: int | None = None) -> float:
    """Seconds of fixed per-op cost: measured op counts x the device's per-op cost."""
    counts = op_counts(arch.model_type, mode, attention)[phase]
    n_layers = arch.num_layers if layers is None else layers
    kernels = counts["kernels_per_layer"] * n_layers + counts["kernels_model"]
    views = counts["views_per_layer"] * n_layers + counts["views_model"]
    return dispatch_cost(kernels, views, rates, phase)


def dispatch_cost(kernels: float, views: float, rates: DeviceRates, phase: str,
                  per_step: bool = True, runtime: bool = True) -> float:
    """Seconds to dispatch `kernels` ops and `views` (metadata-only ops) in `phase`; with
    `per_step`, plus the runtime's measured fixed cost per step. `runtime` False: the bare
    per-op cost, without the transformers runtime's measured cost per op."""
    if runtime and rates.runtime_op_s:  # measured: the cost of an op in the runtime, views less
        per_op, step = rates.op_cost(phase)
        views_per_op = time_model_rules().runtime_views_per_op
        return (kernels + views / views_per_op) * per_op + (step if per_step else 0.0)
    return kernels * rates.op_overhead_s + views * rates.view_overhead_s


def phase_time(name: str, ops: Sequence[Op], rates: DeviceRates, dtype: str, overhead_s: float,
               comm_s: float = 0.0, scale: float = 1.0, kernels: float | None = None,
               direction: str = "forward") -> PhaseTime:
    """Sum the operations' times; `scale` multiplies the work (backward is ~2x forward).

    On an accelerator every kernel also pays a device-side latency (launch, ramp-up and
    tail), and the host dispatches asynchronously: the phase takes the longer of the host's
    dispatch time and the device's time. On a CPU the same cores do both, so they add.
    `kernels` is how many kernels run (default: one per operation).
    """
    times = tuple(time_op(op, rates, dtype, direction, scale) for op in ops)
    ops_s = flops = moved = count = 0.0
    for t in times:  # one pass
        op = t.op
        ops_s += t.seconds
        flops += op.flops * op.count
        moved += op.bytes * op.count
        count += op.count
    n_kernels = scale * count if kernels is None else kernels
    ops_s += n_kernels * rates.kernel_latency_s
    if rates.kind != "cpu":
        overhead_s = max(0.0, overhead_s - ops_s)  # only the part the device cannot hide
    flops, moved = scale * flops, scale * moved
    return PhaseTime(name, ops_s + overhead_s + comm_s, ops_s, overhead_s, comm_s, flops, moved,
                     times)


def fresh_bytes_per_s(rates: DeviceRates) -> float:
    """The probed first-touch rate of a CPU's fresh pages (0: not probed, or not a CPU)."""
    k = rates.kernels
    return k.fresh_bytes_per_s if rates.kind == "cpu" and k is not None else 0.0


def _first_touch_at(rates: DeviceRates, bytes_per_s: float) -> DeviceRates:
    k = rates.kernels
    return rates if k is None else replace(rates, kernels=replace(k, fresh_bytes_per_s=bytes_per_s))


def without_faults(rates: DeviceRates) -> DeviceRates:
    """The rates with no first-touch rate: estimates from them charge no page fault."""
    return _first_touch_at(rates, 0.0)


def with_slow_faults(rates: DeviceRates) -> DeviceRates | None:
    """The rates with first touch at the slowest the probe saw with memory in use; None
    where it saw none under half its small process's rate."""
    k = rates.kernels
    if rates.kind != "cpu" or k is None or not k.slow_fresh_bytes_per_s:
        return None
    return _first_touch_at(rates, k.slow_fresh_bytes_per_s)


def with_faults(phase: PhaseTime, nbytes: int, fresh_bytes_per_s: float) -> PhaseTime:
    """The phase plus the first touch of the pages the allocator gives it afresh, at the
    probed first-touch rate (a row of its own in the op table)."""
    if not nbytes or not fresh_bytes_per_s:
        return phase
    return with_row(phase, Op("page faults", "faults", 0.0, float(nbytes)),
                    nbytes / fresh_bytes_per_s)


def with_row(phase: PhaseTime, op: Op, seconds: float) -> PhaseTime:
    """The phase with one more row of its own in the op table, taking `seconds`."""
    return replace(phase, seconds=phase.seconds + seconds, ops_s=phase.ops_s + seconds,
                   ops=(*phase.ops, OpTime(op, 0.0, seconds, measured=False)))
