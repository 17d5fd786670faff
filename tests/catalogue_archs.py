"""Catalogue models as Architecture records, built once for the whole test session."""

from functools import cache

from gpuwise.catalog import resolve_model
from gpuwise.workload import Architecture, from_config


@cache
def arch(name: str) -> Architecture:
    return from_config(resolve_model(name).config, name)
