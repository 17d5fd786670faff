"""Whether the machine held still while it was probed: its headline rates (read bandwidth,
1024^3 fp32 and bf16 matmuls) measured again at the end of the probe, as ratios to the
probe's own readings of them. A shared host (a cloud VM) can change speed by 2x within
minutes, and an estimate can only be as steady as the profile it reads."""

from __future__ import annotations

import statistics
from functools import partial
from typing import Any

from gpuwise.measure.probe.backends import Backend, make_backend
from gpuwise.measure.probe.measurements import attempt
from gpuwise.measure.probe.profile import STEADY, describe_ratios, largest_move

SQUARE = 1024  # the matmul the check repeats (m = n = k)
# On a GPU a 1024^3 bf16 matmul takes 3 us: the check would time its launch, and read a
# launch's jitter as the machine changing speed (x0.66 on an H200 that had not).
GPU_SQUARE = 8192
MATMUL_DTYPES = ("fp32", "bf16")


def probe_figures(profile: Any) -> dict[str, float]:
    """The headline rates as the probe measured them: read GB/s and GFLOP/s (median) of the
    1024^3 matmul per dtype, where present."""
    figures: dict[str, float] = {}
    read = profile.bandwidth_gbs("read")
    if read:
        figures["read"] = read
    size = square(profile)
    for p in profile.matmul_points:
        if (p.m, p.n, p.k) == (size,) * 3 and p.dtype in MATMUL_DTYPES and p.median_s:
            figures[f"matmul_{p.dtype}"] = 2.0 * size**3 / p.median_s / 1e9
    return figures


def square(profile: Any) -> int:
    """The side of the square matmul the check repeats: 8192 on a GPU, 1024 on a CPU."""
    return GPU_SQUARE if profile.backend == "torch-cuda" else SQUARE


def figures_now(backend: Backend, profile: Any, wanted: dict[str, float]) -> dict[str, float]:
    """The same rates measured now (those that fail to measure are left out)."""
    now: dict[str, float] = {}
    reading = next((r for r in profile.bandwidth if r.kind == "read"), None)
    if "read" in wanted and reading is not None:
        ops = attempt({}, "read", lambda: backend.stream_ops(reading.array_bytes // 4)) or {}
        times = attempt({}, "read", lambda: backend.time_calls(ops["read"], 3)) if ops else None
        if times:
            now["read"] = reading.array_bytes / min(times) / 1e9
        del ops
        attempt({}, "release", backend.release)
    size = square(profile)
    for dtype in MATMUL_DTYPES:
        if f"matmul_{dtype}" not in wanted:
            continue
        op = attempt({}, "matmul", partial(backend.matmul_op, size, size, size, dtype))
        times = attempt({}, "matmul", partial(backend.time_calls, op, 6)) if op else None
        if times:  # the first call warms up
            now[f"matmul_{dtype}"] = 2.0 * size**3 / statistics.median(times[1:]) / 1e9
    return now


def machine_vs_profile(profile: Any) -> dict[str, float]:
    """This machine's headline rates now, as ratios to the profile's readings of them (1.0:
    as fast as when probed); empty where none could be measured again."""
    at_probe = probe_figures(profile)
    if not at_probe:
        return {}
    backend = make_backend(profile.backend)
    try:
        return steadiness(at_probe, figures_now(backend, profile, at_probe))
    finally:
        attempt({}, "close", backend.close)


def steadiness(at_probe: dict[str, float], now: dict[str, float]) -> dict[str, float]:
    """Each headline rate now against the probe's reading (1.0: as fast as when probed)."""
    return {k: now[k] / at_probe[k] for k in now if at_probe.get(k)}


def steadiness_note(ratios: dict[str, float]) -> tuple[str, ...]:
    """A warning when a headline rate moved by more than `STEADY` during the probe."""
    moved = {k: r for k, r in ratios.items() if abs(r - 1.0) > STEADY}
    if not moved:
        return ()
    return (f"this machine changed speed while it was probed ({describe_ratios(moved)} at "
            f"the end against the probe's readings): time estimates from this profile may be "
            f"off by {largest_move(moved):.0%} or more; probe again just before a time "
            "check",)


def merged_steadiness_note(each: list[dict[str, float] | None]) -> tuple[str, ...]:
    """One warning for several probes: how many changed speed, with the note of the one that
    moved most (each probe's own note says the same thing at another size)."""
    moved = [r for r in each if r and steadiness_note(r)]
    if not moved:
        return ()
    (note,) = steadiness_note(max(moved, key=largest_move))
    return (f"{len(moved)} of the {len(each)} probes changed speed while they ran; the most: "
            f"{note}",)
