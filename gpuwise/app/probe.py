"""`gpuwise probe`: measure this machine (median of `repeat` probes), keep the full parts of
an earlier probe under a quick one, and save it where `--on local` estimates read it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuwise.measure.probe.machine import probe_machine
from gpuwise.measure.probe.merge import keep_full_parts, median_profile
from gpuwise.measure.probe.profile import Profile
from gpuwise.measure.probe.store import load_profile, save_profile

# progress(what is being measured, share of the whole done from 0 to 1)
Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class ProbeAnswer:
    profile: Profile
    saved_to: Path


def probe(quick: bool, repeat: int = 1, progress: Progress | None = None) -> ProbeAnswer:
    profiles = [probe_machine(quick, _one_of(progress, i, repeat)) for i in range(repeat)]
    profile = median_profile(profiles)
    if quick:
        profile = keep_full_parts(profile, load_profile(profile.backend, profile.fingerprint))
    return ProbeAnswer(profile, save_profile(profile))


def _one_of(progress: Progress | None, i: int, repeat: int) -> Progress | None:
    """Progress of probe i of `repeat` on one bar."""
    if progress is None:
        return None
    prefix = f"probe {i + 1}/{repeat}: " if repeat > 1 else ""
    return lambda what, done: progress(prefix + what, (i + done) / repeat)
