"""Measured kernel times at the shapes a model runs them (from `gpuwise probe`), and how an
estimate reads them: log-log interpolation on the measured grid, flat rates outside it."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

from gpuwise.catalog.allocators import host_allocator
from gpuwise.catalog.thresholds import probe_thresholds
from gpuwise.estimate.speed.probe_record import check_kernels


@dataclass(frozen=True)
class Grid:
    """Seconds by (m, k, n), and the sorted values measured along each axis."""

    seconds: dict[tuple[int, int, int], float]
    axes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, points: list[list[float]]) -> Grid:
        seconds = {(int(m), int(k), int(n)): float(s) for m, k, n, s in points}
        return cls(seconds, tuple(tuple(sorted({key[i] for key in seconds})) for i in range(3)))


def _mmap_threshold_max() -> int:
    """glibc raises its mmap threshold as mapped chunks are freed, up to this: larger tensors
    are always mapped afresh and unmapped on free (catalog/data/allocators.toml)."""
    return host_allocator().mmap_threshold_max


def slow_first_touch_reading(fresh: dict[str, Any]) -> tuple[int, float]:
    """(bytes in use, bytes/s) of the slowest first touch in the probe's `fresh` record
    (`by_held`), where it ran at under half the small process's rate (`slow_first_touch_share`,
    catalog/data/thresholds.toml); (0, 0.0) where none did, or it was not measured so. On a
    VM whose host backs guest memory lazily a step's page faults land between the two rates,
    moving with the host (docs/speed.md, "Page faults on a CPU")."""
    base = fresh.get("bytes_per_s") or 0.0
    held, rate = min(fresh.get("by_held") or (), key=lambda p: p[1], default=(0, 0.0))
    if not base or not rate or rate >= base * probe_thresholds().slow_first_touch_share:
        return 0, 0.0
    return int(held), float(rate)


@dataclass(frozen=True)
class KernelRates:
    """`linear[dtype][direction]`: seconds of F.linear by (rows, in, out); `sdpa[dtype][mode]`:
    (length, seconds per batch x head) with head dim 64; `elementwise[dtype][kind]`: bytes/s."""

    linear: dict[str, dict[str, Grid]] = field(default_factory=dict)
    sdpa: dict[str, dict[str, tuple[tuple[float, float], ...]]] = field(default_factory=dict)
    elementwise: dict[str, dict[str, float]] = field(default_factory=dict)
    # optimizer[dtype][name]: (tensor elements, seconds per element of one step)
    optimizer: dict[str, dict[str, tuple[tuple[float, float], ...]]] = field(default_factory=dict)
    # conv[dtype][direction]: (m, k, n[, gemms], seconds) of convolutions as implicit GEMMs;
    # "forward"/"backward" hold 3x3 stride-1 ones, "forward:1x1/s2" (and so on) other
    # windows and strides. gemms: the GEMMs one call runs (a backward: 2, both gradients,
    # unless the input needed none; 2 where a point does not say).
    conv: dict[str, dict[str, tuple[tuple[float, ...], ...]]] = field(default_factory=dict)
    # Bytes/s at which fresh memory is faulted in (first touch of a newly mapped tensor), and
    # the size from which the host allocator maps tensors afresh rather than reusing its heap.
    fresh_bytes_per_s: float = 0.0
    fresh_threshold: float = field(default_factory=_mmap_threshold_max)
    # The slowest first touch the probe saw with memory in use, where under half the above
    # (0 where it did not): the bound of `gpuwise train`'s page faults on such a machine.
    slow_fresh_bytes_per_s: float = 0.0

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> KernelRates:
        """From the probe's `kernels` record (lists of numbers, as saved in JSON); ValueError
        naming the first malformed field of a record of another shape."""
        check_kernels(record)
        linear = {
            dtype: {
                direction: Grid.of(points)
                for direction, points in by_direction.items() if points
            }
            for dtype, by_direction in record.get("linear", {}).items()
        }
        sdpa = {
            dtype: {mode: tuple(sorted((float(x), float(s)) for x, s in pts))
                    for mode, pts in modes.items() if pts}
            for dtype, modes in record.get("sdpa", {}).items()
        }
        optimizer = {
            dtype: {name: tuple(sorted((float(n), float(s)) for n, s in pts))
                    for name, pts in by_name.items() if pts}
            for dtype, by_name in record.get("optimizer", {}).items()
        }
        conv = {
            dtype: {d: tuple(tuple(float(v) for v in p) for p in pts)
                    for d, pts in by_direction.items() if pts}
            for dtype, by_direction in record.get("conv", {}).items()
        }
        fresh = record.get("fresh") or {}
        return cls(linear, sdpa, dict(record.get("elementwise", {})), optimizer, conv,
                   float(fresh.get("bytes_per_s") or 0.0),
                   float(fresh.get("threshold") or _mmap_threshold_max()),
                   slow_first_touch_reading(fresh)[1])

    def optimizer_s(self, name: str, tensors: tuple[tuple[int, int], ...], dtype: str,
                    ) -> float | None:
        """Seconds of one optimizer step over parameter tensors given as (elements, count);
        None where this optimizer and dtype were not probed."""
        curve = self.optimizer.get(dtype, {}).get(name)
        if not curve:
            return None
        # Per element flat beyond the largest size; below the smallest a step costs what
        # the smallest did per tensor (the loop's fixed cost per parameter).
        smallest, per_element = curve[0]
        return sum(k * (smallest * per_element if n < smallest else n * _loglog(curve, n, 0.0))
                   for n, k in tensors)

    def linear_s(self, m: int, k: int, n: int, dtype: str, direction: str = "forward",
                 layout: str = "") -> float | None:
        """Seconds of an (m x k) @ (k x n)^T linear, or None where the grid lacks the dtype.
        Layout "nn" (x @ W, W stored in x out, as GPT-2's Conv1D) reads its own forward grid
        up to the rows it covers; beyond them the layouts run alike."""
        grids = self.linear.get(dtype, {})
        grid = grids.get(direction)
        nn = grids.get("forward_nn") if layout == "nn" and direction == "forward" else None
        if nn and m <= nn.axes[0][-1]:
            grid = nn
        if not grid or min(m, k, n) <= 0:
            return None
        rate = _grid_rate(grid, (m, k, n))
        # The grid's rates count a forward's FLOPs in either direction: times come back.
        return None if rate is None else 2.0 * m * k * n / rate

    def conv_s(self, m: int, k: int, n: int, dtype: str, direction: str = "forward",
               variant: str = "") -> float | None:
        """Seconds of one GEMM of a convolution that is an (m x k) @ (k x n) implicit GEMM:
        its forward, or one gradient of its backward, at the FLOP/s per GEMM of the probed
        convolution of its window and stride (`variant`, "1x1/s2"; 3x3 stride 1 where that
        one was not probed) nearest in log(m), log(k), log(n): equal FLOPs run 2x apart at
        different channel counts, and 1.5-3x apart between windows. None: not probed."""
        by_direction = self.conv.get(dtype, {})
        points = by_direction.get(f"{direction}:{variant}") or by_direction.get(direction)
        if not points or min(m, k, n) <= 0:
            return None
        here = [math.log(v) for v in (m, k, n)]
        near = min(points, key=lambda p: sum((math.log(v) - h) ** 2
                                             for v, h in zip(p[:3], here, strict=True)))
        gemms = near[3] if len(near) > 4 else (2.0 if direction == "backward" else 1.0)
        rate = gemms * 2.0 * near[0] * near[1] * near[2] / near[-1]
        return 2.0 * m * k * n / rate

    def linear_min_width(self, dtype: str) -> int:
        """The narrowest input or output width the forward grid measured (0: none)."""
        grid = self.linear.get(dtype, {}).get("forward")
        return min(grid.axes[1][0], grid.axes[2][0]) if grid else 0

    def sdpa_s(self, heads: int, queries: int, keys: int, head_dim: int, dtype: str,
               backward: bool = False, causal: bool = True) -> float | None:
        """Seconds of SDPA over `heads` (batch x heads) rows: a decode step (one query), a
        causal prefill (queries == keys) or its backward, or a non-causal forward or
        backward (q = kv); None where not measured (a profile older than 2026-12-03 18:00
        has no non-causal backward)."""
        modes = self.sdpa.get(dtype, {})
        mode, length = ("decode", keys) if queries == 1 else ("prefill", queries)
        if backward:
            mode = "backward"
        if not causal and queries > 1:
            mode = "full_backward" if backward else "full"
        curve = modes.get(mode)
        if not curve:
            return None
        power = 1.0 if mode == "decode" else 2.0  # decode: kv positions; else q x kv / 2
        per_head = _loglog(curve, length, power)
        if mode != "decode" and keys != queries:  # a chunk against a longer cache
            per_head *= keys / queries
        return heads * per_head * head_dim / 64

    def elementwise_rate(self, kind: str, dtype: str) -> float | None:
        """Bytes/s of an elementwise kernel of this kind (binary, silu, gelu)."""
        rates = self.elementwise.get(dtype) or {}
        if kind in UNLIKE_PRODUCTS:  # unprobed: the roofline, not the product's rate
            return rates.get(kind)
        return rates.get(kind) or rates.get(NEAREST_PROBED.get(kind, "")) or rates.get("binary")


# A kernel an older profile lacks, timed as the probed kernel nearest to it: tanh as the
# tanh-approximated GELU (0.9 ms against tanh's 1.6 on 1.5M fp32 values here; a mul: 0.065).
NEAREST_PROBED = {"tanh": "gelu"}

# Probed kernels that are not an elementwise product: where a profile lacks one, the op moves
# its bytes at the memory bandwidth rather than at the product's rate.
UNLIKE_PRODUCTS = frozenset({"bernoulli", "pool", "pool_backward", "batch_norm",
                             "batch_norm_train", "batch_norm_backward"})


def _loglog(curve: tuple[tuple[float, float], ...], x: float, power: float) -> float:
    """Interpolate log(seconds) in log(x); beyond the ends, seconds scale as x**power."""
    xs = [math.log(p) for p, _ in curve]
    lx = math.log(max(x, 1.0))
    if lx <= xs[0]:
        return curve[0][1] * (max(x, 1.0) / curve[0][0]) ** power
    if lx >= xs[-1]:
        return curve[-1][1] * (x / curve[-1][0]) ** power
    i = bisect.bisect_left(xs, lx)
    t = (lx - xs[i - 1]) / (xs[i] - xs[i - 1])
    ly = (1 - t) * math.log(curve[i - 1][1]) + t * math.log(curve[i][1])
    return math.exp(ly)


def _grid_rate(grid: Grid, point: tuple[int, int, int]) -> float | None:
    """FLOP/s at (m, k, n): trilinear in log space over the measured grid; each coordinate
    clamped to the measured range (a bigger matmul runs at the edge's rate)."""
    axes = grid.axes
    weights: list[list[tuple[int, float]]] = []
    for axis, value in zip(axes, point, strict=True):
        weights.append(_bracket(axis, value))
    log_rate, total = 0.0, 0.0
    for m, wm in weights[0]:
        for k, wk in weights[1]:
            for n, wn in weights[2]:
                w = wm * wk * wn
                if not w:
                    continue
                log_rate += w * math.log(_point_rate(grid, (m, k, n)))
                total += w
    return math.exp(log_rate / total) if total else None


def _point_rate(grid: Grid, point: tuple[int, int, int]) -> float:
    """FLOP/s measured at a grid point; at a hole (a point the probe found too slow to time),
    the rate of the measured point nearest in log(m), log(k), log(n)."""
    seconds = grid.seconds.get(point)
    if not seconds:
        here = [math.log(v) for v in point]
        point = min(grid.seconds, key=lambda p: sum((math.log(v) - h) ** 2
                                                    for v, h in zip(p, here, strict=True)))
        seconds = grid.seconds[point]
    return 2.0 * point[0] * point[1] * point[2] / seconds


def _bracket(axis: tuple[int, ...], value: int) -> list[tuple[int, float]]:
    """The grid values around `value` with their linear weights in log space."""
    if value <= axis[0]:
        return [(axis[0], 1.0)]
    if value >= axis[-1]:
        return [(axis[-1], 1.0)]
    i = bisect.bisect_left(axis, value)
    if axis[i] == value:
        return [(value, 1.0)]
    lo, hi = math.log(axis[i - 1]), math.log(axis[i])
    t = (math.log(value) - lo) / (hi - lo)
    return [(axis[i - 1], 1 - t), (axis[i], t)]
