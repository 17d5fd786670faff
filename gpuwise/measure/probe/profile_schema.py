"""The saved profile's schema, derived from the dataclasses the probe writes (`Profile`,
`BandwidthReading`, `MatmulPoint`, the llama.cpp part's `LlamaCppPart`, llama.cpp's
`GgmlRates`): what is written and what is read have one definition and cannot drift apart
(`gpuwise.estimate.speed.probe_record.record_of`). Only what a field's type cannot say is given
here by name: a matrix side is at least 1, the kernel grids and the eager runtime's costs are
tables of their own shape.

A profile is checked in parts (`PARTS`): the core readings (bandwidth, matmuls, overhead) and
each optional part alone, so a part that fails its check is set aside by itself and the rest
of the same probe stays in use."""

from __future__ import annotations

from typing import Any

from gpuwise.estimate.speed.probe_record import (
    Check,
    check_kernels,
    list_of,
    maybe,
    number,
    point,
    record_of,
    size,
    table_of,
    text,
)
from gpuwise.measure.llama_cpp.record import LlamaCppPart


def _anything(value: Any, where: str) -> None:
    """A part's place in the core record: checked on its own (PART_CHECKS)."""


# The transformers runtime's costs: seconds and factors by name, GEMV rates by dtype.
RUNTIME = table_of(number, {"gemv": table_of(list_of(point(1))), "device": text})
LLAMA_CPP = record_of(LlamaCppPart)
# The parts of a profile checked and set aside one by one, with what each is, for messages.
PART_CHECKS: dict[str, Check] = {"runtime": RUNTIME, "kernels": check_kernels,
                                 "llama_cpp": LLAMA_CPP}
PARTS = {"runtime": "eager runtime costs", "kernels": "kernel grids",
         "llama_cpp": "llama.cpp rates"}


def core_check(profile: type, bandwidth: type, matmul: type) -> Check:
    """The check of a saved profile's core, from its dataclasses (profile.py passes them: it
    imports this module); each part is checked alone (`part_problems`)."""
    point_check = record_of(matmul, {"m": size, "n": size, "k": size,
                                     "repeats": number})  # a median of counts after --repeat
    reading = list_of(record_of(bandwidth))
    nested = {"matmul_points": list_of(point_check), "matmul_best": table_of(maybe(point_check)),
              "bandwidth": reading, "links": reading}
    return record_of(profile, {**nested, **{part: _anything for part in PART_CHECKS}})


def part_problems(raw: dict[str, Any]) -> dict[str, str]:
    """Each part of a saved profile that fails its check, with the first field that is wrong."""
    found = {}
    for part, check in PART_CHECKS.items():
        if raw.get(part) is None:
            continue
        try:
            check(raw[part], f"profile.{part}")
        except ValueError as exc:
            found[part] = str(exc)
    return found
