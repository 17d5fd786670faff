"""Probe this machine: memory bandwidth, matmul throughput by size and dtype, per-op overhead.

Time estimates use these measured numbers instead of datasheet peaks. The measurements are
generic; the hardware sits behind a narrow `Backend` (torch on the CPU or CUDA, numpy when
torch is missing, and a null backend for tests), which builds the operations and times them.

Method
------
- Bandwidth, the STREAM way: read (a sum), copy (c = a) and triad (a = b + s*c) over fp32
  arrays at least 4x the last-level cache, best of >= 5 passes, counting 1, 2 and 3 arrays
  moved per pass (no write-allocate traffic). torch runs each as one multithreaded pass.
- Matmul: a sweep of square and LLM-shaped (tokens x out x in) sizes per dtype, smallest
  first; each point is warmed up, then timed (best and median). A point predicted to exceed
  the time budget is skipped and said so in `missing`, so slow paths (fp16 on most CPUs)
  cannot stall the probe.
- Overhead: the median time of a tiny op (an add of 1-element tensors, a 1x1 matmul): the
  dispatch cost on a CPU, the launch cost on a GPU.
- Links (GPU only): host-to-device and device-to-host copies from pinned memory, and
  device-to-device with two GPUs.

Every reading is a number or None with the reason in `Profile.missing`; nothing raises.
torch and numpy are imported only inside functions (see `probe_backends`... here: below).
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from gpuwise.catalog.hardware import Hardware
from gpuwise.helpers import GpuwiseError
from gpuwise.measure.device import LocalMachine, detect_local
from gpuwise.measure.probe_backends import (
    BACKENDS,
    Backend,
    NullBackend,
    Unsupported,
    auto_backend,
    make_backend,
)

__all__ = [
    "BandwidthReading",
    "MatmulPoint",
    "ProbePlan",
    "Profile",
    "machine_fingerprint",
    "probe_with",
    "run_probe",
]

SCHEMA_VERSION = 1
Progress = Callable[[str, float], None]
STREAM_ARRAYS = {"read": 1, "copy": 2, "triad": 3}  # arrays moved per pass, the STREAM way
LINK_KINDS = ("h2d", "d2h", "d2d")
OVERHEAD_BATCH = 10  # tiny ops per timed batch: a perf_counter read costs about as much as one
SAFETY = 1.5  # a larger matmul is predicted this much slower per flop than the last (fp16 on CPU)


@dataclass(frozen=True)
class BandwidthReading:
    """One bandwidth: memory (read/copy/triad) or a link (h2d/d2h/d2d), in GB/s (1e9 B/s)."""

    kind: str
    gbs: float | None
    array_bytes: int  # size of each array (or of the transfer)
    bytes_per_pass: int  # bytes counted per pass
    best_s: float | None
    fraction_of_spec: float | None = None


@dataclass(frozen=True)
class MatmulPoint:
    """One matmul (m x k) @ (k x n): best and median time of the repeats, 2*m*n*k flops."""

    m: int
    n: int
    k: int
    dtype: str
    seconds: float  # best of the repeats; flops_per_s uses it
    median_s: float
    flops_per_s: float
    repeats: int


@dataclass(frozen=True)
class ProbePlan:
    """What to measure and how long to spend: `ProbePlan.for_mode` gives quick and full."""

    array_bytes: int  # per stream array
    stream_repeats: int
    matmul_shapes: tuple[tuple[int, int, int], ...]  # (m, n, k)
    matmul_target_s: float  # timed seconds per point
    matmul_max_call_s: float  # skip a point predicted slower than this per call
    matmul_dtype_budget_s: float  # seconds per dtype, the whole sweep
    matmul_repeats: tuple[int, int]  # (min, max)
    overhead_samples: int
    link_bytes: int
    link_repeats: int

    @classmethod
    def for_mode(cls, quick: bool, cache_bytes: int, on_gpu: bool = False) -> ProbePlan:
        floor = (256 if quick else 1024) * 2**20 if on_gpu else 0
        squares = (64, 256, 1024, 2048) if quick else (64, 128, 256, 512, 1024, 2048, 4096, 8192)
        llm = ((1, 4096, 4096), (128, 4096, 4096))
        if not quick:
            llm += ((16, 4096, 4096), (512, 11008, 4096), (2048, 4096, 4096))
        return cls(
            array_bytes=max(4 * cache_bytes, floor),
            stream_repeats=5 if quick else 20,
            matmul_shapes=tuple(sorted({(s, s, s) for s in squares} | set(llm), key=_flops)),
            matmul_target_s=0.05 if quick else 0.3,
            matmul_max_call_s=0.3 if quick else 2.0,
            matmul_dtype_budget_s=1.5 if quick else 12.0,
            matmul_repeats=(3, 50) if quick else (5, 200),
            overhead_samples=100 if quick else 1000,
            link_bytes=(256 if quick else 1024) * 2**20,
            link_repeats=5 if quick else 20,
        )


@dataclass(frozen=True)
class Profile:
    """What the probe measured on one machine with one backend. Units in the field names."""

    fingerprint: str
    device: str
    backend: str  # torch-cpu | numpy-cpu | torch-cuda | null | none
    threads: int | None
    bandwidth: tuple[BandwidthReading, ...]
    links: tuple[BandwidthReading, ...]
    matmul_points: tuple[MatmulPoint, ...]
    matmul_best: dict[str, MatmulPoint | None]
    matmul_fraction_of_spec: dict[str, float | None]
    overhead_s: dict[str, float | None]
    missing: dict[str, str]  # measurement -> why it is not there
    created_at: str
    versions: dict[str, str]
    cache_bytes: int | None = None
    spec_id: str | None = None  # the catalogue entry fractions of spec refer to
    quick: bool = False
    notes: tuple[str, ...] = ()
    schema: int = SCHEMA_VERSION

    def bandwidth_gbs(self, kind: str = "triad") -> float | None:
        """Measured GB/s of a memory kind (read/copy/triad) or a link (h2d/d2h/d2d)."""
        for reading in (*self.bandwidth, *self.links):
            if reading.kind == kind:
                return reading.gbs
        return None

    def best_flops_per_s(self, dtype: str) -> float | None:
        best = self.matmul_best.get(dtype)
        return best.flops_per_s if best else None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        """Read `to_json` output back; raises ValueError on another schema or bad data."""
        raw = json.loads(text)
        if raw.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"probe profile schema {raw.get('schema')!r}, want {SCHEMA_VERSION}")
        try:
            best = raw["matmul_best"]
            return cls(
                **{
                    **raw,
                    "bandwidth": tuple(BandwidthReading(**r) for r in raw["bandwidth"]),
                    "links": tuple(BandwidthReading(**r) for r in raw["links"]),
                    "matmul_points": tuple(MatmulPoint(**p) for p in raw["matmul_points"]),
                    "matmul_best": {d: MatmulPoint(**p) if p else None for d, p in best.items()},
                    "notes": tuple(raw.get("notes", ())),
                }
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a probe profile: {exc}") from exc


def machine_fingerprint(machine: LocalMachine | None = None) -> str:
    """What identifies this machine's hardware: CPU model, core count and GPU names."""
    m = machine or detect_local()
    gpus = ", ".join(g.name for g in m.gpus) or "no GPU"
    return f"{m.cpu_model} | {m.logical_cores} cores | {gpus}"


def run_probe(quick: bool, progress: Progress | None = None, backend: str | None = None) -> Profile:
    """Measure this machine. `backend`: None picks torch-cuda, torch-cpu, numpy-cpu, in order.

    `progress(label, fraction_done)` is called before each step and with 1.0 at the end.
    A backend that cannot start gives a profile of None readings with the reason.
    """
    if backend is not None and backend not in BACKENDS:
        raise GpuwiseError(f"unknown probe backend {backend!r}", f"one of: {', '.join(BACKENDS)}")
    impl = auto_backend() if backend is None else make_backend(backend)
    try:
        cache = _attempt({}, "cache", impl.cache_bytes) or 32 * 2**20
        plan = ProbePlan.for_mode(quick, cache, on_gpu=impl.name == "torch-cuda")
        return probe_with(impl, plan, progress, quick=quick)
    finally:
        _attempt({}, "close", impl.close)


def probe_with(
    backend: Backend,
    plan: ProbePlan,
    progress: Progress | None = None,
    quick: bool = False,
    fingerprint: str | None = None,
) -> Profile:
    """Run `plan` on `backend`. Never raises for a failed reading: it becomes None + reason."""
    missing: dict[str, str] = {}
    dtypes = _attempt(missing, "matmul", backend.matmul_dtypes) or ()
    steps = _Steps(progress, 3 + len(dtypes) * len(plan.matmul_shapes) + 2 + len(LINK_KINDS))
    spec = _attempt(missing, "spec", backend.spec)
    if spec is None and "spec" not in missing:
        missing["spec"] = "device not in the catalogue: no fraction of spec"
    bandwidth = _measure_stream(backend, plan, spec, missing, steps)
    points, best = _measure_matmul(backend, plan, dtypes, missing, steps)
    overhead = _measure_overhead(backend, plan, missing, steps)
    links = _measure_links(backend, plan, missing, steps)
    peaks = spec.peak_tflops if spec else {}
    steps.done()
    return Profile(
        fingerprint=fingerprint or _attempt(missing, "fingerprint", machine_fingerprint) or "",
        device=_attempt(missing, "device", backend.describe) or "unknown",
        backend=backend.name,
        threads=_attempt(missing, "threads", backend.threads),
        bandwidth=bandwidth,
        links=links,
        matmul_points=points,
        matmul_best=best,
        matmul_fraction_of_spec={
            d: p.flops_per_s / (peaks[d] * 1e12) if p and peaks.get(d) else None
            for d, p in best.items()
        },
        overhead_s=overhead,
        missing=missing,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        versions={"python": platform.python_version(), **(_attempt({}, "v", backend.versions) or {})},
        cache_bytes=_attempt({}, "cache", backend.cache_bytes),
        spec_id=spec.id if spec else None,
        quick=quick,
        notes=_attempt({}, "notes", backend.notes) or (),
    )


# --- The four measurements ------------------------------------------------------------------


class _Steps:
    """Counts steps for the progress callback; a failing callback is not the probe's problem."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.total, self.count = progress, max(total, 1), 0

    def next(self, label: str) -> None:
        self._say(label, min(self.count / self.total, 1.0))
        self.count += 1

    def done(self) -> None:
        self._say("done", 1.0)

    def _say(self, label: str, fraction: float) -> None:
        if self.progress is not None:
            _attempt({}, "progress", lambda: self.progress(label, fraction))  # type: ignore[misc]


def _measure_stream(
    backend: Backend, plan: ProbePlan, spec: Hardware | None, missing: dict[str, str], steps: _Steps
) -> tuple[BandwidthReading, ...]:
    n = plan.array_bytes // 4
    steps.next(f"memory bandwidth: allocating 3 x {plan.array_bytes / 2**20:.0f} MiB")
    ops = _attempt(missing, "bandwidth", lambda: backend.stream_ops(n))
    best: dict[str, float] = {}
    if ops:
        for kind, op in ops.items():  # warm-up: page faults, thread pool start
            _attempt(missing, f"bandwidth.{kind}", lambda op=op: backend.time_calls(op, 1))
        for _ in range(plan.stream_repeats):  # interleaved like STREAM, best of each kind
            for kind, op in ops.items():
                if f"bandwidth.{kind}" not in missing:
                    t = _attempt(missing, f"bandwidth.{kind}", lambda op=op: backend.time_calls(op, 1))
                    if t:
                        best[kind] = min(best.get(kind, t[0]), t[0])
        del ops
        _attempt({}, "release", backend.release)
    steps.count += 2
    readings = []
    for kind, arrays in STREAM_ARRAYS.items():
        moved = arrays * n * 4
        gbs = moved / best[kind] / 1e9 if best.get(kind) else None
        if gbs is None and f"bandwidth.{kind}" not in missing:
            missing[f"bandwidth.{kind}"] = missing.get("bandwidth", "not measured")
        peak = spec.memory_bandwidth_gbs if spec else 0.0
        fraction = gbs / peak if gbs and peak else None
        readings.append(BandwidthReading(kind, gbs, n * 4, moved, best.get(kind), fraction))
    return tuple(readings)


def _flops(shape: tuple[int, int, int]) -> int:
    m, n, k = shape
    return 2 * m * n * k


def _measure_matmul(
    backend: Backend,
    plan: ProbePlan,
    dtypes: tuple[str, ...],
    missing: dict[str, str],
    steps: _Steps,
) -> tuple[tuple[MatmulPoint, ...], dict[str, MatmulPoint | None]]:
    points: list[MatmulPoint] = []
    best: dict[str, MatmulPoint | None] = {}
    for dtype in dtypes:
        curve = _sweep(backend, plan, dtype, missing, steps)
        points += curve
        best[dtype] = max(curve, key=lambda p: p.flops_per_s) if curve else None
        if not curve and f"matmul.{dtype}" not in missing:
            missing[f"matmul.{dtype}"] = "no size could be measured"
    return tuple(points), best


def _sweep(
    backend: Backend, plan: ProbePlan, dtype: str, missing: dict[str, str], steps: _Steps
) -> list[MatmulPoint]:
    curve: list[MatmulPoint] = []
    spent, rate, stop = 0.0, 0.0, ""
    lo, hi = plan.matmul_repeats
    for m, n, k in plan.matmul_shapes:
        steps.next(f"matmul {dtype} {m}x{n}x{k}")
        key = f"matmul.{dtype}.{m}x{n}x{k}"
        flops = _flops((m, n, k))
        predicted = flops / rate * SAFETY if rate else 0.0
        left = plan.matmul_dtype_budget_s - spent
        if not stop and predicted and (predicted > plan.matmul_max_call_s or 3 * predicted > left):
            stop = f"skipped: about {predicted:.2g} s a call at {rate / 1e9:.3g} GFLOP/s, over the budget"
        if stop:
            missing[key] = stop
            continue
        started = time.perf_counter()
        try:
            op = backend.matmul_op(m, n, k, dtype)
            warm = backend.time_calls(op, 2)[-1]
            calls = min(hi, max(lo, int(plan.matmul_target_s / max(warm, 1e-9))))
            calls = max(1, min(calls, int((left - (time.perf_counter() - started)) / max(warm, 1e-9))))
            times = backend.time_calls(op, calls)
            del op
        except Unsupported as exc:
            missing[f"matmul.{dtype}"] = str(exc)
            break
        except Exception as exc:
            missing[key] = _why(exc)
            continue
        finally:
            spent += time.perf_counter() - started
        fastest = min(times)
        point = MatmulPoint(m, n, k, dtype, fastest, statistics.median(times), flops / fastest, calls)
        curve.append(point)
        rate = point.flops_per_s
    steps.count += len(plan.matmul_shapes) - (steps.count % max(len(plan.matmul_shapes), 1)) * 0
    return curve


def _measure_overhead(
    backend: Backend, plan: ProbePlan, missing: dict[str, str], steps: _Steps
) -> dict[str, float | None]:
    steps.next("per-op overhead")
    ops = _attempt(missing, "overhead", backend.tiny_ops) or {}
    result: dict[str, float | None] = {"add": None, "matmul_1x1": None}
    for name, op in ops.items():
        steps.next(f"per-op overhead: {name}")

        def samples(op: Callable[[], Any] = op) -> list[float]:
            backend.time_batch(op, OVERHEAD_BATCH * 10)  # warm-up
            return [backend.time_batch(op, OVERHEAD_BATCH) for _ in range(plan.overhead_samples)]

        times = _attempt(missing, f"overhead.{name}", samples)
        result[name] = statistics.median(times) if times else None
    for name, value in result.items():
        if value is None and f"overhead.{name}" not in missing:
            missing[f"overhead.{name}"] = missing.get("overhead", "not measured")
    return result


def _measure_links(
    backend: Backend, plan: ProbePlan, missing: dict[str, str], steps: _Steps
) -> tuple[BandwidthReading, ...]:
    steps.next("host-device links")
    ops = _attempt(missing, "links", lambda: backend.link_ops(plan.link_bytes)) or {}
    readings = []
    for kind in LINK_KINDS:
        steps.next(f"link {kind}")
        if kind not in ops:
            if "links" not in missing:
                missing.setdefault(f"link.{kind}", "one GPU: no device-to-device link")
            continue
        op = ops[kind]
        times = _attempt(missing, f"link.{kind}", lambda op=op: backend.time_calls(op, plan.link_repeats + 1)[1:])
        if times:
            best = min(times)
            readings.append(BandwidthReading(kind, plan.link_bytes / best / 1e9, plan.link_bytes, plan.link_bytes, best))
    del ops
    _attempt({}, "release", backend.release)
    return tuple(readings)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _attempt(missing: dict[str, str], key: str, fn: Callable[[], Any]) -> Any:
    """fn() or None, with the reason under `key` in `missing` (Unsupported: its message)."""
    try:
        return fn()
    except Unsupported as exc:
        missing[key] = str(exc)
    except Exception as exc:  # a reading that fails is None with the reason, never a crash
        missing[key] = _why(exc)
    return None


_ = NullBackend  # re-exported for tests: gpuwise.measure.probe.NullBackend
