"""Which saved profile `--on local` estimates may use, and what to say about the others: a
profile that cannot be read, is malformed or holds implausible readings is ignored with its
reason in one line, and a newer probe set aside as not trusted is named."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuwise.errors import GpuwiseError
from gpuwise.files import file_type, shown
from gpuwise.measure.probe import store
from gpuwise.measure.probe.plausible import profile_warnings, summary
from gpuwise.measure.probe.profile import Profile
from gpuwise.measure.probe.run import machine_fingerprint


@dataclass(frozen=True)
class LocalProfile:
    """The trusted profile of this machine (None: none), and one line for each profile that
    was not used or probe that was set aside."""

    profile: Profile | None
    remarks: tuple[str, ...] = ()


def local_profile() -> LocalProfile:
    """This machine's saved profile where it is trusted, with what to say about the others."""
    profile = store.load_profile()
    if profile is not None:
        warnings = profile_warnings(profile)
        if not warnings:
            return LocalProfile(profile, set_aside(profile.fingerprint, after=profile.created_at))
        path = store.profile_path(profile.fingerprint, profile.backend)
        remarks: tuple[str, ...] = (f"the saved probe profile {shown(path, 200)} was not used: "
                                    f"{summary(warnings)}",)  # fmt: skip
        fingerprint = profile.fingerprint
    else:
        fingerprint = machine_fingerprint()
        remarks = unreadable(fingerprint)
    return LocalProfile(None, (*remarks, *set_aside(fingerprint)))


def trusted_profile(backend: str, fingerprint: str) -> Profile | None:
    """The saved profile of this backend and machine where it is trusted."""
    profile = store.load_profile(backend, fingerprint)
    return profile if profile is not None and not profile_warnings(profile) else None


def unreadable(fingerprint: str) -> tuple[str, ...]:
    """Why each profile file of this machine that is there could not be used."""
    found = []
    for backend in store.PREFERRED_BACKENDS:
        path = store.profile_path(fingerprint, backend)
        try:
            if file_type(path) is None:
                continue
            profile = store.read_profile(path)
        except GpuwiseError as exc:
            found.append(f"{exc.message}: ignored")
        except ValueError as exc:
            found.append(f"the saved probe profile {shown(path, 200)} is malformed ({exc}): ignored")
        else:
            if (profile.fingerprint, profile.backend) != (fingerprint, backend):
                found.append(f"the saved probe profile {shown(path, 200)} is of another machine or "
                             "backend: ignored")  # fmt: skip
    return tuple(found)


def set_aside(fingerprint: str, after: str = "") -> tuple[str, ...]:
    """The newest probe of this machine set aside as not trusted, where newer than `after`
    (the created_at of the profile in use): one line naming why and where it is."""
    for backend in store.PREFERRED_BACKENDS:
        path = store.profile_path(fingerprint, backend, rejected=True)
        rejected = _read(path)
        if rejected is not None and rejected.created_at > after:
            why = summary(profile_warnings(rejected)) or "no reason saved"
            return (f"the probe of {rejected.created_at} was set aside, not trusted ({why}; "
                    f"in {shown(path, 200)})",)  # fmt: skip
    return ()


def _read(path: Path) -> Profile | None:
    try:
        return store.read_profile(path) if file_type(path) == "file" else None
    except (GpuwiseError, ValueError):
        return None
