"""Keep probe profiles between runs: JSON files in the user's cache directory.

The directory is `$GPUWISE_CACHE_DIR`, else `$XDG_CACHE_HOME/gpuwise`, else
`~/.cache/gpuwise`. One file per machine fingerprint (CPU model, core count, GPU names) and
backend, so a profile is never applied to other hardware: a changed GPU or a new machine
with the same home directory simply finds no profile.

A profile is replaced atomically. When the cache directory cannot take it (a file, read-only,
full), the profile is saved in a new temporary directory instead and the error says where, so a
probe that just ran is never lost; a profile that cannot be read (a FIFO, binary, huge) is none.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from gpuwise.errors import GpuwiseError
from gpuwise.files import CACHE_ENV, cache_dir, read_text, replace_atomically, shown
from gpuwise.measure.probe import Profile, machine_fingerprint
from gpuwise.units import MIB

__all__ = ["cache_dir", "load_profile", "profile_path", "read_profile", "save_profile"]

# Which profile answers for this machine when no backend is named: the fastest device first.
PREFERRED_BACKENDS = ("torch-cuda", "torch-cpu", "numpy-cpu")
WHAT = "probe profile"
MAX_PROFILE_BYTES = 64 * MIB  # a full probe's profile is ~100 KB


def profile_path(fingerprint: str, backend: str, rejected: bool = False) -> Path:
    """The file of one machine's profile for one backend; `rejected`: the file beside it that
    holds the last probe not trusted (gpuwise.measure.probe.plausible), never read as one."""
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
    return cache_dir() / f"probe-{backend}-{digest}{'-rejected' if rejected else ''}.json"


def save_profile(profile: Profile) -> Path:
    """Write `profile` (replacing the previous one for its machine and backend); its path.
    A cache directory that cannot take it is a GpuwiseError saying where it was saved instead.
    A profile with warnings (not trusted) goes aside, to the `rejected` path: never over one."""
    path = profile_path(profile.fingerprint, profile.backend, rejected=not profile.trusted)
    data = profile.to_json().encode()
    hint = f"point {CACHE_ENV} at a writable directory"
    try:
        replace_atomically(path, data, WHAT, hint)
        return path
    except GpuwiseError as exc:
        failed = exc
    try:
        aside = Path(tempfile.mkdtemp(prefix="gpuwise-cache-")) / path.name
        aside.write_bytes(data)
    except OSError as exc:
        raise GpuwiseError(f"{failed.message}; nor could it be saved in a temporary directory "
                           f"({exc.strerror}): this probe is lost", hint) from None
    raise GpuwiseError(f"{failed.message}; the probe was saved to {shown(aside, 200)} instead",
                       f"{CACHE_ENV}={shown(aside.parent, 200)} uses it; or {hint}") from None


def load_profile(backend: str | None = None, fingerprint: str | None = None) -> Profile | None:
    """This machine's saved profile, or None when there is none (or it is unreadable).

    `backend`: None takes the first of torch-cuda, torch-cpu, numpy-cpu that was probed.
    `fingerprint`: defaults to this machine's (`machine_fingerprint()`).
    """
    fingerprint = fingerprint or machine_fingerprint()
    for name in (backend,) if backend else PREFERRED_BACKENDS:
        try:
            profile = read_profile(profile_path(fingerprint, name))
        except (GpuwiseError, ValueError):  # none, not a file, binary, huge, or malformed
            continue
        if profile.fingerprint == fingerprint and profile.backend == name:
            return profile
    return None


def read_profile(path: Path) -> Profile:
    """The profile saved at `path`: a GpuwiseError when it cannot be read as text (none, not a
    file, binary, huge), a ValueError naming what is malformed in it."""
    return Profile.from_json(read_text(path, WHAT, MAX_PROFILE_BYTES))
