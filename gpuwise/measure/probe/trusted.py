"""Which saved profile `--on local` estimates may use, and what to say about the others: a
profile that cannot be read, is malformed or holds implausible readings is ignored with its
reason in one line, and a newer probe set aside as not trusted is named."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuwise.errors import GpuwiseError
from gpuwise.files import file_type, shown
from gpuwise.measure.probe import store
from gpuwise.measure.probe.plausible import (
    implausible_parts,
    profile_warnings,
    summary,
    unsteady_dtypes,
)
from gpuwise.measure.probe.profile import Profile
from gpuwise.measure.probe.profile_schema import PARTS
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
            profile, parts = parts_judged(profile)
            return LocalProfile(profile, (*parts, *set_aside(profile.fingerprint,
                                                              after=profile.created_at)))
        path = store.profile_path(profile.fingerprint, profile.backend)
        remarks: tuple[str, ...] = (f"the saved probe profile {shown(path, 200)} was not used: "
                                    f"{summary(warnings)}",)
        fingerprint = profile.fingerprint
    else:
        fingerprint = machine_fingerprint()
        remarks = unreadable(fingerprint)
    return LocalProfile(None, (*remarks, *set_aside(fingerprint)))


def trusted_profile(backend: str, fingerprint: str) -> Profile | None:
    """The saved profile of this backend and machine where it is trusted, its parts with
    implausible readings set aside."""
    profile = store.load_profile(backend, fingerprint)
    if profile is None or profile_warnings(profile):
        return None
    return parts_judged(profile)[0]


def parts_judged(profile: Profile) -> tuple[Profile, tuple[str, ...]]:
    """The profile with each part that is malformed or holds implausible readings set aside
    (bounds may have changed since it was saved), and one line for each part set aside: the
    rest of the probe is used, and the estimates say what they go without."""
    profile = untrusted_set_aside(profile)
    path = shown(store.profile_path(profile.fingerprint, profile.backend), 200)
    return profile, tuple(f"the {PARTS[part]} of the saved probe profile {path} were {why}: "
                          f"estimates go without them" for part, why in profile.parts_set_aside().items())


def untrusted_set_aside(profile: Profile) -> Profile:
    """The profile with each matmul dtype that moved while it was probed, and each part with
    implausible readings, set aside alone (`missing` says why); its core is judged apart
    (`profile_warnings`)."""
    for dtype, line in unsteady_dtypes(profile).items():
        profile = profile.without_dtype(dtype, line)
    for part, lines in implausible_parts(profile).items():
        profile = profile.without_part(part, summary(lines))
    return profile


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
                             "backend: ignored")
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
                    f"in {shown(path, 200)})",)
    return ()


def _read(path: Path) -> Profile | None:
    try:
        return store.read_profile(path) if file_type(path) == "file" else None
    except (GpuwiseError, ValueError):
        return None
