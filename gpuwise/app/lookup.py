"""The names a user gives, resolved: a device (`local` is this machine) and a model."""

from __future__ import annotations

from gpuwise.catalog.hardware import Hardware, find_hardware
from gpuwise.catalog.models import ResolvedModel, resolve_model
from gpuwise.measure.hardware.detect import detect_local
from gpuwise.workload import Architecture, from_config

LOCAL_NAMES = ("local", "here", "this")


def hardware_named(name: str) -> Hardware:
    """A catalogue device by name, or this machine's best device for 'local'."""
    if name.strip().lower() in LOCAL_NAMES:
        return detect_local().best_device()
    return find_hardware(name)


def model_named(name: str) -> tuple[ResolvedModel, Architecture]:
    """A catalogue model (or config path, checkpoint, hub id) and its architecture."""
    model = resolve_model(name)
    return model, from_config(model.config, model.name)
