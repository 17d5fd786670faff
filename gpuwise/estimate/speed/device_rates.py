"""How fast a device does each kind of work: from its datasheet with default efficiencies
(`spec`), or from a probe of this machine (`measured`)."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from gpuwise.catalog.efficiency import device_efficiency
from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.stacks import stack_value
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.speed.probed_kernels import KernelRates

PHASES = ("inference", "decode", "training")
DTYPE_PEAK_KEY = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "int8": "bf16",
                  "int4": "bf16", "nf4": "bf16"}


@dataclass(frozen=True)
class DeviceRates:
    """Achievable rates of one device. `matmul_curves[dtype]` holds (flops, flop/s) points."""

    name: str
    kind: str
    peak_flops: dict[str, float]
    bandwidth_bytes_per_s: float
    matmul_max: float
    compute_units: int
    tile: int
    min_rows: int
    memory_efficiency: float
    op_overhead_s: float
    view_overhead_s: float
    interconnect_bytes_per_s: float
    collective_latency_s: float
    kernel_latency_s: float
    vector_efficiency: float  # elementwise FLOP/s as a share of the fp32 peak
    source: str  # "spec" or "measured"
    matmul_curves: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    # Measured FLOP/s of (m x 4096) @ (4096 x 4096) by rows m: how skinny matmuls fare.
    row_curves: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    # Measured bytes/s of one-row matmuls on weights not in cache, by matrix bytes.
    gemv_curves: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    # The eager runtime's measured cost per dispatched op and fixed cost per step, by phase.
    runtime_op_s: dict[str, float] = field(default_factory=dict)
    runtime_step_s: dict[str, float] = field(default_factory=dict)
    # generate()'s own work on each decode step's logits, per vocabulary entry per sequence.
    runtime_vocab_s: float = 0.0
    # Kernels timed at model shapes (linear grid, SDPA, elementwise), where probed.
    kernels: KernelRates | None = None
    # What the runtime's kernels make of the rates (estimate/speed/runtime_time.py): the share
    # of the matmul rate its matmuls reach, the share of the memory rate its weight-only
    # kernels stream packed weights at and its decode attention reads the KV cache at, and
    # the dtype whose peak weight matmuls run at ("" the compute dtype; "fp8" for W8A8).
    matmul_share: float = 1.0
    weight_stream_share: float = 1.0
    attention_memory_share: float = 1.0
    weight_dtype: str = ""
    # Compute units x boost clock (GPUs; 0 where not known): kernels that keep too few bytes
    # in flight run at a rate per unit per cycle, whatever the bandwidth (ggml_time.py).
    unit_cycles_per_s: float = 0.0
    split_k_min: int = 0  # K per split where a GEMM splits K over idle units (0: never)
    host_link_bytes_per_s: float = 0.0  # one way between host and device (0: not known)
    # what an optimizer step on the device's host reads and writes a second (offload's host
    # step; catalog/data/stacks.toml [host_transfer], by where the device runs)
    host_memory_bytes_per_s: float = 0.0
    # llama.cpp timed on this machine by `gpuwise probe`, by "ggml type/threads": the
    # fields of estimate/speed/ggml_time.GgmlRates but `source`.
    ggml_measured: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def runtime_kernels(self) -> bool:
        """Whether a runtime's kernels replace the plain ones the probe timed."""
        return (self.matmul_share, self.weight_stream_share, self.attention_memory_share,
                self.weight_dtype) != (1.0, 1.0, 1.0, "")

    def gemv_rate(self, matrix_bytes: float, dtype: str) -> float | None:
        """Bytes/s a one-row matmul streams a weight of this size at, where measured."""
        curve = self.gemv_curves.get(dtype) or self.gemv_curves.get("fp32")
        return _interpolate(curve, matrix_bytes, below="flat") if curve else None

    def op_cost(self, phase: str) -> tuple[float, float]:
        """(seconds per dispatched op, fixed seconds per step) of the eager runtime."""
        per_op = self.runtime_op_s.get(phase) or self.runtime_op_s.get("decode")
        if per_op:
            return per_op, self.runtime_step_s.get(phase, 0.0)
        return self.op_overhead_s, 0.0

    @cached_property  # read for every op of a sweep: computed once per DeviceRates
    def memory_bytes_per_s(self) -> float:
        return self.bandwidth_bytes_per_s * self.memory_efficiency

    @cached_property
    def vector_flops(self) -> float:
        """FLOP/s of elementwise math, which runs on the vector units: a share of the fp32
        peak (catalog/data/efficiency.toml, `vector`)."""
        return self.peak("fp32") * self.vector_efficiency

    def peak(self, dtype: str) -> float:
        key = DTYPE_PEAK_KEY.get(dtype, dtype)
        value = self.peak_flops.get(key) or self.peak_flops.get("fp16") or self.peak_flops.get(
            "fp32") or max(self.peak_flops.values(), default=0.0)
        if not value:
            raise GpuwiseError(f"no {dtype} compute rate known for {self.name}",
                               "run `gpuwise probe` on it, or pick catalogue hardware")
        return value

    def matmul_rate(self, m: int, n: int, flops: float, dtype: str) -> float:
        """FLOP/s an (m x k) @ (k x n) matmul achieves: from the probe's curve (by FLOPs) where
        measured, else the peak x `matmul_max` x the share of the hardware the shape fills:
        rows below `min_rows` idle the matrix units, and the last wave of output tiles
        leaves compute units idle."""
        curve = self.matmul_curves.get(dtype) or self.matmul_curves.get(
            DTYPE_PEAK_KEY.get(dtype, dtype))
        if curve:
            rate = _interpolate(curve, flops)
            rows = self.row_curves.get(dtype) or self.row_curves.get(
                DTYPE_PEAK_KEY.get(dtype, dtype)
            )
            if not rows or (m < self.min_rows and self.gemv_curves):
                return rate  # one-row matmuls are timed by the GEMV bandwidth instead
            return min(rate, _interpolate(rows, max(1, m), below="flat"))
        best = self.peak(dtype) * self.matmul_max
        if m < self.min_rows:
            # Skinny (GEMV-like) shapes split the reduction over every unit instead of tiling
            # the output, so only the idle rows of the matrix units are lost.
            return best * max(1, m) / self.min_rows
        tiles = math.ceil(m / self.tile) * math.ceil(max(1, n) / self.tile)
        if self.split_k_min and tiles < self.compute_units:  # split-K fills the idle units
            k = flops / (2.0 * m * max(1, n))
            tiles = min(self.compute_units, tiles * max(1, int(k // self.split_k_min)))
        waves = math.ceil(tiles / self.compute_units)
        return best * tiles / (waves * self.compute_units)


def _interpolate(curve: tuple[tuple[float, float], ...], x_value: float,
                 below: str = "proportional") -> float:
    """Piecewise-linear in log(x); flat above the measured range. Below it the rate falls in
    proportion (a fixed cost dominates small matmuls), or stays flat (`below="flat"`)."""
    xs = [math.log(f) for f, _ in curve]
    x = math.log(max(x_value, 1.0))
    i = bisect.bisect_left(xs, x)
    if i == 0:
        if below == "flat":
            return curve[0][1]
        return curve[0][1] * max(x_value, 1.0) / curve[0][0]
    if i >= len(xs):
        return curve[-1][1]
    t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return curve[i - 1][1] + t * (curve[i][1] - curve[i - 1][1])


def rates_from_spec(hw: Hardware) -> DeviceRates:
    """Datasheet peaks with the default efficiencies for this kind of device."""
    d = device_efficiency(hw.kind)
    if not hw.memory_bandwidth_gbs or not hw.peak_tflops:
        raise GpuwiseError(f"no speed figures for {hw.name}",
                           "run `gpuwise probe` here first, or estimate --on a catalogue device")
    units = max(1, hw.compute_units)
    return DeviceRates(
        name=hw.name, kind=hw.kind,
        peak_flops={k: v * 1e12 for k, v in hw.peak_tflops.items()},
        bandwidth_bytes_per_s=hw.memory_bandwidth_gbs * 1e9,
        matmul_max=d.matmul_max, compute_units=units, tile=d.tile, min_rows=d.min_rows,
        memory_efficiency=d.memory, op_overhead_s=d.op_overhead_s,
        view_overhead_s=d.view_overhead_s,
        interconnect_bytes_per_s=hw.interconnect_gbs * 1e9 / 2 * d.interconnect,
        collective_latency_s=d.collective_latency_s,
        kernel_latency_s=d.kernel_latency_s, vector_efficiency=d.vector, source="spec",
        runtime_op_s=dict(d.runtime_op_s), runtime_step_s=dict(d.runtime_step_s),
        unit_cycles_per_s=units * hw.boost_clock_mhz * 1e6, split_k_min=d.split_k_min,
        host_link_bytes_per_s=hw.host_link_gbs * 1e9,
        host_memory_bytes_per_s=host_memory_rate(hw),
    )


def rates_from_measurements(hw: Hardware, bandwidth_bytes_per_s: float,
                            matmul_curves: dict[str, tuple[tuple[float, float], ...]],
                            op_overhead_s: float, view_overhead_s: float,
                            row_curves: dict[str, tuple[tuple[float, float], ...]] | None = None,
                            runtime: dict[str, Any] | None = None,
                            kernels: dict[str, Any] | None = None,
                            llama_cpp: dict[str, dict[str, float]] | None = None,
                            ) -> DeviceRates:
    """Rates measured on this machine by `gpuwise probe` (efficiency already included)."""
    peaks = {k: max(r for _, r in v) for k, v in matmul_curves.items() if v}
    rt = runtime or {}
    d = device_efficiency(hw.kind)
    return DeviceRates(
        name=hw.name, kind=hw.kind, peak_flops=peaks,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s, matmul_max=1.0,
        compute_units=max(1, hw.compute_units), tile=d.tile, min_rows=d.min_rows,
        memory_efficiency=1.0, op_overhead_s=op_overhead_s, view_overhead_s=view_overhead_s,
        interconnect_bytes_per_s=hw.interconnect_gbs * 1e9 / 2 * d.interconnect,
        collective_latency_s=d.collective_latency_s,
        kernel_latency_s=0.0 if hw.kind == "cpu" else d.kernel_latency_s,
        vector_efficiency=d.vector, source="measured", matmul_curves=matmul_curves, row_curves=row_curves or {},
        gemv_curves={k: tuple((b, r) for b, r in v) for k, v in rt.get("gemv", {}).items()},
        # Measured with the caches hot; a real model's ops find them cold (runtime_probe).
        runtime_op_s={p: rt[f"{p}_op_s"] * rt.get("cold_op_factor", 1.0)
                      for p in PHASES if f"{p}_op_s" in rt},
        runtime_step_s={p: rt[f"{p}_step_s"] for p in PHASES if f"{p}_step_s" in rt},
        runtime_vocab_s=float(rt.get("decode_vocab_s", 0.0)),
        kernels=KernelRates.from_record(kernels) if kernels else None,
        ggml_measured=dict(llama_cpp or {}),
        unit_cycles_per_s=max(1, hw.compute_units) * hw.boost_clock_mhz * 1e6,
        host_link_bytes_per_s=hw.host_link_gbs * 1e9,
        host_memory_bytes_per_s=host_memory_rate(hw),
    )


def host_memory_rate(hw: Hardware) -> float:
    """Bytes a second an optimizer step on `hw`'s host streams (0 for a CPU: it is the host)."""
    if hw.kind == "cpu":
        return 0.0
    return float(stack_value("host_transfer", f"host_memory_gbs_{hw.site}")) * 1e9
