"""Data and loaders only: hardware specs, model configs, formats and runtimes (with sources)."""

from gpuwise.catalog.formats import WeightFormat, dtype_bytes, weight_format
from gpuwise.catalog.hardware import Hardware, find_hardware, load_hardware
from gpuwise.catalog.models import ModelEntry, ResolvedModel, load_models, resolve_model

__all__ = [
    "Hardware", "ModelEntry", "ResolvedModel", "WeightFormat", "dtype_bytes", "find_hardware",
    "load_hardware", "load_models", "resolve_model", "weight_format",
]
