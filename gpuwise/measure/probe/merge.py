"""Several probes of one machine made into one profile: every reading the median of its
readings. A shared machine (a cloud VM, a KVM guest) changes speed from minute to minute;
one probe reads each kernel at whatever speed the machine had at that moment, the median
of three reads it at its typical speed."""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence
from typing import Any

from gpuwise.measure.probe.kernels import kernel_notes
from gpuwise.measure.probe.profile import Profile, largest_move
from gpuwise.measure.probe.steadiness import merged_steadiness_note, steadiness_note

# The fields that say which reading a record is (the rest are its values).
IDENTITY = ("kind", "dtype", "m", "n", "k", "array_bytes")


def median_profile(profiles: Sequence[Profile]) -> Profile:
    """One profile whose every reading is the median of the profiles' readings of it (a
    reading only some of them have: the median of those)."""
    if len(profiles) == 1:
        return profiles[0]
    raw = [json.loads(p.to_json()) for p in profiles]
    merged = _median_tree(raw)
    merged["matmul_best"] = _best_points(merged["matmul_points"], raw[0]["matmul_best"])
    merged["created_at"] = raw[-1]["created_at"]
    merged["missing"] = {k: v for r in raw for k, v in r["missing"].items()}
    spread = probe_spread(profiles)
    # Each probe's kernel and steadiness notes give way to one of each for them all.
    own = {n for r in raw for n in kernel_notes(r.get("kernels") or {})}
    own |= {n for p in profiles for n in steadiness_note(p.steadiness or {})}
    notes = [n for r in raw for n in r["notes"] if n not in own]
    notes += kernel_notes(merged.get("kernels") or {})
    notes += merged_steadiness_note([p.steadiness for p in profiles])
    notes.append(f"the median of {len(profiles)} probes taken one after another"
                 + (f"; their headline rates differed by up to {spread:.0%}" if spread else ""))
    merged["notes"] = list(dict.fromkeys(notes))
    return Profile.from_json(json.dumps(merged))


def probe_spread(profiles: Sequence[Profile]) -> float:
    """How far the probes' headline rates (read bandwidth, best matmul per dtype) lay apart:
    the largest max / min - 1 over them."""
    figures: dict[str, list[float]] = {}
    for p in profiles:
        read = p.bandwidth_gbs("read")
        if read:
            figures.setdefault("read", []).append(read)
        for dtype in p.matmul_best:
            best = p.best_flops_per_s(dtype)
            if best:
                figures.setdefault(dtype, []).append(best)
    return largest_move({k: max(v) / min(v) for k, v in figures.items() if len(v) > 1})


def _best_points(points: list[dict], dtypes: dict[str, Any]) -> dict[str, dict | None]:
    best: dict[str, dict | None] = {d: None for d in dtypes}
    for p in points:
        held = best.get(p["dtype"])
        if held is None or p["flops_per_s"] > held["flops_per_s"]:
            best[p["dtype"]] = p
    return best


def _median_tree(values: list[Any]) -> Any:
    """The median of corresponding numbers across several JSON trees of the same shape."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    first = present[0]
    if isinstance(first, dict):
        keys = dict.fromkeys(k for v in present if isinstance(v, dict) for k in v)
        return {k: _median_tree([v.get(k) for v in present if isinstance(v, dict)]) for k in keys}
    if isinstance(first, list):
        return _median_list([v for v in present if isinstance(v, list)])
    numbers = [v for v in present if _is_number(v)]
    if not _is_number(first) or len(numbers) < len(present):
        return first  # text, flags: as the first probe has them
    return first if all(v == first for v in numbers) else statistics.median(numbers)


def _median_list(lists: list[list]) -> list:
    items = [item for lst in lists for item in lst]
    if items and all(isinstance(i, dict) for i in items):
        return _by_key(lists, lambda d: tuple((f, d[f]) for f in IDENTITY if f in d), None)
    if items and all(_is_point(i) for i in items):  # [shape..., value]: keyed by the shape
        return _by_key(lists, lambda p: tuple(p[:-1]), lambda p, v: [*p[:-1], v])
    if all(len(lst) == len(lists[0]) for lst in lists):
        return [_median_tree(list(column)) for column in zip(*lists, strict=True)]
    return lists[0]


def _by_key(lists: list[list], key: Any, rebuild: Any) -> list:
    """Items matched across the lists by `key`, in the first list's order; each the median of
    its matches (a point: the median of its last number, rebuilt by `rebuild`)."""
    groups: dict[Any, list] = {}
    for lst in lists:
        for item in lst:
            groups.setdefault(key(item), []).append(item)
    if rebuild is None:
        return [_median_tree(group) for group in groups.values()]
    return [rebuild(g[0], _median_tree([p[-1] for p in g])) for g in groups.values()]


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_point(v: Any) -> bool:
    return isinstance(v, list) and len(v) >= 2 and all(_is_number(x) for x in v)


# What only a full probe measures: a quick probe saved over a full one keeps these from it.
FULL_ONLY = ("kernels", "runtime")
KEPT_NOTE = "kept from the full probe"


def keep_full_parts(quick: Profile, previous: Profile | None) -> Profile:
    """A quick probe's profile with the kernels and runtime costs of the profile it replaces
    (same machine and backend: a full probe, or a quick one that kept them in turn), so
    `--quick` refreshes the headline rates without throwing away what only a full probe
    measures. Anything else: `quick` unchanged."""
    if (not quick.quick or previous is None
            or (previous.fingerprint, previous.backend) != (quick.fingerprint, quick.backend)):
        return quick
    kept = {k: getattr(previous, k) for k in FULL_ONLY
            if getattr(quick, k) is None and getattr(previous, k) is not None}
    if not kept:
        return quick

    def part_of_kept(key: str) -> bool:
        return any(key.startswith(f"{p}.") for p in kept)

    missing = {k: v for k, v in quick.missing.items() if k not in kept and not part_of_kept(k)}
    missing |= {k: v for k, v in previous.missing.items() if part_of_kept(k)}
    # A quick profile that kept them says from which full probe: that note carries over.
    earlier = [n for n in previous.notes if n.startswith(KEPT_NOTE)] if previous.quick else []
    note = earlier[0] if earlier else (f"{KEPT_NOTE} of {previous.created_at}: "
                                       f"{' and '.join(kept)} (a quick probe does not measure them)")
    return dataclasses.replace(quick, **kept, missing=missing, notes=(*quick.notes, note))
