"""Run the probe: pick a backend, measure, and assemble the profile."""

from __future__ import annotations

import os
import platform
import time
from datetime import UTC, datetime

from gpuwise.catalog.hardware import Hardware
from gpuwise.errors import GpuwiseError
from gpuwise.measure.hardware.detect import LocalMachine, detect_local
from gpuwise.measure.probe.backends import Backend, auto_backend, make_backend
from gpuwise.measure.probe.measurements import (
    Steps,
    attempt,
    measure_links,
    measure_matmul,
    measure_overhead,
    measure_stream,
)
from gpuwise.measure.probe.profile import (
    BACKENDS,
    DEFAULT_CACHE_BYTES,
    ProbePlan,
    Profile,
    Progress,
)

# How the note of other work during the probe starts (local estimates repeat it).
BUSY_NOTE = "other processes (or the hypervisor) used"


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
    impl = auto_backend() if backend is None else make_backend(backend)
    try:
        cache = attempt({}, "cache", impl.cache_bytes) or DEFAULT_CACHE_BYTES
        plan = ProbePlan.for_mode(quick, cache, on_gpu=impl.name == "torch-cuda")
        return probe_with(impl, plan, progress, quick=quick)
    finally:
        attempt({}, "close", impl.close)


def probe_with(
    backend: Backend,
    plan: ProbePlan,
    progress: Progress | None = None,
    quick: bool = False,
    fingerprint: str | None = None,
) -> Profile:
    """Run `plan` on `backend`. A reading that fails becomes None with the reason; no raise."""
    missing: dict[str, str] = {}
    started, others_before = time.perf_counter(), others_cpu_s()
    dtypes: tuple[str, ...] = attempt(missing, "matmul", backend.matmul_dtypes) or ()
    steps = Steps(progress, 1 + len(dtypes) * len(plan.matmul_shapes) + 2 + 3)
    spec: Hardware | None = attempt(missing, "spec", backend.spec)
    if spec is None:
        missing.setdefault("spec", "device not in the catalogue: no fraction of spec")
    bandwidth = measure_stream(backend, plan, spec, missing, steps)
    points, best = measure_matmul(backend, plan, dtypes, missing, steps)
    overhead = measure_overhead(backend, plan, missing, steps)
    links = measure_links(backend, plan, spec, missing, steps)
    steps.say("done", 1.0)
    peaks = spec.peak_tflops if spec else {}
    versions = attempt({}, "versions", backend.versions) or {}
    contention = contention_note(others_before, started)
    return Profile(
        fingerprint=fingerprint or attempt(missing, "fingerprint", machine_fingerprint) or "",
        device=attempt(missing, "device", backend.describe) or "unknown",
        backend=backend.name,
        threads=attempt(missing, "threads", backend.threads),
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
        cache_bytes=attempt({}, "cache", backend.cache_bytes),
        spec_id=spec.id if spec else None,
        quick=quick,
        notes=(*(attempt({}, "notes", backend.notes) or ()), *contention),
    )


def others_cpu_s() -> float | None:
    """CPU seconds used so far by everything but this process and the children it waited
    for (a real run in a child process is not "others"), the hypervisor's steal too."""
    try:
        import psutil

        t, mine = psutil.cpu_times(), psutil.Process().cpu_times()
    except Exception:
        return None
    busy = t.user + t.nice + t.system + sum(getattr(t, f, 0.0) for f in ("irq", "softirq", "steal"))
    children = getattr(mine, "children_user", 0.0) + getattr(mine, "children_system", 0.0)
    return busy - mine.user - mine.system - children


def contention_note(others_before: float | None, started: float) -> tuple[str, ...]:
    """A warning when other work ran during the probe: one busy core stalls threaded ops."""
    others_after, wall = others_cpu_s(), time.perf_counter() - started
    if others_before is None or others_after is None or wall <= 0:
        return ()
    share = (others_after - others_before) / (wall * (os.cpu_count() or 1))
    if share < 0.1:
        return ()
    return (f"{BUSY_NOTE} {share:.0%} of the CPUs during the probe: readings may be low; "
            "probe again when the machine is idle",)
