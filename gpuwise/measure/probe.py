"""Probe this machine: memory bandwidth, matmul throughput by size and dtype, per-op overhead.

Time estimates use these measured numbers instead of datasheet peaks. The measurements are
generic; the hardware sits behind a narrow `Backend` (torch on the CPU or CUDA, numpy when
torch is missing, and a null backend for tests) that builds the operations and times them.

- Bandwidth, the STREAM way: read (a sum), copy (c = a) and triad (a = b + s*c) over fp32
  arrays at least 4x the last-level cache, best of >= 5 interleaved passes, counting 1, 2 and
  3 arrays moved per pass (write-allocate traffic is not counted, as in STREAM).
- Matmul: square and LLM-shaped (tokens x out x in) sizes per dtype, smallest first, each
  warmed up then timed (best and median). A point predicted to break the time budget is
  skipped and said so in `missing`, so a slow path (fp16 on most CPUs) cannot stall the probe.
- Overhead: the median time of a tiny op (add of 1-element tensors, 1x1 matmul): the dispatch
  cost on a CPU, the launch cost on a GPU.
- Links (GPU only): host-to-device and device-to-host copies from pinned memory, and
  device-to-device with two GPUs.

Every reading is a number or None with the reason in `Profile.missing`; nothing raises.
Other work on the machine stalls multithreaded ops (a 2-thread op waits a scheduler tick for
a busy core), so the CPU time other processes took during the probe is checked, and a note
says when the readings are suspect. torch and numpy are imported only inside functions: importing this module stays light.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from gpuwise.catalog.hardware import Hardware, load_hardware
from gpuwise.helpers import GpuwiseError, normalise_name
from gpuwise.measure.device import LocalMachine, _cpu_model, detect_local, match_catalogue

__all__ = ["Backend", "BandwidthReading", "MatmulPoint", "NullBackend", "NumpyBackend", "ProbePlan",
           "Profile", "TorchBackend", "TorchCudaBackend", "Unsupported", "machine_fingerprint",
           "probe_with", "run_probe"]  # fmt: skip

SCHEMA_VERSION = 1
BACKENDS = ("torch-cuda", "torch-cpu", "numpy-cpu", "null")
STREAM_ARRAYS = {"read": 1, "copy": 2, "triad": 3}  # arrays moved per pass, the STREAM way
TRIAD_SCALAR = 0.5  # below 1, so repeated copy + triad passes never overflow
LINK_KINDS = ("h2d", "d2h", "d2d")
OVERHEAD_OPS = ("add", "matmul_1x1")
OVERHEAD_BATCH = 10  # tiny ops per timed batch: one clock read costs about as much as one op
SAFETY = 1.5  # a larger matmul is predicted this much slower per flop than the best so far
DEFAULT_CACHE_BYTES = 32 * 2**20
NO_LINK = "CPU backend: no host-device link to measure"
Op = Callable[[], object]
Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class BandwidthReading:
    """One bandwidth: memory (read/copy/triad) or a link (h2d/d2h/d2d), in GB/s (1e9 B/s)."""

    kind: str
    gbs: float | None
    array_bytes: int  # size of each array (or of one transfer)
    bytes_per_pass: int  # bytes counted per pass
    best_s: float | None
    fraction_of_spec: float | None = None


@dataclass(frozen=True)
class MatmulPoint:
    """One matmul (m x k) @ (k x n) = 2*m*n*k flops; `flops_per_s` uses the best time."""

    m: int
    n: int
    k: int
    dtype: str
    seconds: float  # best of the repeats
    median_s: float
    flops_per_s: float
    repeats: int


@dataclass(frozen=True)
class ProbePlan:
    """What to measure and how long to spend; `ProbePlan.for_mode` gives quick and full."""

    array_bytes: int  # per stream array
    stream_repeats: int
    matmul_shapes: tuple[tuple[int, int, int], ...]  # (m, n, k), fewest flops first
    matmul_target_s: float  # timed seconds per point
    matmul_max_call_s: float  # skip a point predicted slower than this per call
    matmul_dtype_budget_s: float  # seconds for one dtype's whole sweep
    matmul_repeats: tuple[int, int]  # (min, max)
    overhead_samples: int
    link_bytes: int
    link_repeats: int

    @classmethod
    def for_mode(cls, quick: bool, cache_bytes: int, on_gpu: bool = False) -> ProbePlan:
        floor = (256 if quick else 1024) * 2**20 if on_gpu else 0
        full = not quick or on_gpu  # a GPU does the whole sweep in seconds
        squares = (64, 128, 256, 512, 1024, 2048, 4096, 8192) if full else (64, 256, 1024, 2048)
        llm = {(1, 4096, 4096), (128, 4096, 4096)}
        if full:
            llm |= {(16, 4096, 4096), (512, 11008, 4096), (2048, 4096, 4096)}
        return cls(
            array_bytes=max(4 * cache_bytes, floor),
            stream_repeats=5 if quick else 20,
            matmul_shapes=tuple(sorted({(s, s, s) for s in squares} | llm, key=_flops)),
            matmul_target_s=0.05 if quick else 0.3,
            matmul_max_call_s=0.3 if quick else 2.0,
            matmul_dtype_budget_s=1.5 if quick else 15.0,
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
    threads: int | None  # CPU threads the backend used
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
    spec_id: str | None = None  # the catalogue entry that fractions of spec refer to
    quick: bool = False
    notes: tuple[str, ...] = ()
    schema: int = SCHEMA_VERSION
    # The eager runtime's own costs (gpuwise.measure.runtime_probe), when transformers is here.
    runtime: dict[str, Any] | None = None

    def bandwidth_gbs(self, kind: str = "triad") -> float | None:
        """Measured GB/s of a memory kind (read/copy/triad) or a link (h2d/d2h/d2d)."""
        found = [r.gbs for r in (*self.bandwidth, *self.links) if r.kind == kind]
        return found[0] if found else None

    def best_flops_per_s(self, dtype: str) -> float | None:
        best = self.matmul_best.get(dtype)
        return best.flops_per_s if best else None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        """Read `to_json` output back; ValueError for another schema or a malformed record."""
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"not a probe profile of schema {SCHEMA_VERSION}")
        try:
            return cls(**{
                **raw,
                "bandwidth": tuple(BandwidthReading(**r) for r in raw["bandwidth"]),
                "links": tuple(BandwidthReading(**r) for r in raw["links"]),
                "matmul_points": tuple(MatmulPoint(**p) for p in raw["matmul_points"]),
                "matmul_best": {d: p and MatmulPoint(**p) for d, p in raw["matmul_best"].items()},
                "notes": tuple(raw.get("notes", ())),
            })  # fmt: skip
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed probe profile: {exc}") from exc


def machine_fingerprint(machine: LocalMachine | None = None) -> str:
    """What identifies this machine's hardware: CPU model, core count and GPU names."""
    m = machine or detect_local()
    gpus = ", ".join(g.name for g in m.gpus) or "no GPU"
    return f"{m.cpu_model} | {m.logical_cores} cores | {gpus}"


def run_probe(quick: bool, progress: Progress | None = None, backend: str | None = None) -> Profile:
    """Measure this machine (quick: under 15 s on a laptop-class CPU; full: about a minute).

    `backend`: one of `BACKENDS`; None picks torch-cuda, torch-cpu, numpy-cpu, the first that
    works. `progress(label, fraction_done)` is called before each step, and with 1.0 at the end.
    A backend that cannot start gives a profile whose readings are all None, with the reason.
    """
    if backend is not None and backend not in BACKENDS:
        raise GpuwiseError(f"unknown probe backend {backend!r}", f"one of: {', '.join(BACKENDS)}")
    impl = _auto_backend() if backend is None else _make_backend(backend)
    try:
        cache = _attempt({}, "cache", impl.cache_bytes) or DEFAULT_CACHE_BYTES
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
    """Run `plan` on `backend`. A reading that fails becomes None with the reason; no raise."""
    missing: dict[str, str] = {}
    started, others_before = time.perf_counter(), _others_cpu_s()
    dtypes: tuple[str, ...] = _attempt(missing, "matmul", backend.matmul_dtypes) or ()
    steps = _Steps(progress, 1 + len(dtypes) * len(plan.matmul_shapes) + 2 + 3)
    spec: Hardware | None = _attempt(missing, "spec", backend.spec)
    if spec is None:
        missing.setdefault("spec", "device not in the catalogue: no fraction of spec")
    bandwidth = _measure_stream(backend, plan, spec, missing, steps)
    points, best = _measure_matmul(backend, plan, dtypes, missing, steps)
    overhead = _measure_overhead(backend, plan, missing, steps)
    links = _measure_links(backend, plan, spec, missing, steps)
    steps.say("done", 1.0)
    peaks = spec.peak_tflops if spec else {}
    versions = _attempt({}, "versions", backend.versions) or {}
    contention = _contention_note(others_before, started)
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
        versions={"python": platform.python_version(), **versions},
        cache_bytes=_attempt({}, "cache", backend.cache_bytes),
        spec_id=spec.id if spec else None,
        quick=quick,
        notes=(*(_attempt({}, "notes", backend.notes) or ()), *contention),
    )


def _others_cpu_s() -> float | None:
    """CPU seconds used so far by everything but this process, the hypervisor's steal too."""
    try:
        import psutil

        t, mine = psutil.cpu_times(), psutil.Process().cpu_times()
    except Exception:
        return None
    busy = t.user + t.nice + t.system + sum(getattr(t, f, 0.0) for f in ("irq", "softirq", "steal"))
    return busy - mine.user - mine.system


def _contention_note(others_before: float | None, started: float) -> tuple[str, ...]:
    """A warning when other work ran during the probe: one busy core stalls threaded ops."""
    others_after, wall = _others_cpu_s(), time.perf_counter() - started
    if others_before is None or others_after is None or wall <= 0:
        return ()
    share = (others_after - others_before) / (wall * (os.cpu_count() or 1))
    if share < 0.1:
        return ()
    return (f"other processes (or the hypervisor) used {share:.0%} of the CPUs during the "
            "probe: readings may be low; probe again when the machine is idle",)  # fmt: skip


# --- The measurements -------------------------------------------------------------------------


class _Steps:
    """Feeds the progress callback; a callback that fails is ignored, not the probe's problem."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.total, self.count = progress, total, 0

    def next(self, label: str) -> None:
        self.say(label, min(self.count / self.total, 1.0))
        self.count += 1

    def say(self, label: str, fraction: float) -> None:
        if self.progress is not None:
            progress = self.progress
            _attempt({}, "progress", lambda: progress(label, fraction))


def _measure_stream(
    backend: Backend, plan: ProbePlan, spec: Hardware | None, missing: dict[str, str], steps: _Steps
) -> tuple[BandwidthReading, ...]:
    n = plan.array_bytes // 4
    steps.next(f"memory bandwidth (3 x {plan.array_bytes / 2**20:.0f} MiB fp32)")
    ops: dict[str, Op] = _attempt(missing, "bandwidth", lambda: backend.stream_ops(n)) or {}
    best: dict[str, float] = {}
    for repeat in range(plan.stream_repeats + 1):  # interleaved as in STREAM; pass 0 warms up
        for kind, op in ops.items():
            key = f"bandwidth.{kind}"
            if key in missing:
                continue
            t = _attempt(missing, key, partial(backend.time_calls, op, 1))
            if t and repeat:
                best[kind] = min(best.get(kind, t[0]), t[0])
    del ops
    _attempt({}, "release", backend.release)
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


def _flops(shape: tuple[int, int, int]) -> int:
    m, n, k = shape
    return 2 * m * n * k


def _measure_matmul(
    backend: Backend, plan: ProbePlan, dtypes: tuple[str, ...], missing: dict[str, str],
    steps: _Steps,
) -> tuple[tuple[MatmulPoint, ...], dict[str, MatmulPoint | None]]:  # fmt: skip
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
    backend: Backend, plan: ProbePlan, dtype: str, missing: dict[str, str], steps: _Steps
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
        key, flops = f"matmul.{dtype}.{m}x{n}x{k}", _flops((m, n, k))
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
            missing[f"matmul.{dtype}" if unsupported else key] = _why(exc)
            if unsupported:
                steps.count += len(plan.matmul_shapes) - plan.matmul_shapes.index((m, n, k)) - 1
                break
            continue
        finally:
            spent += time.perf_counter() - started
        fastest = min(times)
        point = MatmulPoint(m, n, k, dtype, fastest, statistics.median(times), flops / fastest,
                            len(times))  # fmt: skip
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


def _measure_overhead(
    backend: Backend, plan: ProbePlan, missing: dict[str, str], steps: _Steps
) -> dict[str, float | None]:
    ops: dict[str, Op] = _attempt(missing, "overhead", backend.tiny_ops) or {}
    result: dict[str, float | None] = {}
    for name in OVERHEAD_OPS:
        steps.next(f"per-op overhead: {name}")
        op = ops.get(name)

        def samples(op: Op | None = op) -> list[float]:
            if op is None:
                raise Unsupported(missing.get("overhead", "not measured"))
            backend.time_batch(op, OVERHEAD_BATCH * 10)  # warm-up
            return [backend.time_batch(op, OVERHEAD_BATCH) for _ in range(plan.overhead_samples)]

        times = _attempt(missing, f"overhead.{name}", samples)
        result[name] = statistics.median(times) if times else None
    missing.pop("overhead", None)  # said for each op
    return result


def _measure_links(
    backend: Backend, plan: ProbePlan, spec: Hardware | None, missing: dict[str, str], steps: _Steps
) -> tuple[BandwidthReading, ...]:
    ops: dict[str, Op] = _attempt(missing, "links", lambda: backend.link_ops(plan.link_bytes)) or {}
    readings = []
    for kind in LINK_KINDS:
        steps.next(f"link {kind}")
        op = ops.get(kind)
        if op is None:
            if ops:
                missing[f"link.{kind}"] = "one GPU: no device-to-device link"
            continue
        runs = partial(backend.time_calls, op, plan.link_repeats + 1)  # the first warms up
        times = _attempt(missing, f"link.{kind}", runs)
        if times:
            best, size = min(times[1:]), plan.link_bytes
            gbs = size / best / 1e9
            # host_link_gbs is one direction; interconnect_gbs is a marketed two-way sum: skipped
            peak = spec.host_link_gbs if spec and kind != "d2d" else 0.0
            readings.append(
                BandwidthReading(kind, gbs, size, size, best, gbs / peak if peak else None)
            )
    del ops
    _attempt({}, "release", backend.release)
    return tuple(readings)


def _why(exc: BaseException) -> str:
    if isinstance(exc, Unsupported):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _attempt(missing: dict[str, str], key: str, fn: Callable[[], Any]) -> Any:
    """fn(), or None with the reason stored under `key` in `missing`."""
    try:
        return fn()
    except Exception as exc:  # a reading that fails is None with the reason, never a crash
        missing[key] = _why(exc)
    return None


# --- Backends: the only code that touches hardware ----------------------------------------------


class Unsupported(Exception):
    """A measurement the backend cannot make; the message is the reason."""


class Backend:
    """The interface the probe measures through. This base measures nothing (null backend)."""

    name = "null"

    def __init__(self, reason: str = "null backend: nothing is measured") -> None:
        self.reason = reason

    def describe(self) -> str:
        return "no device"

    def threads(self) -> int | None:
        raise Unsupported(self.reason)

    def versions(self) -> dict[str, str]:
        return {}

    def notes(self) -> tuple[str, ...]:
        return (self.reason,)

    def spec(self) -> Hardware | None:
        raise Unsupported(self.reason)

    def cache_bytes(self) -> int | None:
        raise Unsupported(self.reason)

    def matmul_dtypes(self) -> tuple[str, ...]:
        return ("fp32", "bf16", "fp16", "int8")

    def stream_ops(self, n: int) -> dict[str, Op]:
        """read/copy/triad over three fp32 arrays of n elements."""
        raise Unsupported(self.reason)

    def matmul_op(self, m: int, n: int, k: int, dtype: str) -> Op:
        raise Unsupported(self.reason)

    def tiny_ops(self) -> dict[str, Op]:
        raise Unsupported(self.reason)

    def link_ops(self, nbytes: int) -> dict[str, Op]:
        raise Unsupported(self.reason)

    def time_calls(self, op: Op, calls: int) -> list[float]:
        """Seconds each of `calls` calls took, one after another."""
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            op()
            times.append(time.perf_counter() - start)
        return times

    def time_batch(self, op: Op, calls: int) -> float:
        """Mean seconds per call over `calls` back-to-back calls."""
        start = time.perf_counter()
        for _ in range(calls):
            op()
        return (time.perf_counter() - start) / calls

    def release(self) -> None:
        gc.collect()

    def close(self) -> None:
        """Undo what the backend changed (thread count); called once at the end."""


class NullBackend(Backend):
    """Measures nothing: every reading is None with the reason. For tests, and no libraries."""

    def __init__(self, reason: str = "null backend: nothing is measured", name: str = "null"):
        super().__init__(reason)
        self.name = name


class _CpuBackend(Backend):
    def describe(self) -> str:
        return _cpu_model()

    def threads(self) -> int | None:
        return _compute_cores()

    def notes(self) -> tuple[str, ...]:
        return ()

    def spec(self) -> Hardware | None:
        model = normalise_name(_cpu_model())
        found = [hw for hw in load_hardware() if hw.kind == "cpu" and model in
                 {hw.id, normalise_name(hw.name), *map(normalise_name, hw.aliases)}]  # fmt: skip
        if not found:
            raise Unsupported(f"CPU {_cpu_model()!r} not in the catalogue: no fraction of spec")
        return found[0]

    def cache_bytes(self) -> int | None:
        return _llc_bytes()

    def link_ops(self, nbytes: int) -> dict[str, Op]:
        raise Unsupported(NO_LINK)


class TorchBackend(_CpuBackend):
    """torch on the CPU, on all physical cores."""

    name = "torch-cpu"

    def __init__(self) -> None:
        import torch

        self.torch, self.device = torch, torch.device("cpu")
        self._threads_before = torch.get_num_threads()
        if self.name == "torch-cpu":
            torch.set_num_threads(_compute_cores())

    def threads(self) -> int | None:
        return int(self.torch.get_num_threads())

    def versions(self) -> dict[str, str]:
        return {"torch": self.torch.__version__, "cuda": str(self.torch.version.cuda)}

    def stream_ops(self, n: int) -> dict[str, Op]:
        t, f32 = self.torch, {"dtype": self.torch.float32, "device": self.device}
        a, b, c = (t.empty(n, **f32).fill_(v) for v in (1.0, 2.0, 0.5))  # fill_: parallel touch
        return {"read": lambda: t.sum(a), "copy": lambda: c.copy_(a),
                "triad": lambda: t.add(b, c, alpha=TRIAD_SCALAR, out=a)}  # fmt: skip

    def matmul_op(self, m: int, n: int, k: int, dtype: str) -> Op:
        t, dev = self.torch, self.device
        if dtype == "int8":
            a8 = t.randint(-8, 8, (m, k), dtype=t.int8, device=dev)
            b8 = t.randint(-8, 8, (k, n), dtype=t.int8, device=dev)
            out = t.empty(m, n, dtype=t.int32, device=dev)
            return lambda: t._int_mm(a8, b8, out=out)
        types = {"fp32": t.float32, "tf32": t.float32, "bf16": t.bfloat16, "fp16": t.float16}
        if dtype not in types:
            raise Unsupported(f"{self.name}: no {dtype} matmul")
        a, b = (t.randn(*s, device=dev).to(types[dtype]) for s in ((m, k), (k, n)))
        out = t.empty(m, n, dtype=types[dtype], device=dev)
        if dtype != "tf32":
            return lambda: t.mm(a, b, out=out)

        def tf32() -> object:
            with warnings.catch_warnings():  # newer torch prefers another switch; same effect
                warnings.simplefilter("ignore")
                before = t.get_float32_matmul_precision()
                t.set_float32_matmul_precision("high")
                try:
                    return t.mm(a, b, out=out)
                finally:
                    t.set_float32_matmul_precision(before)

        return tf32

    def tiny_ops(self) -> dict[str, Op]:
        t = self.torch
        x, y = t.ones(1, device=self.device), t.ones(1, 1, device=self.device)
        return {"add": lambda: t.add(x, x), "matmul_1x1": lambda: t.mm(y, y)}

    def close(self) -> None:
        self.torch.set_num_threads(self._threads_before)


class TorchCudaBackend(TorchBackend):
    """torch on CUDA device 0: timed with CUDA events; host links and peer copies too."""

    name = "torch-cuda"

    def __init__(self) -> None:
        super().__init__()
        if not self.torch.cuda.is_available():
            raise Unsupported(f"torch {self.torch.__version__}: no CUDA device")
        self.device = self.torch.device("cuda", 0)
        self.props = self.torch.cuda.get_device_properties(0)

    def describe(self) -> str:
        return f"{self.props.name} (GPU 0 of {self.torch.cuda.device_count()})"

    def spec(self) -> Hardware | None:
        return match_catalogue(self.props.name, int(self.props.total_memory))

    def cache_bytes(self) -> int | None:
        return int(self.props.L2_cache_size)

    def matmul_dtypes(self) -> tuple[str, ...]:
        return ("fp32", "tf32", "bf16", "fp16", "int8")

    def link_ops(self, nbytes: int) -> dict[str, Op]:
        t = self.torch
        host = t.empty(nbytes, dtype=t.uint8, pin_memory=True)
        dev = t.empty(nbytes, dtype=t.uint8, device=self.device)
        ops: dict[str, Op] = {"h2d": lambda: dev.copy_(host, non_blocking=True),
                              "d2h": lambda: host.copy_(dev, non_blocking=True)}  # fmt: skip
        if t.cuda.device_count() > 1:
            peer = t.empty(nbytes, dtype=t.uint8, device="cuda:1")
            ops["d2d"] = lambda: (peer.copy_(dev, non_blocking=True), t.cuda.synchronize(1))
        return ops

    def time_calls(self, op: Op, calls: int) -> list[float]:
        cuda = self.torch.cuda
        cuda.synchronize()
        times = []
        for _ in range(calls):
            start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
            start.record()
            op()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return times

    def time_batch(self, op: Op, calls: int) -> float:
        self.torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            op()
        self.torch.cuda.synchronize()
        return (time.perf_counter() - start) / calls

    def release(self) -> None:
        gc.collect()
        self.torch.cuda.empty_cache()


class NumpyBackend(_CpuBackend):
    """numpy: elementwise ops on one thread; matmul through numpy's BLAS (fp32 only)."""

    name = "numpy-cpu"

    def __init__(self) -> None:
        import numpy

        self.np = numpy

    def threads(self) -> int | None:
        return 1

    def notes(self) -> tuple[str, ...]:
        return ("numpy backend: elementwise ops run on one thread, so bandwidth is one core's; "
                "triad is two passes (s*c, then + b) counted as one; fp16/int8 matmul have no "
                "BLAS path in numpy",)  # fmt: skip

    def versions(self) -> dict[str, str]:
        return {"numpy": self.np.__version__}

    def stream_ops(self, n: int) -> dict[str, Op]:
        np = self.np
        a, b, c = (np.full(n, v, dtype=np.float32) for v in (1.0, 2.0, 0.5))

        def triad() -> object:
            np.multiply(c, TRIAD_SCALAR, out=a)
            return np.add(a, b, out=a)

        return {"read": lambda: a.sum(), "copy": lambda: np.copyto(c, a), "triad": triad}

    def matmul_op(self, m: int, n: int, k: int, dtype: str) -> Op:
        np = self.np
        types = {"fp32": np.float32, "fp16": np.float16, "int8": np.int8}
        if dtype not in types:
            raise Unsupported(f"numpy has no {dtype} matmul")
        rng = np.random.default_rng(0)
        a, b = (rng.integers(-8, 8, size=s).astype(types[dtype]) for s in ((m, k), (k, n)))
        out = np.empty((m, n), dtype=types[dtype])
        return lambda: np.matmul(a, b, out=out)

    def tiny_ops(self) -> dict[str, Op]:
        np = self.np
        x, y = np.ones(1, dtype=np.float32), np.ones((1, 1), dtype=np.float32)
        return {"add": lambda: np.add(x, x), "matmul_1x1": lambda: np.matmul(y, y)}


def _make_backend(name: str) -> Backend:
    """The named backend, or a null one carrying the reason it could not start."""
    if name == "null":
        return NullBackend()
    try:
        if name == "numpy-cpu":
            return NumpyBackend()
        return TorchCudaBackend() if name == "torch-cuda" else TorchBackend()
    except Exception as exc:
        return NullBackend(f"{name} unavailable: {_why(exc)}", name=name)


def _auto_backend() -> Backend:
    """torch-cuda, torch-cpu, numpy-cpu: the first that starts; else a null one saying why."""
    reasons = []
    for name, module in (("torch-cuda", "torch"), ("torch-cpu", "torch"), ("numpy-cpu", "numpy")):
        if not _installed(module):
            reasons.append(f"{module} not installed")
            continue
        backend = _make_backend(name)
        if not isinstance(backend, NullBackend):
            return backend
        reasons.append(backend.reason)
    why = "; ".join(dict.fromkeys(reasons))
    return NullBackend(f"no backend: {why} (pip install 'gpuwise[torch]')", name="none")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# --- CPU facts ----------------------------------------------------------------------------------


def _compute_cores() -> int:
    """Physical cores this process may run on (SMT siblings add no bandwidth or FMA units)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
    except Exception:
        physical = None
    return max(1, min(physical or usable or 1, usable or 1))


def _size_bytes(text: str) -> int:
    found = re.fullmatch(r"\s*([\d.]+)\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not found:
        raise ValueError(f"not a cache size: {text!r}")
    return int(float(found[1]) * 1024 ** " KMG".index(found[2].upper() or " "))


def _llc_bytes() -> int | None:
    """Total last-level cache (all instances): sysfs first, then lscpu; None if unreadable."""
    level, size, owners = 0, 0, set()
    for index in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            lvl, kib = int((index / "level").read_text()), _size_bytes((index / "size").read_text())
            owner = (index / "shared_cpu_list").read_text().strip()
        except (OSError, ValueError):
            continue
        if lvl > level:
            level, size, owners = lvl, kib, {owner}
        elif lvl == level:
            size, owners = max(size, kib), owners | {owner}
    if size:
        return size * len(owners)
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        caches = re.findall(r"^L(\d)\S* cache:\s*([\d.]+ *[KMG]i?B)", out, re.MULTILINE)
        return _size_bytes(max(caches)[1]) if caches else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
