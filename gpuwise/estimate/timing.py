"""The roofline time model: each operation takes max(compute time, memory time), and an eager
runtime adds a fixed cost for every operation it dispatches."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwise.catalog.runtimes import op_counts
from gpuwise.estimate.rates import DeviceRates
from gpuwise.workload import Architecture
from gpuwise.workload.ops import Op


@dataclass(frozen=True)
class OpTime:
    """One operation's time on a device, and what bounds it."""

    op: Op
    compute_s: float
    memory_s: float

    @property
    def seconds(self) -> float:
        return self.op.count * max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


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


def time_op(op: Op, rates: DeviceRates, dtype: str) -> OpTime:
    if op.kind == "matmul":
        compute = op.flops / rates.matmul_rate(op.m, op.n, op.flops, dtype)
        gemv = rates.gemv_rate(op.weight_bytes, dtype) if op.m < rates.min_rows else None
        if gemv and op.weight_bytes:
            memory = (
                op.weight_bytes / gemv + (op.bytes - op.weight_bytes) / rates.memory_bytes_per_s
            )
            return OpTime(op, compute, memory)
    elif op.kind == "attention":
        # Attention is blocked matmul work over (query rows x key columns) per head.
        compute = op.flops / rates.matmul_rate(op.m, op.n, op.flops, dtype)
    else:
        vector = rates.peak("fp32") * 0.5  # elementwise math runs on vector units
        compute = op.flops / vector
    return OpTime(op, compute, op.bytes / rates.memory_bytes_per_s)


def dispatch_overhead(arch: Architecture, mode: str, attention: str, phase: str,
                      rates: DeviceRates, layers: int | None = None) -> float:  # fmt: skip
    """Seconds of fixed per-op cost: measured op counts x the device's per-op cost."""
    counts = op_counts(arch.model_type, mode, attention)[phase]
    n_layers = arch.num_layers if layers is None else layers
    kernels = counts["kernels_per_layer"] * n_layers + counts["kernels_model"]
    views = counts["views_per_layer"] * n_layers + counts["views_model"]
    if rates.runtime_op_s:  # measured: the cost of an op in the runtime, views as a third
        per_op, per_step = rates.op_cost(phase)
        return (kernels + views / 3) * per_op + per_step
    return kernels * rates.op_overhead_s + views * rates.view_overhead_s


def phase_time(name: str, ops: list[Op], rates: DeviceRates, dtype: str, overhead_s: float,
               comm_s: float = 0.0, scale: float = 1.0, kernels: float | None = None,
               ) -> PhaseTime:  # fmt: skip
    """Sum the operations' times; `scale` multiplies the work (backward is ~2x forward).

    On an accelerator every kernel also pays a device-side latency (launch, ramp-up and
    tail), and the host dispatches asynchronously: the phase takes the longer of the host's
    dispatch time and the device's time. On a CPU the same cores do both, so they add.
    `kernels` is how many kernels run (default: one per operation).
    """
    times = tuple(time_op(op, rates, dtype) for op in ops)
    ops_s = scale * sum(t.seconds for t in times)
    n_kernels = scale * sum(op.count for op in ops) if kernels is None else kernels
    ops_s += n_kernels * rates.kernel_latency_s
    if rates.kind != "cpu":
        overhead_s = max(0.0, overhead_s - ops_s)  # only the part the device cannot hide
    flops = scale * sum(t.op.flops * t.op.count for t in times)
    moved = scale * sum(t.op.bytes * t.op.count for t in times)
    return PhaseTime(name, ops_s + overhead_s + comm_s, ops_s, overhead_s, comm_s, flops, moved,
                     times)  # fmt: skip
