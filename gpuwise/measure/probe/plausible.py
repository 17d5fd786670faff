"""Whether a probe's readings are ones a real device gives: each reading against the range a
device of its kind (CPU, GPU) has (catalog/data/thresholds.toml, `probe_cpu`, `probe_gpu`,
each bound with its source), and the headline rates measured again at the probe's end against
the steadiness bound. A reading of exactly 0, NaN or infinity is never plausible.

A busy machine can stall a probe (one core taken made a 64^3 fp32 matmul read 0.03 GFLOP/s,
and the sweep then skipped every larger size): such a profile would put a 135M model's
prefill at half an hour. A probe with an implausible reading is saved aside, never over a
good profile, and no estimate uses it."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

from gpuwise.catalog.thresholds import ProbeBounds, probe_bounds, probe_thresholds

GPU_BACKENDS = ("torch-cuda",)


def device_kind(profile: Any) -> str:
    """cpu or gpu: which bounds a profile's readings are judged by."""
    return "gpu" if profile.backend in GPU_BACKENDS else "cpu"


def profile_warnings(profile: Any) -> tuple[str, ...]:
    """Why `profile` is not to be trusted (empty: it is): the warnings it was saved with, or
    its core readings judged now (bounds may have changed since it was saved). Its parts are
    judged alone (`implausible_parts`)."""
    return tuple(getattr(profile, "warnings", ()) or ()) or implausible(profile)


def implausible(profile: Any) -> tuple[str, ...]:
    """One line for each core reading (bandwidth, matmul sweep, per-op overhead) outside the
    bounds of its device kind, and for each headline rate that moved beyond the steadiness
    bound during the probe."""
    bounds = probe_bounds(device_kind(profile))
    return tuple(
        [
            *_memory(profile, bounds),
            *_matmul(profile, bounds),
            *_overhead(profile, bounds),
            *_steadiness({k: v for k, v in (profile.steadiness or {}).items() if k in CORE_HEADLINES}),
        ]
    )


# The headline rates whose motion during the probe makes the whole core untrusted; another
# dtype's matmul that moved is set aside alone (`unsteady_dtypes`): on a VM whose bf16 runs on
# AMX, bf16 read x0.34-x4.9 at the end while bandwidth and fp32 held within 2%.
CORE_HEADLINES = ("read", "matmul_fp32")


def unsteady_dtypes(profile: Any) -> dict[str, str]:
    """Each matmul dtype but fp32 whose headline rate moved beyond the steadiness bound while
    the probe ran, with the line saying so: its readings are set aside alone."""
    found = {}
    for key, ratio in (profile.steadiness or {}).items():
        if key.startswith("matmul_") and key not in CORE_HEADLINES:
            line = next(_steadiness({key: ratio}), "")
            if line:
                found[key.removeprefix("matmul_")] = line
    return found


def implausible_parts(profile: Any) -> dict[str, tuple[str, ...]]:
    """Each part of the profile (runtime costs, kernel grids, llama.cpp rates) with readings
    outside the bounds, and one line for each: such a part is set aside alone."""
    bounds = probe_bounds(device_kind(profile))
    found = {
        "runtime": tuple(_runtime(getattr(profile, "runtime", None) or {}, bounds)),
        "kernels": tuple(_kernels(profile.kernels or {}, bounds)),
        "llama_cpp": tuple(_llama_cpp(getattr(profile, "llama_cpp", None) or {}, bounds)),
    }
    return {part: lines for part, lines in found.items() if lines}


def summary(warnings: Sequence[str]) -> str:
    """The first warning, and how many more there are."""
    more = len(warnings) - 1
    return warnings[0] + (f" (and {more} more)" if more > 0 else "") if warnings else ""


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _judge(what: str, value: float, bounds: Sequence[float], unit: str, kind: str,
           scale: float = 1.0, floor: bool = True) -> Iterator[str]:
    """A line when `value` (in the bounds' unit) is 0, not finite, over `bounds` or (`floor`)
    under them; shown x `scale` in `unit`."""
    low, high = bounds
    if math.isfinite(value) and 0 < value <= high and (value >= low or not floor):
        return
    yield (f"{what} read {_fmt(value * scale)} {unit}: a real {kind.upper()} gives "
           f"{_fmt(low * scale)}-{_fmt(high * scale)}")


def _curve(what: str, points: Sequence[tuple[str, float]], bounds: Sequence[float],
           kind: str) -> Iterator[str]:
    """One line at most for a curve of (label, FLOP/s): its first point that is 0, not finite
    or over the ceiling, else its best point under the floor (small sizes run slow)."""
    tflops = [(label, rate / 1e12) for label, rate in points]
    for label, rate in tflops:
        line = next(_judge(f"{what} {label}", rate, bounds, "GFLOP/s", kind, 1e3, floor=False), "")
        if line:
            yield line
            return
    if tflops:
        label, best = max(tflops, key=lambda lr: lr[1])
        yield from _judge(f"{what} (best, {label})", best, bounds, "GFLOP/s", kind, 1e3)


def _memory(profile: Any, bounds: ProbeBounds) -> Iterator[str]:
    for r in profile.bandwidth:
        if r.gbs is not None:
            yield from _judge(f"{r.kind} bandwidth", r.gbs, bounds.memory_gbs, "GB/s", bounds.kind)
    for r in profile.links:
        if r.gbs is not None:
            link = bounds.link_gbs or bounds.memory_gbs  # a CPU measures none
            yield from _judge(f"{r.kind} link", r.gbs, link, "GB/s", bounds.kind)


def _matmul(profile: Any, bounds: ProbeBounds) -> Iterator[str]:
    """Each dtype's sweep, every point by its best and its median time (estimates read the
    median)."""
    for dtype in dict.fromkeys(p.dtype for p in profile.matmul_points):
        points = [(f"{p.m}x{p.n}x{p.k}", rate) for p in profile.matmul_points if p.dtype == dtype
                  for rate in (p.flops_per_s, 2.0 * p.m * p.n * p.k / p.median_s
                               if p.median_s else math.inf)]
        yield from _curve(f"matmul {dtype}", points,
                          bounds.matmul_tflops.get(dtype, [0.0, math.inf]), bounds.kind)


def _overhead(profile: Any, bounds: ProbeBounds) -> Iterator[str]:
    for name, seconds in profile.overhead_s.items():
        if seconds is not None:
            yield from _judge(f"per-op overhead ({name})", seconds, bounds.overhead_s, "us",
                              bounds.kind, scale=1e6)


def _runtime(runtime: dict[str, Any], bounds: ProbeBounds) -> Iterator[str]:
    """The eager runtime's costs per op within the overhead bounds, its GEMV rates within the
    elementwise ones."""
    for key, seconds in runtime.items():
        if key.endswith("_op_s"):
            yield from _judge(f"the runtime's cost per op ({key.removesuffix('_op_s')})",
                              seconds, bounds.overhead_s, "us", bounds.kind, scale=1e6)
    for dtype, points in (runtime.get("gemv") or {}).items():  # [weight bytes, bytes/s]
        wrong = (line for b, rate in points for line in _judge(
            f"cold GEMV {dtype} over {b / 2**20:.0f} MiB", rate / 1e9, bounds.elementwise_gbs,
            "GB/s", bounds.kind))
        yield from itertools.islice(wrong, 1)


def _grid_rate(family: str, p: Sequence[float]) -> float:
    """FLOP/s of a linear point [m, k, n, s] or a convolution's [m, k, n, (gemms), s]."""
    gemms = p[3] if family == "conv" and len(p) > 4 else 1.0
    return gemms * 2.0 * p[0] * p[1] * p[2] / p[-1] if p[-1] else math.inf


def _kernels(kernels: dict[str, Any], bounds: ProbeBounds) -> Iterator[str]:
    """Matmul grids as the matmul sweep; attention and optimizer curves: every time above 0;
    elementwise rates within their bounds."""
    for family in ("linear", "conv"):
        for dtype, grids in (kernels.get(family) or {}).items():
            for name, grid in grids.items():
                points = [("x".join(f"{v:.0f}" for v in p[:3]), _grid_rate(family, p)) for p in grid]
                yield from _curve(f"{family} {dtype} {name}", points,
                                  bounds.matmul_tflops.get(dtype, [0.0, math.inf]), bounds.kind)
    for family in ("sdpa", "optimizer"):
        for dtype, curves in (kernels.get(family) or {}).items():
            for name, curve in curves.items():
                zero = [p for p in curve if not (math.isfinite(p[-1]) and p[-1] > 0)]
                if zero:
                    yield (f"{family} {dtype} {name} at {_fmt(zero[0][0])} read "
                           f"{_fmt(zero[0][-1])} s: a real kernel takes time")
    for dtype, rates in (kernels.get("elementwise") or {}).items():
        for name, rate in rates.items():
            yield from _judge(f"elementwise {name} {dtype}", rate / 1e9, bounds.elementwise_gbs,
                              "GB/s", bounds.kind)


def _steadiness(ratios: dict[str, float]) -> Iterator[str]:
    low, high = probe_thresholds().steadiness_ratio
    for name, ratio in ratios.items():
        if not (math.isfinite(ratio) and low <= ratio <= high):
            what = "read bandwidth" if name == "read" else name.replace("_", " ")
            yield (f"{what} measured again at the probe's end ran at "
                   f"x{ratio:.2f} its reading: the machine changed speed while it was probed "
                   f"(beyond x{low:g}-x{high:g})")


def _llama_cpp(record: dict[str, Any], bounds: ProbeBounds) -> Iterator[str]:
    """llama.cpp's fitted rates: streaming within the elementwise bounds (a small probe model
    runs from cache), matmuls within the int8 ones (its quantised dot products), and no fixed
    cost past a stalled op's."""
    matmul = bounds.matmul_tflops.get("int8", [0.0, math.inf])
    for key, r in (record.get("rates") or {}).items():
        yield from _judge(f"llama.cpp {key} weight streaming", r["weight_bytes_per_s"] / 1e9,
                          bounds.elementwise_gbs, "GB/s", bounds.kind)
        if r.get("cache_bytes_per_s"):  # 0.0: no cache seen, not a reading
            yield from _judge(f"llama.cpp {key} streaming from the cache", r["cache_bytes_per_s"] / 1e9,
                              bounds.elementwise_gbs, "GB/s", bounds.kind)
        yield from _judge(f"llama.cpp {key} prompt matmuls", r["matmul_flops"] / 1e12, matmul,
                          "GFLOP/s", bounds.kind, 1e3)
        for cost in ("layer_s", "layer_token_s", "half_layer_token_s", "token_s"):
            value = r.get(cost, 0.0)
            if not 0 <= value <= bounds.overhead_s[1]:
                yield (f"llama.cpp {key} {cost} read {value * 1e6:,.0f} us: a stalled run, "
                       f"not a cost (at most {bounds.overhead_s[1] * 1e6:,.0f} us)")
