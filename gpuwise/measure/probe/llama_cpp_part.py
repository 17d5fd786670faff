"""The llama.cpp part of a probe profile (`gpuwise probe --runtime llama.cpp`): measured here
once, after the generic probes, and carried from one profile to the next of the same machine
while nobody asks for it again."""

from __future__ import annotations

import dataclasses
import os

from gpuwise.measure.probe.profile import Profile, Progress

CPU_BACKENDS = ("torch-cpu", "numpy-cpu")
KEPT_NOTE = "llama.cpp rates kept from the previous probe (`gpuwise probe --runtime llama.cpp` measures them again)"


def with_llama_cpp(profile: Profile, progress: Progress | None = None) -> Profile:
    """The profile with llama.cpp's rates on this CPU (its GPU backends are not probed)."""
    if profile.backend not in CPU_BACKENDS:
        missing = {**profile.missing, "llama_cpp": f"probed on a CPU, not {profile.backend}"}
        return dataclasses.replace(profile, missing=missing)
    from gpuwise.measure.llama_cpp.probe import probe_llama_cpp

    return dataclasses.replace(profile, llama_cpp=probe_llama_cpp(os.cpu_count() or 1, progress))


def keep_llama_cpp(profile: Profile, previous: Profile | None) -> Profile:
    """`profile` with the llama.cpp rates of the one it replaces, where it has none itself."""
    if (profile.llama_cpp is not None or previous is None or previous.llama_cpp is None
            or (previous.fingerprint, previous.backend) != (profile.fingerprint, profile.backend)):  # fmt: skip
        return profile
    return dataclasses.replace(profile, llama_cpp=previous.llama_cpp,
                               notes=(*profile.notes, KEPT_NOTE))  # fmt: skip
