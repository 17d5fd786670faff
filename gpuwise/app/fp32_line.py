"""The fp32 alternative `gpuwise infer` and `gpuwise train` name on a CPU whose probed
kernels make fp32 faster than half precision (estimate/speed/precision_advice.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Fp32Alternative(Generic[T]):
    """The same work in fp32: its time estimate and its memory."""

    time: T
    memory_bytes: int
