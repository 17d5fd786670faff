"""The measurements: bandwidth, the matmul sweep, per-op overhead and host/device links.
Each reading that fails becomes None with the reason in `missing`; nothing raises."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from gpuwise.catalog.hardware import Hardware
from gpuwise.measure.probe.backends import Backend, Unsupported, why
from gpuwise.measure.probe.profile import (
    LINK_KINDS,
    OVERHEAD_BATCH,
    OVERHEAD_OPS,
    SAFETY,
    STREAM_ARRAYS,
    BandwidthReading,
    MatmulPoint,
    Op,
    ProbePlan,
    Progress,
    matmul_flops,
)


class Steps:
    """Feeds the progress callback; a callback that fails is ignored, not the probe's problem."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.total, self.count = progress, total, 0

    def next(self, label: str) -> None:
        self.say(label, min(self.count / self.total, 1.0))
        self.count += 1

    def say(self, label: str, fraction: float) -> None:
        if self.progress is not None:
            progress = self.progress
            attempt({}, "progress", lambda: progress(label, fraction))


def measure_stream(
    backend: Backend, plan: ProbePlan, spec: Hardware | None, missing: dict[str, str], steps: Steps
) -> tuple[BandwidthReading, ...]:
    n = plan.array_bytes // 4
    steps.next(f"memory bandwidth (3 x {plan.array_bytes / 2**20:.0f} MiB fp32)")
    ops: dict[str, Op] = attempt(missing, "bandwidth", lambda: backend.stream_ops(n)) or {}
    best: dict[str, float] = {}
    for repeat in range(plan.stream_repeats + 1):  # interleaved as in STREAM; pass 0 warms up
        for kind, op in ops.items():
            key = f"bandwidth.{kind}"
            if key in missing:
                continue
            t = attempt(missing, key, partial(backend.time_calls, op, 1))
            if t and repeat:
                best[kind] = min(best.get(kind, t[0]), t[0])
    del ops
    attempt({}, "release", backend.release)
    readings = []
    for kind, arrays in STREAM_ARRAYS.items():
        moved, seconds = arrays * n * 4, best.get(kind)
        gbs = moved / seconds / 1e9 if seconds else None
        if gbs is None:
            missing.setdefault(f"bandwidth.{kind}", missing.get("bandwidth", "not measured"))
        peak = spec.memory_bandwidth_gbs if spec else 0.0
        fraction = gbs / peak if gbs and peak else None
        readings.append(BandwidthReading(kind, gbs, n * 4, moved, seconds, fraction))
    missing.pop("bandwidth", None)  # said for each kind
    return tuple(readings)


def measure_matmul(
    backend: Backend, plan: ProbePlan, dtypes: tuple[str, ...], missing: dict[str, str],
    steps: Steps,
) -> tuple[tuple[MatmulPoint, ...], dict[str, MatmulPoint | None]]:
    points: list[MatmulPoint] = []
    best: dict[str, MatmulPoint | None] = {}
    for dtype in dtypes:
        curve = _sweep(backend, plan, dtype, missing, steps)
        points += curve
        best[dtype] = max(curve, key=lambda p: p.flops_per_s) if curve else None
        if not curve:
            missing.setdefault(f"matmul.{dtype}", "no size could be measured")
    return tuple(points), best


def _sweep(
    backend: Backend, plan: ProbePlan, dtype: str, missing: dict[str, str], steps: Steps
) -> list[MatmulPoint]:
    """One dtype's curve, smallest first, within the plan's time budget.

    The next size's time is predicted from the best rate so far (small sizes are slowed by
    fixed costs, so the last rate would be too pessimistic), times SAFETY for paths that get
    slower per flop with size; a first call slower than the cap ends the sweep.
    """
    curve: list[MatmulPoint] = []
    spent, rate, stop = 0.0, 0.0, ""
    for m, n, k in plan.matmul_shapes:
        steps.next(f"matmul {dtype} {m}x{n}x{k}")
        key, flops = f"matmul.{dtype}.{m}x{n}x{k}", matmul_flops((m, n, k))
        predicted = flops / rate * SAFETY if rate else 0.0
        left = plan.matmul_dtype_budget_s - spent
        if not stop and predicted and (predicted > plan.matmul_max_call_s or 3 * predicted > left):
            stop = f"skipped: about {predicted:.2g} s a call at {rate / 1e9:.3g} GFLOP/s: over the time budget"
        if stop:
            missing[key] = stop
            continue
        started = time.perf_counter()
        try:
            times = _time_matmul(backend, plan, backend.matmul_op(m, n, k, dtype), left)
        except Exception as exc:  # the first size failing means the dtype is not supported
            unsupported = isinstance(exc, Unsupported) or not curve
            missing[f"matmul.{dtype}" if unsupported else key] = why(exc)
            if unsupported:
                steps.count += len(plan.matmul_shapes) - plan.matmul_shapes.index((m, n, k)) - 1
                break
            continue
        finally:
            spent += time.perf_counter() - started
        fastest = min(times)
        point = MatmulPoint(m, n, k, dtype, fastest, statistics.median(times), flops / fastest,
                            len(times))
        curve.append(point)
        rate = max(rate, point.flops_per_s)
        if fastest > plan.matmul_max_call_s:
            stop = f"skipped: {m}x{n}x{k} took {fastest:.2g} s a call: over the time budget"
    return curve


def _time_matmul(backend: Backend, plan: ProbePlan, op: Op, left_s: float) -> list[float]:
    """Warm up, then time as many calls as the plan's target allows (one if very slow)."""
    started = time.perf_counter()
    first = backend.time_calls(op, 1)[0]
    if first > plan.matmul_max_call_s:
        return [first]
    warm = max(backend.time_calls(op, 1)[0], 1e-9)
    left_s -= time.perf_counter() - started
    lo, hi = plan.matmul_repeats
    calls = max(1, min(hi, max(lo, int(plan.matmul_target_s / warm)), int(left_s / warm)))
    return backend.time_calls(op, calls)


def measure_overhead(
    backend: Backend, plan: ProbePlan, missing: dict[str, str], steps: Steps
) -> dict[str, float | None]:
    ops: dict[str, Op] = attempt(missing, "overhead", backend.tiny_ops) or {}
    result: dict[str, float | None] = {}
    for name in OVERHEAD_OPS:
        steps.next(f"per-op overhead: {name}")
        op = ops.get(name)

        def samples(op: Op | None = op) -> list[float]:
            if op is None:
                raise Unsupported(missing.get("overhead", "not measured"))
            backend.time_batch(op, OVERHEAD_BATCH * 10)  # warm-up
            return [backend.time_batch(op, OVERHEAD_BATCH) for _ in range(plan.overhead_samples)]

        times = attempt(missing, f"overhead.{name}", samples)
        result[name] = statistics.median(times) if times else None
    missing.pop("overhead", None)  # said for each op
    return result


def measure_links(
    backend: Backend, plan: ProbePlan, spec: Hardware | None, missing: dict[str, str], steps: Steps
) -> tuple[BandwidthReading, ...]:
    ops: dict[str, Op] = attempt(missing, "links", lambda: backend.link_ops(plan.link_bytes)) or {}
    readings = []
    for kind in LINK_KINDS:
        steps.next(f"link {kind}")
        op = ops.get(kind)
        if op is None:
            if ops:
                missing[f"link.{kind}"] = "one GPU: no device-to-device link"
            continue
        runs = partial(backend.time_calls, op, plan.link_repeats + 1)  # the first warms up
        times = attempt(missing, f"link.{kind}", runs)
        if times:
            best, size = min(times[1:]), plan.link_bytes
            gbs = size / best / 1e9
            # host_link_gbs is one direction; interconnect_gbs is a marketed two-way sum: skipped
            peak = spec.host_link_gbs if spec and kind != "d2d" else 0.0
            readings.append(
                BandwidthReading(kind, gbs, size, size, best, gbs / peak if peak else None)
            )
    del ops
    attempt({}, "release", backend.release)
    return tuple(readings)


def attempt(missing: dict[str, str], key: str, fn: Callable[[], Any]) -> Any:
    """fn(), or None with the reason stored under `key` in `missing`."""
    try:
        return fn()
    except Exception as exc:  # a reading that fails is None with the reason, never a crash
        missing[key] = why(exc)
    return None
