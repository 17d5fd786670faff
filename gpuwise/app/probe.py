"""`gpuwise probe`: measure this machine (median of `repeat` probes), keep the full parts of
an earlier probe under a quick one, and save it where `--on local` estimates read it. A probe
with implausible readings (gpuwise.measure.probe.plausible) is saved aside with its warnings,
never over a good profile, which stays in use."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuwise.errors import GpuwiseError
from gpuwise.estimate.runtimes import runtime_units
from gpuwise.measure.llama_cpp.gguf_model import need_llama_cpp
from gpuwise.measure.probe.llama_cpp_part import keep_llama_cpp, with_llama_cpp
from gpuwise.measure.probe.machine import probe_machine
from gpuwise.measure.probe.merge import keep_full_parts, median_profile
from gpuwise.measure.probe.plausible import profile_warnings
from gpuwise.measure.probe.profile import Profile
from gpuwise.measure.probe.store import profile_path, save_profile
from gpuwise.measure.probe.trusted import trusted_profile, untrusted_set_aside

# progress(what is being measured, share of the whole done from 0 to 1)
Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class ProbeAnswer:
    profile: Profile  # not trusted where it has warnings: then saved aside
    saved_to: Path
    in_use: Profile | None = None  # the good profile estimates keep, where this one is not trusted
    in_use_path: Path | None = None


def probe(quick: bool, repeat: int = 1, progress: Progress | None = None,
          runtime: str = "transformers") -> ProbeAnswer:
    """`runtime` "llama.cpp" also times llama.cpp here (llama-cpp-python installed): the
    runtime's own part of the probe (estimate/runtimes/: `probe_part`)."""
    own_part = _probe_part(runtime)
    if own_part:
        need_llama_cpp()  # before minutes of probing, not after
    share = 0.6 if own_part else 1.0
    profiles = [probe_machine(quick, _one_of(progress, i, repeat, share)) for i in range(repeat)]
    profile = median_profile(profiles)
    previous = trusted_profile(profile.backend, profile.fingerprint)
    if quick:
        profile = keep_full_parts(profile, previous)
    if own_part:
        part = (lambda what, done: progress(what, share + (1 - share) * done)) if progress else None
        profile = with_llama_cpp(profile, part, quick)
    profile, warnings = _checked(profile)
    profile = keep_llama_cpp(profile, previous)  # where its own part was none or set aside
    if not warnings:
        return ProbeAnswer(profile, save_profile(profile))
    profile = dataclasses.replace(profile, warnings=warnings)
    kept = profile_path(previous.fingerprint, previous.backend) if previous else None
    return ProbeAnswer(profile, save_profile(profile), previous, kept)


def _checked(profile: Profile) -> tuple[Profile, tuple[str, ...]]:
    """The probe as it will be read back, each part (runtime costs, kernel grids, llama.cpp
    rates) of the wrong type or shape or with implausible readings set aside alone (said in
    `missing`); and why the rest is not to be trusted: a core field of the wrong type or shape,
    or implausible core readings."""
    try:
        profile = Profile.from_json(profile.to_json())
    except ValueError as exc:
        return profile, (f"a reading of the wrong type or shape: {exc}",)
    profile = untrusted_set_aside(profile)
    return profile, profile_warnings(profile)


def _probe_part(runtime: str) -> str:
    """The runtime's own part of the probe ("" where the machine's probe times it)."""
    probed = {u.id: u.probe_part for u in runtime_units().values() if u.probe_part is not None}
    if runtime not in probed:
        raise GpuwiseError(f"the probe measures no {runtime!r} runtime",
                           f"choose one of: {', '.join(probed)}")
    return probed[runtime]


def _one_of(progress: Progress | None, i: int, repeat: int,
            share: float = 1.0) -> Progress | None:
    """Progress of probe i of `repeat` on one bar, of which they take `share`."""
    if progress is None:
        return None
    prefix = f"probe {i + 1}/{repeat}: " if repeat > 1 else ""
    return lambda what, done: progress(prefix + what, share * (i + done) / repeat)
