"""Keep probe profiles between runs: JSON files in the user's cache directory.

The directory is `$GPUWISE_CACHE_DIR`, else `$XDG_CACHE_HOME/gpuwise`, else
`~/.cache/gpuwise`. One file per machine fingerprint (CPU model, core count, GPU names) and
backend, so a profile is never applied to other hardware: a changed GPU or a new machine
with the same home directory simply finds no profile.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from gpuwise.measure.probe import Profile, machine_fingerprint

__all__ = ["cache_dir", "load_profile", "profile_path", "save_profile"]

CACHE_ENV = "GPUWISE_CACHE_DIR"
# Which profile answers for this machine when no backend is named: the fastest device first.
PREFERRED_BACKENDS = ("torch-cuda", "torch-cpu", "numpy-cpu")


def cache_dir() -> Path:
    """Where profiles live (not created until a profile is saved)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gpuwise"


def profile_path(fingerprint: str, backend: str) -> Path:
    """The file of one machine's profile for one backend."""
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
    return cache_dir() / f"probe-{backend}-{digest}.json"


def save_profile(profile: Profile) -> Path:
    """Write `profile` (replacing the previous one for its machine and backend); its path."""
    path = profile_path(profile.fingerprint, profile.backend)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(profile.to_json())
    partial.replace(path)  # atomic: a reader never sees half a file
    return path


def load_profile(backend: str | None = None, fingerprint: str | None = None) -> Profile | None:
    """This machine's saved profile, or None when there is none (or it is unreadable).

    `backend`: None takes the first of torch-cuda, torch-cpu, numpy-cpu that was probed.
    `fingerprint`: defaults to this machine's (`machine_fingerprint()`).
    """
    fingerprint = fingerprint or machine_fingerprint()
    for name in (backend,) if backend else PREFERRED_BACKENDS:
        try:
            profile = Profile.from_json(profile_path(fingerprint, name).read_text())
        except (OSError, ValueError):
            continue
        if profile.fingerprint == fingerprint and profile.backend == name:
            return profile
    return None
