"""Touches hardware: device detection, probes, real runs. Readings that fail are None + reason."""

from gpuwise.measure.hardware.detect import (
    GpuInfo,
    LocalMachine,
    detect_gpus,
    detect_local,
    match_catalogue,
)

__all__ = ["GpuInfo", "LocalMachine", "detect_gpus", "detect_local", "match_catalogue"]
