"""The llama.cpp part of a probe profile (`gpuwise probe --runtime llama.cpp`): measured here
once, after the generic probes, and carried from one profile to the next of the same machine
while nobody asks for it again. A quick llama.cpp probe times fewer thread counts: the rates
it did not take are kept from the fuller one before it."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from gpuwise.measure.probe.profile import Profile, Progress

CPU_BACKENDS = ("torch-cpu", "numpy-cpu")
KEPT_NOTE = "llama.cpp rates kept from the previous probe (`gpuwise probe --runtime llama.cpp` measures them again)"
KEPT_RATES_NOTE = "llama.cpp rates kept from the previous probe for what this quick one did not time"


def with_llama_cpp(profile: Profile, progress: Progress | None = None,
                   quick: bool = False) -> Profile:
    """The profile with llama.cpp's rates on this CPU (its GPU backends are not probed)."""
    if profile.backend not in CPU_BACKENDS:
        missing = {**profile.missing, "llama_cpp": f"probed on a CPU, not {profile.backend}"}
        return dataclasses.replace(profile, missing=missing)
    from gpuwise.measure.llama_cpp.probe import probe_llama_cpp

    part = probe_llama_cpp(os.cpu_count() or 1, progress, quick)
    missing = {k: v for k, v in profile.missing.items() if k != "llama_cpp"}
    return dataclasses.replace(profile, llama_cpp=part, missing=missing)


def keep_llama_cpp(profile: Profile, previous: Profile | None) -> Profile:
    """`profile` with the llama.cpp rates of the one it replaces, where it has none itself, or
    where it is a quick llama.cpp probe, the rates of the previous one it did not time."""
    if (previous is None or previous.llama_cpp is None
            or (previous.fingerprint, previous.backend) != (profile.fingerprint, profile.backend)):
        return profile
    if profile.llama_cpp is None:
        why = profile.parts_set_aside().get("llama_cpp")
        note = f"this probe's llama.cpp rates were {why}: the previous probe's are kept" if why else KEPT_NOTE
        missing = {k: v for k, v in profile.missing.items() if k != "llama_cpp"}
        return dataclasses.replace(profile, llama_cpp=previous.llama_cpp, missing=missing,
                                   notes=(*profile.notes, note))
    if not profile.llama_cpp.get("quick"):
        return profile
    merged = _merged_rates(profile.llama_cpp, previous.llama_cpp)
    if merged is profile.llama_cpp:
        return profile
    return dataclasses.replace(profile, llama_cpp=merged, notes=(*profile.notes, KEPT_RATES_NOTE))


def _merged_rates(quick: dict[str, Any], previous: dict[str, Any]) -> dict[str, Any]:
    """The quick part with the previous part's rates and timings for the keys it lacks."""
    kept = {k: v for k, v in previous["rates"].items() if k not in quick["rates"]}
    if not kept:
        return quick
    taken = {(t["model"], t["type"], t["threads"]) for t in quick["timings"]}
    timings = [*quick["timings"], *(t for t in previous["timings"]
                                    if (t["model"], t["type"], t["threads"]) not in taken)]
    return {**quick, "rates": {**quick["rates"], **kept}, "timings": timings}
