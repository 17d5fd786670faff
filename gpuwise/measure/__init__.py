"""Touches hardware: device detection, probes, real runs. Readings that fail are None + reason."""

from gpuwise.measure.hardware.catalogue_match import match_catalogue
from gpuwise.measure.hardware.detect import LocalMachine, detect_gpus, detect_local
from gpuwise.measure.hardware.gpus import GpuInfo

__all__ = ["GpuInfo", "LocalMachine", "detect_gpus", "detect_local", "match_catalogue"]
