"""The whole `gpuwise probe`: the generic measurements, then (with torch) the kernels at
model shapes and the transformers runtime's own costs, one progress bar across all three."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from gpuwise.measure.probe import kernels as kernel_probe
from gpuwise.measure.probe.profile import Profile, Progress
from gpuwise.measure.probe.run import contention_note, others_cpu_s, run_probe
from gpuwise.measure.probe.runtime_costs import (
    measure_cold_factor,
    measure_gemv,
    measure_logits_step,
    measure_runtime_overhead,
)
from gpuwise.measure.probe.steadiness import machine_vs_profile, probe_figures, steadiness_note

# Share of the progress bar each part takes (they take about these shares of the time).
GENERIC, KERNELS = 0.35, 0.55


def probe_machine(quick: bool, progress: Progress | None = None) -> Profile:
    """Measure this machine and return the profile (not saved). Parts that cannot run are
    listed in `missing` with the reason; nothing raises."""
    started, others_before = time.perf_counter(), others_cpu_s()
    profile = run_probe(quick, _part(progress, 0.0, GENERIC if not quick else 0.8))
    if quick:
        profile = _missing(profile, "kernels", "quick probe: kernels at model shapes not "
                           "measured (run `gpuwise probe` without --quick)")
    elif profile.backend in ("torch-cpu", "torch-cuda"):
        profile = _with_kernels(profile, _part(progress, GENERIC, KERNELS))
    else:
        profile = _missing(profile, "kernels", f"needs torch (backend {profile.backend})")
    if quick:  # the runtime's costs take 15-20 s here: a quick probe stays under 15 s
        profile = _missing(profile, "runtime", "quick probe: the transformers runtime's "
                           "costs not measured (run `gpuwise probe` without --quick)")
    else:
        if progress:
            progress("transformers runtime costs", 0.9)
        profile = _with_runtime(profile)
    if progress:
        progress("the headline rates again (did the machine hold still?)", 0.97)
    profile = _with_steadiness(profile)
    # The generic part says if others were busy during it; this covers the whole probe.
    late = [n for n in contention_note(others_before, started) if n not in profile.notes]
    if late and not any("other processes" in n for n in profile.notes):
        profile = dataclasses.replace(profile, notes=(*profile.notes, *late))
    return profile


def _part(progress: Progress | None, start: float, share: float) -> Progress | None:
    if progress is None:
        return None
    report = progress
    return lambda label, done: report(label, start + share * min(done, 1.0))


def _missing(profile: Profile, key: str, why: str) -> Profile:
    return dataclasses.replace(profile, missing={**profile.missing, key: why})


def _with_kernels(profile: Profile, progress: Progress | None) -> Profile:
    try:
        device = "cuda" if profile.backend == "torch-cuda" else "cpu"
        kernels = kernel_probe.measure_kernels(None, progress, device, profile.cache_bytes)
    except Exception as exc:  # a reading that fails is NA with its reason, never a crash
        return _missing(profile, "kernels", f"{type(exc).__name__}: {exc}")
    missing = {f"kernels.{k}": v for k, v in kernels.pop("missing", {}).items()}
    notes = (*profile.notes, *kernel_probe.kernel_notes(kernels))
    return dataclasses.replace(profile, kernels=kernels, missing={**profile.missing, **missing},
                               notes=notes)


def _with_steadiness(profile: Profile) -> Profile:
    """Read bandwidth and the 1024^3 matmuls measured again at the end, against the probe's
    readings: a warning note when the machine changed speed while it was probed."""
    if not probe_figures(profile):
        return _missing(profile, "steadiness", "no headline rate to measure again")
    ratios = machine_vs_profile(profile)
    if not ratios:
        return _missing(profile, "steadiness", "the headline rates could not be measured again")
    notes = (*profile.notes, *steadiness_note(ratios))
    return dataclasses.replace(profile, steadiness=ratios, notes=notes)


def _with_runtime(profile: Profile) -> Profile:
    """Add the transformers runtime's measured costs when torch and transformers are here,
    on the device the profile is for (a GPU's eager runtime is its host's dispatch)."""
    try:
        device = "cuda" if profile.backend == "torch-cuda" else "cpu"
        runtime: dict[str, Any] = dict(measure_runtime_overhead(device=device))
        runtime["cold_op_factor"] = measure_cold_factor() if device == "cpu" else 1.0
        runtime["decode_vocab_s"] = measure_logits_step(device=device)
        runtime["gemv"] = measure_gemv(device=device)
        runtime["device"] = device
    except ImportError as exc:
        return _missing(profile, "runtime", f"needs transformers ({exc})")
    except Exception as exc:  # a reading that fails is NA with its reason, never a crash
        return _missing(profile, "runtime", repr(exc))
    return dataclasses.replace(profile, runtime=runtime)
